package operator

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	cmmeta "github.com/cert-manager/cert-manager/pkg/apis/meta/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/certificates/sources"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// certManagerCRDs is deploy/crds of the cert-manager module go.mod pins
// (the same release as the API types the operator is built with).
func certManagerCRDs(t *testing.T) string {
	t.Helper()
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/cert-manager/cert-manager")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("locate the cert-manager module: %v", err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "deploy", "crds")
}

// Mode CertManager. There is no cert-manager controller here (its
// cmd/controller module is not published on the Go module proxy), so the
// test is the issuer: it fills the Certificate's Secret and status the way
// cert-manager does, against cert-manager's real CRDs.
//
// Without the CRDs the CR says so (CertManagerNotInstalled, a Warning
// Event) and the operator neither crashes nor loops; once they are
// installed it creates a self-signed Issuer and the Certificate, mounts its
// Secret, publishes ca.crt as caBundle, and admission through the Service
// works with the issued certificate. A configuration annotated for
// cainjector keeps the caBundle cainjector wrote.
func TestCertManagerMode(t *testing.T) {
	ctx := cluster.TestContext(t, 6*time.Minute)
	const name = "cm"
	si := cluster.SampleInjector(t, name)
	// issuerRef belongs to mode CertManager (CEL rule on the CRD).
	si.Spec.Certificate = v1alpha1.CertificateSpec{IssuerRef: &v1alpha1.IssuerReference{Name: "corp-ca"}}
	if err := env.Client.Create(ctx, si.DeepCopy(), client.DryRunAll); err == nil || !strings.Contains(err.Error(), "issuerRef is only used when mode is CertManager") {
		t.Fatalf("issuerRef with mode SelfSigned: %v", err)
	}
	si.Spec.Certificate = v1alpha1.CertificateSpec{Mode: v1alpha1.CertificateCertManager}
	si.Spec.Server.Replicas = ptr.To[int32](1)
	create(t, ctx, si)
	base := desired.SidecarKind.BaseName(name)

	// 1. No cert-manager CRDs.
	waitConditions(t, ctx, si, func() []metav1.Condition { return si.Status.Conditions }, map[string]metav1.ConditionStatus{
		v1alpha1.ConditionCertificateReady: metav1.ConditionFalse, v1alpha1.ConditionWebhookConfigured: metav1.ConditionFalse,
	}, 60*time.Second)
	if c := apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionCertificateReady); c.Reason != sources.ReasonCertManagerNotInstalled || !strings.Contains(c.Message, "install cert-manager") {
		t.Fatalf("CertificateReady %+v", c)
	}
	err := cluster.WaitFor(ctx, 30*time.Second, "CertManagerNotInstalled event", func(ctx context.Context) (bool, error) {
		r, err := eventReasons(ctx, "SidecarInjector", name)
		return r[sources.EventCertManagerNotInstalled] > 0, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: base}, &admissionregistrationv1.MutatingWebhookConfiguration{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a webhook configuration exists without a certificate: %v", err)
	}
	quiet(t, 5*time.Second) // no hot loop: the recheck is every 30 s and writes nothing new

	// 2. cert-manager's CRDs appear: the operator notices on its recheck.
	start := time.Now()
	if _, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{Paths: []string{certManagerCRDs(t)}, ErrorIfPathMissing: true, MaxTime: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	crt := &cmapi.Certificate{ObjectMeta: metav1.ObjectMeta{Name: base, Namespace: operatorNS}}
	iss := &cmapi.Issuer{ObjectMeta: metav1.ObjectMeta{Name: base, Namespace: operatorNS}}
	err = cluster.WaitFor(ctx, 90*time.Second, "Certificate and Issuer created", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(iss), iss); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(crt), crt); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Issuer and Certificate created %s after the CRDs were installed", time.Since(start).Round(time.Millisecond))
	if iss.Spec.SelfSigned == nil {
		t.Fatalf("Issuer spec %+v, want selfSigned", iss.Spec)
	}
	for _, o := range []client.Object{iss, crt} {
		if ref := metav1.GetControllerOf(o); ref == nil || ref.UID != si.UID {
			t.Fatalf("%T controller %+v", o, ref)
		}
	}
	dns := cluster.ServiceDNSNames(operatorNS, base)
	if !equalStrings(crt.Spec.DNSNames, dns) || crt.Spec.SecretName != base+"-cm-tls" || crt.Spec.IssuerRef.Name != base || crt.Spec.IssuerRef.Kind != "Issuer" {
		t.Fatalf("Certificate spec %+v", crt.Spec)
	}
	err = cluster.WaitFor(ctx, 30*time.Second, "CertificateReady=False CertificatePending", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(si), si); err != nil {
			return false, err
		}
		c := apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionCertificateReady)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == sources.ReasonCertificatePending, nil
	})
	if err != nil {
		t.Fatalf("%v; conditions: %s", err, fmtConds(si.Status.Conditions))
	}
	dep := &appsv1.Deployment{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: operatorNS, Name: base}, dep); err != nil {
		t.Fatal(err)
	}
	if v := dep.Spec.Template.Spec.Volumes[0]; v.Secret == nil || v.Secret.SecretName != crt.Spec.SecretName {
		t.Fatalf("Deployment volume %+v, want Secret %s", v, crt.Spec.SecretName)
	}

	// 3. Act as cert-manager: write the Secret, then the status.
	ca, err := cluster.NewTestCA("test issuer")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Serving(dns...)
	if err != nil {
		t.Fatal(err)
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: crt.Spec.SecretName, Namespace: operatorNS,
			Annotations: map[string]string{cmapi.CertificateNameKey: crt.Name, cmapi.IssuerNameAnnotationKey: iss.Name, cmapi.IssuerKindAnnotationKey: "Issuer"}},
		Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM, cmmeta.TLSCAKey: ca.CertPEM},
	}
	if err := env.Client.Create(ctx, sec); err != nil {
		t.Fatal(err)
	}
	leaf, err := pki.ParseCertPEM(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	notAfter := metav1.NewTime(leaf.NotAfter)
	if err := updateStatus(ctx, crt, func() {
		crt.Status = cmapi.CertificateStatus{
			Conditions: []cmapi.CertificateCondition{{Type: cmapi.CertificateConditionReady, Status: cmmeta.ConditionTrue,
				Reason: "Ready", Message: "Certificate is up to date and has not expired", LastTransitionTime: ptr.To(metav1.Now()), ObservedGeneration: crt.Generation}},
			NotBefore: ptr.To(metav1.NewTime(leaf.NotBefore)), NotAfter: &notAfter,
			RenewalTime: ptr.To(metav1.NewTime(leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) * 2 / 3))),
			Revision:    ptr.To(1),
		}
	}); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	waitConfigured(t, ctx, si, 60*time.Second)
	t.Logf("CertificateReady and WebhookConfigured %s after the Certificate became Ready", time.Since(start).Round(time.Millisecond))
	if c := apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionCertificateReady); !strings.Contains(c.Message, notAfter.UTC().Format(time.RFC3339)) {
		t.Fatalf("CertificateReady message %q lacks notAfter", c.Message)
	}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: base}, mwc); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mwc.Webhooks[0].ClientConfig.CABundle, ca.CertPEM) {
		t.Fatal("caBundle is not the Certificate Secret's ca.crt")
	}

	// 4. Admission through the Service with cert-manager's certificate.
	svc := &corev1.Service{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: operatorNS, Name: base}, svc); err != nil {
		t.Fatal(err)
	}
	kc := serviceAccountKubeconfig(t, t.TempDir(), operatorNS, base)
	srv := startLocalServer(t, "injector-cm", dep.Spec.Template.Spec.Containers[0].Args, certPEM, keyPEM, kc)
	if err := env.RouteService(svc, srv.Addr()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.UnrouteService(svc) })
	if _, err := env.CreateNamespace(ctx, "cm-apps", map[string]string{"sidecar-injection": "enabled"}); err != nil {
		t.Fatal(err)
	}
	err = cluster.WaitFor(ctx, 30*time.Second, "a pod injected with cert-manager's certificate", func(ctx context.Context) (bool, error) {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "app-", Namespace: "cm-apps"},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "nginx:1.23-alpine"}}},
		}
		if err := env.Client.Create(ctx, p, client.DryRunAll); err != nil {
			return false, err
		}
		return injected(p), nil
	})
	if err != nil {
		t.Fatalf("%v\ninjector log:\n%s", err, srv.proc.Tail(3000))
	}

	// 5. cainjector owns caBundle once the configuration asks for it: the
	// value it writes stays (here another CA's, to tell them apart).
	other, err := cluster.NewTestCA("cainjector")
	if err != nil {
		t.Fatal(err)
	}
	injectedBundle := append(append([]byte(nil), ca.CertPEM...), other.CertPEM...)
	if err := update(ctx, mwc, func() {
		mwc.Annotations = map[string]string{cmapi.WantInjectAnnotation: operatorNS + "/" + base}
		mwc.Webhooks[0].ClientConfig.CABundle = injectedBundle
	}); err != nil {
		t.Fatal(err)
	}
	// The live check has seen the server routed: no status write pending.
	waitReachable(t, ctx, si, metav1.ConditionTrue, nil, 3*time.Minute)
	quiet(t, 3*time.Second)
	if err := env.Client.Get(ctx, client.ObjectKey{Name: base}, mwc); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mwc.Webhooks[0].ClientConfig.CABundle, injectedBundle) {
		t.Fatal("the operator replaced the caBundle cainjector wrote")
	}

	// 6. Deleting the CR garbage-collects the Certificate and the Issuer.
	if err := env.Client.Delete(ctx, si); err != nil {
		t.Fatal(err)
	}
	err = cluster.WaitFor(ctx, 90*time.Second, "Certificate and Issuer garbage-collected", func(ctx context.Context) (bool, error) {
		for _, o := range []client.Object{crt, iss, mwc} {
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(o), o); !apierrors.IsNotFound(err) {
				return false, client.IgnoreNotFound(err)
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// updateStatus is update for the status subresource.
func updateStatus(ctx context.Context, obj client.Object, mutate func()) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		mutate()
		return env.Client.Status().Update(ctx, obj)
	})
}

func equalStrings(a, b []string) bool {
	return strings.Join(a, "\x00") == strings.Join(b, "\x00")
}
