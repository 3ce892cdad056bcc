package operator

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/certificates/sources"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// `hookwright rotate-ca` rotates the installation CA at once with a
// SelfSigned and a CSR-mode CR side by side, each with its real server,
// under pod-create load (server-side dry runs at 50 per second): no
// admission fails or goes uninjected and WebhookReachable stays True for
// both throughout. Every 20 ms, for both CRs,
// the certificate in the serving Secret must verify against the caBundle
// of its configuration as the API server reads it (what a TLS client given
// that caBundle checks); the rotation ends with both certificates from the
// new CA and the old CA gone from the ClusterTrustBundle.
func TestRotateNowWithCSRAndSelfSigned(t *testing.T) {
	ctx := cluster.TestContext(t, 5*time.Minute)
	logOnFailure(t, "CreateNextCA")
	logOnFailure(t, "\"ca\"")
	self := &v1alpha1.SidecarInjector{
		ObjectMeta: metav1.ObjectMeta{Name: "rotnow-self"},
		Spec: v1alpha1.SidecarInjectorSpec{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"rotate-now-test": "self"}},
			Server:            v1alpha1.ServerSpec{Replicas: ptr.To[int32](1)},
		},
	}
	csr := csrInjector("rotnow-csr", v1alpha1.DefaultCSRSignerName, true)
	csr.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"rotate-now-test": "csr"}}
	// The sample's sidecar templates, so both servers inject.
	sample := cluster.SampleInjector(t, "sample")
	for _, si := range []*v1alpha1.SidecarInjector{self, csr} {
		spec := *sample.Spec.DeepCopy()
		spec.NamespaceSelector, spec.Server, spec.Certificate = si.Spec.NamespaceSelector, si.Spec.Server, si.Spec.Certificate
		si.Spec = spec
	}
	for _, si := range []*v1alpha1.SidecarInjector{self, csr} {
		create(t, ctx, si)
	}
	for _, si := range []*v1alpha1.SidecarInjector{self, csr} {
		waitConfigured(t, ctx, si, 60*time.Second)
	}
	caKey := client.ObjectKey{Namespace: operatorNS, Name: desired.CASecretName}
	caSec := &corev1.Secret{}
	if err := env.Client.Get(ctx, caKey, caSec); err != nil {
		t.Fatal(err)
	}
	oldCA, err := pki.ParseCertPEM(caSec.Data[pki.SecretKeyActiveCert])
	if err != nil {
		t.Fatal(err)
	}

	// Both injectors' real servers, following their serving Secrets as a
	// kubelet would; an application namespace selected by each.
	bases := []string{desired.SidecarKind.BaseName(self.Name), desired.SidecarKind.BaseName(csr.Name)}
	loopCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	var mu sync.Mutex
	appNS := []string{"rotnow-self-apps", "rotnow-csr-apps"}
	for i, base := range bases {
		o := ownedKeys(base, operatorNS)
		for _, obj := range []client.Object{o.Secret, o.Deploy, o.Svc} {
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
				t.Fatal(err)
			}
		}
		kc := serviceAccountKubeconfig(t, t.TempDir(), operatorNS, base)
		srv := startLocalServer(t, "injector-"+base, o.Deploy.Spec.Template.Spec.Containers[0].Args,
			o.Secret.Data[corev1.TLSCertKey], o.Secret.Data[corev1.TLSPrivateKeyKey], kc)
		if err := env.RouteService(o.Svc, srv.Addr()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { env.UnrouteService(o.Svc) })
		wg.Add(1)
		go func() { defer wg.Done(); followSecret(loopCtx, o.Secret, srv, 0, nil) }()
		if _, err := env.CreateNamespace(ctx, appNS[i], map[string]string{"rotate-now-test": []string{"self", "csr"}[i]}); err != nil {
			t.Fatal(err)
		}
	}
	crs := []*v1alpha1.SidecarInjector{self, csr}
	for _, si := range crs {
		waitReachable(t, ctx, si, metav1.ConditionTrue, []string{v1alpha1.WebhookProbeReasonReachable}, 3*time.Minute)
	}

	// Load: server-side dry-run pod creates at 50 per second, alternating
	// between the two injectors' namespaces; every one must be admitted
	// and injected.
	var adm admissionLoad
	loadStart := time.Now()
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		sem := make(chan struct{}, 16)
		var inflight sync.WaitGroup
		defer inflight.Wait()
		for i := 0; ; i++ {
			select {
			case <-loopCtx.Done():
				return
			case <-tick.C:
			}
			select {
			case sem <- struct{}{}:
			case <-loopCtx.Done():
				return
			}
			inflight.Add(1)
			go func() {
				defer func() { <-sem; inflight.Done() }()
				p := &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{GenerateName: "app-", Namespace: appNS[i%2]},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "nginx:1.23-alpine"}}},
				}
				err := env.Client.Create(loopCtx, p, client.DryRunAll)
				if loopCtx.Err() != nil {
					return
				}
				adm.attempted.Add(1)
				adm.record(err, p)
			}()
		}
	}()
	// WebhookReachable of both CRs, sampled every 200 ms.
	var reachSamples, notReachable atomic.Int64
	var firstUnreachable []string
	wg.Add(1)
	go func() {
		defer wg.Done()
		for loopCtx.Err() == nil {
			for _, si := range crs {
				cur := &v1alpha1.SidecarInjector{}
				if env.Client.Get(loopCtx, client.ObjectKeyFromObject(si), cur) != nil {
					continue
				}
				reachSamples.Add(1)
				if c := apimeta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionWebhookReachable); c == nil || c.Status != metav1.ConditionTrue {
					notReachable.Add(1)
					mu.Lock()
					if len(firstUnreachable) < 5 {
						firstUnreachable = append(firstUnreachable, fmt.Sprintf("%s: %+v", si.Name, c))
					}
					mu.Unlock()
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	// A baseline of admissions before rotating (about 2 s of load on an
	// idle machine), counted rather than slept.
	waitCount(t, ctx, "admissions before rotating", &adm.attempted, 100)
	probesBefore := []float64{total(probeCounts(t, desired.SidecarKind.Name, self.Name)), total(probeCounts(t, desired.SidecarKind.Name, csr.Name))}

	// The invariant, sampled while the rotation runs.
	var samples, broken atomic.Int64
	var firstBroken []string
	wg.Add(1)
	go func() {
		defer wg.Done()
		cluster.Every(loopCtx, 20*time.Millisecond, func(loopCtx context.Context) {
			for _, base := range bases {
				sec, mwc := &corev1.Secret{}, &admissionregistrationv1.MutatingWebhookConfiguration{}
				if env.Client.Get(loopCtx, client.ObjectKey{Namespace: operatorNS, Name: base + "-tls"}, sec) != nil ||
					env.Client.Get(loopCtx, client.ObjectKey{Name: base}, mwc) != nil {
					continue
				}
				samples.Add(1)
				leaf, err := pki.ParseCertPEM(sec.Data[corev1.TLSCertKey])
				if err == nil {
					err = pki.VerifyServing(leaf, mwc.Webhooks[0].ClientConfig.CABundle, base+"."+operatorNS+".svc", time.Now())
				}
				if err != nil {
					broken.Add(1)
					mu.Lock()
					if len(firstBroken) < 5 {
						firstBroken = append(firstBroken, base+": "+err.Error())
					}
					mu.Unlock()
				}
			}
		})
	}()

	bin := cluster.MustHookwrightBinary(t)
	start := time.Now()
	cmd := exec.CommandContext(ctx, bin, "rotate-ca", "--namespace", operatorNS)
	cmd.Env = append(cmd.Environ(), "KUBECONFIG="+env.Kubeconfig)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), v1alpha1.AnnotationRotateCA) {
		t.Fatalf("hookwright rotate-ca: %v\n%s", err, out)
	}
	t.Logf("hookwright rotate-ca: %s", strings.TrimSpace(string(out)))

	var staged, promoted, selfDone, csrDone, dropped time.Duration
	mark := func(d *time.Duration, ok bool) {
		if ok && *d == 0 {
			*d = time.Since(start)
		}
	}
	var newCA *pki.KeyPair
	err = cluster.WaitFor(ctx, 4*time.Minute, "rotation finished for both CRs", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, caKey, caSec); err != nil {
			return false, err
		}
		set := pki.ParseCASecret(caSec.Data, time.Now())
		mark(&staged, set.Next != nil || (set.Active != nil && !set.Active.Cert.Equal(oldCA)))
		if set.Active != nil && !set.Active.Cert.Equal(oldCA) {
			newCA = set.Active
			mark(&promoted, true)
		}
		if newCA == nil {
			return false, nil
		}
		issuedByNew := func(base string) bool {
			sec := &corev1.Secret{}
			if env.Client.Get(ctx, client.ObjectKey{Namespace: operatorNS, Name: base + "-tls"}, sec) != nil {
				return false
			}
			leaf, err := pki.ParseCertPEM(sec.Data[corev1.TLSCertKey])
			return err == nil && pki.SignedBy(leaf, newCA.Cert)
		}
		mark(&selfDone, issuedByNew(bases[0]))
		mark(&csrDone, issuedByNew(bases[1]))
		mark(&dropped, !pki.BundleContains([]byte(signerTrust(t, ctx)), oldCA))
		return selfDone > 0 && csrDone > 0 && dropped > 0, nil
	})
	if err == nil {
		// Admissions after the old CA left (about 3 s of load on an idle
		// machine), counted rather than slept.
		waitCount(t, ctx, "admissions in all, through the old CA leaving", &adm.attempted, adm.attempted.Load()+150)
	}
	rotation := time.Since(start)
	stop()
	wg.Wait()
	load := time.Since(loadStart)
	if err != nil {
		t.Fatalf("%v (staged %s, promoted %s, SelfSigned re-issued %s, CSR re-issued %s, old CA dropped %s)", err, staged, promoted, selfDone, csrDone, dropped)
	}
	t.Logf("rotate-now → next CA staged %s, promoted %s, SelfSigned certificate from the new CA %s, old CA out of the ClusterTrustBundle %s, CSR-mode certificate from the new CA %s",
		staged.Round(time.Millisecond), promoted.Round(time.Millisecond), selfDone.Round(time.Millisecond), dropped.Round(time.Millisecond), csrDone.Round(time.Millisecond))
	t.Logf("%d samples of served certificate vs published caBundle, %d not verifying", samples.Load(), broken.Load())
	if broken.Load() > 0 {
		t.Fatalf("served certificates not trusted by their caBundle: %v", firstBroken)
	}
	t.Logf("load for %s (rotation %s of it): %d admissions attempted (%.1f/s), %d failed, %d not injected; WebhookReachable sampled %d times, not True %d",
		load.Round(time.Millisecond), rotation.Round(time.Millisecond), adm.attempted.Load(), float64(adm.attempted.Load())/load.Seconds(), adm.failed.Load(), adm.notInjected.Load(),
		reachSamples.Load(), notReachable.Load())
	for i, si := range crs {
		n := total(probeCounts(t, desired.SidecarKind.Name, si.Name)) - probesBefore[i]
		t.Logf("%s: %.0f probes in the %s of the rotation (each CA step changes the published caBundle or certificate: probed again, 5 s apart at least)", si.Name, n, rotation.Round(time.Millisecond))
	}
	if adm.failed.Load() > 0 || adm.notInjected.Load() > 0 {
		t.Fatalf("%d admissions failed, %d not injected during the rotation: %v", adm.failed.Load(), adm.notInjected.Load(), adm.errs())
	}
	if adm.attempted.Load() == 0 {
		t.Fatal("no admission attempted")
	}
	if notReachable.Load() > 0 {
		t.Fatalf("WebhookReachable not True in %d samples: %v", notReachable.Load(), firstUnreachable)
	}
	if caSec.Annotations[sources.AnnotationRotateCAHandled] != caSec.Annotations[v1alpha1.AnnotationRotateCA] {
		t.Fatalf("rotate-now token not marked handled: %v", caSec.Annotations)
	}
	// Handled once: no second rotation, once every reconcile the rotation
	// queued has run (settle), nor in the 3 s after.
	settle(t, ctx)
	err = cluster.During(ctx, 3*time.Second, 100*time.Millisecond, func(ctx context.Context) error {
		if err := env.Client.Get(ctx, caKey, caSec); err != nil {
			return err
		}
		if set := pki.ParseCASecret(caSec.Data, time.Now()); set.Next != nil || !set.Active.Cert.Equal(newCA.Cert) {
			return fmt.Errorf("a second rotation started")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// `hookwright renew-certificate` for the SelfSigned CR: one new
	// certificate, once.
	secKey := client.ObjectKey{Namespace: operatorNS, Name: bases[0] + "-tls"}
	before := &corev1.Secret{}
	if err := env.Client.Get(ctx, secKey, before); err != nil {
		t.Fatal(err)
	}
	renew := time.Now()
	cmd = exec.CommandContext(ctx, bin, "renew-certificate", "sidecarinjector/"+self.Name)
	cmd.Env = append(cmd.Environ(), "KUBECONFIG="+env.Kubeconfig)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hookwright renew-certificate: %v\n%s", err, out)
	}
	var renewed *corev1.Secret
	err = cluster.WaitFor(ctx, 30*time.Second, "SelfSigned certificate renewed", func(ctx context.Context) (bool, error) {
		renewed = &corev1.Secret{}
		if err := env.Client.Get(ctx, secKey, renewed); err != nil {
			return false, err
		}
		return string(renewed.Data[corev1.TLSCertKey]) != string(before.Data[corev1.TLSCertKey]), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("renew-certificate → new SelfSigned certificate in %s", time.Since(renew).Round(time.Millisecond))
	// Once: no second certificate, once every reconcile the renewal queued
	// has run (settle), nor in the 3 s after.
	settle(t, ctx)
	err = cluster.During(ctx, 3*time.Second, 100*time.Millisecond, func(ctx context.Context) error {
		if err := env.Client.Get(ctx, secKey, before); err != nil {
			return err
		}
		if string(renewed.Data[corev1.TLSCertKey]) != string(before.Data[corev1.TLSCertKey]) {
			return fmt.Errorf("renewed more than once for one request")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
