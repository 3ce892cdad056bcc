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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/certs"
	"github.com/hookwright/hookwright/internal/certsource"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// `hookwright rotate-ca` rotates the installation CA at once with a
// SelfSigned and a CSR-mode CR side by side. Every 20 ms, for both CRs,
// the certificate in the serving Secret must verify against the caBundle
// of its configuration as the API server reads it (what a TLS client given
// that caBundle checks); the rotation ends with both certificates from the
// new CA and the old CA gone from the ClusterTrustBundle.
func TestRotateNowWithCSRAndSelfSigned(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	logOnFailure(t, "CreateNextCA")
	logOnFailure(t, "\"ca\"")
	self := &v1alpha1.SidecarInjector{
		ObjectMeta: metav1.ObjectMeta{Name: "rotnow-self"},
		Spec: v1alpha1.SidecarInjectorSpec{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"rotate-now-test": "never"}},
			Server:            v1alpha1.ServerSpec{Replicas: ptr.To[int32](1)},
		},
	}
	csr := csrInjector("rotnow-csr", v1alpha1.DefaultCSRSignerName, true)
	for _, si := range []*v1alpha1.SidecarInjector{self, csr} {
		if err := env.Client.Create(ctx, si); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), si) })
	}
	for _, si := range []*v1alpha1.SidecarInjector{self, csr} {
		waitConditions(t, ctx, si, func() []metav1.Condition { return si.Status.Conditions }, map[string]metav1.ConditionStatus{
			v1alpha1.ConditionCertificateReady: metav1.ConditionTrue, v1alpha1.ConditionWebhookConfigured: metav1.ConditionTrue,
		}, 60*time.Second)
	}
	caKey := client.ObjectKey{Namespace: operatorNS, Name: desired.CASecretName}
	caSec := &corev1.Secret{}
	if err := env.Client.Get(ctx, caKey, caSec); err != nil {
		t.Fatal(err)
	}
	oldCA, err := certs.ParseCertPEM(caSec.Data[certs.SecretKeyActiveCert])
	if err != nil {
		t.Fatal(err)
	}

	// The invariant, sampled while the rotation runs.
	bases := []string{desired.SidecarKind.BaseName(self.Name), desired.SidecarKind.BaseName(csr.Name)}
	var samples, broken atomic.Int64
	var mu sync.Mutex
	var firstBroken []string
	loopCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
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
				leaf, err := certs.ParseCertPEM(sec.Data[corev1.TLSCertKey])
				if err == nil {
					err = certs.VerifyServing(leaf, mwc.Webhooks[0].ClientConfig.CABundle, base+"."+operatorNS+".svc", time.Now())
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
	var newCA *certs.KeyPair
	err = cluster.WaitFor(ctx, 4*time.Minute, "rotation finished for both CRs", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, caKey, caSec); err != nil {
			return false, err
		}
		set := certs.ParseCASecret(caSec.Data, time.Now())
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
			leaf, err := certs.ParseCertPEM(sec.Data[corev1.TLSCertKey])
			return err == nil && certs.SignedBy(leaf, newCA.Cert)
		}
		mark(&selfDone, issuedByNew(bases[0]))
		mark(&csrDone, issuedByNew(bases[1]))
		ctb := publishedTrustBundle(t, ctx)
		mark(&dropped, !certs.BundleContains([]byte(ctb.Spec.TrustBundle), oldCA))
		return selfDone > 0 && csrDone > 0 && dropped > 0, nil
	})
	stop()
	wg.Wait()
	if err != nil {
		t.Fatalf("%v (staged %s, promoted %s, SelfSigned re-issued %s, CSR re-issued %s, old CA dropped %s)", err, staged, promoted, selfDone, csrDone, dropped)
	}
	t.Logf("rotate-now → next CA staged %s, promoted %s, SelfSigned certificate from the new CA %s, old CA out of the ClusterTrustBundle %s, CSR-mode certificate from the new CA %s",
		staged.Round(time.Millisecond), promoted.Round(time.Millisecond), selfDone.Round(time.Millisecond), dropped.Round(time.Millisecond), csrDone.Round(time.Millisecond))
	if staged > 5*time.Second {
		t.Errorf("staging took %s", staged)
	}
	t.Logf("%d samples of served certificate vs published caBundle, %d not verifying", samples.Load(), broken.Load())
	if broken.Load() > 0 {
		t.Fatalf("served certificates not trusted by their caBundle: %v", firstBroken)
	}
	if caSec.Annotations[certsource.AnnotationRotateCAHandled] != caSec.Annotations[v1alpha1.AnnotationRotateCA] {
		t.Fatalf("rotate-now token not marked handled: %v", caSec.Annotations)
	}
	// Handled once: no second rotation.
	time.Sleep(3 * time.Second)
	if err := env.Client.Get(ctx, caKey, caSec); err != nil {
		t.Fatal(err)
	}
	if set := certs.ParseCASecret(caSec.Data, time.Now()); set.Next != nil || !set.Active.Cert.Equal(newCA.Cert) {
		t.Fatal(fmt.Errorf("a second rotation started"))
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
	time.Sleep(3 * time.Second)
	if err := env.Client.Get(ctx, secKey, before); err != nil {
		t.Fatal(err)
	}
	if string(renewed.Data[corev1.TLSCertKey]) != string(before.Data[corev1.TLSCertKey]) {
		t.Fatal("renewed more than once for one request")
	}
}
