package operator

// This file sorts before the others so its CRs create the installation CA:
// testCAPolicy makes that CA due for rotation 4 min later, which the test
// reaches by moving the operator's clock ahead by less than pki.Backdate.

import (
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/apply"
	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/certificates/sources"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// kubeletSwap publishes files in dir as the kubelet updates a mounted
// Secret: a new "..<timestamp>" directory, a "..data_tmp" symlink to it
// renamed over "..data", and visible names that are symlinks through
// "..data" (created once).
func kubeletSwap(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	ts := "..2026_" + time.Now().Format("01_02_15_04_05.000000000")
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, ts, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func mwcBundle(ctx context.Context, name string) ([]byte, error) {
	m := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, m); err != nil {
		return nil, err
	}
	if len(m.Webhooks) == 0 {
		return nil, nil
	}
	return m.Webhooks[0].ClientConfig.CABundle, nil
}

// allCarry waits until every configuration in names satisfies ok, failing
// past limit, and returns how long that took.
func allCarry(t *testing.T, ctx context.Context, what string, limit time.Duration, names []string, ok func([]byte) bool) time.Duration {
	t.Helper()
	return timeWithin(t, ctx, what, limit, func(ctx context.Context) (bool, error) {
		for _, n := range names {
			b, err := mwcBundle(ctx, n)
			if err != nil || !ok(b) {
				return false, err
			}
		}
		return true, nil
	})
}

func TestCADirAndCARotation(t *testing.T) {
	ctx := cluster.TestContext(t, 8*time.Minute)
	c := env.Client
	// Two SelfSigned injectors: "rot" serves pods of rot-apps through a
	// local server; "rot-idle" selects no namespace, but its configuration
	// must carry every CA change all the same.
	si := cluster.SampleInjector(t, "rot")
	si.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"rotation-test": "enabled"}}
	idle := cluster.SampleInjector(t, "rot-idle")
	idle.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"rotation-test": "never"}}
	for _, o := range []*v1alpha1.SidecarInjector{si, idle} {
		create(t, ctx, o)
	}
	for _, o := range []*v1alpha1.SidecarInjector{si, idle} {
		waitConfigured(t, ctx, o, 60*time.Second)
	}
	base := desired.SidecarKind.BaseName(si.Name)
	configs := []string{base, desired.SidecarKind.BaseName(idle.Name)}

	// (a) --ca-dir: the kubelet's ..data swap reaches every configuration.
	ca1, err := cluster.NewTestCA("ca-dir-1")
	if err != nil {
		t.Fatal(err)
	}
	ca2, err := cluster.NewTestCA("ca-dir-2")
	if err != nil {
		t.Fatal(err)
	}
	contains := func(ca *cluster.TestCA) func([]byte) bool {
		return func(b []byte) bool { return pki.BundleContains(b, ca.Cert) }
	}
	// The swap is seen by fsnotify (about 2 s at most on an idle machine),
	// not by the CA-directory watcher's 30 s poll: the limit is ten times that bound and
	// still under the poll interval; the time itself is a figure.
	const caDirLimit = 20 * time.Second
	kubeletSwap(t, caDir, map[string][]byte{"ca.crt": ca1.CertPEM})
	d := allCarry(t, ctx, "ca-dir CA 1 in every configuration", caDirLimit, configs, contains(ca1))
	t.Logf("ca-dir: first CA in all %d configurations %s after the ..data swap", len(configs), d.Round(time.Millisecond))
	kubeletSwap(t, caDir, map[string][]byte{"ca.crt": ca2.CertPEM})
	d = allCarry(t, ctx, "ca-dir CA 2 replacing CA 1 in every configuration", caDirLimit, configs, func(b []byte) bool {
		return contains(ca2)(b) && !contains(ca1)(b)
	})
	t.Logf("ca-dir: replaced CA in all %d configurations %s after the ..data swap", len(configs), d.Round(time.Millisecond))
	t.Cleanup(func() {
		// Later tests expect caBundle == the CA Secret's ca.crt.
		kubeletSwap(t, caDir, map[string][]byte{"empty.txt": nil})
		_ = os.Remove(filepath.Join(caDir, "ca.crt"))
	})

	// (b) CA rotation under a steady stream of admissions.
	o := ownedKeys(base, operatorNS)
	if err := c.Get(ctx, client.ObjectKeyFromObject(o.Secret), o.Secret); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(o.Deploy), o.Deploy); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(o.Svc), o.Svc); err != nil {
		t.Fatal(err)
	}
	kc := serviceAccountKubeconfig(t, t.TempDir(), operatorNS, base)
	srv := startLocalServer(t, "injector-rot", o.Deploy.Spec.Template.Spec.Containers[0].Args,
		o.Secret.Data[corev1.TLSCertKey], o.Secret.Data[corev1.TLSPrivateKeyKey], kc)
	if err := env.RouteService(o.Svc, srv.Addr()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.UnrouteService(o.Svc) })
	if _, err := env.CreateNamespace(ctx, "rot-apps", map[string]string{"rotation-test": "enabled"}); err != nil {
		t.Fatal(err)
	}

	// The kubelet's part: copy the serving Secret into the server's
	// --cert-dir when it changes (certwatcher reloads it).
	loopCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// A failed wait (t.Fatal) stops the load loops too.
	defer func() { stop(); wg.Wait() }()
	var reloads atomic.Int32
	wg.Add(1)
	go func() {
		defer wg.Done()
		followSecret(loopCtx, o.Secret, srv, 0, func() { reloads.Add(1) })
	}()
	// Admissions every 20 ms: a server-side dry-run pod through the injector.
	var adm admissionLoad
	wg.Add(1)
	go func() {
		defer wg.Done()
		adm.at50PerSecond(loopCtx, func(ctx context.Context) error {
			p := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{GenerateName: "app-", Namespace: "rot-apps"},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "nginx:1.23-alpine"}}},
			}
			if err := c.Create(ctx, p, client.DryRunAll); err != nil {
				return err
			}
			if !injected(p) {
				return errNotInjected
			}
			return nil
		})
	}()
	// A baseline of admissions before rotating (about 2 s of them on an
	// idle machine), counted rather than slept.
	waitCount(t, ctx, "admissions before rotating", &adm.attempted, 100)

	caSec := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: operatorNS, Name: desired.CASecretName}, caSec); err != nil {
		t.Fatal(err)
	}
	oldCA, err := pki.ParseCertPEM(caSec.Data[pki.SecretKeyActiveCert])
	if err != nil {
		t.Fatal(err)
	}
	shift := time.Until(pki.CARotationTime(oldCA, testCAPolicy)) + 2*time.Second
	if shift >= pki.Backdate-30*time.Second {
		t.Fatalf("CA %q is due at %s, %s away: too far to force by moving the clock", oldCA.Subject.CommonName, pki.CARotationTime(oldCA, testCAPolicy), shift)
	}
	// Back to real time afterwards: nothing then rotates for ~4 more min
	// (what was generated in the shifted time is backdated enough to stay valid).
	t.Cleanup(func() { clock.Set(0) })
	shift = max(shift, 0)
	forced := time.Now()
	clock.Set(shift)
	// Any reconcile now sees the CA due: touch the CR.
	if err := update(ctx, si, func() {
		if si.Annotations == nil {
			si.Annotations = map[string]string{}
		}
		si.Annotations["test/rotate"] = forced.Format(time.RFC3339Nano)
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("clock moved ahead by %s: CA %q due for rotation", shift.Round(time.Millisecond), oldCA.Subject.CommonName)

	// Observe the steps from the API.
	at := map[string]time.Duration{}
	mark := func(step string) {
		if _, ok := at[step]; !ok {
			at[step] = time.Since(forced)
			t.Logf("+%s %s", at[step].Round(time.Millisecond), step)
		}
	}
	var newCA *pki.KeyPair
	var statusSteps []string // CertificateReady messages naming a step
	err = cluster.WaitFor(ctx, 90*time.Second, "old CA dropped from every configuration", func(ctx context.Context) (bool, error) {
		cur := &v1alpha1.SidecarInjector{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(si), cur); err == nil {
			m := metaCond(cur.Status.Conditions, v1alpha1.ConditionCertificateReady)
			if strings.Contains(m, "applied ") || strings.Contains(m, "waiting: ") || strings.Contains(m, "CA rotation in progress") {
				if len(statusSteps) == 0 || statusSteps[len(statusSteps)-1] != m {
					statusSteps = append(statusSteps, m)
				}
			}
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(caSec), caSec); err != nil {
			return false, err
		}
		if len(caSec.Data[pki.SecretKeyNextCert]) > 0 {
			mark("CreateNextCA: next CA staged in the CA Secret")
		}
		active, err := pki.ParseCertPEM(caSec.Data[pki.SecretKeyActiveCert])
		if err != nil {
			return false, err
		}
		if !active.Equal(oldCA) {
			mark("PromoteNextCA: the new CA signs")
			newCA = &pki.KeyPair{Cert: active}
		}
		both, neither := true, true
		for _, n := range configs {
			b, err := mwcBundle(ctx, n)
			if err != nil {
				return false, err
			}
			has := pki.BundleContains(b, oldCA)
			fresh := newCA != nil && pki.BundleContains(b, newCA.Cert)
			if newCA == nil && len(caSec.Data[pki.SecretKeyNextCert]) > 0 {
				next, _ := pki.ParseCertPEM(caSec.Data[pki.SecretKeyNextCert])
				fresh = next != nil && pki.BundleContains(b, next)
			}
			both = both && has && fresh
			neither = neither && !has
		}
		if both {
			mark("PublishBundle: old and new CA in every configuration")
		}
		if newCA != nil {
			sec := &corev1.Secret{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(o.Secret), sec); err != nil {
				return false, err
			}
			if leaf, err := pki.ParseCertPEM(sec.Data[corev1.TLSCertKey]); err == nil && pki.SignedBy(leaf, newCA.Cert) {
				mark("IssueServing: serving certificate from the new CA")
			}
		}
		if neither && newCA != nil && len(caSec.Data[pki.SecretKeyRetiredCerts]) == 0 {
			mark("DropRetiredCA: old CA gone from every configuration")
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%v; steps seen %v", err, at)
	}
	failedRotation := adm.failed.Load()

	// A deleted CA Secret (its key is lost): a new CA signs at once, but no
	// serving certificate from it is served before every configuration
	// carries it, and the lost CA (still known from the caBundles) stays
	// trusted until no certificate in use chains to it.
	lost := newCA.Cert
	if err := c.Delete(ctx, caSec.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	var replacement *x509.Certificate
	var waiting string // what the wait last waited for
	err = cluster.WaitFor(ctx, 60*time.Second, "a new CA after the CA Secret was deleted, the lost one dropped", func(ctx context.Context) (bool, error) {
		sec := &corev1.Secret{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(caSec), sec); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		active, err := pki.ParseCertPEM(sec.Data[pki.SecretKeyActiveCert])
		if err != nil || active.Equal(lost) {
			waiting = "the CA Secret's active CA is still the lost one"
			return false, nil
		}
		if replacement == nil {
			replacement = active
			t.Logf("+%s CreateCA: CA Secret re-created with a new CA", time.Since(deleted).Round(time.Millisecond))
		}
		serving := &corev1.Secret{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(o.Secret), serving); err != nil {
			return false, err
		}
		leaf, err := pki.ParseCertPEM(serving.Data[corev1.TLSCertKey])
		if err != nil || !pki.SignedBy(leaf, active) {
			waiting = "the serving certificate is not yet signed by the new CA"
			return false, nil
		}
		for _, n := range configs {
			b, err := mwcBundle(ctx, n)
			if err != nil || pki.BundleContains(b, lost) || !pki.BundleContains(b, active) {
				waiting = fmt.Sprintf("configuration %s: caBundle has the lost CA %t, the new CA %t (%v)", n, pki.BundleContains(b, lost), pki.BundleContains(b, active), err)
				return false, err
			}
		}
		return true, nil
	})
	if err != nil {
		for _, o := range []*v1alpha1.SidecarInjector{si, idle} {
			if c.Get(context.Background(), client.ObjectKeyFromObject(o), o) == nil {
				t.Logf("%s conditions: %+v", o.Name, o.Status.Conditions)
			}
		}
		t.Fatalf("%v; last waiting for: %s", err, waiting)
	}
	t.Logf("+%s deleted CA Secret: serving certificate from the new CA and the lost CA gone from every configuration", time.Since(deleted).Round(time.Millisecond))
	// Admissions against the new CA only (about 2 s of them on an idle
	// machine), counted rather than slept.
	waitCount(t, ctx, "admissions in all, through the new CA alone", &adm.attempted, adm.attempted.Load()+100)
	stop()
	wg.Wait()
	t.Logf("admissions during the rotation and the CA Secret replacement: %d attempted, %d failed (%d during the rotation), %d not injected; %d certificate reloads of the local server; first errors %v",
		adm.attempted.Load(), adm.failed.Load(), failedRotation, adm.notInjected.Load(), reloads.Load(), adm.errs())
	// The staged next CA lives only PromoteDelay (2 s) in the CA Secret:
	// a poll slowed by load may miss it. The operator's CARotation Event
	// for the step, on the CA Secret, is its own record that it wrote it.
	caEvents, err := caRotationActions(ctx, forced)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("CARotation Events on the CA Secret since the rotation was forced: %v", caEvents)
	for _, s := range []string{"CreateNextCA", "PublishBundle", "PromoteNextCA", "IssueServing", "DropRetiredCA"} {
		found := false
		for k := range at {
			found = found || len(k) >= len(s) && k[:len(s)] == s
		}
		if !found && s == "CreateNextCA" && caEvents[s] > 0 {
			t.Logf("step %s not seen by the poll; the operator's Event records it", s)
			found = true
		}
		if !found {
			t.Errorf("step %s not observed; seen %v", s, at)
		}
	}
	if adm.failed.Load() != 0 || adm.notInjected.Load() != 0 {
		t.Fatalf("%d of %d admissions failed and %d were not injected during the CA rotation and replacement: %v\ninjector log:\n%s",
			adm.failed.Load(), adm.attempted.Load(), adm.notInjected.Load(), adm.errs(), srv.proc.Tail(3000))
	}
	if adm.attempted.Load() < 100 {
		t.Fatalf("only %d admissions attempted", adm.attempted.Load())
	}
	if len(statusSteps) == 0 {
		t.Error("CertificateReady never named a rotation step")
	}
	for _, m := range statusSteps {
		t.Logf("CertificateReady during the rotation: %s", m)
	}
	// Events are recorded asynchronously: polled, not read once.
	var reasons, idleReasons map[string]int
	err = cluster.WaitFor(ctx, time.Minute, sources.EventCARotation+" events", func(ctx context.Context) (bool, error) {
		var err error
		if reasons, err = eventReasons(ctx, "SidecarInjector", si.Name); err != nil {
			return false, err
		}
		idleReasons, err = eventReasons(ctx, "SidecarInjector", idle.Name)
		return reasons[sources.EventCARotation]+idleReasons[sources.EventCARotation] > 0, err
	})
	if err != nil {
		t.Fatalf("%v: %v / %v", err, reasons, idleReasons)
	}
	t.Logf("events: %s %v, %s %v", si.Name, reasons, idle.Name, idleReasons)
	if reasons[apply.EventDriftRepaired]+idleReasons[apply.EventDriftRepaired] != 0 {
		t.Errorf("planned changes (ca-dir, rotation) reported as drift repairs: %v / %v", reasons, idleReasons)
	}
	// OLM was told to hold upgrades during the rotation (olm_test.go).
	held := waitUpgradeable(t, ctx, forced, metav1.ConditionFalse, "CA rotation")
	released := waitUpgradeable(t, ctx, held.at, metav1.ConditionTrue, "no CA rotation")
	t.Logf("OperatorCondition Upgradeable=False %s after the rotation was forced, True again %s later",
		held.at.Sub(forced).Round(time.Millisecond), released.at.Sub(held.at).Round(time.Millisecond))
}

// caRotationActions counts the CARotation Events on the installation CA
// Secret by action (the step: CreateNextCA, PromoteNextCA, ...) created
// at or after since.
func caRotationActions(ctx context.Context, since time.Time) (map[string]int, error) {
	var list eventsv1.EventList
	if err := env.Client.List(ctx, &list, client.InNamespace(operatorNS)); err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, e := range list.Items {
		if e.Reason != sources.EventCARotation || e.Regarding.Kind != "Secret" || e.Regarding.Name != desired.CASecretName {
			continue
		}
		at := e.EventTime.Time
		if e.Series != nil {
			at = e.Series.LastObservedTime.Time
		}
		if !at.Before(since.Truncate(time.Second)) {
			out[e.Action]++
		}
	}
	return out, nil
}
