package operator

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/controllers/csrsigner"
	"github.com/hookwright/hookwright/internal/certificates/csrsign"
	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

var servingUsages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageServerAuth}

// newCSRPEM returns a PEM CERTIFICATE REQUEST for tmpl and its key.
func newCSRPEM(t *testing.T, tmpl x509.CertificateRequest) ([]byte, crypto.Signer) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), key
}

// createCSR creates a CSR for the operator's signer, deleted when the test ends.
func createCSR(t *testing.T, ctx context.Context, name string, req []byte, usages []certificatesv1.KeyUsage, exp *int32) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request: req, SignerName: v1alpha1.DefaultCSRSignerName, Usages: usages, ExpirationSeconds: exp,
		},
	}
	if err := env.Client.Create(ctx, csr); err != nil {
		t.Fatalf("create CSR %s: %v", name, err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), csr) })
	return csr
}

// setApproval adds the Approved (or Denied) condition, as kubectl
// certificate approve/deny does, through the approval subresource.
func setApproval(t *testing.T, ctx context.Context, name string, typ certificatesv1.RequestConditionType) {
	t.Helper()
	csrs := env.Clientset.CertificatesV1().CertificateSigningRequests()
	csr, err := csrs.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: typ, Status: corev1.ConditionTrue, Reason: "TestDecision", Message: "by the test",
	})
	if _, err := csrs.UpdateApproval(ctx, name, csr, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("%s CSR %s: %v", typ, name, err)
	}
}

// waitCSR waits until the CSR has a certificate or a Failed condition.
func waitCSR(t *testing.T, ctx context.Context, name string) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	csr := &certificatesv1.CertificateSigningRequest{}
	err := cluster.WaitFor(ctx, 30*time.Second, "CSR "+name+" signed or failed", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, csr); err != nil {
			return false, err
		}
		return len(csr.Status.Certificate) > 0 || failedReason(csr) != "", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return csr
}

func failedReason(csr *certificatesv1.CertificateSigningRequest) string {
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateFailed && c.Status == corev1.ConditionTrue {
			return c.Reason
		}
	}
	return ""
}

// trustBundlesServed tells whether the API server serves
// certificates.k8s.io/v1 ClusterTrustBundle (KEP-3257): GA and on by
// default from Kubernetes v1.37, beta and off before (make test-compat
// runs older servers, cluster.KubeVersionEnv).
func trustBundlesServed() bool { return env.MinorAtLeast(37) }

// caSecretActive reads the CA Secret and its active CA: nil, with no
// error, while it has none that parses.
func caSecretActive(ctx context.Context) (*corev1.Secret, *x509.Certificate, error) {
	sec := &corev1.Secret{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: operatorNS, Name: desired.CASecretName}, sec); err != nil {
		return nil, nil, err
	}
	active, err := pki.ParseCertPEM(sec.Data[pki.SecretKeyActiveCert])
	if err != nil {
		return sec, nil, nil
	}
	return sec, active, nil
}

// publishedTrustBundle waits for the signer's ClusterTrustBundle to carry
// the CA Secret's active CA and returns it. Only where trustBundlesServed.
func publishedTrustBundle(t *testing.T, ctx context.Context) *certificatesv1.ClusterTrustBundle {
	t.Helper()
	ctb := &certificatesv1.ClusterTrustBundle{}
	err := cluster.WaitFor(ctx, 60*time.Second, "ClusterTrustBundle with the active CA", func(ctx context.Context) (bool, error) {
		_, active, err := caSecretActive(ctx)
		if active == nil {
			return false, err
		}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: csrsigner.TrustBundleName(v1alpha1.DefaultCSRSignerName)}, ctb); err != nil {
			return false, err
		}
		return pki.BundleContains([]byte(ctb.Spec.TrustBundle), active), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ctb
}

// signerTrust is the PEM bundle a consumer of the operator's signer
// trusts: its ClusterTrustBundle with the active CA where the API is
// served; on an older server the documented fallback (docs/versions.md):
// the operator reports the API absent in a Warning event on the CA
// Secret, and the CA Secret's ca.crt (with the active CA) is the trust.
func signerTrust(t *testing.T, ctx context.Context) string {
	t.Helper()
	if trustBundlesServed() {
		return publishedTrustBundle(t, ctx).Spec.TrustBundle
	}
	var bundle []byte
	err := cluster.WaitFor(ctx, 60*time.Second, "ClusterTrustBundleUnavailable event and the CA Secret's bundle", func(ctx context.Context) (bool, error) {
		sec, active, err := caSecretActive(ctx)
		if active == nil {
			return false, err
		}
		r, err := eventReasons(ctx, "Secret", desired.CASecretName)
		if err != nil {
			return false, err
		}
		bundle = sec.Data[pki.SecretKeyBundle]
		return r[csrsigner.EventTrustBundleUnavailable] > 0 && pki.BundleContains(bundle, active), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return string(bundle)
}

// csrService creates a Service (with a ClusterIP) in ns for the test.
func csrService(t *testing.T, ctx context.Context, ns, name string) *corev1.Service {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443}}},
	}
	create(t, ctx, svc)
	return svc
}

// The operator's signer against the real API server: each request its
// policy forbids is approved by an administrator and still refused, with
// the Failed condition's reason naming the rule and a Warning event; an
// allowed one is signed by the active installation CA and verifies against
// the published ClusterTrustBundle; unapproved and denied ones are left
// alone.
func TestCSRSignerRefusesWhatItMustNotSign(t *testing.T) {
	ctx := cluster.TestContext(t, 3*time.Minute)
	trust := signerTrust(t, ctx)
	if trustBundlesServed() {
		ctb := publishedTrustBundle(t, ctx)
		if ctb.Spec.SignerName != v1alpha1.DefaultCSRSignerName || ctb.Labels[desired.LabelManagedBy] != desired.ManagedByValue {
			t.Fatalf("ClusterTrustBundle %s: signerName %q labels %v", ctb.Name, ctb.Spec.SignerName, ctb.Labels)
		}
	}
	svc := csrService(t, ctx, operatorNS, "csr-policy")
	name := "csr-policy." + operatorNS + ".svc"
	foreign := csrService(t, ctx, "default", "csr-policy-foreign")
	ip := net.ParseIP(svc.Spec.ClusterIP)

	type tc struct {
		name   string
		tmpl   x509.CertificateRequest
		usages []certificatesv1.KeyUsage
		exp    *int32
		reason string
	}
	dns := x509.CertificateRequest{DNSNames: []string{name, name + ".cluster.local"}}
	cases := []tc{
		{"client-auth", dns, append(slices.Clone(servingUsages), certificatesv1.UsageClientAuth), nil, csrsign.ReasonForbiddenUsage},
		{"no-server-auth", dns, []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature}, nil, csrsign.ReasonForbiddenUsage},
		{"foreign-namespace", x509.CertificateRequest{DNSNames: []string{foreign.Name + ".default.svc"}}, servingUsages, nil, csrsign.ReasonNamespaceNotAllowed},
		{"not-a-service-name", x509.CertificateRequest{DNSNames: []string{"www.example.com"}}, servingUsages, nil, csrsign.ReasonForbiddenName},
		{"no-such-service", x509.CertificateRequest{DNSNames: []string{"missing." + operatorNS + ".svc"}}, servingUsages, nil, csrsign.ReasonServiceNotFound},
		{"ip-outside-service-range", x509.CertificateRequest{DNSNames: []string{name}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}, servingUsages, nil, csrsign.ReasonForbiddenIP},
		{"group-in-subject", x509.CertificateRequest{Subject: pkix.Name{CommonName: name, Organization: []string{"system:masters"}}, DNSNames: []string{name}}, servingUsages, nil, csrsign.ReasonForbiddenSubject},
		{"too-long", dns, servingUsages, ptr.To(int32(testSignerMaxValidity/time.Second) + 1), csrsign.ReasonLifetimeTooLong},
		{"allowed", x509.CertificateRequest{DNSNames: dns.DNSNames, IPAddresses: []net.IP{ip}}, servingUsages, ptr.To[int32](3600), ""},
	}
	for _, c := range cases {
		req, _ := newCSRPEM(t, c.tmpl)
		createCSR(t, ctx, "csr-policy-"+c.name, req, c.usages, c.exp)
		setApproval(t, ctx, "csr-policy-"+c.name, certificatesv1.CertificateApproved)
	}
	req, _ := newCSRPEM(t, dns)
	createCSR(t, ctx, "csr-policy-unapproved", req, servingUsages, nil)
	createCSR(t, ctx, "csr-policy-denied", req, servingUsages, nil)
	setApproval(t, ctx, "csr-policy-denied", certificatesv1.CertificateDenied)

	for _, c := range cases {
		csr := waitCSR(t, ctx, "csr-policy-"+c.name)
		got := failedReason(csr)
		if got != c.reason {
			t.Errorf("%s: Failed reason %q (certificate %d bytes), want %q; conditions %+v", c.name, got, len(csr.Status.Certificate), c.reason, csr.Status.Conditions)
			continue
		}
		if c.reason != "" {
			if len(csr.Status.Certificate) > 0 {
				t.Errorf("%s: refused and signed", c.name)
			}
			t.Logf("%s: refused, %s", c.name, csr.Status.Conditions[len(csr.Status.Conditions)-1].Message)
			continue
		}
		leaf, err := pki.ParseCertPEM(csr.Status.Certificate)
		if err != nil {
			t.Fatal(err)
		}
		if err := pki.VerifyServing(leaf, []byte(trust), name, time.Now()); err != nil {
			t.Errorf("signed certificate does not verify against the signer's trust bundle: %v", err)
		}
		if got := leaf.NotAfter.Sub(leaf.NotBefore); got > time.Hour+pki.Backdate {
			t.Errorf("lifetime %s for expirationSeconds 3600", got)
		}
		if len(leaf.IPAddresses) != 1 || !leaf.IPAddresses[0].Equal(ip) || slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
			t.Errorf("IPs %v ext key usages %v", leaf.IPAddresses, leaf.ExtKeyUsage)
		}
	}
	err := cluster.WaitFor(ctx, 30*time.Second, "SigningRefused events", func(ctx context.Context) (bool, error) {
		r, err := eventReasons(ctx, "CertificateSigningRequest", "csr-policy-client-auth")
		return r[csrsigner.EventSigningRefused] > 0, err
	})
	if err != nil {
		t.Error(err)
	}
	for _, n := range []string{"csr-policy-unapproved", "csr-policy-denied"} {
		csr := &certificatesv1.CertificateSigningRequest{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: n}, csr); err != nil {
			t.Fatal(err)
		}
		if len(csr.Status.Certificate) > 0 || failedReason(csr) != "" {
			t.Errorf("%s: touched by the signer: %+v", n, csr.Status)
		}
	}
}

// The classic manual flow of the Kubernetes documentation against the
// operator's signer: openssl req, kubectl create -f csr.yaml, kubectl
// certificate approve; the issued certificate then serves a webhook whose
// caBundle is the ClusterTrustBundle's, and the API server calls it.
func TestCSRManualFlowWithKubectl(t *testing.T) {
	ctx := cluster.TestContext(t, 3*time.Minute)
	trust := signerTrust(t, ctx)
	const svcName, nsName = "csr-manual", "csr-manual-flow"
	svc := csrService(t, ctx, operatorNS, svcName)
	host := svcName + "." + operatorNS + ".svc"
	dir := t.TempDir()
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "KUBECONFIG="+env.Kubeconfig)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
		"-keyout", "server.key", "-out", "server.csr", "-subj", "/CN="+host,
		"-addext", "subjectAltName=DNS:"+host+",DNS:"+host+".cluster.local")
	req, err := os.ReadFile(filepath.Join(dir, "server.csr"))
	if err != nil {
		t.Fatal(err)
	}
	manifest := fmt.Sprintf(`apiVersion: certificates.k8s.io/v1
kind: CertificateSigningRequest
metadata:
  name: %s
spec:
  request: %s
  signerName: %s
  usages:
  - digital signature
  - key encipherment
  - server auth
`, svcName, base64.StdEncoding.EncodeToString(req), v1alpha1.DefaultCSRSignerName)
	if err := os.WriteFile(filepath.Join(dir, "csr.yaml"), []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	kubectl := filepath.Join(env.Bin, "k8s", "kubectl")
	run(kubectl, "create", "-f", "csr.yaml")
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: svcName}})
	})
	approved := time.Now()
	run(kubectl, "certificate", "approve", svcName)
	var certB64 string
	err = cluster.WaitFor(ctx, 30*time.Second, "certificate issued", func(ctx context.Context) (bool, error) {
		certB64 = strings.TrimSpace(run(kubectl, "get", "csr", svcName, "-o", "jsonpath={.status.certificate}"))
		return certB64 != "", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl certificate approve -> certificate in status: %s (includes kubectl's start)", time.Since(approved).Round(time.Millisecond))
	certPEM, err := base64.StdEncoding.DecodeString(certB64)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "server.key"))
	if err != nil {
		t.Fatal(err)
	}

	// A webhook serving it, with the ClusterTrustBundle as its caBundle.
	wh, err := cluster.StartToyWebhookPEM(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = wh.Close() })
	if err := env.RouteService(svc, wh.Addr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.UnrouteService(svc) })
	if _, err := env.CreateNamespace(ctx, nsName, map[string]string{"csr-manual": "true"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsName}})
	})
	none := admissionregistrationv1.SideEffectClassNone
	fail := admissionregistrationv1.Fail
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "csr-manual-flow"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "toy.csr-manual.hookwright.io",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service:  &admissionregistrationv1.ServiceReference{Namespace: operatorNS, Name: svcName, Path: ptr.To("/mutate"), Port: ptr.To[int32](443)},
				CABundle: []byte(trust),
			},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
			}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"csr-manual": "true"}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	create(t, ctx, mwc)
	err = cluster.WaitFor(ctx, 30*time.Second, "dry-run create mutated by the webhook", func(ctx context.Context) (bool, error) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: nsName, Name: "probe"}}
		if err := env.Client.Create(ctx, cm, client.DryRunAll); err != nil {
			return false, err
		}
		return cm.Labels["toy.hookwright.io/mutated"] == "true", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if wh.Calls("configmaps") == 0 {
		t.Fatal("webhook never called")
	}
}

// The ClusterTrustBundle is repaired like a caBundle: deleted, it is
// recreated; edited, it is restored.
func TestClusterTrustBundleRepaired(t *testing.T) {
	ctx := cluster.TestContext(t, 2*time.Minute)
	if !trustBundlesServed() {
		// Nothing to repair: the fallback is asserted instead.
		signerTrust(t, ctx)
		t.Skipf("Kubernetes 1.%d serves no certificates.k8s.io/v1 ClusterTrustBundle (from 1.37); the ClusterTrustBundleUnavailable fallback was asserted", env.KubeMinor())
	}
	ctb := publishedTrustBundle(t, ctx)
	want := ctb.Spec.TrustBundle
	key := client.ObjectKeyFromObject(ctb)
	if err := env.Client.Delete(ctx, ctb); err != nil {
		t.Fatal(err)
	}
	d := timeUntil(t, ctx, "ClusterTrustBundle recreated", func(ctx context.Context) (bool, error) {
		got := &certificatesv1.ClusterTrustBundle{}
		if err := env.Client.Get(ctx, key, got); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return got.UID != ctb.UID && got.Spec.TrustBundle == want, nil
	})
	t.Logf("deleted ClusterTrustBundle recreated in %s", d.Round(time.Millisecond))

	other, err := pki.NewCA(pki.CAOptions{CommonName: "intruder"})
	if err != nil {
		t.Fatal(err)
	}
	if err := update(ctx, ctb, func() { ctb.Spec.TrustBundle = string(other.CertPEM) }); err != nil {
		t.Fatal(err)
	}
	d = timeUntil(t, ctx, "ClusterTrustBundle restored", func(ctx context.Context) (bool, error) {
		got := &certificatesv1.ClusterTrustBundle{}
		if err := env.Client.Get(ctx, key, got); err != nil {
			return false, err
		}
		return got.Spec.TrustBundle == want, nil
	})
	t.Logf("edited ClusterTrustBundle restored in %s", d.Round(time.Millisecond))
}

// On a server that does not serve certificates.k8s.io/v1
// ClusterTrustBundle (here turned off with --runtime-config, as on servers
// before v1.37 where it is beta and off) the operator starts, reports it
// with a Warning event on the CA Secret, and still signs.
func TestClusterTrustBundleAPIAbsent(t *testing.T) {
	ctx := cluster.TestContext(t, 3*time.Minute)
	opts := cluster.Options{}
	if trustBundlesServed() {
		// Older servers (make test-compat) lack the API as they are.
		opts.APIServerArgs = map[string][]string{"runtime-config": {"certificates.k8s.io/v1/clustertrustbundles=false"}}
	}
	c, err := cluster.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	if _, err := c.CreateNamespace(ctx, operatorNS, nil); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.NewCA(pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	caSecret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: operatorNS, Name: desired.CASecretName},
		Data:       map[string][]byte{pki.SecretKeyActiveCert: ca.CertPEM, pki.SecretKeyActiveKey: ca.KeyPEM, pki.SecretKeyBundle: ca.CertPEM},
	}
	if err := c.Client.Create(ctx, caSecret); err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(c.Config, ctrl.Options{
		Scheme: c.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		// The operator of TestMain already registered the controller names.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	trust, err := csrsigner.Setup(mgr, csrsigner.Options{
		CASecret: client.ObjectKeyFromObject(caSecret), Namespaces: []string{operatorNS},
	})
	if err != nil {
		t.Fatal(err)
	}
	mctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	ok, why := trust.Available()
	if ok || !strings.Contains(why, "does not serve certificates.k8s.io/v1 ClusterTrustBundle") {
		t.Fatalf("Available() = %v, %q", ok, why)
	}
	t.Logf("reported: %s", why)
	err = cluster.WaitFor(ctx, 30*time.Second, "ClusterTrustBundleUnavailable event", func(ctx context.Context) (bool, error) {
		var list eventsv1.EventList
		if err := c.Client.List(ctx, &list, client.InNamespace(operatorNS)); err != nil {
			return false, err
		}
		for _, e := range list.Items {
			if e.Regarding.Name == desired.CASecretName && e.Reason == csrsigner.EventTrustBundleUnavailable && e.Type == corev1.EventTypeWarning {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}

	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: operatorNS, Name: "no-ctb"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 443}}}}
	if err := c.Client.Create(ctx, svc); err != nil {
		t.Fatal(err)
	}
	req, _ := newCSRPEM(t, x509.CertificateRequest{DNSNames: []string{"no-ctb." + operatorNS + ".svc"}})
	csrs := c.Clientset.CertificatesV1().CertificateSigningRequests()
	csr, err := csrs.Create(ctx, &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "no-ctb"},
		Spec:       certificatesv1.CertificateSigningRequestSpec{Request: req, SignerName: v1alpha1.DefaultCSRSignerName, Usages: servingUsages},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "Test"})
	if _, err := csrs.UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = cluster.WaitFor(ctx, 30*time.Second, "signed without ClusterTrustBundles", func(ctx context.Context) (bool, error) {
		got, err := csrs.Get(ctx, csr.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if len(got.Status.Certificate) == 0 {
			return false, nil
		}
		leaf, err := pki.ParseCertPEM(got.Status.Certificate)
		if err != nil {
			return false, cluster.Permanent(err)
		}
		return true, pki.VerifyServing(leaf, ca.CertPEM, "no-ctb."+operatorNS+".svc", time.Now())
	})
	if err != nil {
		t.Fatal(err)
	}
}
