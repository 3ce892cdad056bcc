package operator

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// Mode Secret: the user's issuer replaces the serving certificate and its
// CA while pods are being admitted every 20 ms. The server picks up the new
// certificate only after a kubelet-like delay, so the caBundle must carry
// the previous CA until then: zero failed admissions, and the previous CA
// leaves the caBundle once the overlap (the drain grace) ends.
func TestSecretModeCARotationUnderLoad(t *testing.T) {
	t.Parallel()
	ctx := cluster.TestContext(t, 4*time.Minute)
	c := env.Client
	const name, secretName, ns = "byo-rot", "byo-rot-serving", "byo-rot-apps"
	si := cluster.SampleInjector(t, name)
	si.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"byo-rotation": "enabled"}}
	si.Spec.Certificate = v1alpha1.CertificateSpec{Mode: v1alpha1.CertificateSecret, SecretName: secretName}
	si.Spec.Server.Replicas = ptr.To[int32](1)
	base := desired.SidecarKind.BaseName(name)
	issue := func(cn string) (*cluster.TestCA, map[string][]byte) {
		ca, crt, key := cluster.MustServiceCA(t, cn, operatorNS, base)
		return ca, map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key, "ca.crt": ca.CertPEM}
	}
	ca1, data1 := issue("byo-rot-1")
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secretName, Namespace: operatorNS}, Type: corev1.SecretTypeTLS, Data: data1}
	create(t, ctx, sec)
	create(t, ctx, si)
	waitConfigured(t, ctx, si, 60*time.Second)
	if b, err := mwcBundle(ctx, base); err != nil || !bytes.Equal(b, ca1.CertPEM) {
		t.Fatalf("caBundle is not the user's ca.crt: %v", err)
	}
	o := ownedKeys(base, operatorNS)
	for _, obj := range []client.Object{o.Deploy, o.Svc} {
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			t.Fatal(err)
		}
	}
	kc := serviceAccountKubeconfig(t, t.TempDir(), operatorNS, base)
	srv := startLocalServer(t, "injector-byo-rot", o.Deploy.Spec.Template.Spec.Containers[0].Args, data1[corev1.TLSCertKey], data1[corev1.TLSPrivateKeyKey], kc)
	if err := env.RouteService(o.Svc, srv.Addr()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.UnrouteService(o.Svc) })
	if _, err := env.CreateNamespace(ctx, ns, map[string]string{"byo-rotation": "enabled"}); err != nil {
		t.Fatal(err)
	}
	admitOne := func(ctx context.Context) (bool, error) {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "app-", Namespace: ns},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "nginx:1.27"}}},
		}
		if err := c.Create(ctx, p, client.DryRunAll); err != nil {
			return false, err
		}
		return injected(p), nil
	}
	if err := cluster.WaitFor(ctx, bound(30*time.Second), "a pod injected with the first certificate", admitOne); err != nil {
		t.Fatalf("%v\ninjector log:\n%s", err, srv.proc.Tail(3000))
	}

	// The kubelet's part, late as it is in a cluster (sync period plus
	// cache TTL): the server's --cert-dir gets the Secret 2 s after it changed.
	const kubeletDelay = 2 * time.Second
	loopCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// A failed wait (t.Fatal) stops the load loops too.
	defer func() { stop(); wg.Wait() }()
	var reloaded atomic.Int64 // unix nanos of the copy
	wg.Add(2)
	followed := sec.DeepCopy() // the test changes sec below
	go func() {
		defer wg.Done()
		followSecret(loopCtx, followed, srv, kubeletDelay, func() { reloaded.Store(time.Now().UnixNano()) })
	}()
	var adm admissionLoad
	go func() {
		defer wg.Done()
		adm.at50PerSecond(loopCtx, func(ctx context.Context) error {
			ok, err := admitOne(ctx)
			if err == nil && !ok {
				// Not injected is a failure here, as any.
				err = errors.New("not injected")
			}
			return err
		})
	}()
	// A baseline before the issuer rotates (about 1 s of admissions on an
	// idle machine), counted rather than slept.
	waitCount(t, ctx, "admissions before the issuer rotates", &adm.attempted, 25)

	ca2, data2 := issue("byo-rot-2")
	replaced := time.Now()
	if err := update(ctx, sec, func() { sec.Data = data2 }); err != nil {
		t.Fatal(err)
	}
	ca1Cert, _ := pki.ParseCertPEM(ca1.CertPEM)
	ca2Cert, _ := pki.ParseCertPEM(ca2.CertPEM)
	var both time.Duration
	err := cluster.WaitFor(ctx, bound(60*time.Second), "caBundle with the new CA only", func(ctx context.Context) (bool, error) {
		b, err := mwcBundle(ctx, base)
		if err != nil {
			return false, err
		}
		if both == 0 && pki.BundleContains(b, ca1Cert) && pki.BundleContains(b, ca2Cert) {
			both = time.Since(replaced)
		}
		return bytes.Equal(b, ca2.CertPEM), nil
	})
	done := time.Since(replaced)
	if err == nil {
		// Admissions after the previous CA left (about 1 s of them on an
		// idle machine), counted rather than slept: with the baseline, the
		// 50 the check below wants however slow each admission is.
		waitCount(t, ctx, "admissions in all, through the previous CA leaving", &adm.attempted, max(adm.attempted.Load()+25, 50))
	}
	stop()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Secret replaced: both CAs published after %s, the new one alone after %s; server reloaded %s after the replacement; %d admissions, %d failed",
		both.Round(time.Millisecond), done.Round(time.Millisecond), time.Unix(0, reloaded.Load()).Sub(replaced).Round(time.Millisecond), adm.attempted.Load(), adm.failed.Load())
	if both == 0 {
		t.Error("the caBundle never carried both CAs")
	}
	if reloaded.Load() == 0 || adm.attempted.Load() < 50 {
		t.Fatalf("no reload or too few admissions (%d)", adm.attempted.Load())
	}
	if adm.failed.Load() > 0 {
		t.Fatalf("%d of %d admissions failed during the rotation; first: %q", adm.failed.Load(), adm.attempted.Load(), adm.errs())
	}
}
