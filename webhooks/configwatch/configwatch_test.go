package configwatch

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache/informertest"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllertest"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/test/cluster"
	"github.com/hookwright/hookwright/webhooks/oversell"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

// fakeCache is a cache whose informer for kind is fi, not yet synced.
func fakeCache(t *testing.T, kind string, fi *controllertest.FakeInformer) *informertest.FakeInformers {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return &informertest.FakeInformers{Scheme: scheme, InformersByGVK: map[schema.GroupVersionKind]toolscache.SharedIndexInformer{
		v1alpha1.GroupVersion.WithKind(kind): fi,
	}}
}

// The injector's shell offers its own SidecarInjector's versions to the
// store, ignores other names and keeps serving through a deletion.
func TestSidecarInjector(t *testing.T) {
	fi := controllertest.NewFakeInformer()
	reg := prometheus.NewRegistry()
	m, err := sidecar.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	store := &sidecar.Store{}
	if err := SidecarInjector(context.Background(), fakeCache(t, "SidecarInjector", fi), store, "mesh", m, logr.Discard()); err != nil {
		t.Fatal(err)
	}
	cr := func(name string, gen int64, tmpl string) *v1alpha1.SidecarInjector {
		return &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: name, UID: "u1", Generation: gen},
			Spec: v1alpha1.SidecarInjectorSpec{DefaultTemplates: []string{"proxy"},
				Templates: []v1alpha1.NamedTemplate{{Name: "proxy", Template: tmpl}}}}
	}
	good := "spec:\n  containers:\n  - name: proxy\n    image: proxy:1\n"
	fi.Add(cr("other", 1, good))
	if store.Load() != nil {
		t.Fatal("another SidecarInjector was loaded")
	}
	v1 := cr("mesh", 1, good)
	fi.Add(v1)
	if c := store.Load(); c == nil || c.Generation != 1 {
		t.Fatalf("loaded %+v", c)
	}
	v2 := cr("mesh", 2, "{{ .Nope")
	fi.Update(v1, v2)
	if c := store.Load(); c.Generation != 1 {
		t.Fatalf("a broken version replaced the good one: serving %d", c.Generation)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`# HELP hookwright_sidecar_config_errors_total SidecarInjector versions that failed to compile and were not loaded.
# TYPE hookwright_sidecar_config_errors_total counter
hookwright_sidecar_config_errors_total{injector="mesh"} 1
`), "hookwright_sidecar_config_errors_total"); err != nil {
		t.Fatal(err)
	}
	v3 := cr("mesh", 3, good)
	fi.Update(v2, v3)
	fi.Delete(v3)
	if c := store.Load(); c == nil || c.Generation != 3 {
		t.Fatalf("after update and delete: %+v", c)
	}
}

// The oversell shell upserts, removes (tombstones too) and marks the store
// synced once the informer is.
func TestNodeOversells(t *testing.T) {
	fi := controllertest.NewFakeInformer() // not yet synced
	store := oversell.NewStore(nil, logr.Discard(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := NodeOversells(ctx, fakeCache(t, "NodeOversell", fi), store, logr.Discard()); err != nil {
		t.Fatal(err)
	}
	no := &v1alpha1.NodeOversell{ObjectMeta: metav1.ObjectMeta{Name: "pool", Generation: 1},
		Spec: v1alpha1.NodeOversellSpec{Ratios: v1alpha1.OversellRatios{CPU: "2"}}}
	fi.Add(no)
	if store.Synced() {
		t.Fatal("synced before the informer")
	}
	fi.Synced()
	if err := cluster.WaitFor(ctx, 30*time.Second, "store synced", func(context.Context) (bool, error) { return store.Synced(), nil }); err != nil {
		t.Fatal(err)
	}
	if z := configz(t, store); len(z.NodeOversells) != 1 || z.NodeOversells[0].Generation != 1 {
		t.Fatalf("configz %+v", z)
	}
	next := no.DeepCopy()
	next.Generation = 2
	fi.Update(no, next)
	if z := configz(t, store); len(z.NodeOversells) != 1 || z.NodeOversells[0].Generation != 2 {
		t.Fatalf("after update: configz %+v", z)
	}
	fi.Delete(next)
	if z := configz(t, store); len(z.NodeOversells) != 0 {
		t.Fatalf("after a delete: configz %+v", z)
	}
	// A deletion the watch missed arrives as a tombstone.
	if o, ok := nodeOversell(toolscache.DeletedFinalStateUnknown{Key: "pool", Obj: next}); !ok || o.Name != "pool" {
		t.Fatal("tombstone not unwrapped")
	}
}

func configz(t *testing.T, s *oversell.Store) oversell.Configz {
	t.Helper()
	w := httptest.NewRecorder()
	oversell.ConfigzHandler(s).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/configz", nil))
	var z oversell.Configz
	if err := json.Unmarshal(w.Body.Bytes(), &z); err != nil {
		t.Fatal(err)
	}
	return z
}

// MarkGone follows one object: true while it is being deleted and after
// its deletion, false again when it exists anew; other
// names never move it.
func TestMarkGone(t *testing.T) {
	fi := controllertest.NewFakeInformer()
	var gone atomic.Bool
	if err := MarkGone(context.Background(), fakeCache(t, "SidecarInjector", fi), &v1alpha1.SidecarInjector{}, "mesh", &gone); err != nil {
		t.Fatal(err)
	}
	si := func(name string, deleting bool) *v1alpha1.SidecarInjector {
		o := &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if deleting {
			o.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
		}
		return o
	}
	for i, step := range []struct {
		do   func()
		want bool
	}{
		{func() { fi.Add(si("mesh", false)) }, false},
		{func() { fi.Update(si("mesh", false), si("mesh", true)) }, true},
		{func() { fi.Add(si("mesh", false)) }, false},
		{func() { fi.Delete(si("other", false)) }, false},
		{func() { fi.Update(si("other", false), si("other", true)) }, false},
		{func() { fi.Delete(si("mesh", false)) }, true},
	} {
		step.do()
		if got := gone.Load(); got != step.want {
			t.Fatalf("step %d: gone %v, want %v", i, got, step.want)
		}
	}
}
