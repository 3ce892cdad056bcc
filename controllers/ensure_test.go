package controllers

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/hookwright/hookwright/internal/apply"
	"github.com/hookwright/hookwright/internal/desired"
	corev1 "k8s.io/api/core/v1"
)

func newEnsureReconciler(t *testing.T) (*reconciler, client.Client) {
	t.Helper()
	s := testScheme(t)
	api := fake.NewClientBuilder().WithScheme(s).Build()
	r := &reconciler{
		Client: api, APIReader: api, Scheme: s, Recorder: events.NewFakeRecorder(100),
		Settings: Settings{Settings: testSettings.Settings, Repairs: apply.Budget{Max: 5, Window: time.Hour}},
		kind:     sidecarKind{}, Now: func() time.Time { return t0 },
	}
	r.applier = newApplier(r)
	return r, api
}

// tamper changes the Service's selector as another writer would.
func tamper(t *testing.T, api client.Client, key client.ObjectKey) {
	t.Helper()
	svc := &corev1.Service{}
	if err := api.Get(context.Background(), key, svc); err != nil {
		t.Fatal(err)
	}
	svc.Spec.Selector = map[string]string{"someone": "else"}
	if err := api.Update(context.Background(), svc); err != nil {
		t.Fatal(err)
	}
}

func mustEnsure(t *testing.T, r *reconciler, op desired.CR, obj client.Object) {
	t.Helper()
	if _, err := r.ensure(context.Background(), op, obj); err != nil {
		t.Fatal(err)
	}
}

// TestForgetDeletedCR: the per-object memory of a CR is dropped when the CR
// is gone, so years of created and deleted CRs do not grow it.
func TestForgetDeletedCR(t *testing.T) {
	r, api := newEnsureReconciler(t)
	si := testInjector()
	op := desired.SidecarCR(si)
	other := testInjector()
	other.Name = "mesh2"
	other.UID = "mesh2-uid"
	// Ensure creates children only for CRs the API server has.
	for _, cr := range []client.Object{si.DeepCopy(), other.DeepCopy()} {
		if err := api.Create(context.Background(), cr); err != nil {
			t.Fatal(err)
		}
	}
	for _, o := range desired.BuildSidecarInjector(si, r.Settings.Settings).Objects() {
		mustEnsure(t, r, op, o)
	}
	oop := desired.SidecarCR(other)
	svc2 := desired.BuildSidecarInjector(other, r.Settings.Settings).Service
	mustEnsure(t, r, oop, svc2)
	tamper(t, api, client.ObjectKeyFromObject(svc2))
	mustEnsure(t, r, oop, svc2)
	n := r.applier.Remembered()
	if n == 0 {
		t.Fatal("nothing remembered")
	}
	for _, cr := range []client.Object{si.DeepCopy(), other.DeepCopy()} {
		if err := api.Delete(context.Background(), cr); err != nil {
			t.Fatal(err)
		}
	}
	// mesh is gone from the API: Reconcile finds it gone.
	if _, err := r.Reconcile(context.Background(), requestFor("mesh")); err != nil {
		t.Fatal(err)
	}
	if got := r.applier.Remembered(); got != 3 { // mesh2: applied, wrote, repairs
		t.Fatalf("%d entries remembered after mesh was deleted (from %d), want mesh2's 3 (repairs, applied, wrote)", got, n)
	}
	if _, err := r.Reconcile(context.Background(), requestFor("mesh2")); err != nil {
		t.Fatal(err)
	}
	if got := r.applier.Remembered(); got != 0 {
		t.Fatalf("%d entries remembered after every CR was deleted", got)
	}
}

func requestFor(name string) reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Name: name}}
}
