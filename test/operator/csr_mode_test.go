package operator

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/certificates/csrplan"
	"github.com/hookwright/hookwright/internal/certificates/csrsign"
	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/certificates/sources"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// csrInjector is a one-replica SidecarInjector in mode CSR that selects no
// namespace (its webhook never intercepts another test's pods).
func csrInjector(name, signer string, approve bool) *v1alpha1.SidecarInjector {
	return &v1alpha1.SidecarInjector{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.SidecarInjectorSpec{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"csr-mode-test": "never"}},
			Server:            v1alpha1.ServerSpec{Replicas: ptr.To[int32](1)},
			Certificate: v1alpha1.CertificateSpec{Mode: v1alpha1.CertificateCSR, CSR: &v1alpha1.CSRCertificate{
				SignerName: signer, Approve: approve, ExpirationSeconds: ptr.To[int32](3600),
			}},
		},
	}
}

// logOnFailure prints the operator's log lines that mention name when
// the test fails.
func logOnFailure(t *testing.T, name string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		b, _ := os.ReadFile(filepath.Join(env.Dir, "logs", "operator.log"))
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, name) {
				t.Log(line)
			}
		}
	})
}

// csrsOf lists the CSRs mode CSR made for the CR with uid.
func csrsOf(ctx context.Context, owner client.Object) ([]certificatesv1.CertificateSigningRequest, error) {
	var l certificatesv1.CertificateSigningRequestList
	err := env.Client.List(ctx, &l, client.MatchingLabels{sources.LabelCSROwner: string(owner.GetUID())})
	return l.Items, err
}

func certReady(si *v1alpha1.SidecarInjector) *metav1.Condition {
	return apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionCertificateReady)
}

// waitReason waits for CertificateReady with reason.
func waitReason(t *testing.T, ctx context.Context, si *v1alpha1.SidecarInjector, reason string, d time.Duration) *metav1.Condition {
	t.Helper()
	var last *metav1.Condition
	err := cluster.WaitFor(ctx, d, "CertificateReady reason "+reason, func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(si), si); err != nil {
			return false, err
		}
		last = certReady(si)
		return last != nil && last.Reason == reason && last.ObservedGeneration == si.Generation, nil
	})
	if err != nil {
		t.Fatalf("%v; last %+v", err, last)
	}
	return last
}

// servedCert checks the serving Secret of base against the webhook
// configuration's caBundle, as the API server's TLS client would.
func servedCert(t *testing.T, ctx context.Context, base string) *corev1.Secret {
	t.Helper()
	o := ownedKeys(base, operatorNS)
	o.MWC.Name = base
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(o.Secret), o.Secret); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(o.MWC), o.MWC); err != nil {
		t.Fatal(err)
	}
	leaf, err := pki.ParseCertPEM(o.Secret.Data[corev1.TLSCertKey])
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.VerifyServing(leaf, o.MWC.Webhooks[0].ClientConfig.CABundle, base+"."+operatorNS+".svc", time.Now()); err != nil {
		t.Fatalf("served certificate does not verify against the caBundle: %v", err)
	}
	if _, err := pki.ParseKeyPair(o.Secret.Data[corev1.TLSCertKey], o.Secret.Data[corev1.TLSPrivateKeyKey]); err != nil {
		t.Fatal(err)
	}
	return o.Secret
}

// Mode CSR with approve: true against the operator's own signer: the CR
// becomes Ready with no other component, the caBundle is the signer's
// ClusterTrustBundle, and renew-now replaces the certificate through a new
// CSR, deleting the old one only once the new certificate is served.
func TestCSRModeApprovedByOperator(t *testing.T) {
	ctx := cluster.TestContext(t, 3*time.Minute)
	si := csrInjector("csr-auto", v1alpha1.DefaultCSRSignerName, true)
	logOnFailure(t, "csr-auto")
	start := time.Now()
	create(t, ctx, si)
	base := desired.SidecarKind.BaseName(si.Name)
	secKey := client.ObjectKey{Namespace: operatorNS, Name: base + "-tls"}
	// CSR created → certificate in the serving Secret.
	var csrSeen, served time.Time
	err := cluster.WaitFor(ctx, 60*time.Second, "certificate served", func(ctx context.Context) (bool, error) {
		if csrSeen.IsZero() {
			if l, err := csrsOf(ctx, si); err == nil && len(l) > 0 {
				csrSeen = time.Now()
			}
		}
		sec := &corev1.Secret{}
		if err := env.Client.Get(ctx, secKey, sec); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		served = time.Now()
		return len(sec.Data[corev1.TLSCertKey]) > 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("CR created → CSR seen %s, CSR seen → certificate served %s (polled every 50 ms)",
		csrSeen.Sub(start).Round(time.Millisecond), served.Sub(csrSeen).Round(time.Millisecond))
	waitConfigured(t, ctx, si, 30*time.Second)
	if c := certReady(si); c.Reason != csrplan.ReasonIssued {
		t.Fatalf("CertificateReady %+v", c)
	}
	sec := servedCert(t, ctx, base)
	trust := signerTrust(t, ctx)
	leaf, _ := pki.ParseCertPEM(sec.Data[corev1.TLSCertKey])
	if err := pki.VerifyServing(leaf, []byte(trust), base+"."+operatorNS+".svc", time.Now()); err != nil {
		t.Fatalf("not issued by the installation CA of the signer's trust bundle: %v", err)
	}
	if life := leaf.NotAfter.Sub(leaf.NotBefore); life > time.Hour+pki.Backdate {
		t.Fatalf("lifetime %s, expirationSeconds 3600", life)
	}
	l, err := csrsOf(ctx, si)
	if err != nil || len(l) != 1 {
		t.Fatalf("CSRs %d: %v", len(l), err)
	}
	first := l[0]
	if !metav1.IsControlledBy(&first, si) || first.Spec.SignerName != v1alpha1.DefaultCSRSignerName || !slices.Equal(first.Spec.Usages, csrplan.ServingUsages) {
		t.Fatalf("CSR %s: owner %v signer %s usages %v", first.Name, first.OwnerReferences, first.Spec.SignerName, first.Spec.Usages)
	}
	if !slices.ContainsFunc(first.Status.Conditions, func(c certificatesv1.CertificateSigningRequestCondition) bool {
		return c.Type == certificatesv1.CertificateApproved && c.Reason == sources.CSRApprovalReason
	}) {
		t.Fatalf("CSR %s not approved by the operator: %+v", first.Name, first.Status.Conditions)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: operatorNS, Name: base + "-tls-csr-key"}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatalf("pending key Secret left after issuance: %v", err)
	}

	// Renew now: a new CSR, served, and only then the old CSR deleted.
	renewAt := time.Now()
	if err := update(ctx, si, func() {
		si.Annotations = map[string]string{v1alpha1.AnnotationRenewCertificate: renewAt.UTC().Format(time.RFC3339Nano)}
	}); err != nil {
		t.Fatal(err)
	}
	err = cluster.WaitFor(ctx, 60*time.Second, "renewed certificate served and the old CSR deleted", func(ctx context.Context) (bool, error) {
		s := &corev1.Secret{}
		if err := env.Client.Get(ctx, secKey, s); err != nil {
			return false, err
		}
		if string(s.Data[corev1.TLSCertKey]) == string(sec.Data[corev1.TLSCertKey]) {
			err := env.Client.Get(ctx, client.ObjectKeyFromObject(&first), &certificatesv1.CertificateSigningRequest{})
			if !apierrors.IsNotFound(err) {
				return false, err
			}
			// The two reads are not atomic: the new certificate may have been
			// served and the CSR deleted between them. Only a Secret that
			// still holds the old certificate after the CSR is gone is wrong.
			if err := env.Client.Get(ctx, secKey, s); err != nil {
				return false, err
			}
			if string(s.Data[corev1.TLSCertKey]) == string(sec.Data[corev1.TLSCertKey]) {
				return false, cluster.Permanent(fmt.Errorf("CSR %s deleted before the new certificate was served", first.Name))
			}
			return true, nil
		}
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(&first), &certificatesv1.CertificateSigningRequest{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("renew-now annotation → new certificate served and old CSR deleted in %s", time.Since(renewAt).Round(time.Millisecond))
	servedCert(t, ctx, base)
	if l, err := csrsOf(ctx, si); err != nil || len(l) != 1 || l[0].Name == first.Name {
		t.Fatalf("after renewal: %d CSRs (%v)", len(l), err)
	}
}

// Approval left to someone else: the condition waits naming the CSR, and
// no webhook configuration exists meanwhile; a person approves after a
// delay and the certificate is served. A denied request is a Warning event
// and a CSRDenied reason.
func TestCSRModeManualApprovalAndDenial(t *testing.T) {
	ctx := cluster.TestContext(t, 3*time.Minute)
	si := csrInjector("csr-manual", v1alpha1.DefaultCSRSignerName, false)
	create(t, ctx, si)
	base := desired.SidecarKind.BaseName(si.Name)
	c := waitReason(t, ctx, si, csrplan.ReasonWaitingForApproval, 60*time.Second)
	l, err := csrsOf(ctx, si)
	if err != nil || len(l) != 1 {
		t.Fatalf("CSRs %d: %v", len(l), err)
	}
	name := l[0].Name
	if c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, name) || !strings.Contains(c.Message, "kubectl certificate approve "+name) {
		t.Fatalf("CertificateReady %+v", c)
	}
	t.Logf("waiting: %s", c.Message)
	mwc := ownedKeys(base, "").MWC
	mwc.Name = base
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(mwc), mwc); !apierrors.IsNotFound(err) {
		t.Fatalf("webhook configuration written before a certificate exists: %v", err)
	}
	// Someone takes a while to approve. A stand-in for a person, not a
	// wait for the operator: nothing is judged by how long it lasts (the
	// checks before hold at the start of it; the approval is awaited by
	// condition after), so a loaded machine changes nothing here.
	time.Sleep(2 * time.Second)
	approved := time.Now()
	setApproval(t, ctx, name, certificatesv1.CertificateApproved)
	waitConfigured(t, ctx, si, 30*time.Second)
	t.Logf("approval → CertificateReady and WebhookConfigured in %s", time.Since(approved).Round(time.Millisecond))
	servedCert(t, ctx, base)

	// Denial of the next request (renew now), while the old certificate
	// stays served.
	if err := update(ctx, si, func() {
		si.Annotations = map[string]string{v1alpha1.AnnotationRenewCertificate: time.Now().UTC().Format(time.RFC3339Nano)}
	}); err != nil {
		t.Fatal(err)
	}
	var renewal string
	err = cluster.WaitFor(ctx, 30*time.Second, "renewal CSR", func(ctx context.Context) (bool, error) {
		l, err := csrsOf(ctx, si)
		for _, c := range l {
			if c.Name != name {
				renewal = c.Name
			}
		}
		return renewal != "", err
	})
	if err != nil {
		t.Fatal(err)
	}
	setApproval(t, ctx, renewal, certificatesv1.CertificateDenied)
	c = waitReason(t, ctx, si, csrplan.ReasonDenied, 30*time.Second)
	if c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, renewal) || !strings.Contains(c.Message, "TestDecision") {
		t.Fatalf("denied: %+v", c)
	}
	err = cluster.WaitFor(ctx, 30*time.Second, "Warning event", func(ctx context.Context) (bool, error) {
		r, err := eventReasons(ctx, "SidecarInjector", si.Name)
		return r[sources.EventCSR] > 0, err
	})
	if err != nil {
		t.Fatal(err)
	}
	servedCert(t, ctx, base) // the old certificate is still served
}

// Another signer, played by the test: a signer that never answers is
// reported after the wait; one that signs and publishes its own
// ClusterTrustBundle becomes the caBundle.
func TestCSRModeExternalSigner(t *testing.T) {
	ctx := cluster.TestContext(t, 3*time.Minute)
	const signer = "signer.example.com/webhooks"
	si := csrInjector("csr-external", signer, true)
	create(t, ctx, si)
	base := desired.SidecarKind.BaseName(si.Name)
	if !trustBundlesServed() {
		// Another signer's trust is only its ClusterTrustBundles: without
		// the API the CR says so instead of trusting anything else.
		c := waitReason(t, ctx, si, "ClusterTrustBundleUnavailable", 60*time.Second) // internal/certificates/sources' CertificateReady reason
		t.Logf("Kubernetes 1.%d, no ClusterTrustBundle API: %s", env.KubeMinor(), c.Message)
		return
	}
	c := waitReason(t, ctx, si, csrplan.ReasonSignerSilent, 60*time.Second)
	t.Logf("silent signer: %s", c.Message)

	// The external signer: its CA published as a ClusterTrustBundle, then
	// the approved request signed.
	ca, err := pki.NewCA(pki.CAOptions{CommonName: "external-signer"})
	if err != nil {
		t.Fatal(err)
	}
	ctb := &certificatesv1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: "signer.example.com:webhooks:root"},
		Spec:       certificatesv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: string(ca.CertPEM)},
	}
	create(t, ctx, ctb)
	l, err := csrsOf(ctx, si)
	if err != nil || len(l) != 1 {
		t.Fatalf("CSRs %d: %v", len(l), err)
	}
	csr := &l[0]
	r, err := csrsign.ParseRequest(csr.Spec.Request)
	if err != nil {
		t.Fatal(err)
	}
	out, err := csrsign.Sign(ca, csrsign.Grant{CSR: r, DNSNames: r.DNSNames, Validity: time.Hour}, time.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	csr.Status.Certificate = out
	signed := time.Now()
	if _, err := env.Clientset.CertificatesV1().CertificateSigningRequests().UpdateStatus(ctx, csr, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitConfigured(t, ctx, si, 30*time.Second)
	t.Logf("external signer's certificate → CertificateReady in %s", time.Since(signed).Round(time.Millisecond))
	sec := servedCert(t, ctx, base)
	if string(sec.Data["ca.crt"]) != string(ca.CertPEM) {
		t.Fatal("ca.crt is not the external signer's CA")
	}
	mwc := ownedKeys(base, "").MWC
	mwc.Name = base
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(mwc), mwc); err != nil {
		t.Fatal(err)
	}
	if own := signerTrust(t, ctx); strings.Contains(string(mwc.Webhooks[0].ClientConfig.CABundle), strings.TrimSpace(own)) {
		t.Fatal("the installation CA is in the caBundle of another signer's CR")
	}
}
