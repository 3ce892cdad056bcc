package apply

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// laggingClient is a cache stand-in: while frozen, Get serves the snapshot
// taken when it was frozen (a watch cache that has not seen the latest
// writes yet); writes go through and are counted. noopApply makes Apply
// answer like an API server whose apply changed nothing: the object comes
// back at its current resourceVersion and nothing is stored.
type laggingClient struct {
	client.Client
	mu        sync.Mutex
	frozen    map[client.ObjectKey]client.Object // nil value: not found
	writes    int
	noopApply bool
}

func (c *laggingClient) freeze(t *testing.T, obj client.Object) {
	t.Helper()
	cur := obj.DeepCopyObject().(client.Object)
	err := c.Client.Get(context.Background(), client.ObjectKeyFromObject(obj), cur)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.frozen == nil {
		c.frozen = map[client.ObjectKey]client.Object{}
	}
	if err != nil {
		c.frozen[client.ObjectKeyFromObject(obj)] = nil
		return
	}
	c.frozen[client.ObjectKeyFromObject(obj)] = cur
}

func (c *laggingClient) thaw() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.frozen = nil
}

func (c *laggingClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.mu.Lock()
	snap, ok := c.frozen[key]
	c.mu.Unlock()
	if !ok {
		return c.Client.Get(ctx, key, obj, opts...)
	}
	if snap == nil {
		return c.Client.Get(ctx, client.ObjectKey{Namespace: "absent", Name: "absent"}, obj)
	}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(snap)
	if err != nil {
		return err
	}
	return runtime.DefaultUnstructuredConverter.FromUnstructured(u, obj)
}

func (c *laggingClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	c.mu.Lock()
	c.writes++
	noop := c.noopApply
	c.mu.Unlock()
	if noop {
		u, ok := obj.(interface {
			GetName() string
			GetNamespace() string
			SetResourceVersion(string)
		})
		if !ok {
			return fmt.Errorf("apply configuration %T has no object metadata", obj)
		}
		cur := &metav1.PartialObjectMetadata{}
		cur.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Service"))
		if err := c.Client.Get(ctx, client.ObjectKey{Namespace: u.GetNamespace(), Name: u.GetName()}, cur); err != nil {
			return err
		}
		u.SetResourceVersion(cur.GetResourceVersion())
		return nil
	}
	return c.Client.Apply(ctx, obj, opts...)
}

func (c *laggingClient) Writes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writes
}

func newEnsureReconciler(t *testing.T) (*Applier, *laggingClient, client.Client) {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	api := fake.NewClientBuilder().WithScheme(s).WithObjects(testOwner().Object.DeepCopyObject().(client.Object)).Build()
	lc := &laggingClient{Client: api}
	r := &Applier{
		Client: lc, APIReader: api, Scheme: s, Recorder: events.NewFakeRecorder(100),
		Budget: Budget{Max: 5, Window: time.Hour}, Now: func() time.Time { return t0 },
	}
	return r, lc, api
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

func mustEnsure(t *testing.T, r *Applier, op Owner, obj client.Object) bool {
	t.Helper()
	wrote, err := r.Ensure(context.Background(), op, obj)
	if err != nil {
		t.Fatal(err)
	}
	return wrote
}

// TestEnsureStaleReadAfterRepair: after a repair, reads of the owned object
// at the resourceVersion the repair replaced are the cache lagging behind
// the repair, not new drift: no write, no repair-budget spend (the CI flake
// of TestConflictingWriterBackoff, fixed in e19a66c).
func TestEnsureStaleReadAfterRepair(t *testing.T) {
	r, lc, api := newEnsureReconciler(t)
	op := testOwner()
	svc := testService()
	svcKey := client.ObjectKeyFromObject(svc)
	budgetKey := key(op, "Service", svc)

	if !mustEnsure(t, r, op, svc.DeepCopy()) {
		t.Fatal("first ensure did not create the Service")
	}
	tamper(t, api, svcKey)
	lc.freeze(t, svc) // the cache sees the tampered object ...
	if !mustEnsure(t, r, op, svc.DeepCopy()) {
		t.Fatal("tampered Service not repaired")
	}
	if n := len(r.repairs[budgetKey]); n != 1 {
		t.Fatalf("repairs after one repair: %d", n)
	}
	before := lc.Writes()
	// ... and keeps serving it after the repair: every reconcile until the
	// watch event arrives sees the pre-repair version.
	for i := range 10 {
		if mustEnsure(t, r, op, svc.DeepCopy()) {
			t.Fatalf("stale read %d was written again", i+1)
		}
	}
	if w := lc.Writes() - before; w != 0 {
		t.Fatalf("%d writes on stale reads", w)
	}
	if n := len(r.repairs[budgetKey]); n != 1 {
		t.Fatalf("stale reads spent the repair budget: %d repairs recorded", n)
	}
	// The cache catches up: in sync, nothing to do.
	lc.thaw()
	if mustEnsure(t, r, op, svc.DeepCopy()) || lc.Writes() != before {
		t.Fatal("write after the cache caught up")
	}
	// A real second tamper is drift again: repaired and counted.
	tamper(t, api, svcKey)
	if !mustEnsure(t, r, op, svc.DeepCopy()) {
		t.Fatal("second tamper not repaired")
	}
	if n := len(r.repairs[budgetKey]); n != 2 {
		t.Fatalf("repairs after two repairs: %d", n)
	}
	// A desired-state change while the cache lags behind a repair waits
	// for the repair's event (no write now), then is written as an update
	// (outside the budget).
	tamper(t, api, svcKey)
	lc.freeze(t, svc)
	if !mustEnsure(t, r, op, svc.DeepCopy()) {
		t.Fatal("third tamper not repaired")
	}
	changed := svc.DeepCopy()
	changed.Labels["extra"] = "x"
	before = lc.Writes()
	if mustEnsure(t, r, op, changed.DeepCopy()) || lc.Writes() != before {
		t.Fatal("wrote while the cache was behind the last write")
	}
	lc.thaw()
	if !mustEnsure(t, r, op, changed.DeepCopy()) {
		t.Fatal("changed desired state not written once the cache caught up")
	}
	if n := len(r.repairs[budgetKey]); n != 3 {
		t.Fatalf("an update was counted as a repair: %d repairs", n)
	}
}

// TestEnsureStaleReadAfterCreate: a cache that has not seen a created
// object yet does not cause a second create; an object deleted by someone
// else (the API server agrees it is gone) is created again.
func TestEnsureStaleReadAfterCreate(t *testing.T) {
	r, lc, api := newEnsureReconciler(t)
	op := testOwner()
	svc := testService()
	lc.freeze(t, svc) // not found, and stays so in the cache
	if !mustEnsure(t, r, op, svc.DeepCopy()) {
		t.Fatal("not created")
	}
	for range 5 {
		if mustEnsure(t, r, op, svc.DeepCopy()) {
			t.Fatal("created again while the cache lagged")
		}
	}
	if lc.Writes() != 1 {
		t.Fatalf("%d writes, want 1", lc.Writes())
	}
	if err := api.Delete(context.Background(), svc.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	lc.thaw()
	if !mustEnsure(t, r, op, svc.DeepCopy()) {
		t.Fatal("deleted object not created again")
	}
	if len(r.repairs) != 0 {
		t.Fatalf("creates spent the repair budget: %v", r.repairs)
	}
}

// TestEnsureNoopApply: an apply that does not move the resourceVersion (the
// drift was a field the server normalises) is not repeated while the object
// stays at that version, and spends the budget once at most.
func TestEnsureNoopApply(t *testing.T) {
	r, lc, api := newEnsureReconciler(t)
	op := testOwner()
	svc := testService()
	svcKey := client.ObjectKeyFromObject(svc)
	mustEnsure(t, r, op, svc.DeepCopy())
	tamper(t, api, svcKey) // drift that the "server" will not change back
	lc.noopApply = true
	mustEnsure(t, r, op, svc.DeepCopy())
	before := lc.Writes()
	for range 10 {
		if mustEnsure(t, r, op, svc.DeepCopy()) {
			t.Fatal("no-op apply repeated")
		}
	}
	if lc.Writes() != before {
		t.Fatalf("%d further writes", lc.Writes()-before)
	}
	if n := len(r.repairs[key(op, "Service", svc)]); n > 1 {
		t.Fatalf("%d repairs recorded for one no-op apply", n)
	}
}

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// testOwner is a SidecarInjector "mesh" as the owner of testService.
func testOwner() Owner {
	return Owner{Kind: "SidecarInjector", Object: &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: "mesh", UID: "11111111-2222-3333-4444-555555555555"}}}
}

// testService is a Service the owner controls.
func testService() *corev1.Service {
	o := testOwner()
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: "hookwright-sidecar-mesh", Namespace: "hookwright-system", Labels: map[string]string{"app.kubernetes.io/name": "hookwright-sidecar"},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(o.Object, v1alpha1.GroupVersion.WithKind(o.Kind))},
		},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app.kubernetes.io/name": "hookwright-sidecar"}, Ports: []corev1.ServicePort{{Name: "https", Port: 443}}},
	}
}

// TestEnsureOwnerGone: a reconcile that read its CR before the CR was
// deleted (or replaced) creates nothing; the owner is checked uncached.
func TestEnsureOwnerGone(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, api client.Client)
		reason string
	}{
		{"deleted", func(t *testing.T, api client.Client) {
			if err := api.Delete(context.Background(), testOwner().Object.DeepCopyObject().(client.Object)); err != nil {
				t.Fatal(err)
			}
		}, "not found"},
		{"replaced", func(t *testing.T, api client.Client) {
			if err := api.Delete(context.Background(), testOwner().Object.DeepCopyObject().(client.Object)); err != nil {
				t.Fatal(err)
			}
			o := testOwner().Object.DeepCopyObject().(client.Object)
			o.SetUID("99999999-2222-3333-4444-555555555555")
			if err := api.Create(context.Background(), o); err != nil {
				t.Fatal(err)
			}
		}, "replaced"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, lc, api := newEnsureReconciler(t)
			tc.change(t, api)
			wrote, err := r.Ensure(context.Background(), testOwner(), testService())
			var gone *OwnerGoneError
			if !errors.As(err, &gone) || gone.Reason != tc.reason || wrote {
				t.Fatalf("Ensure = %v, %v; want OwnerGoneError %q and no write", wrote, err, tc.reason)
			}
			if lc.Writes() != 0 {
				t.Fatalf("%d writes, want 0", lc.Writes())
			}
			if err := api.Get(context.Background(), client.ObjectKeyFromObject(testService()), &corev1.Service{}); !apierrors.IsNotFound(err) {
				t.Fatalf("Service exists (%v); want none created", err)
			}
		})
	}
}
