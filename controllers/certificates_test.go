package controllers

import (
	"crypto/x509"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/certs"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func TestSelfSignedState(t *testing.T) {
	op := SidecarOperand(testInjector())
	caData, err := NewCASecretData(t0, certs.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	if len(caData[certs.SecretKeyBundle]) == 0 || len(caData[certs.SecretKeyActiveKey]) == 0 {
		t.Fatalf("CA Secret keys %v", keys(caData))
	}

	// No Secret yet: issue.
	st, err := SelfSignedState(op, testSettings, caData, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Ready || !st.Issued || st.IssueReason != certs.ReasonMissing || st.Secret == nil || st.Secret.Type != corev1.SecretTypeTLS {
		t.Fatalf("first state %+v", st)
	}
	leaf, err := certs.ParseCertPEM(st.Secret.Data[corev1.TLSCertKey])
	if err != nil {
		t.Fatal(err)
	}
	wantSANs := []string{"hookwright-sidecar-mesh.hookwright-system.svc", "hookwright-sidecar-mesh.hookwright-system.svc.cluster.local"}
	if !slices.Equal(leaf.DNSNames, wantSANs) {
		t.Fatalf("SANs %v", leaf.DNSNames)
	}
	if err := certs.VerifyServing(leaf, st.CABundle, wantSANs[0], t0); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(st.Message, leaf.NotAfter.UTC().Format(time.RFC3339)) {
		t.Fatalf("message %q lacks notAfter", st.Message)
	}

	// Same Secret a day later: kept byte for byte (no write).
	st2, err := SelfSignedState(op, testSettings, caData, st.Secret, t0.Add(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if st2.Issued || string(st2.Secret.Data[corev1.TLSCertKey]) != string(st.Secret.Data[corev1.TLSCertKey]) || st2.Reason != ReasonValid {
		t.Fatalf("kept state %+v", st2)
	}

	// Past 2/3 of the lifetime: renewed.
	st3, err := SelfSignedState(op, testSettings, caData, st.Secret, st.RenewAt.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if !st3.Issued || st3.IssueReason != certs.ReasonRenewalDue {
		t.Fatalf("renewal state %+v", st3)
	}

	// Key deleted by someone: re-issued.
	broken := st.Secret.DeepCopy()
	delete(broken.Data, corev1.TLSPrivateKeyKey)
	st4, err := SelfSignedState(op, testSettings, caData, broken, t0)
	if err != nil || !st4.Issued || st4.IssueReason != certs.ReasonUnparsable {
		t.Fatalf("missing key: %+v %v", st4, err)
	}

	// Moved to another namespace: SANs differ, re-issued.
	moved := testInjector()
	moved.Spec.Server.Namespace = "mesh-system"
	st5, err := SelfSignedState(SidecarOperand(moved), testSettings, caData, st.Secret, t0)
	if err != nil || !st5.Issued || st5.IssueReason != certs.ReasonSANMismatch {
		t.Fatalf("moved: %+v %v", st5, err)
	}

	// Another CA: certificate from the old one is re-issued.
	otherCA, err := NewCASecretData(t0, certs.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	st6, err := SelfSignedState(op, testSettings, otherCA, st.Secret, t0)
	if err != nil || !st6.Issued || st6.IssueReason != certs.ReasonWrongCA {
		t.Fatalf("other CA: %+v %v", st6, err)
	}

	// Unusable CA: a new one is created (no configuration can trust the
	// broken one) and the certificate issued from it.
	st7, err := SelfSignedState(op, testSettings, map[string][]byte{certs.SecretKeyActiveCert: []byte("junk")}, nil, t0)
	if err != nil || !st7.Ready || st7.CAData == nil || len(st7.Steps) == 0 || st7.Steps[0].Kind != certs.StepCreateCA {
		t.Fatalf("unusable CA: %+v %v", st7, err)
	}

	// CA past its rotation time: a next CA is staged and published first;
	// the serving certificate is kept (still from the old CA) meanwhile.
	late := certs.CARotationTime(mustCA(t, caData), certs.Policy{}).Add(time.Hour)
	st8, err := SelfSignedState(op, testSettings, caData, st.Secret, late)
	if err != nil || !st8.Ready || st8.Issued || st8.CAData == nil || st8.Last.Kind != certs.StepPublishBundle ||
		!strings.Contains(st8.Message, "CreateNextCA") {
		t.Fatalf("rotation due: %+v %v", st8, err)
	}
	if n, _ := certs.ParseCertsPEM(st8.CABundle); len(n) != 2 {
		t.Fatalf("bundle during rotation has %d CAs, want old and next", len(n))
	}
}

func mustCA(t *testing.T, data map[string][]byte) *x509.Certificate {
	t.Helper()
	c, err := certs.ParseCertPEM(data[certs.SecretKeyActiveCert])
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func TestUserSecretState(t *testing.T) {
	si := testInjector()
	si.Spec.Certificate = v1alpha1.CertificateSpec{Mode: v1alpha1.CertificateSecret, SecretName: "my-tls"}
	op := SidecarOperand(si)
	caData, err := NewCASecretData(t0, certs.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	good, err := SelfSignedState(op, testSettings, caData, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "my-tls"}, Data: good.Secret.Data}
	if n := ServingSecretName(op); n != "my-tls" {
		t.Fatalf("serving secret name %s", n)
	}
	st := UserSecretState(op, testSettings, sec, t0)
	if !st.Ready || string(st.CABundle) != string(caData[certs.SecretKeyBundle]) || st.Secret != nil {
		t.Fatalf("good user Secret: %+v", st)
	}
	if st := UserSecretState(op, testSettings, nil, t0); st.Ready || st.Reason != ReasonSecretMissing {
		t.Fatalf("missing: %+v", st)
	}
	noCA := sec.DeepCopy()
	delete(noCA.Data, SecretKeyCA)
	if st := UserSecretState(op, testSettings, noCA, t0); st.Ready || st.Reason != ReasonSecretInvalid || st.CABundle != nil {
		t.Fatalf("no ca.crt: %+v", st)
	}
	// A certificate for another Service does not verify for this one.
	other := testInjector()
	other.Name = "other"
	otherState, err := SelfSignedState(SidecarOperand(other), testSettings, caData, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	wrong := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "my-tls"}, Data: otherState.Secret.Data}
	if st := UserSecretState(op, testSettings, wrong, t0); st.Ready || !strings.Contains(st.Message, "does not verify") {
		t.Fatalf("wrong SANs: %+v", st)
	}
}

func TestRestorePatch(t *testing.T) {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{
			v1alpha1.OversellRawAllocatableKey: `{"cpu":"3800m","memory":"16Gi"}`,
			v1alpha1.OversellRatiosKey:         `{"cpu":"2"}`,
			v1alpha1.OversellAppliedByKey:      "pool",
		}},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("17Gi")},
			Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("7600m"), corev1.ResourceMemory: resource.MustParse("24Gi")},
		},
	}
	const dropAnnotations = `{"metadata":{"annotations":{"oversell.hookwright.io/applied-by":null,"oversell.hookwright.io/ratios":null,"oversell.hookwright.io/raw-allocatable":null}}`
	b, notes := RestorePatch(node)
	if want := dropAnnotations + `,"status":{"allocatable":{"cpu":"3800m","memory":"16Gi"}}}`; string(b) != want || len(notes) != 0 {
		t.Fatalf("patch\n%s\nwant\n%s\nnotes %v", b, want, notes)
	}
	// Tampered, unparseable or missing records are never published: an
	// allocatable above capacity is lowered to capacity, the annotations go.
	for _, c := range []struct{ raw, want, note string }{
		{`{"cpu":"3800m","memory":"1e30"}`, `{"cpu":"3800m","memory":"17Gi"}`, `memory: recorded raw "1e30" is not plausible for capacity 17Gi; allocatable 24Gi lowered to capacity`},
		{`{"cpu":"0","memory":"16Gi"}`, `{"cpu":"4","memory":"16Gi"}`, `cpu: recorded raw "0" is not plausible for capacity 4`},
		{`{"cpu":"-1","memory":"16Gi"}`, `{"cpu":"4","memory":"16Gi"}`, `not plausible`},
		{`{"cpu":"lots"}`, `{"cpu":"4"}`, `cpu: recorded raw "lots" does not parse`},
		{``, `{"cpu":"4","memory":"17Gi"}`, `no oversell.hookwright.io/raw-allocatable annotation`},
		{`{`, `{"cpu":"4","memory":"17Gi"}`, `is not a JSON object`},
		{`null`, `{"cpu":"4","memory":"17Gi"}`, `is not a JSON object`},
	} {
		node.Annotations[v1alpha1.OversellRawAllocatableKey] = c.raw
		b, notes := RestorePatch(node)
		if want := dropAnnotations + `,"status":{"allocatable":` + c.want + `}}`; string(b) != want {
			t.Errorf("raw %q: patch\n%s\nwant\n%s", c.raw, b, want)
		}
		if !strings.Contains(strings.Join(notes, "; "), c.note) {
			t.Errorf("raw %q: notes %q lack %q", c.raw, notes, c.note)
		}
	}
	// Allocatable already within capacity stays for the kubelet to correct.
	within := node.DeepCopy()
	within.Annotations[v1alpha1.OversellRawAllocatableKey] = `{"memory":"1e30"}`
	within.Status.Allocatable[corev1.ResourceMemory] = resource.MustParse("16Gi")
	b, notes = RestorePatch(within)
	if string(b) != dropAnnotations+"}" || len(notes) != 1 || !strings.Contains(notes[0], "left until the kubelet's next report") {
		t.Fatalf("within capacity: %s %v", b, notes)
	}
	// No capacity: nothing can be checked, nothing is written.
	nocap := node.DeepCopy()
	nocap.Annotations[v1alpha1.OversellRawAllocatableKey] = `{"cpu":"3800m"}`
	nocap.Status.Capacity = nil
	if b, notes := RestorePatch(nocap); string(b) != dropAnnotations+"}" || len(notes) != 1 {
		t.Fatalf("no capacity: %s %v", b, notes)
	}
	// Only memory recorded: only memory restored.
	node.Annotations[v1alpha1.OversellRawAllocatableKey] = `{"memory":"1.5e9"}`
	if b, notes := RestorePatch(node); !strings.Contains(string(b), `"allocatable":{"memory":"1.5e9"}`) || len(notes) != 0 {
		t.Fatalf("memory only: %s %v", b, notes)
	}
}

func TestCertificateMetrics(t *testing.T) {
	op := SidecarOperand(testInjector())
	caData, err := NewCASecretData(t0, certs.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := SelfSignedState(op, testSettings, caData, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	recordCertificate("SidecarInjector", "mesh", "hookwright-system", "hookwright-sidecar-mesh-tls", st)
	if got := testutil.ToFloat64(servingNotAfter.WithLabelValues("SidecarInjector", "mesh", "hookwright-system", "hookwright-sidecar-mesh-tls")); got != float64(st.NotAfter.Unix()) {
		t.Fatalf("serving notAfter %v, want %d", got, st.NotAfter.Unix())
	}
	ca := mustCA(t, caData)
	if got := testutil.ToFloat64(bundleNotAfter.WithLabelValues("SidecarInjector", "mesh", ca.Subject.CommonName)); got != float64(ca.NotAfter.Unix()) {
		t.Fatalf("CA notAfter %v", got)
	}
	forgetMetrics("SidecarInjector", "mesh")
	if n := testutil.CollectAndCount(servingNotAfter) + testutil.CollectAndCount(bundleNotAfter); n != 0 {
		t.Fatalf("%d series left after the CR was deleted", n)
	}
}

func TestAmplifiedTotals(t *testing.T) {
	node := func(name string, ann map[string]string) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann}, Status: corev1.NodeStatus{Capacity: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi")}}}
	}
	nodes := []corev1.Node{
		node("a", map[string]string{
			v1alpha1.OversellAppliedByKey: "pool", v1alpha1.OversellRawAllocatableKey: `{"cpu":"3800m","memory":"7Gi"}`,
			v1alpha1.OversellRatiosKey: `{"cpu":"2","memory":"1.5"}`,
		}),
		node("b", map[string]string{
			v1alpha1.OversellAppliedByKey: "pool", v1alpha1.OversellRawAllocatableKey: `{"cpu":"1","memory":"1000Mi"}`,
			v1alpha1.OversellRatiosKey: `{"cpu":"1.333333"}`,
		}),
		node("other", map[string]string{
			v1alpha1.OversellAppliedByKey: "other", v1alpha1.OversellRawAllocatableKey: `{"cpu":"64"}`,
		}),
		node("broken", map[string]string{v1alpha1.OversellAppliedByKey: "pool", v1alpha1.OversellRawAllocatableKey: `{"cpu":"x"}`}),
		// Tampered records the engine would not trust stay out of the sums.
		node("tampered", map[string]string{v1alpha1.OversellAppliedByKey: "pool", v1alpha1.OversellRawAllocatableKey: `{"cpu":"1","memory":"1e30"}`}),
		node("zero", map[string]string{v1alpha1.OversellAppliedByKey: "pool", v1alpha1.OversellRawAllocatableKey: `{"cpu":"0"}`}),
		node("plain", nil),
	}
	nocap := node("nocap", map[string]string{v1alpha1.OversellAppliedByKey: "pool", v1alpha1.OversellRawAllocatableKey: `{"cpu":"1"}`})
	nocap.Status.Capacity = nil
	nodes = append(nodes, nocap)
	got := AmplifiedTotals(nodes, "pool")
	if got.Nodes != 6 || len(got.Problems) != 4 || !strings.HasPrefix(got.Problems[0], "broken: ") ||
		!strings.Contains(got.Problems[2], `tampered: raw memory "1e30": not plausible for capacity 8Gi`) ||
		!strings.HasPrefix(got.Problems[1], "nocap: ") || !strings.HasPrefix(got.Problems[3], "zero: ") {
		t.Fatalf("nodes %d problems %q", got.Nodes, got.Problems)
	}
	// cpu: 3800m + 1 = 4800m raw; 7600m + 1333m (rounded down) effective.
	// memory: 7Gi + 1000Mi raw; 10.5Gi + 1000Mi (no memory ratio) effective.
	for _, c := range []struct {
		l    corev1.ResourceList
		k    corev1.ResourceName
		want string
	}{
		{got.Raw, corev1.ResourceCPU, "4800m"}, {got.Effective, corev1.ResourceCPU, "8933m"},
		{got.Raw, corev1.ResourceMemory, "8168Mi"}, {got.Effective, corev1.ResourceMemory, "11752Mi"},
	} {
		q := c.l[c.k]
		if want := resource.MustParse(c.want); q.Cmp(want) != 0 {
			t.Errorf("%s = %s, want %s", c.k, q.String(), c.want)
		}
	}
	if none := AmplifiedTotals(nodes, "absent"); none.Nodes != 0 || none.Raw != nil || none.Effective != nil {
		t.Fatalf("no amplified node: %+v", none)
	}
}

func TestPodRequests(t *testing.T) {
	req := func(cpu, mem string) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}}
	}
	always := corev1.ContainerRestartPolicyAlways
	p := &corev1.Pod{Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Resources: req("500m", "1Gi")}, {Resources: req("250m", "256Mi")}},
		InitContainers: []corev1.Container{
			{Resources: req("2", "64Mi")},                             // before the sidecar: 2 cpu alone
			{Resources: req("100m", "128Mi"), RestartPolicy: &always}, // native sidecar, runs throughout
			{Resources: req("1", "4Gi")},                              // after it: 1.1 cpu, 4Gi+128Mi
		},
		Overhead: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")},
	}}
	got := PodRequests(p)
	// cpu: max(0.75+0.1, 2, 1.1) + 0.01 = 2.01; memory: max(1.25Gi+128Mi, 64Mi, 4Gi+128Mi) = 4224Mi.
	if c, m := got[corev1.ResourceCPU], got[corev1.ResourceMemory]; c.Cmp(resource.MustParse("2010m")) != 0 || m.Cmp(resource.MustParse("4224Mi")) != 0 {
		t.Fatalf("PodRequests = cpu %s memory %s", c.String(), m.String())
	}
}
