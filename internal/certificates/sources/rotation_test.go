package sources

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"maps"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/apply"
	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/desired"
)

// world is an installation in controller-runtime's fake client: the CRs,
// the CA Secret, each CR's serving Secret and configuration, written by the
// production CA controller and SelfSigned source; served follows each
// serving Secret only after a reload lag, like a mounted Secret.
type world struct {
	c       client.Client
	ca      *CAReconciler
	src     Source
	env     Env
	now     time.Time
	served  map[string][]byte
	changed map[string]time.Time
	steps   map[pki.StepKind]time.Time
}

func newWorld(t *testing.T, extra []byte, cs Settings) *world {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	w := &world{served: map[string][]byte{}, changed: map[string]time.Time{}, steps: map[pki.StepKind]time.Time{}, now: t0}
	w.c = fake.NewClientBuilder().WithScheme(s).WithObjects(testInjector(), testOversell()).Build()
	cs.Clock = pki.ClockFunc(func() time.Time { return w.now })
	w.env = Env{
		Client: w.c, APIReader: w.c, Recorder: &events.FakeRecorder{},
		Settings:     desired.Settings{Namespace: testSettings.Namespace, Image: testSettings.Image, AllowedNamespaces: []string{testSettings.Namespace, "nodes-system"}},
		Certificates: cs,
		Extra:        func() []byte { return extra },
	}
	w.ca = &CAReconciler{Env: w.env}
	w.src = New(w.env)[v1alpha1.CertificateSelfSigned]
	return w
}

// put creates obj or replaces the stored one.
func (w *world) put(t *testing.T, obj client.Object) {
	t.Helper()
	ctx := context.Background()
	cur := obj.DeepCopyObject().(client.Object)
	switch err := w.c.Get(ctx, client.ObjectKeyFromObject(obj), cur); {
	case apierrors.IsNotFound(err):
		if err := w.c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	case err != nil:
		t.Fatal(err)
	default:
		obj.SetResourceVersion(cur.GetResourceVersion())
		if err := w.c.Update(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
}

func (w *world) crs(t *testing.T) []desired.CR {
	t.Helper()
	si, no := &v1alpha1.SidecarInjector{}, &v1alpha1.NodeOversell{}
	if err := w.c.Get(context.Background(), client.ObjectKey{Name: testInjector().Name}, si); err != nil {
		t.Fatal(err)
	}
	if err := w.c.Get(context.Background(), client.ObjectKey{Name: testOversell().Name}, no); err != nil {
		t.Fatal(err)
	}
	return []desired.CR{desired.SidecarCR(si), desired.OversellCR(no)}
}

// reconcileCA runs the CA controller once and returns its RequeueAfter.
func (w *world) reconcileCA(t *testing.T) time.Duration {
	t.Helper()
	out, err := w.ca.advance(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range out.Steps {
		if _, ok := w.steps[s.Kind]; !ok {
			w.steps[s.Kind] = w.now
		}
	}
	return out.RequeueAfter
}

// reconcile runs cr's certificate share and publishes its configuration
// as the lifecycle reconciler does. It returns the source's RequeueAfter.
func (w *world) reconcile(t *testing.T, cr desired.CR) time.Duration {
	t.Helper()
	ctx := context.Background()
	st, err := w.src.Certificate(ctx, cr, func(_ context.Context, obj client.Object) error {
		sec := obj.(*corev1.Secret)
		old := &corev1.Secret{}
		err := w.c.Get(ctx, client.ObjectKeyFromObject(sec), old)
		if err != nil || !bytes.Equal(old.Data[corev1.TLSCertKey], sec.Data[corev1.TLSCertKey]) {
			w.changed[servingKey(cr, w.env.Settings)] = w.now
			if _, ok := w.steps[pki.StepIssueServing]; !ok && err == nil {
				w.steps[pki.StepIssueServing] = w.now
			}
		}
		if err == nil && !drifted(t, sec, old) {
			return nil // the Applier writes only on drift (apply.Drift)
		}
		w.put(t, sec.DeepCopy())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var d *desired.Desired
	switch o := cr.Object.(type) {
	case *v1alpha1.SidecarInjector:
		d = desired.BuildSidecarInjector(o, w.env.Settings)
	case *v1alpha1.NodeOversell:
		d = desired.BuildNodeOversell(o, w.env.Settings)
	}
	var live *admissionregistrationv1.MutatingWebhookConfiguration
	if m := (&admissionregistrationv1.MutatingWebhookConfiguration{}); w.c.Get(ctx, client.ObjectKeyFromObject(d.Webhook), m) == nil {
		live = m
	}
	if ok, _ := Publish(d.Webhook, live, st, w.now, w.env.Certificates.Grace()); ok {
		if _, seen := w.steps[pki.StepPublishBundle]; !seen && live != nil && !bytes.Equal(live.Webhooks[0].ClientConfig.CABundle, d.Webhook.Webhooks[0].ClientConfig.CABundle) {
			w.steps[pki.StepPublishBundle] = w.now
		}
		w.put(t, d.Webhook)
	}
	return st.RequeueAfter
}

func (w *world) bundle(t *testing.T, cr desired.CR) []byte {
	t.Helper()
	m := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := w.c.Get(context.Background(), client.ObjectKey{Name: cr.Base()}, m); err != nil {
		t.Fatal(err)
	}
	return m.Webhooks[0].ClientConfig.CABundle
}

func (w *world) secret(t *testing.T, cr desired.CR) *corev1.Secret {
	t.Helper()
	sec := &corev1.Secret{}
	key := client.ObjectKey{Namespace: desired.ServerNamespace(cr, w.env.Settings), Name: desired.ServingSecretName(cr)}
	if err := w.c.Get(context.Background(), key, sec); err != nil {
		t.Fatal(err)
	}
	return sec
}

func (w *world) caData(t *testing.T) map[string][]byte {
	t.Helper()
	sec := &corev1.Secret{}
	if err := w.c.Get(context.Background(), client.ObjectKey{Namespace: w.env.Settings.Namespace, Name: desired.CASecretName}, sec); err != nil {
		t.Fatal(err)
	}
	return sec.Data
}

// TestRotationNoFailedAdmission drives two CRs (one of each kind) through a
// CA rotation with the production gathering, CA controller and SelfSigned
// source on a fake API, reconciling the CA and then the CRs once per
// simulated second, with pods reloading a new serving certificate 3 s
// after the Secret changed. After every reconcile, each server's
// certificate must verify against its configuration's caBundle: no
// admission would fail.
func TestRotationNoFailedAdmission(t *testing.T) {
	const reloadLag = 3 * time.Second
	extraCA, err := pki.NewCA(pki.CAOptions{CommonName: "ca-dir", Clock: pki.FixedClock(t0)})
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld(t, extraCA.CertPEM, Settings{Policy: pki.Policy{CAValidity: time.Hour, PromoteDelay: 2 * time.Second}, DrainGrace: 10 * time.Second})
	for range 3 {
		w.reconcileCA(t)
		for _, cr := range w.crs(t) {
			w.reconcile(t, cr)
		}
	}
	for _, cr := range w.crs(t) {
		w.served[servingKey(cr, w.env.Settings)] = w.secret(t, cr).Data[corev1.TLSCertKey]
	}
	firstCA := mustCA(t, w.caData(t))
	w.now = pki.CARotationTime(firstCA, w.env.Certificates.Policy)
	clear(w.steps)
	for i := range 120 {
		w.reconcileCA(t)
		for _, cr := range w.crs(t) {
			w.reconcile(t, cr)
			// Pods pick up the Secret after the lag.
			for k, at := range w.changed {
				if w.now.Sub(at) >= reloadLag {
					for _, o := range w.crs(t) {
						if servingKey(o, w.env.Settings) == k {
							w.served[k] = w.secret(t, o).Data[corev1.TLSCertKey]
						}
					}
				}
			}
			for _, o := range w.crs(t) {
				k, cfg := servingKey(o, w.env.Settings), o.Base()
				leaf, err := pki.ParseCertPEM(w.served[k])
				if err != nil {
					t.Fatal(err)
				}
				if err := pki.VerifyServing(leaf, w.bundle(t, o), pki.ServingDNSNames(cfg, desired.ServerNamespace(o, w.env.Settings), "")[0], w.now); err != nil {
					t.Fatalf("second %d: %s serves a certificate its configuration does not trust: %v", i, cfg, err)
				}
				if !pki.BundleContains(w.bundle(t, o), extraCA.Cert) {
					t.Fatalf("second %d: %s lost the ca-dir CA", i, cfg)
				}
			}
		}
		w.now = w.now.Add(time.Second)
	}
	steps := w.steps
	for _, k := range []pki.StepKind{pki.StepCreateNextCA, pki.StepPublishBundle, pki.StepPromoteNextCA, pki.StepIssueServing, pki.StepDropRetiredCA} {
		if _, ok := steps[k]; !ok {
			t.Fatalf("step %s never ran; ran %v", k, steps)
		}
	}
	if !(steps[pki.StepCreateNextCA].Before(steps[pki.StepPromoteNextCA]) && steps[pki.StepPromoteNextCA].Before(steps[pki.StepDropRetiredCA])) {
		t.Fatalf("step order %v", steps)
	}
	t.Logf("steps at (from rotation due): next %s, promote %s, issue %s, drop %s",
		steps[pki.StepCreateNextCA].Sub(steps[pki.StepCreateNextCA]), steps[pki.StepPromoteNextCA].Sub(steps[pki.StepCreateNextCA]),
		steps[pki.StepIssueServing].Sub(steps[pki.StepCreateNextCA]), steps[pki.StepDropRetiredCA].Sub(steps[pki.StepCreateNextCA]))
	// Rotated: a new signing CA, the old one gone from every bundle.
	if mustCA(t, w.caData(t)).Equal(firstCA) {
		t.Fatal("CA not rotated")
	}
	for _, o := range w.crs(t) {
		b := w.bundle(t, o)
		if pki.BundleContains(b, firstCA) {
			t.Fatalf("%s still trusts the old CA", o.Base())
		}
		if n, _ := pki.ParseCertsPEM(b); len(n) != 2 {
			t.Fatalf("%s bundle has %d CAs, want the new CA and the ca-dir CA", o.Base(), len(n))
		}
	}
}

func TestPlannerView(t *testing.T) {
	own, err := newCASecretData(t0, pki.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.NewCA(pki.CAOptions{CommonName: "other", Clock: pki.FixedClock(t0)})
	if err != nil {
		t.Fatal(err)
	}
	ownCA := mustCA(t, own)
	published := unionBundle(own[pki.SecretKeyBundle], other.CertPEM)
	// The ca-dir CA is hidden from the planner; the operator's own CA stays
	// even when the ca-dir holds it too (the mounted CA Secret).
	view := plannerView(published, append(append([]byte{}, other.CertPEM...), own[pki.SecretKeyBundle]...), own)
	got, err := pki.ParseCertsPEM(view)
	if err != nil || len(got) != 1 || !got[0].Equal(ownCA) {
		t.Fatalf("view %d certs, err %v", len(got), err)
	}
	if v := plannerView(published, nil, own); !bytes.Equal(v, published) {
		t.Fatal("without extra CAs the view must be the published bundle")
	}
}

// drifted reports whether the Applier would write desired over live.
func drifted(t *testing.T, desired, live client.Object) bool {
	t.Helper()
	gvk := corev1.SchemeGroupVersion.WithKind("Secret")
	want, err := apply.ToApplyObject(desired, gvk)
	if err != nil {
		t.Fatal(err)
	}
	l, err := runtime.DefaultUnstructuredConverter.ToUnstructured(live)
	if err != nil {
		t.Fatal(err)
	}
	return len(apply.Drift(want.Object, l)) > 0
}

// versions are the contents of every object a controller watches that the
// certificate work writes (the fake client's Update bumps the
// resourceVersion even of an unchanged object; the API server does not).
func (w *world) versions(t *testing.T) map[string]string {
	t.Helper()
	v := map[string]string{}
	var secs corev1.SecretList
	var mwcs admissionregistrationv1.MutatingWebhookConfigurationList
	for _, l := range []client.ObjectList{&secs, &mwcs} {
		if err := w.c.List(context.Background(), l); err != nil {
			t.Fatal(err)
		}
	}
	for _, o := range secs.Items {
		v["secret/"+o.Namespace+"/"+o.Name] = fmt.Sprint(o.Data, o.Annotations)
	}
	for _, o := range mwcs.Items {
		for _, wh := range o.Webhooks {
			v["mwc/"+o.Name+"/"+wh.Name] = string(wh.ClientConfig.CABundle)
		}
	}
	return v
}

// runOnEvents runs each controller only when it would run in a manager:
// when an object it watches changed or its RequeueAfter came due, never on
// a fixed tick, so a step that becomes due with time alone (a draining
// grace period ending) is reached only if a controller asked to be woken
// for it. It returns how much simulated time passed until done held, and
// false if it did not within limit.
func (w *world) runOnEvents(t *testing.T, limit time.Duration, done func() bool) (time.Duration, bool) {
	t.Helper()
	// due is when each controller runs next: "ca" and each CR's base name.
	due := map[string]time.Time{"ca": w.now}
	for _, cr := range w.crs(t) {
		due[cr.Base()] = w.now
	}
	start := w.now
	for w.now.Sub(start) < limit {
		before := w.versions(t)
		for name, at := range due {
			if at.IsZero() || w.now.Before(at) {
				continue
			}
			due[name] = time.Time{}
			var after time.Duration
			if name == "ca" {
				after = w.reconcileCA(t)
			} else {
				for _, cr := range w.crs(t) {
					if cr.Base() == name {
						after = w.reconcile(t, cr)
					}
				}
			}
			if after > 0 {
				due[name] = w.now.Add(after)
			}
		}
		if !maps.Equal(before, w.versions(t)) {
			// Every controller watches the CA Secret, the serving Secrets and
			// the configurations (an over-approximation for the CRs). CR
			// status updates, which also wake the CA controller, are not
			// modelled: nothing may depend on them.
			for name := range due {
				due[name] = w.now
			}
			continue
		}
		if done() {
			return w.now.Sub(start), true
		}
		w.now = w.now.Add(time.Second)
	}
	return limit, false
}

// settled reports whether every serving certificate is signed by the
// active CA and no configuration trusts old.
func (w *world) settled(t *testing.T, old *x509.Certificate) bool {
	t.Helper()
	active := mustCA(t, w.caData(t))
	for _, cr := range w.crs(t) {
		leaf, err := pki.ParseCertPEM(w.secret(t, cr).Data[corev1.TLSCertKey])
		if err != nil || !pki.SignedBy(leaf, active) || pki.BundleContains(w.bundle(t, cr), old) {
			return false
		}
	}
	return !active.Equal(old)
}

// TestConvergesOnEventsAndRequeues runs a due CA rotation and a deleted CA
// Secret (its CA known only from the caBundles) on events and requeues
// alone: each ends with every certificate from the new CA and the old CA
// out of every configuration, once the replaced certificates' grace ends.
func TestConvergesOnEventsAndRequeues(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(w *world)
	}{
		{"rotation due", func(w *world) {
			w.now = pki.CARotationTime(mustCA(t, w.caData(t)), w.env.Certificates.Policy)
		}},
		{"CA Secret and a serving Secret deleted", func(w *world) {
			for _, o := range []client.Object{
				&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: w.env.Settings.Namespace, Name: desired.CASecretName}},
				w.secret(t, w.crs(t)[1]),
			} {
				if err := w.c.Delete(context.Background(), o); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"CA Secret deleted", func(w *world) {
			if err := w.c.Delete(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: w.env.Settings.Namespace, Name: desired.CASecretName}}); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, nil, Settings{Policy: pki.Policy{CAValidity: time.Hour, PromoteDelay: 2 * time.Second}, DrainGrace: 10 * time.Second})
			for range 3 {
				w.reconcileCA(t)
				for _, cr := range w.crs(t) {
					w.reconcile(t, cr)
				}
			}
			old := mustCA(t, w.caData(t))
			tc.start(w)
			took, ok := w.runOnEvents(t, 2*time.Minute, func() bool { return w.settled(t, old) })
			if !ok {
				t.Fatalf("after %s the old CA is still trusted or signs a serving certificate; steps %v", took, w.steps)
			}
			t.Logf("settled %s after the start", took)
		})
	}
}
