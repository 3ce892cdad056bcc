package sources

import (
	"bytes"
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
)

// TestRenewOnceWhileTheCacheLags: a renew-now request is answered once
// even when a reconcile reads the serving Secret from a cache that has not
// seen the renewed one yet (a reconcile woken by another object right
// after the renewal; test/operator renewed twice under load): the pending
// renewal is confirmed from the API server before it is acted on.
func TestRenewOnceWhileTheCacheLags(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, nil, Settings{})
	for range 2 {
		w.reconcileCA(t)
		for _, cr := range w.crs(t) {
			w.reconcile(t, cr)
		}
	}
	cr := w.crs(t)[0]
	key := client.ObjectKey{Namespace: desired.ServerNamespace(cr, w.env.Settings), Name: desired.ServingSecretName(cr)}
	before := &corev1.Secret{}
	if err := w.c.Get(ctx, key, before); err != nil {
		t.Fatal(err)
	}
	si := cr.Object.(*v1alpha1.SidecarInjector)
	si.Annotations = map[string]string{v1alpha1.AnnotationRenewCertificate: "2026-12-05T17:42:00Z"}
	w.put(t, si)
	w.reconcile(t, w.crs(t)[0])
	after := &corev1.Secret{}
	if err := w.c.Get(ctx, key, after); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(after.Data[corev1.TLSCertKey], before.Data[corev1.TLSCertKey]) || after.Annotations[annotationRenewedFor] != si.Annotations[v1alpha1.AnnotationRenewCertificate] {
		t.Fatalf("the request was not answered: renewed-for %q", after.Annotations[annotationRenewedFor])
	}

	// The cache: the CRs as now, the serving Secret as before the renewal.
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	crs := w.crs(t)
	stale := before.DeepCopy()
	stale.ResourceVersion = ""
	cache := fake.NewClientBuilder().WithScheme(s).WithObjects(crs[0].Object, crs[1].Object, stale).Build()
	env := w.env
	env.Client = cache // APIReader stays the API server's view
	g, err := gather(ctx, env, nil, w.now)
	if err != nil {
		t.Fatal(err)
	}
	if sv := g.State.Serving[servingKey(crs[0], env.Settings)]; sv.RenewRequested {
		t.Fatal("a renewal already answered counts as requested again when the cache lags")
	}
	if got := g.Secrets[servingKey(crs[0], env.Settings)]; got == nil || !bytes.Equal(got.Data[corev1.TLSCertKey], after.Data[corev1.TLSCertKey]) {
		t.Fatal("the decision is not taken on the Secret the API server holds")
	}
}
