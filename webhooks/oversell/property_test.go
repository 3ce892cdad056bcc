package oversell

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"

	"gopkg.in/inf.v0"
	"k8s.io/apimachinery/pkg/api/resource"
)

func cloneState(n NodeState) NodeState {
	return NodeState{
		Labels:      maps.Clone(n.Labels),
		Annotations: maps.Clone(n.Annotations),
		Capacity:    maps.Clone(n.Capacity),
		Allocatable: maps.Clone(n.Allocatable),
	}
}

// TestMixedWritesConverge replays random mixes of status writes through the
// engine, the patch builder and a real JSON patch implementation:
//   - kubelet heartbeats built as the kubelet builds them: a two-way merge
//     from its informer copy (fresh or one write behind) to the values it
//     computes, so allocatable is sent only when it differs from that copy;
//   - kubelet reports of a new real value (reservations changed);
//   - other writers patching only conditions, full writes from old copies,
//     writes of arbitrary allocatable, operator resync writes;
//   - ratio changes, deselection and reselection (hot reload);
//   - webhook outages (failurePolicy Ignore) on kubelet, condition-only and
//     old-copy writes;
//   - raw-allocatable annotations tampered with through a nodes (not
//     nodes/status) write, which the webhook never sees.
//
// After every applied decision the published value is never above capacity
// × ratio. It is exactly raw × ratio where raw is a real value the kubelet
// computed, a value written while the node carried no amplification
// (adopted, as documented) or a plausible tampered raw, never compounded;
// except that after a tampered raw and until the kubelet reports its real
// value again, a kubelet patch from a stale copy may carry the published
// value as its own (as with any lost raw), so only the bound is checked
// then. A non-reporting write finding only an implausible raw is admitted
// unchanged. After the next heartbeat from a fresh copy the value is exactly
// current real × current ratio.
func TestMixedWritesConverge(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { runMixedWrites(t, seed, 1000) })
	}
}

func runMixedWrites(t *testing.T, seed uint64, writes int) {
	rng := rand.New(rand.NewPCG(seed, 42))
	cpuRatios := []string{"1", "1.5", "2", "3", "2.5"}
	memRatios := []string{"1", "1.25", "1.5", "2"}
	newPolicy := func() *Policy {
		return policy("oversell-pool", cpuRatios[rng.IntN(len(cpuRatios))], memRatios[rng.IntN(len(memRatios))])
	}
	realValue := func() [numResources]string {
		return [numResources]string{
			resource.NewMilliQuantity(int64(3000+100*rng.IntN(10)), resource.DecimalSI).String(),
			resource.NewQuantity(int64(12+rng.IntN(4))<<30-int64(rng.IntN(8))<<20, resource.BinarySI).String(),
		}
	}

	real := realValue()
	reals := map[string]bool{real[CPU]: true, real[Memory]: true}
	pol := newPolicy()
	stored := node(real[CPU], real[Memory], map[string]string{"other": "kept"})
	lister := cloneState(stored) // kubelet's informer copy
	history := []NodeState{cloneState(stored)}
	tainted := false // a raw was tampered with and the kubelet has not reported since

	kubeletWrite := func(fresh bool) NodeState {
		if fresh {
			lister = cloneState(stored)
		}
		merged := cloneState(stored)
		for r := Resource(0); r < numResources; r++ {
			if lister.Allocatable[resourceNames[r]] != real[r] {
				merged.Allocatable[resourceNames[r]] = real[r]
			}
		}
		return merged
	}

	for i := 0; i < writes; i++ {
		switch x := rng.IntN(100); {
		case x < 3:
			pol = newPolicy()
		case x < 5:
			if pol != nil {
				pol = nil
			} else {
				pol = newPolicy()
			}
		case x < 10:
			real = realValue()
			reals[real[CPU]], reals[real[Memory]] = true, true
		case x < 13:
			// A plausible tampered raw (at most capacity, not zero) cannot
			// be told from a real one; an implausible one must never be used.
			tampered := [...]string{"1e30", "0", "4", "16Gi", "3500m", "12Gi", "40", "64Gi", "1n"}
			cpu, mem := tampered[rng.IntN(len(tampered))], tampered[rng.IntN(len(tampered))]
			if stored.Annotations == nil {
				stored.Annotations = map[string]string{}
			}
			stored.Annotations[annRaw] = fmt.Sprintf(`{"cpu":%q,"memory":%q}`, cpu, mem)
			tainted = true
			for _, v := range []string{cpu, mem} {
				q := resource.MustParse(v)
				reals[q.String()] = true
			}
		}

		var (
			merged NodeState
			writer = WriterOther
			outage = rng.IntN(100) < 5
		)
		switch x := rng.IntN(100); {
		case x < 50:
			writer = writerKubelet
			merged = kubeletWrite(rng.IntN(100) < 70)
		case x < 70:
			merged = cloneState(stored)
		case x < 85:
			merged = cloneState(history[rng.IntN(len(history))])
		case x < 95:
			outage = false
			merged = cloneState(stored)
			merged.Allocatable["cpu"] = fmt.Sprintf("%dm", rng.IntN(40000))
			merged.Allocatable["memory"] = fmt.Sprintf("%dMi", rng.IntN(200000))
			if !hasEngineAnnotations(stored.Annotations) {
				// Documented: on a node never amplified, any writer's value
				// is taken as raw until the kubelet reports.
				for _, k := range []string{"cpu", "memory"} {
					q := resource.MustParse(merged.Allocatable[k])
					reals[q.String()] = true
				}
			}
		default:
			outage = false
			merged = cloneState(stored)
			if merged.Annotations == nil {
				merged.Annotations = map[string]string{}
			}
			merged.Annotations["oversell.hookwright.io/resync"] = fmt.Sprint(i)
		}
		if rng.IntN(100) < 70 {
			lister = cloneState(stored) // informer caught up before the write
		}

		if outage {
			stored = merged
		} else {
			old := stored
			d := Decide(Input{Writer: writer, Object: merged, Old: &old, Policy: pol})
			switch {
			case !d.Apply && d.Reason == reasonRawUnknown && writer == WriterOther && implausibleRaw(merged, old):
				// Admitted unchanged; a later kubelet patch from a stale
				// copy carries these values as its own (documented).
				stored = merged
				for _, k := range []string{"cpu", "memory"} {
					q := resource.MustParse(merged.Allocatable[k])
					reals[q.String()] = true
				}
			case !d.Apply && d.Reason != reasonNotSelected:
				t.Fatalf("write %d: no decision (%s) for %+v over %+v", i, d.Reason, merged, old)
			default:
				stored, _ = applyDecision(t, merged, d)
				if d.Apply && d.Raw[CPU].String() == real[CPU] && d.Raw[Memory].String() == real[Memory] {
					tainted = false
				}
				checkPublished(t, i, stored, pol, reals, !tainted, d.Apply)
			}
		}
		history = append(history, cloneState(stored))
	}

	// The next heartbeat, from a fresh copy, settles on real × ratio.
	d := Decide(Input{Writer: writerKubelet, Object: kubeletWrite(true), Old: &stored, Policy: pol})
	stored, _ = applyDecision(t, kubeletWrite(false), d)
	for r := Resource(0); r < numResources; r++ {
		var ratio Ratio
		if pol != nil {
			ratio = pol.Ratios[r]
		}
		capacity := resource.MustParse(stored.Capacity[resourceNames[r]])
		want := Amplify(r, resource.MustParse(real[r]), &capacity, ratio)
		got := resource.MustParse(stored.Allocatable[resourceNames[r]])
		if got.Cmp(want) != 0 {
			t.Fatalf("final %s = %s, want %s (real %s, ratio %s)", r, got.String(), want.String(), real[r], ratio)
		}
		checkBound(t, writes, r, got, capacity, ratio)
	}
	if pol == nil && hasEngineAnnotations(stored.Annotations) {
		t.Fatalf("deselected node keeps annotations %v", stored.Annotations)
	}
}

// implausibleRaw reports whether a non-reporting writer finds nothing it may
// take as raw: the recorded raw (from the stored object, else the written
// one) or, on a node never amplified, the written value is missing, zero or
// above capacity.
func implausibleRaw(merged, old NodeState) bool {
	st := readStored(old.Annotations)
	if !st.present {
		st = readStored(merged.Annotations)
	}
	for r := Resource(0); r < numResources; r++ {
		capacity := resource.MustParse(merged.Capacity[resourceNames[r]])
		v := resource.MustParse(merged.Allocatable[resourceNames[r]])
		if st.present {
			if !st.rawOK[r] {
				return true
			}
			v = st.raw[r]
		}
		if v.Cmp(capacity) > 0 || v.Sign() == 0 {
			return true
		}
	}
	return false
}

// checkBound asserts published ≤ capacity × ratio (an unset ratio is 1),
// computed here without Amplify.
func checkBound(t *testing.T, i int, r Resource, published, capacity resource.Quantity, ratio Ratio) {
	t.Helper()
	micro := int64(1_000_000)
	if ratio.IsSet() {
		micro = ratio.micro
	}
	limit := new(inf.Dec).Mul(capacity.AsDec(), inf.NewDec(micro, 6))
	if published.AsDec().Cmp(limit) > 0 {
		t.Fatalf("write %d: %s = %s above capacity %s × %s", i, r, published.String(), capacity.String(), inf.NewDec(micro, 6))
	}
}

// checkPublished asserts the stored node after an admitted write: amplified
// exactly from a raw with the current ratios, or restored to a raw without
// bookkeeping; the raw is a real value when strict. An applied decision
// never publishes above capacity × ratio; a deselected raw above capacity is
// published as capacity.
func checkPublished(t *testing.T, i int, n NodeState, pol *Policy, reals map[string]bool, strict, applied bool) {
	t.Helper()
	st := readStored(n.Annotations)
	if pol == nil {
		if st.present {
			t.Fatalf("write %d: deselected node keeps annotations %v", i, n.Annotations)
		}
		for r := Resource(0); r < numResources; r++ {
			q := resource.MustParse(n.Allocatable[resourceNames[r]])
			capacity := resource.MustParse(n.Capacity[resourceNames[r]])
			if strict && !reals[q.String()] && !(applied && q.Cmp(capacity) == 0) {
				t.Fatalf("write %d: deselected %s = %s is not a real value", i, r, q.String())
			}
			if applied {
				checkBound(t, i, r, q, capacity, Ratio{})
			}
		}
		return
	}
	for r := Resource(0); r < numResources; r++ {
		if !st.rawOK[r] {
			t.Fatalf("write %d: raw %s missing from %v", i, r, n.Annotations)
		}
		if strict && !reals[st.raw[r].String()] {
			t.Fatalf("write %d: raw %s = %s is not a real value (compounded)", i, r, st.raw[r].String())
		}
		capacity := resource.MustParse(n.Capacity[resourceNames[r]])
		want := Amplify(r, st.raw[r], &capacity, pol.Ratios[r])
		got := resource.MustParse(n.Allocatable[resourceNames[r]])
		if got.Cmp(want) != 0 {
			t.Fatalf("write %d: %s = %s, want raw %s × %s = %s", i, r, got.String(), st.raw[r].String(), pol.Ratios[r], want.String())
		}
		checkBound(t, i, r, got, capacity, pol.Ratios[r])
	}
}
