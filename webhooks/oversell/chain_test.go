package oversell

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// chainModel is a cluster of overlapping NodeOversells as the API server
// sees them: one server and one webhook configuration per CR, the webhook's
// objectSelector the CR's nodeSelector (controllers.BuildNodeOversell), the
// webhooks called in series in configuration name order (k8s.io/apiserver
// pkg/admission/configuration/mutating_webhook_manager.go sorts by name),
// each seeing the previous one's output, each server acting through Route
// with its own snapshot, which may lag behind the CRs.
type chainModel struct {
	t      *testing.T
	rng    *rand.Rand
	crs    map[string]*v1alpha1.NodeOversell // current CRs (deleting ones have a deletionTimestamp)
	hooks  map[string]labels.Selector        // webhook configurations the API server calls
	snaps  map[string]*Snapshot              // each server's view
	lag    bool                              // servers refresh their view at random
	stored NodeState
	lister NodeState // the kubelet's informer copy
	real   [numResources]string
	clock  time.Time
	calls  int // webhook calls
	writes int
	acted  bool            // a server changed the last write
	reals  map[string]bool // every value the kubelet reported
}

var chainNames = []string{"pool-a", "pool-b", "pool-c"}

func (m *chainModel) newCR(name string) {
	m.clock = m.clock.Add(time.Second)
	pools := []string{"x", "y", "z"}
	var in []string
	for _, p := range pools {
		if m.rng.IntN(2) == 0 {
			in = append(in, p)
		}
	}
	if len(in) == 0 {
		in = []string{pools[m.rng.IntN(3)]}
	}
	no := &v1alpha1.NodeOversell{
		ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1, CreationTimestamp: metav1.NewTime(m.clock)},
		Spec: v1alpha1.NodeOversellSpec{
			NodeSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "pool", Operator: metav1.LabelSelectorOpIn, Values: in}}},
			Priority:     int32(m.rng.IntN(3)),
		},
	}
	m.setRatios(no)
	m.crs[name] = no
	sel, err := metav1.LabelSelectorAsSelector(no.Spec.NodeSelector)
	if err != nil {
		m.t.Fatal(err)
	}
	m.hooks[name] = sel
}

// setRatios picks ratios for which no real value equals another's
// amplification (reals are 3000-3900m and 12-15Gi, ratios 1 or ≥ 1.5), so
// the documented misreading of such a coincidence never occurs.
func (m *chainModel) setRatios(no *v1alpha1.NodeOversell) {
	cpu := []v1alpha1.Ratio{"1", "1.5", "2", "3", "2.5"}
	mem := []v1alpha1.Ratio{"1", "1.5", "2"}
	no.Spec.Ratios = v1alpha1.OversellRatios{CPU: cpu[m.rng.IntN(len(cpu))], Memory: mem[m.rng.IntN(len(mem))]}
}

func (m *chainModel) objs() []*v1alpha1.NodeOversell {
	var out []*v1alpha1.NodeOversell
	for _, n := range slices.Sorted(maps.Keys(m.crs)) {
		out = append(out, m.crs[n].DeepCopy())
	}
	return out
}

// refresh updates the servers' snapshots: all of them, or with lag a random
// subset (their informers deliver the change at different times).
func (m *chainModel) refresh(all bool) {
	cur := BuildSnapshot(m.objs(), nil, true)
	for _, n := range chainNames {
		if all || !m.lag || m.rng.IntN(2) == 0 {
			m.snaps[n] = cur
		}
	}
}

// truth is the NodeOversell that wins the node by the current CRs.
func (m *chainModel) truth(nodeLabels map[string]string) *Policy {
	return BuildSnapshot(m.objs(), nil, true).policyFor(nodeLabels)
}

// admit runs one nodes/status write through the webhook chain and stores it.
func (m *chainModel) admit(writer WriterClass, obj NodeState) {
	m.writes++
	m.acted = false
	old := cloneState(m.stored)
	for _, name := range slices.Sorted(maps.Keys(m.hooks)) { // configuration name order: hookwright-oversell-<name>
		sel := m.hooks[name]
		if !sel.Matches(labels.Set(obj.Labels)) && !sel.Matches(labels.Set(old.Labels)) {
			continue // objectSelector: neither the object nor the old object matches
		}
		m.calls++
		p, act := m.snaps[name].Route(obj.Labels, name)
		if !act {
			continue
		}
		d := Decide(Input{Writer: writer, Object: obj, Old: &old, Policy: p})
		if !d.Apply && d.Reason != reasonNotSelected && d.Reason != reasonNoAllocatable {
			m.t.Fatalf("write %d: server %s made no decision (%s) for %+v over %+v", m.writes, name, d.Reason, obj, old)
		}
		obj, _ = applyDecision(m.t, obj, d)
		m.acted = true
	}
	m.stored = obj
	if chainTrace {
		m.t.Logf("write %d by %v: %v -> %v %v", m.writes, writer, old.Allocatable, m.stored.Allocatable, m.stored.Annotations)
	}
}

var chainTrace = false

// kubelet writes as the kubelet does: a two-way merge from its informer copy
// (fresh, or one write behind) to the values it computes.
func (m *chainModel) kubelet(fresh bool) {
	if fresh {
		m.lister = cloneState(m.stored)
	}
	merged := cloneState(m.stored)
	for r := Resource(0); r < numResources; r++ {
		if m.lister.Allocatable[resourceNames[r]] != m.real[r] {
			merged.Allocatable[resourceNames[r]] = m.real[r]
		}
	}
	m.admit(writerKubelet, merged)
}

// restore is the operator's RestorePatch of a node no longer selected by
// (or being deleted with) the NodeOversell named in applied-by.
func (m *chainModel) restore() bool {
	by := m.stored.Annotations[annApplied]
	if by == "" {
		return false
	}
	cr, ok := m.crs[by]
	if ok && cr.DeletionTimestamp == nil && m.hooks[by].Matches(labels.Set(m.stored.Labels)) {
		return false
	}
	st := readStored(m.stored.Annotations)
	obj := cloneState(m.stored)
	for r := Resource(0); r < numResources; r++ {
		if st.rawOK[r] {
			obj.Allocatable[resourceNames[r]] = st.raw[r].String()
		}
	}
	for _, k := range annotationKeys {
		delete(obj.Annotations, k)
	}
	m.admit(WriterOther, obj)
	return true
}

// check asserts the stored node: a recorded raw is the kubelet's real value
// (never a webhook's output); published ≤ capacity × ratio. With exact (all
// servers' views current), the winner's server has applied its ratio, or,
// when none selects the node, it carries the real value and no bookkeeping.
func (m *chainModel) check(exact bool) {
	m.t.Helper()
	n := m.stored
	st := readStored(n.Annotations)
	win := m.truth(n.Labels)
	for r := Resource(0); r < numResources; r++ {
		got := resource.MustParse(n.Allocatable[resourceNames[r]])
		capacity := resource.MustParse(n.Capacity[resourceNames[r]])
		if st.present && (!st.rawOK[r] || !m.reals[st.raw[r].String()] || exact && st.raw[r].String() != m.real[r]) {
			m.t.Fatalf("write %d: raw %s = %s, real %s (annotations %v)", m.writes, r, st.raw[r].String(), m.real[r], n.Annotations)
		}
		if !exact && !m.acted {
			// Every server called believed another one wins: the write
			// is stored as written, as during an outage under Ignore.
			continue
		}
		maxRatio := Ratio{}
		for _, s := range m.snaps {
			for _, p := range s.Policies {
				if !maxRatio.IsSet() || p.Ratios[r].micro > maxRatio.micro {
					maxRatio = p.Ratios[r]
				}
			}
		}
		if win != nil && win.Ratios[r].micro > maxRatio.micro {
			maxRatio = win.Ratios[r]
		}
		checkBound(m.t, m.writes, r, got, capacity, maxRatio)
		if !exact {
			continue
		}
		var want resource.Quantity
		if win == nil {
			want = resource.MustParse(m.real[r])
		} else {
			want = Amplify(r, resource.MustParse(m.real[r]), &capacity, win.Ratios[r])
		}
		if got.Cmp(want) != 0 {
			m.t.Fatalf("write %d: %s = %s, want %s (winner %v, annotations %v)", m.writes, r, got.String(), want.String(), win, n.Annotations)
		}
	}
	if !exact {
		return
	}
	if win == nil && st.present {
		m.t.Fatalf("write %d: no NodeOversell selects the node, annotations %v remain", m.writes, n.Annotations)
	}
	if win != nil && n.Annotations[annApplied] != win.Name {
		m.t.Fatalf("write %d: applied-by %q, winner %s", m.writes, n.Annotations[annApplied], win.Name)
	}
}

// TestOverlappingWebhooksInSeries replays random status writes through 2 or
// 3 overlapping NodeOversells' webhooks in API-server order while their
// priorities, ratios and selectors change, CRs are deleted and recreated,
// and the node's pool label moves (through nodes, which no webhook sees;
// the operator then restores a deselected node). Writers are the kubelet
// (fresh or stale informer copy, new real values) and other users
// (conditions only, arbitrary allocatable). With every server's view
// current, each write ends exactly at real × the winner's ratio (or real,
// without bookkeeping, when none selects the node). With views lagging, the
// recorded raw is still always exactly real and published never exceeds
// capacity × ratio; once the views catch up, the next heartbeat settles on
// real × the winner's ratio. With the engine before issue 11's fix (a
// reporting writer's record read from the old object) the second acting
// webhook takes the first's output as the kubelet's report: with every
// server acting, as before, most runs compound; with Route alone, only runs
// where lagging views let two servers act.
func TestOverlappingWebhooksInSeries(t *testing.T) {
	for _, crs := range []int{2, 3} {
		for _, lag := range []bool{false, true} {
			for seed := uint64(1); seed <= 10; seed++ {
				t.Run(fmt.Sprintf("crs%d/lag=%v/seed%d", crs, lag, seed), func(t *testing.T) {
					runChain(t, crs, lag, seed, 600)
				})
			}
		}
	}
}

func runChain(t *testing.T, crs int, lag bool, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, uint64(crs)))
	m := &chainModel{t: t, rng: rng, crs: map[string]*v1alpha1.NodeOversell{}, hooks: map[string]labels.Selector{},
		snaps: map[string]*Snapshot{}, lag: lag, clock: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	m.reals = map[string]bool{}
	newReal := func() {
		m.real = [numResources]string{
			resource.NewMilliQuantity(int64(3000+100*rng.IntN(10)), resource.DecimalSI).String(),
			resource.NewQuantity(int64(12+rng.IntN(4))<<30, resource.BinarySI).String(),
		}
		m.reals[m.real[CPU]], m.reals[m.real[Memory]] = true, true
	}
	newReal()
	m.stored = node(m.real[CPU], m.real[Memory], map[string]string{"other": "kept"})
	m.stored.Labels = map[string]string{"pool": "x"}
	m.lister = cloneState(m.stored)
	for _, n := range chainNames[:crs] {
		m.newCR(n)
	}
	m.refresh(true)

	for i := 0; i < steps; i++ {
		// Configuration changes, each followed by the operator's restore.
		switch x := rng.IntN(100); {
		case x < 6: // priority change
			no := m.crs[chainNames[rng.IntN(crs)]]
			if no != nil && no.DeletionTimestamp == nil {
				no.Spec.Priority = int32(rng.IntN(3))
				no.Generation++
			}
		case x < 10: // ratio change
			no := m.crs[chainNames[rng.IntN(crs)]]
			if no != nil && no.DeletionTimestamp == nil {
				m.setRatios(no)
				no.Generation++
			}
		case x < 13: // delete: webhook configuration first, then restore, then gone
			name := chainNames[rng.IntN(crs)]
			if no := m.crs[name]; no != nil && no.DeletionTimestamp == nil {
				no.DeletionTimestamp = &metav1.Time{Time: m.clock}
				delete(m.hooks, name)
			}
		case x < 16: // a deleting CR goes; a gone one is created again
			name := chainNames[rng.IntN(crs)]
			if no := m.crs[name]; no == nil {
				m.newCR(name)
			} else if no.DeletionTimestamp != nil && m.stored.Annotations[annApplied] != name {
				delete(m.crs, name)
			}
		case x < 20: // the pool label moves (a nodes write: no webhook)
			m.stored.Labels = map[string]string{"pool": []string{"x", "y", "z", "none"}[rng.IntN(4)]}
		}
		m.refresh(false)
		if m.restore() {
			m.check(!lag)
		}

		switch x := rng.IntN(100); {
		case x < 10:
			// A new real value is reported from a fresh copy: from a stale
			// copy equal to it the kubelet itself would omit it until its
			// informer catches up, which no webhook can see.
			newReal()
			m.kubelet(true)
		case x < 60:
			m.kubelet(rng.IntN(100) < 70)
		case x < 80:
			obj := cloneState(m.stored)
			if obj.Annotations == nil {
				obj.Annotations = map[string]string{}
			}
			obj.Annotations["example.com/condition"] = fmt.Sprint(i)
			m.admit(WriterOther, obj)
		default:
			// Another user writes an allocatable; only on an amplified node
			// (on a plain one its value is adopted as raw, as documented).
			if !hasEngineAnnotations(m.stored.Annotations) {
				continue
			}
			obj := cloneState(m.stored)
			obj.Allocatable["cpu"] = fmt.Sprintf("%dm", rng.IntN(40000))
			obj.Allocatable["memory"] = fmt.Sprintf("%dMi", rng.IntN(200000))
			m.admit(WriterOther, obj)
		}
		m.check(!lag)
	}

	// The views catch up; the operator restores; the next heartbeat from a
	// fresh copy settles on real × the winner's ratio.
	m.refresh(true)
	m.restore()
	m.kubelet(true)
	m.check(true)
	t.Logf("%d writes, %d webhook calls", m.writes, m.calls)
}

// TestChainCompoundingRegression is issue 11's reproduction as a table: two
// NodeOversells select the node (cpu 2 priority 0, cpu 1.5 priority 10); a
// kubelet report of 3800m on a 4-CPU node must record raw 3800m and publish
// 5700m, whichever server runs first, in every combination of the servers'
// views (both current; one still without the other CR).
func TestChainCompoundingRegression(t *testing.T) {
	mk := func(name, cpu string, prio int32, created int) *v1alpha1.NodeOversell {
		return &v1alpha1.NodeOversell{
			ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1, CreationTimestamp: metav1.NewTime(time.Unix(int64(created), 0))},
			Spec: v1alpha1.NodeOversellSpec{
				NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "oversell"}},
				Ratios:       v1alpha1.OversellRatios{CPU: v1alpha1.Ratio(cpu)}, Priority: prio,
			},
		}
	}
	a, b := mk("oversell-pool", "2", 0, 1), mk("pool-b", "1.5", 10, 2)
	both := BuildSnapshot([]*v1alpha1.NodeOversell{a, b}, nil, true)
	onlyA := BuildSnapshot([]*v1alpha1.NodeOversell{a}, nil, true)
	onlyB := BuildSnapshot([]*v1alpha1.NodeOversell{b}, nil, true)
	for _, tc := range []struct {
		name  string
		snaps map[string]*Snapshot
		order []string
		cpu   string // published
	}{
		{"views current", map[string]*Snapshot{"oversell-pool": both, "pool-b": both}, []string{"oversell-pool", "pool-b"}, "5700m"},
		{"views current, reverse order", map[string]*Snapshot{"oversell-pool": both, "pool-b": both}, []string{"pool-b", "oversell-pool"}, "5700m"},
		// oversell-pool's server has not seen pool-b yet: both act; the raw
		// stays exact and the last one's ratio holds until the next write.
		{"first server behind", map[string]*Snapshot{"oversell-pool": onlyA, "pool-b": both}, []string{"oversell-pool", "pool-b"}, "5700m"},
		{"last server behind", map[string]*Snapshot{"oversell-pool": onlyA, "pool-b": both}, []string{"pool-b", "oversell-pool"}, "7600m"},
		{"other server behind", map[string]*Snapshot{"oversell-pool": both, "pool-b": onlyB}, []string{"oversell-pool", "pool-b"}, "5700m"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := node("4", "16Gi", nil) // kwok-like: registered with allocatable = capacity
			obj := cloneState(old)
			obj.Allocatable["cpu"] = "3800m"
			for _, name := range tc.order {
				p, act := tc.snaps[name].Route(obj.Labels, name)
				if !act {
					continue
				}
				obj, _ = applyDecision(t, obj, Decide(Input{Writer: writerKubelet, Object: obj, Old: &old, Policy: p}))
			}
			st := readStored(obj.Annotations)
			if !st.rawOK[CPU] || st.raw[CPU].String() != "3800m" {
				t.Fatalf("raw-allocatable %q, want cpu 3800m", obj.Annotations[annRaw])
			}
			got, want := resource.MustParse(obj.Allocatable["cpu"]), resource.MustParse(tc.cpu)
			if got.Cmp(want) != 0 {
				t.Fatalf("published cpu %s, want %s", got.String(), tc.cpu)
			}
		})
	}
}
