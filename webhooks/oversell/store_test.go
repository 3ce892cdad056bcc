package oversell

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

func testTime(sec int64) time.Time { return time.Unix(sec, 0) }

// nodeOversells returns one NodeOversell selecting pool=oversell.
func nodeOversells(t testing.TB, name, cpu, mem string, priority int32, created time.Time) []*v1alpha1.NodeOversell {
	t.Helper()
	o := nodeOversellsSel(t, name, &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "oversell"}})[0]
	o.Spec.Ratios = v1alpha1.OversellRatios{CPU: v1alpha1.Ratio(cpu), Memory: v1alpha1.Ratio(mem)}
	o.Spec.Priority = priority
	o.CreationTimestamp = metav1.NewTime(created)
	return []*v1alpha1.NodeOversell{o}
}

func nodeOversellsSel(t testing.TB, name string, sel *metav1.LabelSelector) []*v1alpha1.NodeOversell {
	t.Helper()
	return []*v1alpha1.NodeOversell{{
		ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1, CreationTimestamp: metav1.NewTime(testTime(100))},
		Spec:       v1alpha1.NodeOversellSpec{NodeSelector: sel, Ratios: v1alpha1.OversellRatios{CPU: "2"}},
	}}
}

func TestBuildSnapshotPrecedence(t *testing.T) {
	var objs []*v1alpha1.NodeOversell
	objs = append(objs, nodeOversells(t, "b-old", "2", "", 5, testTime(10))...)
	objs = append(objs, nodeOversells(t, "a-old", "2", "", 5, testTime(10))...)
	objs = append(objs, nodeOversells(t, "newer", "2", "", 5, testTime(20))...)
	objs = append(objs, nodeOversells(t, "oldest-low", "2", "", 1, testTime(1))...)
	objs = append(objs, nodeOversells(t, "top", "2", "", 7, testTime(30))...)
	s := BuildSnapshot(objs, nil, true)
	var got []string
	for _, p := range s.Policies {
		got = append(got, p.Name)
	}
	want := []string{"top", "a-old", "b-old", "newer", "oldest-low"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("order %v, want %v", got, want)
		}
	}
	if p := s.policyFor(map[string]string{"pool": "oversell"}); p.Name != "top" {
		t.Fatalf("selected %s", p.Name)
	}
	if p := s.policyFor(map[string]string{"pool": "other"}); p != nil {
		t.Fatalf("selected %s", p.Name)
	}
}

func TestBuildSnapshotIgnoresInvalid(t *testing.T) {
	bad := func(name string, mutate func(*v1alpha1.NodeOversell)) *v1alpha1.NodeOversell {
		o := nodeOversells(t, name, "2", "", 0, testTime(1))[0]
		mutate(o)
		return o
	}
	objs := []*v1alpha1.NodeOversell{
		bad("low-ratio", func(o *v1alpha1.NodeOversell) { o.Spec.Ratios.CPU = "0.5" }),
		bad("garbage-ratio", func(o *v1alpha1.NodeOversell) { o.Spec.Ratios.Memory = "lots" }),
		bad("no-ratio", func(o *v1alpha1.NodeOversell) { o.Spec.Ratios = v1alpha1.OversellRatios{} }),
		bad("bad-selector", func(o *v1alpha1.NodeOversell) {
			o.Spec.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "pool", Operator: "Near"}}}
		}),
		bad("fine", func(*v1alpha1.NodeOversell) {}),
	}
	s := BuildSnapshot(objs, nil, true)
	if len(s.Policies) != 1 || s.Policies[0].Name != "fine" || len(s.Ignored) != 4 {
		t.Fatalf("policies %d ignored %+v", len(s.Policies), s.Ignored)
	}
}

// A NodeOversell being deleted (finalizer restore in progress) selects no
// node any more, even when it would take precedence.
func TestBuildSnapshotSkipsDeleting(t *testing.T) {
	objs := append(nodeOversells(t, "going", "3", "", 9, testTime(1)), nodeOversells(t, "staying", "2", "", 0, testTime(2))...)
	now := metav1.NewTime(testTime(50))
	objs[0].DeletionTimestamp = &now
	objs[0].Finalizers = []string{"oversell.hookwright.io/restore"}
	s := BuildSnapshot(objs, nil, true)
	if p := s.policyFor(map[string]string{"pool": "oversell"}); p == nil || p.Name != "staying" {
		t.Fatalf("selected %+v, want staying", p)
	}
	if len(s.Policies) != 1 || len(s.Ignored) != 0 || len(s.Deleting) != 1 || s.Deleting[0] != "going" {
		t.Fatalf("policies %d ignored %v deleting %v", len(s.Policies), s.Ignored, s.Deleting)
	}
	if c := newConfigz(s); len(c.Deleting) != 1 || len(c.NodeOversells) != 1 {
		t.Fatalf("configz %+v", c)
	}
	if BuildSnapshot(objs[:1], nil, true).policyFor(map[string]string{"pool": "oversell"}) != nil {
		t.Fatal("a deleting NodeOversell alone still selects the node")
	}
}

func TestSnapshotHashFollowsGenerations(t *testing.T) {
	a := nodeOversells(t, "a", "2", "", 0, testTime(1))
	h1 := BuildSnapshot(a, nil, true).Hash
	a[0].Generation = 2
	if h2 := BuildSnapshot(a, nil, true).Hash; h2 == h1 {
		t.Fatal("hash unchanged after a generation change")
	}
}

// The store publishes each change to the next review: hot reload without a
// restart (webhooks/configwatch feeds it from the informer).
func TestStoreHotReload(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	store := NewStore([]string{"harness"}, logr.Discard(), m)
	h := NewHandler(store, m, logr.Discard())

	no := nodeOversells(t, "oversell-pool", "2", "1.5", 0, testTime(1))[0]
	store.Upsert(no)
	if store.Synced() {
		t.Fatal("synced before the initial list")
	}
	store.MarkSynced()
	if !store.Synced() {
		t.Fatal("not synced after MarkSynced")
	}

	obj := realisticNode("n1", "7600m", "30Gi", nil)
	cpuAfter := func() string {
		got := patchedNode(t, obj, decodeResponse(t, post(h, reviewFor(t, "system:node:n1", kubeletGroups, obj, obj), "application/json")))
		q := got.Status.Allocatable["cpu"]
		return q.String()
	}
	if c := cpuAfter(); c != "15200m" {
		t.Fatalf("cpu %s", c)
	}

	// Ratio changed: next write uses it.
	updated := no.DeepCopy()
	updated.Generation = 2
	updated.Spec.Ratios.CPU = "1.0"
	store.Upsert(updated)
	if c := cpuAfter(); c != "7600m" {
		t.Fatalf("after ratio 1.0: cpu %s", c)
	}
	if g := store.snapshot().Policies[0].Generation; g != 2 {
		t.Fatalf("generation %d", g)
	}

	// Invalid update: that CR is ignored (logged and counted), not a panic.
	broken := updated.DeepCopy()
	broken.Generation = 3
	broken.Spec.Ratios.CPU = "99"
	store.Upsert(broken)
	if len(store.snapshot().Policies) != 0 || testutil.ToFloat64(m.ConfigRejected.WithLabelValues("oversell-pool")) != 1 {
		t.Fatalf("invalid CR served: %+v", store.snapshot())
	}

	// Deleted: deselected on the next write.
	store.Upsert(updated)
	store.Remove("oversell-pool")
	if len(store.snapshot().Policies) != 0 {
		t.Fatal("deleted CR still served")
	}
	if testutil.ToFloat64(m.Policies) != 0 {
		t.Fatal("policies gauge")
	}
}

func TestConfigz(t *testing.T) {
	objs := append(nodeOversells(t, "oversell-pool", "2", "1.5", 0, testTime(1)), nodeOversells(t, "broken", "0", "", 0, testTime(1))...)
	s := BuildSnapshot(objs, []string{"harness"}, true)
	w := httptest.NewRecorder()
	ConfigzHandler(staticSource{s}).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/configz", nil))
	var c Configz
	if err := json.Unmarshal(w.Body.Bytes(), &c); err != nil {
		t.Fatal(err)
	}
	if !c.Synced || c.Hash != s.Hash || len(c.NodeOversells) != 1 || c.NodeOversells[0].Generation != 1 ||
		c.NodeOversells[0].Ratios["memory"] != "1.5" || c.NodeOversells[0].Selector != "pool=oversell" ||
		len(c.Ignored) != 1 || c.TrustedReporters[0] != "harness" {
		t.Fatalf("configz %s", w.Body)
	}
	w = httptest.NewRecorder()
	ConfigzHandler(staticSource{s}).ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/configz", nil))
	if w.Code != http.StatusMethodNotAllowed {
		t.Fatalf("POST %d", w.Code)
	}
}
