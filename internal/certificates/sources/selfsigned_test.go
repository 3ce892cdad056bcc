package sources

import (
	"crypto/x509"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/desired"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

var testSettings = desired.Settings{Namespace: "hookwright-system", Image: "ghcr.io/hookwright/hookwright:v1.2.3"}

func testInjector() *v1alpha1.SidecarInjector {
	return &v1alpha1.SidecarInjector{
		ObjectMeta: metav1.ObjectMeta{Name: "mesh", UID: types.UID("11111111-2222-3333-4444-555555555555"), Generation: 3},
	}
}

func testOversell() *v1alpha1.NodeOversell {
	return &v1alpha1.NodeOversell{
		ObjectMeta: metav1.ObjectMeta{Name: "pool", UID: types.UID("66666666-7777-8888-9999-000000000000"), Generation: 1},
		Spec: v1alpha1.NodeOversellSpec{
			Server: v1alpha1.ServerSpec{
				Namespace: "nodes-system", Replicas: ptr.To[int32](1),
				Resources: &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("0.2")}},
			},
		},
	}
}

// selfSignedResult is what one reconcile of an installation with a single
// SelfSigned CR decides: the CA controller's share, then the CR's.
type selfSignedResult struct {
	selfSignedDecision
	issued bool
	caData map[string][]byte
	steps  []pki.Step
	last   pki.Step
}

// selfSignedState runs the CA controller's and then cr's share of the plan
// for an installation with cr as its only CR: caData is the CA Secret data
// (nil: none yet), current the serving Secret (nil if missing), and the
// configuration is taken to carry the CA Secret's ca.crt.
func selfSignedState(t *testing.T, cr desired.CR, s desired.Settings, caData map[string][]byte, current *corev1.Secret, now time.Time) selfSignedResult {
	t.Helper()
	own := servingKey(cr, s)
	st := pki.State{CA: caData, Serving: map[string]pki.Serving{own: servingOf(cr, s, current)}}
	if b := caData[pki.SecretKeyBundle]; len(b) > 0 {
		st.Published = map[string][]byte{cr.Base(): b}
	}
	if current != nil {
		d, _ := drainingFromAnnotations(current.Annotations, now)
		st.Draining = splitPEM(d)
	}
	ca, err := advance(inputs{Role: installation, State: st, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if ca.CA != nil {
		st.CA = ca.CA
	}
	out, err := advance(inputs{Role: ownCR, Own: own, OwnConfig: cr.Base(), State: st, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	out.Steps = append(ca.Steps, out.Steps...)
	d := decideSelfSigned(cr, s, Settings{}, out, current, now)
	return selfSignedResult{selfSignedDecision: d, issued: d.issueReason != "", caData: ca.CA, steps: out.Steps, last: out.Last}
}

func mustCA(t *testing.T, data map[string][]byte) *x509.Certificate {
	t.Helper()
	c, err := pki.ParseCertPEM(data[pki.SecretKeyActiveCert])
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

func TestSelfSignedState(t *testing.T) {
	op := desired.SidecarCR(testInjector())
	caData, err := newCASecretData(t0, pki.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	if len(caData[pki.SecretKeyBundle]) == 0 || len(caData[pki.SecretKeyActiveKey]) == 0 {
		t.Fatalf("CA Secret keys %v", keys(caData))
	}

	// No Secret yet: issue.
	st := selfSignedState(t, op, testSettings, caData, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Ready || !st.issued || st.issueReason != pki.ReasonMissing || st.secret == nil || st.secret.Type != corev1.SecretTypeTLS {
		t.Fatalf("first state %+v", st)
	}
	leaf, err := pki.ParseCertPEM(st.secret.Data[corev1.TLSCertKey])
	if err != nil {
		t.Fatal(err)
	}
	wantSANs := []string{"hookwright-sidecar-mesh.hookwright-system.svc", "hookwright-sidecar-mesh.hookwright-system.svc.cluster.local"}
	if !slices.Equal(leaf.DNSNames, wantSANs) {
		t.Fatalf("SANs %v", leaf.DNSNames)
	}
	if err := pki.VerifyServing(leaf, st.CABundle, wantSANs[0], t0); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(st.Message, leaf.NotAfter.UTC().Format(time.RFC3339)) {
		t.Fatalf("message %q lacks notAfter", st.Message)
	}

	// Same Secret a day later: kept byte for byte (no write).
	st2 := selfSignedState(t, op, testSettings, caData, st.secret, t0.Add(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if st2.issued || string(st2.secret.Data[corev1.TLSCertKey]) != string(st.secret.Data[corev1.TLSCertKey]) || st2.Reason != ReasonValid {
		t.Fatalf("kept state %+v", st2)
	}

	// Past 2/3 of the lifetime: renewed.
	st3 := selfSignedState(t, op, testSettings, caData, st.secret, st.RenewAt.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if !st3.issued || st3.issueReason != pki.ReasonRenewalDue {
		t.Fatalf("renewal state %+v", st3)
	}

	// Key deleted by someone: re-issued.
	broken := st.secret.DeepCopy()
	delete(broken.Data, corev1.TLSPrivateKeyKey)
	st4 := selfSignedState(t, op, testSettings, caData, broken, t0)
	if err != nil || !st4.issued || st4.issueReason != pki.ReasonUnparsable {
		t.Fatalf("missing key: %+v %v", st4, err)
	}

	// Moved to another namespace: SANs differ, re-issued.
	moved := testInjector()
	moved.Spec.Server.Namespace = "mesh-system"
	st5 := selfSignedState(t, desired.SidecarCR(moved), testSettings, caData, st.secret, t0)
	if err != nil || !st5.issued || st5.issueReason != pki.ReasonSANMismatch {
		t.Fatalf("moved: %+v %v", st5, err)
	}

	// Another CA: certificate from the old one is re-issued.
	otherCA, err := newCASecretData(t0, pki.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	st6 := selfSignedState(t, op, testSettings, otherCA, st.secret, t0)
	if err != nil || !st6.issued || st6.issueReason != pki.ReasonWrongCA {
		t.Fatalf("other CA: %+v %v", st6, err)
	}

	// Unusable CA: a new one is created (no configuration can trust the
	// broken one) and the certificate issued from it.
	st7 := selfSignedState(t, op, testSettings, map[string][]byte{pki.SecretKeyActiveCert: []byte("junk")}, nil, t0)
	if err != nil || !st7.Ready || st7.caData == nil || len(st7.steps) == 0 || st7.steps[0].Kind != pki.StepCreateCA {
		t.Fatalf("unusable CA: %+v %v", st7, err)
	}

	// CA past its rotation time: a next CA is staged and published first;
	// the serving certificate is kept (still from the old CA) meanwhile.
	late := pki.CARotationTime(mustCA(t, caData), pki.Policy{}).Add(time.Hour)
	st8 := selfSignedState(t, op, testSettings, caData, st.secret, late)
	if err != nil || !st8.Ready || st8.issued || st8.caData == nil || st8.last.Kind != pki.StepPublishBundle ||
		!strings.Contains(st8.Message, "CreateNextCA") {
		t.Fatalf("rotation due: %+v %v", st8, err)
	}
	if n, _ := pki.ParseCertsPEM(st8.CABundle); len(n) != 2 {
		t.Fatalf("bundle during rotation has %d CAs, want old and next", len(n))
	}
}

func TestUserSecretState(t *testing.T) {
	si := testInjector()
	si.Spec.Certificate = v1alpha1.CertificateSpec{Mode: v1alpha1.CertificateSecret, SecretName: "my-tls"}
	op := desired.SidecarCR(si)
	caData, err := newCASecretData(t0, pki.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	good := selfSignedState(t, op, testSettings, caData, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "my-tls"}, Data: good.secret.Data}
	if n := desired.ServingSecretName(op); n != "my-tls" {
		t.Fatalf("serving secret name %s", n)
	}
	st := userSecretState(op, testSettings, sec, t0)
	if !st.Ready || string(st.CABundle) != string(caData[pki.SecretKeyBundle]) || len(st.Keep) != 0 {
		t.Fatalf("good user Secret: %+v", st)
	}
	if st := userSecretState(op, testSettings, nil, t0); st.Ready || st.Reason != ReasonSecretMissing {
		t.Fatalf("missing: %+v", st)
	}
	noCA := sec.DeepCopy()
	delete(noCA.Data, desired.SecretKeyCA)
	if st := userSecretState(op, testSettings, noCA, t0); st.Ready || st.Reason != reasonSecretInvalid || st.CABundle != nil {
		t.Fatalf("no ca.crt: %+v", st)
	}
	// A certificate for another Service does not verify for this one.
	other := testInjector()
	other.Name = "other"
	otherState := selfSignedState(t, desired.SidecarCR(other), testSettings, caData, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	wrong := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "my-tls"}, Data: otherState.secret.Data}
	if st := userSecretState(op, testSettings, wrong, t0); st.Ready || !strings.Contains(st.Message, "does not verify") {
		t.Fatalf("wrong SANs: %+v", st)
	}
}

// newCASecretData generates the data of a new installation CA Secret with
// policy p, in the layout internal/pki.ParseCASecret reads (active-cert,
// active-key, ca.crt).
func newCASecretData(now time.Time, p pki.Policy) (map[string][]byte, error) {
	st, err := pki.Apply(pki.State{}, pki.Step{Kind: pki.StepCreateCA}, now, p)
	if err != nil {
		return nil, err
	}
	return st.CA, nil
}
