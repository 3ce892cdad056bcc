package webhookprobe

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

func TestWait(t *testing.T) {
	p := DefaultPolicy
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	for _, tc := range []struct {
		name string
		h    History
		now  time.Time
		want time.Duration
	}{
		{"never probed", History{}, t0, 0},
		{"never probed, changed", History{LastChange: at(0)}, at(time.Hour), 0},
		{"passing, just probed", History{LastProbe: at(0)}, at(time.Second), 59 * time.Second},
		{"passing, a minute later", History{LastProbe: at(0)}, at(time.Minute), 0},
		{"passing, long overdue", History{LastProbe: at(0)}, at(time.Hour), 0},
		{"passing, change before the probe", History{LastProbe: at(10 * time.Second), LastChange: at(0)}, at(20 * time.Second), 50 * time.Second},
		{"passing, changed after the probe", History{LastProbe: at(0), LastChange: at(2 * time.Second)}, at(3 * time.Second), 2 * time.Second},
		{"passing, changed long after the probe", History{LastProbe: at(0), LastChange: at(30 * time.Second)}, at(30 * time.Second), 0},
		{"failing once", History{LastProbe: at(0), Failures: 1}, at(0), 5 * time.Second},
		{"failing twice", History{LastProbe: at(0), Failures: 2}, at(time.Second), 9 * time.Second},
		{"failing 3 times", History{LastProbe: at(0), Failures: 3}, at(0), 20 * time.Second},
		{"failing 4 times", History{LastProbe: at(0), Failures: 4}, at(0), 40 * time.Second},
		{"failing 5 times: capped", History{LastProbe: at(0), Failures: 5}, at(0), time.Minute},
		{"failing 1000 times: capped", History{LastProbe: at(0), Failures: 1000}, at(0), time.Minute},
		{"failing, changed: retried soon", History{LastProbe: at(0), LastChange: at(time.Second), Failures: 9}, at(time.Second), 4 * time.Second},
	} {
		if got := p.Wait(tc.h, tc.now); got != tc.want {
			t.Errorf("%s: Wait = %s, want %s", tc.name, got, tc.want)
		}
	}
}

// In steady state (no change) the schedule never probes a CR more than
// once per Period after its backoff reached the cap, passing or failing.
func TestSteadyStateRate(t *testing.T) {
	p := DefaultPolicy
	for _, ok := range []bool{true, false} {
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		var h History
		var probes []time.Time
		for end := now.Add(time.Hour); now.Before(end); now = now.Add(time.Second) {
			if p.Wait(h, now) == 0 {
				probes = append(probes, now)
				h = Record(h, now, ok)
			}
		}
		// Skip the first five (the backoff ramp when failing).
		for i := 6; i < len(probes); i++ {
			if gap := probes[i].Sub(probes[i-1]); gap < p.Period {
				t.Fatalf("ok=%v: probes %d and %d %s apart", ok, i-1, i, gap)
			}
		}
		if n := len(probes); n > 66 {
			t.Fatalf("ok=%v: %d probes in an hour", ok, n)
		}
	}
}

func TestRecord(t *testing.T) {
	t0 := time.Unix(100, 0)
	h := Record(History{Failures: 3}, t0, false)
	if h.Failures != 4 || !h.LastProbe.Equal(t0) {
		t.Fatalf("%+v", h)
	}
	if h = Record(h, t0, true); h.Failures != 0 {
		t.Fatalf("%+v", h)
	}
}

func TestClassify(t *testing.T) {
	const wh = "injector.sidecar.hookwright.io"
	for _, tc := range []struct{ msg, want string }{
		{`Internal error occurred: failed calling webhook "injector.sidecar.hookwright.io": failed to call webhook: Post "https://hookwright-si-mesh.hookwright-system.svc:443/inject?timeout=10s": tls: failed to verify certificate: x509: certificate signed by unknown authority`, v1alpha1.WebhookProbeReasonTLSError},
		{`Internal error occurred: failed calling webhook "injector.sidecar.hookwright.io": failed to call webhook: Post "https://x.y.svc:443/inject?timeout=10s": context deadline exceeded`, v1alpha1.WebhookProbeReasonTimeout},
		{`Internal error occurred: failed calling webhook "injector.sidecar.hookwright.io": failed to call webhook: Post "https://x.y.svc:443/inject?timeout=10s": net/http: TLS handshake timeout`, v1alpha1.WebhookProbeReasonTimeout},
		{`Internal error occurred: failed calling webhook "injector.sidecar.hookwright.io": failed to call webhook: Post "https://x.y.svc:443/inject?timeout=10s": dial tcp 10.0.0.7:443: connect: connection refused`, v1alpha1.WebhookProbeReasonUnreachable},
		{`Internal error occurred: failed calling webhook "injector.sidecar.hookwright.io": failed to call webhook: Post "https://x.y.svc:443/inject?timeout=10s": no endpoints available for service "x"`, v1alpha1.WebhookProbeReasonUnreachable},
		// The API server's egress selector (HTTP CONNECT) refused the dial.
		{`Internal error occurred: failed calling webhook "injector.sidecar.hookwright.io": failed to call webhook: Post "https://x.y.svc:443/inject?timeout=10s": proxy error from 127.0.0.1:4000 while dialing 10.96.0.12:443, code 502: 502 Bad Gateway`, v1alpha1.WebhookProbeReasonUnreachable},
		{`Internal error occurred: failed calling webhook "injector.sidecar.hookwright.io": failed to call webhook: the server responded with an unexpected body`, v1alpha1.WebhookProbeReasonWrongAnswer},
		{`admission webhook "injector.sidecar.hookwright.io" denied the request: template failed`, v1alpha1.WebhookProbeReasonWrongAnswer},
		{`pods "probe" is forbidden: User "system:serviceaccount:x:y" cannot create resource "pods"`, v1alpha1.WebhookProbeReasonProbeFailed},
		{`namespaces "hookwright-probe-mesh" not found`, v1alpha1.WebhookProbeReasonProbeFailed},
	} {
		if got := Classify(wh, tc.msg); got != tc.want {
			t.Errorf("Classify(%q) = %s, want %s", tc.msg, got, tc.want)
		}
	}
}

func TestSatisfying(t *testing.T) {
	base := map[string]string{"app.kubernetes.io/managed-by": "hookwright", "drop": "me"}
	for _, tc := range []struct {
		name    string
		sel     *metav1.LabelSelector
		want    map[string]string
		wantErr bool
	}{
		{"nil", nil, base, false},
		{"matchLabels", &metav1.LabelSelector{MatchLabels: map[string]string{"sidecar-injection": "enabled"}},
			map[string]string{"app.kubernetes.io/managed-by": "hookwright", "drop": "me", "sidecar-injection": "enabled"}, false},
		{"expressions", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "env", Operator: metav1.LabelSelectorOpIn, Values: []string{"prod", "dev"}},
			{Key: "mesh", Operator: metav1.LabelSelectorOpExists},
			{Key: "drop", Operator: metav1.LabelSelectorOpDoesNotExist},
			{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system"}},
		}}, map[string]string{"app.kubernetes.io/managed-by": "hookwright", "env": "prod", "mesh": existsValue}, false},
		{"NotIn removes a base value", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "drop", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"me"}},
		}}, map[string]string{"app.kubernetes.io/managed-by": "hookwright"}, false},
		{"unsatisfiable", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "env", Operator: metav1.LabelSelectorOpIn, Values: []string{"prod"}},
			{Key: "env", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"prod"}},
		}}, nil, true},
		{"invalid", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "env", Operator: metav1.LabelSelectorOpIn},
		}}, nil, true},
	} {
		got, err := Satisfying(tc.sel, base)
		if (err != nil) != tc.wantErr {
			t.Fatalf("%s: err %v", tc.name, err)
		}
		if tc.wantErr {
			continue
		}
		if !labels.Equals(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
