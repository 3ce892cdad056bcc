package certsource

import (
	"bytes"
	"context"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/certs"
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
	steps   map[certs.StepKind]time.Time
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
	w := &world{served: map[string][]byte{}, changed: map[string]time.Time{}, steps: map[certs.StepKind]time.Time{}, now: t0}
	w.c = fake.NewClientBuilder().WithScheme(s).WithObjects(testInjector(), testOversell()).Build()
	cs.Clock = certs.ClockFunc(func() time.Time { return w.now })
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

// reconcileCA runs the CA controller once.
func (w *world) reconcileCA(t *testing.T) {
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
}

// reconcile runs cr's certificate share and publishes its configuration
// as the lifecycle reconciler does.
func (w *world) reconcile(t *testing.T, cr desired.CR) {
	t.Helper()
	ctx := context.Background()
	st, err := w.src.Certificate(ctx, cr, func(_ context.Context, obj client.Object) error {
		sec := obj.(*corev1.Secret)
		old := &corev1.Secret{}
		if err := w.c.Get(ctx, client.ObjectKeyFromObject(sec), old); err != nil || !bytes.Equal(old.Data[corev1.TLSCertKey], sec.Data[corev1.TLSCertKey]) {
			w.changed[servingKey(cr, w.env.Settings)] = w.now
			if _, ok := w.steps[certs.StepIssueServing]; !ok && err == nil {
				w.steps[certs.StepIssueServing] = w.now
			}
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
		if _, seen := w.steps[certs.StepPublishBundle]; !seen && live != nil && !bytes.Equal(live.Webhooks[0].ClientConfig.CABundle, d.Webhook.Webhooks[0].ClientConfig.CABundle) {
			w.steps[certs.StepPublishBundle] = w.now
		}
		w.put(t, d.Webhook)
	}
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
	extraCA, err := certs.NewCA(certs.CAOptions{CommonName: "ca-dir", Clock: certs.FixedClock(t0)})
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld(t, extraCA.CertPEM, Settings{Policy: certs.Policy{CAValidity: time.Hour, PromoteDelay: 2 * time.Second}, DrainGrace: 10 * time.Second})
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
	w.now = certs.CARotationTime(firstCA, w.env.Certificates.Policy)
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
				leaf, err := certs.ParseCertPEM(w.served[k])
				if err != nil {
					t.Fatal(err)
				}
				if err := certs.VerifyServing(leaf, w.bundle(t, o), certs.ServingDNSNames(cfg, desired.ServerNamespace(o, w.env.Settings), "")[0], w.now); err != nil {
					t.Fatalf("second %d: %s serves a certificate its configuration does not trust: %v", i, cfg, err)
				}
				if !certs.BundleContains(w.bundle(t, o), extraCA.Cert) {
					t.Fatalf("second %d: %s lost the ca-dir CA", i, cfg)
				}
			}
		}
		w.now = w.now.Add(time.Second)
	}
	steps := w.steps
	for _, k := range []certs.StepKind{certs.StepCreateNextCA, certs.StepPublishBundle, certs.StepPromoteNextCA, certs.StepIssueServing, certs.StepDropRetiredCA} {
		if _, ok := steps[k]; !ok {
			t.Fatalf("step %s never ran; ran %v", k, steps)
		}
	}
	if !(steps[certs.StepCreateNextCA].Before(steps[certs.StepPromoteNextCA]) && steps[certs.StepPromoteNextCA].Before(steps[certs.StepDropRetiredCA])) {
		t.Fatalf("step order %v", steps)
	}
	t.Logf("steps at (from rotation due): next %s, promote %s, issue %s, drop %s",
		steps[certs.StepCreateNextCA].Sub(steps[certs.StepCreateNextCA]), steps[certs.StepPromoteNextCA].Sub(steps[certs.StepCreateNextCA]),
		steps[certs.StepIssueServing].Sub(steps[certs.StepCreateNextCA]), steps[certs.StepDropRetiredCA].Sub(steps[certs.StepCreateNextCA]))
	// Rotated: a new signing CA, the old one gone from every bundle.
	if mustCA(t, w.caData(t)).Equal(firstCA) {
		t.Fatal("CA not rotated")
	}
	for _, o := range w.crs(t) {
		b := w.bundle(t, o)
		if certs.BundleContains(b, firstCA) {
			t.Fatalf("%s still trusts the old CA", o.Base())
		}
		if n, _ := certs.ParseCertsPEM(b); len(n) != 2 {
			t.Fatalf("%s bundle has %d CAs, want the new CA and the ca-dir CA", o.Base(), len(n))
		}
	}
}

func TestPlannerView(t *testing.T) {
	own, err := newCASecretData(t0, certs.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := certs.NewCA(certs.CAOptions{CommonName: "other", Clock: certs.FixedClock(t0)})
	if err != nil {
		t.Fatal(err)
	}
	ownCA := mustCA(t, own)
	published := unionBundle(own[certs.SecretKeyBundle], other.CertPEM)
	// The ca-dir CA is hidden from the planner; the operator's own CA stays
	// even when the ca-dir holds it too (the mounted CA Secret).
	view := plannerView(published, append(append([]byte{}, other.CertPEM...), own[certs.SecretKeyBundle]...), own)
	got, err := certs.ParseCertsPEM(view)
	if err != nil || len(got) != 1 || !got[0].Equal(ownCA) {
		t.Fatalf("view %d certs, err %v", len(got), err)
	}
	if v := plannerView(published, nil, own); !bytes.Equal(v, published) {
		t.Fatal("without extra CAs the view must be the published bundle")
	}
}
