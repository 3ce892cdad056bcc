package sources

import (
	"strings"
	"testing"
	"time"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	cmmeta "github.com/cert-manager/cert-manager/pkg/apis/meta/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

func TestCertManagerState(t *testing.T) {
	op := certManagerInjector(nil)
	now := time.Now()
	ca, err := cluster.NewTestCA("issuer")
	if err != nil {
		t.Fatal(err)
	}
	crt := desired.CertManagerCertificate(op, testSettings)
	certPEM, keyPEM, err := ca.Serving(crt.Spec.DNSNames...)
	if err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM, desired.SecretKeyCA: ca.CertPEM}}
	notAfter := metav1.NewTime(now.Add(90 * 24 * time.Hour).Truncate(time.Second))
	ready := func(st cmmeta.ConditionStatus) *cmapi.Certificate {
		c := crt.DeepCopy()
		c.Status.NotAfter = &notAfter
		c.Status.Conditions = []cmapi.CertificateCondition{{Type: cmapi.CertificateConditionReady, Status: st, Reason: "Issuing", Message: "issuer not ready"}}
		return c
	}

	for _, tc := range []struct {
		name   string
		crt    *cmapi.Certificate
		secret *corev1.Secret
		ready  bool
		reason string
		bundle bool
		msg    string
	}{
		{"no Certificate", nil, nil, false, ReasonCertificatePending, false, "not created yet"},
		{"no condition", crt, nil, false, ReasonCertificatePending, false, "waiting for cert-manager"},
		{"not ready, no Secret", ready(cmmeta.ConditionFalse), nil, false, reasonCertificateNotReady, false, "issuer not ready"},
		{"not ready, old Secret still serves", ready(cmmeta.ConditionFalse), secret, false, reasonCertificateNotReady, true, "Issuing"},
		{"ready", ready(cmmeta.ConditionTrue), secret, true, ReasonValid, true, notAfter.UTC().Format(time.RFC3339)},
		{"ready, no ca.crt", ready(cmmeta.ConditionTrue), &corev1.Secret{Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}}, false, reasonSecretInvalid, false, "no ca.crt"},
		{"ready, wrong CA", ready(cmmeta.ConditionTrue), &corev1.Secret{Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM, desired.SecretKeyCA: otherCA(t)}}, false, reasonSecretInvalid, false, "does not verify"},
		{"ready, Secret gone", ready(cmmeta.ConditionTrue), nil, false, ReasonCertificatePending, false, "not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := certManagerState(op, testSettings, tc.crt, tc.secret, now)
			if st.Ready != tc.ready || st.Reason != tc.reason || (len(st.CABundle) > 0) != tc.bundle || !strings.Contains(st.Message, tc.msg) {
				t.Fatalf("state ready=%v reason=%s bundle=%d message=%q", st.Ready, st.Reason, len(st.CABundle), st.Message)
			}
			if tc.bundle && string(st.CABundle) != string(ca.CertPEM) {
				t.Fatal("caBundle is not the Secret's ca.crt")
			}
		})
	}
}

func otherCA(t *testing.T) []byte {
	ca, err := cluster.NewTestCA("other")
	if err != nil {
		t.Fatal(err)
	}
	return ca.CertPEM
}

func TestInjectedCABundle(t *testing.T) {
	mwc := func(ann map[string]string, bundle string) *admissionregistrationv1.MutatingWebhookConfiguration {
		return &admissionregistrationv1.MutatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Annotations: ann},
			Webhooks:   []admissionregistrationv1.MutatingWebhook{{ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: []byte(bundle)}}},
		}
	}
	inject := map[string]string{cmapi.WantInjectAnnotation: "hookwright-system/hookwright-sidecar-mesh"}
	for _, tc := range []struct {
		name string
		live *admissionregistrationv1.MutatingWebhookConfiguration
		want string
	}{
		{"none", nil, ""},
		{"not annotated", mwc(nil, "ours"), ""},
		{"annotated, injected", mwc(inject, "injected"), "injected"},
		{"annotated, not injected yet", mwc(inject, ""), ""},
		{"from secret", mwc(map[string]string{cmapi.WantInjectFromSecretAnnotation: "ns/s"}, "s"), "s"},
	} {
		if got := string(injectedCABundle(tc.live)); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func certManagerInjector(ref *v1alpha1.IssuerReference) desired.CR {
	si := testInjector()
	si.Spec.Certificate = v1alpha1.CertificateSpec{Mode: v1alpha1.CertificateCertManager, IssuerRef: ref}
	return desired.SidecarCR(si)
}
