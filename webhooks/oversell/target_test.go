package oversell

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"gopkg.in/inf.v0"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

const annTarget = v1alpha1.OversellTargetKey

func targetJSON(by, cpu, mem, excl string) string {
	s := fmt.Sprintf(`{"by":%q`, by)
	if cpu != "" {
		s += fmt.Sprintf(`,"cpu":{"ratio":%q,"source":"usage"}`, cpu)
	}
	if mem != "" {
		s += fmt.Sprintf(`,"memory":{"ratio":%q,"source":"static"}`, mem)
	}
	if excl != "" {
		s += fmt.Sprintf(`,"exclusiveCPU":%q`, excl)
	}
	return s + "}"
}

func withCeiling(p *Policy, cpu, mem string) *Policy {
	p.Ceiling = p.Ratios
	if cpu != "" {
		p.Ceiling[CPU] = mustRatio(cpu)
	}
	if mem != "" {
		p.Ceiling[Memory] = mustRatio(mem)
	}
	return p
}

// TestDecideTargets: the operator's target sets the ratio within [1,
// ceiling] and subtracts exclusive CPUs; anything else about it is ignored.
func TestDecideTargets(t *testing.T) {
	pool := policy("oversell-pool", "2", "1.5")
	held := withCeiling(policy("oversell-pool", "1", "1"), "3", "")
	for _, tc := range []struct {
		name     string
		pol      *Policy
		target   string
		cpu, mem string // published
		ratios   string // the ratios annotation
	}{
		{"no target: spec", pool, "", "7600m", "23040Mi", `{"cpu":"2","memory":"1.5"}`},
		{"usage lowers cpu", pool, targetJSON("oversell-pool", "1.25", "", ""), "4750m", "23040Mi", `{"cpu":"1.25","memory":"1.5"}`},
		{"above spec clamped", pool, targetJSON("oversell-pool", "9", "10", ""), "7600m", "23040Mi", `{"cpu":"2","memory":"1.5"}`},
		{"other NodeOversell's target ignored", pool, targetJSON("other", "1", "1", "3"), "7600m", "23040Mi", `{"cpu":"2","memory":"1.5"}`},
		{"corrupt target ignored", pool, `{"by":`, "7600m", "23040Mi", `{"cpu":"2","memory":"1.5"}`},
		{"ratio below 1 ignored", pool, targetJSON("oversell-pool", "0.5", "", ""), "7600m", "23040Mi", `{"cpu":"2","memory":"1.5"}`},
		{"held above a lowered spec, within the ceiling", held, targetJSON("oversell-pool", "2", "1.5", ""), "7600m", "15Gi", `{"cpu":"2","memory":"1"}`},
		{"held above the ceiling clamped", held, targetJSON("oversell-pool", "5", "", ""), "11400m", "15Gi", `{"cpu":"3","memory":"1"}`},
		{"exclusive cpus", pool, targetJSON("oversell-pool", "", "", "1"), "6600m", "23040Mi", `{"cpu":"2","memory":"1.5","exclusiveCPU":"1"}`},
		{"exclusive above raw: raw", pool, targetJSON("oversell-pool", "", "", "8"), "3800m", "23040Mi", `{"cpu":"2","memory":"1.5","exclusiveCPU":"8"}`},
		{"negative exclusive ignored", pool, targetJSON("oversell-pool", "", "", "-2"), "7600m", "23040Mi", `{"cpu":"2","memory":"1.5"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ann := map[string]string{}
			if tc.target != "" {
				ann[annTarget] = tc.target
			}
			in := node("3800m", "15Gi", ann)
			got, _ := applyDecision(t, in, Decide(Input{Writer: writerKubelet, Object: in, Old: &in, Policy: tc.pol}))
			if got.Allocatable["cpu"] != tc.cpu || got.Allocatable["memory"] != tc.mem {
				t.Errorf("published cpu %s memory %s, want %s %s", got.Allocatable["cpu"], got.Allocatable["memory"], tc.cpu, tc.mem)
			}
			if got.Annotations[annRatios] != tc.ratios {
				t.Errorf("ratios %s, want %s", got.Annotations[annRatios], tc.ratios)
			}
			// The next heartbeat from a stale copy (published value as its
			// report) keeps the raw: staleReport knows the exclusive part.
			d := Decide(Input{Writer: writerKubelet, Object: got, Old: &got, Policy: tc.pol})
			if d.Raw[CPU].String() != "3800m" {
				t.Errorf("stale heartbeat took raw cpu %s", d.Raw[CPU].String())
			}
		})
	}
}

func TestAmplifyExclusive(t *testing.T) {
	for _, tc := range []struct {
		raw, capacity, ratio, excl, want string
	}{
		{"1500m", "2", "2", "1", "2"},     // the real node: (1.5 - 1) x 2 + 1
		{"1500m", "2", "2", "0", "3"},     // none exclusive: Amplify
		{"3", "4", "1", "2", "3"},         // ratio 1: raw
		{"3", "4", "1.5", "3", "3"},       // all exclusive: raw
		{"3", "4", "1.5", "1.5", "3750m"}, // fractional exclusive is still subtracted
		{"4", "3", "2", "1", "6"},         // implausible raw: capacity x ratio bounds it
		{"333m", "1", "1.5", "0", "499m"},
	} {
		raw, capacity, excl := resource.MustParse(tc.raw), resource.MustParse(tc.capacity), resource.MustParse(tc.excl)
		got := AmplifyExclusive(CPU, raw, &capacity, mustRatio(tc.ratio), excl)
		if want := resource.MustParse(tc.want); got.Cmp(want) != 0 {
			t.Errorf("AmplifyExclusive(%s, cap %s, x%s, G %s) = %s, want %s", tc.raw, tc.capacity, tc.ratio, tc.excl, got.String(), tc.want)
		}
	}
	mem, capMem, g := resource.MustParse("4Gi"), resource.MustParse("8Gi"), resource.MustParse("1")
	if got := AmplifyExclusive(Memory, mem, &capMem, mustRatio("2"), g); got.Cmp(resource.MustParse("8Gi")) != 0 {
		t.Errorf("memory has no exclusive part: got %s", got.String())
	}
}

// TestTargetsProperty replays random writes with random targets (the
// operator's and forged ones), exclusive CPUs, ceilings and writers. After
// every applied decision the published value is within [raw, capacity x
// ceiling] (ceiling = max(spec.ratios, status.ratioCeiling)) and equals
// (raw - G) x r + G computed here without the engine, with r the target
// clamped to [1, ceiling] and G clamped to [0, raw]. And it never depends
// on the order of the writers: the same writes in another order, followed
// by the kubelet's next heartbeat, publish the same value.
func TestTargetsProperty(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			ratios := []string{"1", "1.2", "1.5", "2", "3", "10"}
			pick := func() string { return ratios[rng.IntN(len(ratios))] }
			for round := 0; round < 50; round++ {
				pol := policy("oversell-pool", pick(), pick())
				pol.Selector = labels.Everything()
				withCeiling(pol, pick(), pick())
				for r := Resource(0); r < numResources; r++ {
					if pol.Ceiling[r].micro < pol.Ratios[r].micro {
						pol.Ceiling[r] = pol.Ratios[r]
					}
				}
				real := [numResources]string{fmt.Sprintf("%dm", 500+rng.IntN(3500)), fmt.Sprintf("%dMi", 1024+rng.IntN(15000))}
				var writes []NodeState
				for i := 0; i < 8; i++ {
					ann := map[string]string{"other": "kept"}
					by := "oversell-pool"
					if rng.IntN(10) == 0 {
						by = "someone-else"
					}
					excl := []string{"", "0", "1", "2", "3", "250m", "100", "-1"}[rng.IntN(8)]
					if rng.IntN(4) > 0 {
						ann[annTarget] = targetJSON(by, pick(), pick(), excl)
					}
					writes = append(writes, node(real[CPU], real[Memory], ann))
				}
				final := func(order []int) NodeState {
					stored := node(real[CPU], real[Memory], nil)
					for _, i := range order {
						w := cloneState(writes[i])
						for k, v := range stored.Annotations {
							if _, ok := w.Annotations[k]; !ok && k != annTarget {
								w.Annotations[k] = v
							}
						}
						writer := WriterOther
						if rng.IntN(2) == 0 {
							writer = writerKubelet
						}
						old := stored
						d := Decide(Input{Writer: writer, Object: w, Old: &old, Policy: pol})
						stored, _ = applyDecision(t, w, d)
						checkTargetBounds(t, stored, pol, real)
					}
					// The kubelet's next heartbeat from a fresh copy.
					hb := cloneState(stored)
					hb.Allocatable["cpu"], hb.Allocatable["memory"] = real[CPU], real[Memory]
					d := Decide(Input{Writer: writerKubelet, Object: hb, Old: &stored, Policy: pol})
					stored, _ = applyDecision(t, hb, d)
					checkTargetBounds(t, stored, pol, real)
					return stored
				}
				order := rng.Perm(len(writes))
				a := final(order)
				// Same set, another order, ending with the same last write.
				last := order[len(order)-1]
				other := rng.Perm(len(writes))
				for i, v := range other {
					if v == last {
						other[i], other[len(other)-1] = other[len(other)-1], other[i]
					}
				}
				b := final(other)
				if a.Allocatable["cpu"] != b.Allocatable["cpu"] || a.Allocatable["memory"] != b.Allocatable["memory"] {
					t.Fatalf("round %d: order changed the result: %v vs %v", round, a.Allocatable, b.Allocatable)
				}
			}
		})
	}
}

// checkTargetBounds recomputes the published value from the node's target
// and raw without the engine's functions.
func checkTargetBounds(t *testing.T, n NodeState, pol *Policy, real [numResources]string) {
	t.Helper()
	tgt := readTarget(n.Annotations, pol.Name)
	for r := Resource(0); r < numResources; r++ {
		raw := resource.MustParse(real[r])
		capacity := resource.MustParse(n.Capacity[resourceNames[r]])
		got := resource.MustParse(n.Allocatable[resourceNames[r]])
		rm := pol.Ratios[r].micro
		if tgt.ratio[r].IsSet() {
			rm = min(tgt.ratio[r].micro, pol.Ceiling[r].micro)
		}
		g := new(inf.Dec)
		if r == CPU && tgt.hasExcl && tgt.exclusive.Sign() > 0 {
			g = tgt.exclusive.AsDec()
			if g.Cmp(raw.AsDec()) > 0 {
				g = raw.AsDec()
			}
		}
		shared := new(inf.Dec).Sub(raw.AsDec(), g)
		want := new(inf.Dec).Mul(shared, inf.NewDec(rm, 6))
		want.Round(want, r.unitScale(), inf.RoundDown)
		want.Add(want, g)
		if got.AsDec().Cmp(want) != 0 {
			t.Fatalf("%s = %s, want (%s - %s) x %s + %s = %s (target %s)", r, got.String(), raw.String(), g, inf.NewDec(rm, 6), g, want, n.Annotations[annTarget])
		}
		if got.Cmp(raw) < 0 {
			t.Fatalf("%s = %s below raw %s", r, got.String(), raw.String())
		}
		checkBound(t, 0, r, got, capacity, pol.Ceiling[r])
	}
}
