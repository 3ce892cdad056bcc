package operator

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// probeCounts reads the operator's hookwright_webhook_probe_total (the
// operator runs in this process) for one CR, by result.
func probeCounts(t *testing.T, kind, name string) map[string]float64 {
	t.Helper()
	fams := gather(t)
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "hookwright_webhook_probe_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["kind"] == kind && l["name"] == name {
				out[l["result"]] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

func total(m map[string]float64) float64 {
	var n float64
	for _, v := range m {
		n += v
	}
	return n
}

// probeLatency is the mean of hookwright_webhook_probe_duration_seconds of
// kind since before (sum and count).
func probeLatency(t *testing.T, kind string) (sum float64, count uint64) {
	t.Helper()
	for m := range cluster.Labelled(gather(t), "hookwright_webhook_probe_duration_seconds", "kind", kind) {
		return m.GetHistogram().GetSampleSum(), m.GetHistogram().GetSampleCount()
	}
	return 0, 0
}

// waitReachable waits until WebhookReachable has status st (and, if
// reason is set, that reason) and returns the condition.
func waitReachable(t *testing.T, ctx context.Context, obj v1alpha1.Object, st metav1.ConditionStatus, reasons []string, timeout time.Duration) metav1.Condition {
	t.Helper()
	var last *metav1.Condition
	err := cluster.WaitFor(ctx, bound(timeout), fmt.Sprintf("WebhookReachable %s %v", st, reasons), func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return false, err
		}
		last = apimeta.FindStatusCondition(*obj.StatusConditions(), v1alpha1.ConditionWebhookReachable)
		return last != nil && last.Status == st && reasonIn(last.Reason, reasons), nil
	})
	if err != nil {
		t.Fatalf("%v; last: %+v", err, last)
	}
	return *last
}

// fakeWebhook is a TLS webhook (cluster.ToyWebhook: it labels what it
// admits, injects nothing) with certPEM/keyPEM on 127.0.0.1.
func fakeWebhook(t *testing.T, certPEM, keyPEM []byte) (addr string, stop func()) {
	t.Helper()
	w, err := cluster.StartToyWebhookPEM(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	return w.Addr, func() { _ = w.Close() }
}

// probeState is what of a CR's owned objects its probe fingerprint
// follows: the webhook configuration's generation and the served
// certificate.
type probeState struct {
	mwcGeneration int64
	cert          string
}

func probeInputs(t *testing.T, ctx context.Context, o owned) probeState {
	t.Helper()
	m := &admissionregistrationv1.MutatingWebhookConfiguration{}
	sec := &corev1.Secret{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(o.MWC), m); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(o.Secret), sec); err != nil {
		t.Fatal(err)
	}
	return probeState{mwcGeneration: m.Generation, cert: string(sec.Data[corev1.TLSCertKey])}
}

// changesSince counts the changes from before to s: each generation of
// the configuration, and the certificate if it was re-issued.
func (s probeState) changesSince(before probeState) int {
	n := int(s.mwcGeneration - before.mwcGeneration)
	if s.cert != before.cert {
		n++
	}
	return n
}

// fakeWebhookFollowing is fakeWebhook serving the serving Secret sec as
// it is in the API at each TLS handshake.
func fakeWebhookFollowing(t *testing.T, sec *corev1.Secret) (addr string, stop func()) {
	t.Helper()
	w, err := cluster.StartToyWebhookFunc(func() ([]byte, []byte, error) {
		cur := &corev1.Secret{}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(sec), cur); err != nil {
			return nil, nil, err
		}
		return cur.Data[corev1.TLSCertKey], cur.Data[corev1.TLSPrivateKeyKey], nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	return w.Addr, func() { _ = w.Close() }
}

// The live check of each webhook: WebhookReachable becomes True for a
// SidecarInjector and a NodeOversell served by the real servers, False with
// the failing step when the webhook is broken (a server with a certificate
// of a foreign CA, no route to the Service, a server that does not inject,
// the oversell webhook not called) and True again after each repair; a CR
// left alone is probed at most once a probe period (testProbePolicy).
func TestWebhookReachable(t *testing.T) {
	t.Parallel()
	ctx := cluster.TestContext(t, 12*time.Minute)
	c := env.Client
	// The sample's templates, selecting the probe namespace and pods with
	// tier web or api.
	si := cluster.SampleInjector(t, "probe-si")
	si.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"probe-test": "on"}}
	si.Spec.ObjectSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"web", "api"}},
	}}
	si.Spec.Server.Replicas = ptr.To[int32](1)
	plainNode(t, ctx, "probe-node-0", map[string]string{"pool": "probe"})
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "probe-node-0"}})
	})
	no := &v1alpha1.NodeOversell{
		ObjectMeta: metav1.ObjectMeta{Name: "probe-no"},
		Spec: v1alpha1.NodeOversellSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "probe"}},
			Ratios:       v1alpha1.OversellRatios{CPU: "2"},
			Server:       v1alpha1.ServerSpec{Replicas: ptr.To[int32](1)},
		},
	}
	for _, o := range []client.Object{si, no} {
		create(t, ctx, o)
	}
	waitConfigured(t, ctx, si, 60*time.Second)
	waitConfigured(t, ctx, no, 60*time.Second)

	// No route to either Service yet: the API server cannot call them. The
	// SidecarInjector asks for Fail but is published with Ignore until
	// its server answers, so the probe pod comes back uninjected.
	cond := waitReachable(t, ctx, si, metav1.ConditionFalse, []string{v1alpha1.WebhookProbeReasonNotCalled}, 90*time.Second)
	t.Logf("SidecarInjector, no server: %s: %s", cond.Reason, cond.Message)
	cond = waitReachable(t, ctx, no, metav1.ConditionFalse, []string{v1alpha1.WebhookProbeReasonNotCalled}, 90*time.Second)
	t.Logf("NodeOversell, no server: %s: %s", cond.Reason, cond.Message)

	// The probe namespace: selected by the namespaceSelector, owned by the CR.
	pns := &corev1.Namespace{}
	if err := c.Get(ctx, client.ObjectKey{Name: desired.ProbeNamespaceName(si.Name)}, pns); err != nil {
		t.Fatal(err)
	}
	if pns.Labels["probe-test"] != "on" || !metav1.IsControlledBy(pns, si) {
		t.Fatalf("probe namespace %s: labels %v, owners %v", pns.Name, pns.Labels, pns.OwnerReferences)
	}

	// The real servers, with the operator's certificates and RBAC. The API
	// server keeps its connections to a webhook open, so a break or a
	// repair replaces the server process (as a new pod would), not only
	// the route.
	keys := func(kind desired.Kind, name string) owned {
		o := ownedKeys(kind.BaseName(name), operatorNS)
		for _, obj := range []client.Object{o.Secret, o.Deploy, o.Svc} {
			if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() { env.UnrouteService(o.Svc) })
		return o
	}
	siO, noO := keys(desired.SidecarKind, si.Name), keys(desired.OversellKind, no.Name)
	route := func(o owned, addr string) {
		t.Helper()
		if err := env.RouteService(o.Svc, addr); err != nil {
			t.Fatal(err)
		}
	}
	serve := func(o owned, name string) *localServer {
		t.Helper()
		kc := serviceAccountKubeconfig(t, t.TempDir(), operatorNS, o.SA.Name)
		srv := startLocalServer(t, name, o.Deploy.Spec.Template.Spec.Containers[0].Args,
			o.Secret.Data[corev1.TLSCertKey], o.Secret.Data[corev1.TLSPrivateKeyKey], kc)
		srv.follow(t, o.Secret)
		route(o, srv.Addr())
		return srv
	}
	stopServer := func(srv *localServer) {
		t.Helper()
		if err := srv.proc.Stop(5 * time.Second); err != nil {
			t.Logf("stop %s: %v", srv.Addr(), err)
		}
	}
	repaired := func(what string, obj v1alpha1.Object) {
		t.Helper()
		t0 := time.Now()
		cond := waitReachable(t, ctx, obj, metav1.ConditionTrue, []string{v1alpha1.WebhookProbeReasonReachable}, 3*time.Minute)
		t.Logf("%s: WebhookReachable True %s later: %s", what, time.Since(t0).Round(time.Millisecond), cond.Message)
	}
	broken := func(what string, obj v1alpha1.Object, reasons ...string) {
		t.Helper()
		t0 := time.Now()
		cond := waitReachable(t, ctx, obj, metav1.ConditionFalse, reasons, 3*time.Minute)
		t.Logf("%s: WebhookReachable False %s later: %s: %s", what, time.Since(t0).Round(time.Millisecond), cond.Reason, cond.Message)
		if !strings.Contains(cond.Message, "last success: ") {
			t.Errorf("message %q does not give the last success", cond.Message)
		}
	}
	siSrv := serve(siO, "injector-probe")
	noSrv := serve(noO, "oversell-probe")
	repaired("SidecarInjector server routed", si)
	repaired("NodeOversell server routed", no)
	// hookwright check judges the same installation healthy (it only reads).
	for _, r := range checkCRs(t, ctx, "SidecarInjector "+si.Name, "NodeOversell "+no.Name) {
		if r.Area == "SidecarInjector "+si.Name || r.Area == "NodeOversell "+no.Name {
			t.Logf("hookwright check: %s %s: %s", r.Status, r.Description, r.Message)
		}
	}

	// From here on the NodeOversell is left alone: steady state.
	steadyFrom, steadyCount := time.Now(), total(probeCounts(t, desired.OversellKind.Name, no.Name))
	// What the operator's probe fingerprint follows besides the CR: the
	// webhook configuration and the serving certificate. The test CA
	// rotates on its own every few minutes of the package, and a rotation
	// changes both: the NodeOversell is then re-probed, rightly.
	steadyConfig := probeInputs(t, ctx, noO)
	dryFrom := writes.dryRuns.Load()

	// A server whose certificate a foreign CA signed.
	foreign, err := cluster.NewTestCA("foreign")
	if err != nil {
		t.Fatal(err)
	}
	fc, fk, err := foreign.Serving(siO.Svc.Name + "." + operatorNS + ".svc")
	if err != nil {
		t.Fatal(err)
	}
	fake, stopFake := fakeWebhook(t, fc, fk)
	route(siO, fake)
	stopServer(siSrv)
	broken("server certificate from a foreign CA", si, v1alpha1.WebhookProbeReasonTLSError)
	stopFake()
	siSrv = serve(siO, "injector-probe-2")
	repaired("real server back", si)

	// No route to the Service (as if no endpoint were ready).
	env.UnrouteService(siO.Svc)
	stopServer(siSrv)
	broken("Service unrouted", si, v1alpha1.WebhookProbeReasonUnreachable, v1alpha1.WebhookProbeReasonTimeout)
	siSrv = serve(siO, "injector-probe-3")
	repaired("route restored", si)

	// A server that answers with the right certificate but injects nothing:
	// the Secret's current one at each handshake, since the test CA rotates
	// on its own every few minutes of the package.
	fake, stopFake = fakeWebhookFollowing(t, siO.Secret)
	route(siO, fake)
	stopServer(siSrv)
	broken("server that does not inject", si, v1alpha1.WebhookProbeReasonWrongAnswer)
	stopFake()
	serve(siO, "injector-probe-4")
	repaired("real server back", si)

	// The NodeOversell's steady state: at most one probe a period.
	steady := time.Since(steadyFrom)
	periods := steady.Seconds() / testProbePolicy.Period.Seconds()
	n := total(probeCounts(t, desired.OversellKind.Name, no.Name)) - steadyCount
	t.Logf("NodeOversell left alone for %s: %.0f probes (%.2f per %s period); the operator's dry-run requests in that time, both CRs: %d",
		steady.Round(time.Second), n, n/periods, testProbePolicy.Period, writes.dryRuns.Load()-dryFrom)
	changes := probeInputs(t, ctx, noO).changesSince(steadyConfig)
	if changes > 0 {
		t.Logf("NodeOversell's webhook configuration or certificate changed %d times meanwhile (test CA rotation): one probe each allowed", changes)
	}
	if n > periods+1+float64(changes) {
		t.Errorf("%.0f probes of a NodeOversell in %s with %d changes: more than one per %s period", n, steady.Round(time.Second), changes, testProbePolicy.Period)
	}
	if c := apimeta.FindStatusCondition(no.Status.Conditions, v1alpha1.ConditionWebhookReachable); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("NodeOversell WebhookReachable %+v during the SidecarInjector's breaks", c)
	}

	// The oversell webhook fails open (Ignore): unrouted, the write comes
	// back as sent.
	env.UnrouteService(noO.Svc)
	stopServer(noSrv)
	broken("NodeOversell Service unrouted", no, v1alpha1.WebhookProbeReasonNotCalled)
	serve(noO, "oversell-probe-2")
	repaired("NodeOversell server back", no)

	for _, k := range []string{desired.SidecarKind.Name, desired.OversellKind.Name} {
		sum, count := probeLatency(t, k)
		if count > 0 {
			t.Logf("%s probes: %d, mean latency %s", k, count, time.Duration(sum/float64(count)*float64(time.Second)).Round(time.Microsecond))
		}
	}
	t.Logf("probe results: SidecarInjector %v, NodeOversell %v", probeCounts(t, desired.SidecarKind.Name, si.Name), probeCounts(t, desired.OversellKind.Name, no.Name))
}
