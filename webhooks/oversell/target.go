package oversell

import (
	"encoding/json"

	"gopkg.in/inf.v0"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// The operator's per-node decision reaches the engine as the node
// annotation v1alpha1.OversellTargetKey (a v1alpha1.OversellTarget): a
// ratio per resource (usage-aware, fallback, pressure, or held for running
// pods) and the exclusive CPUs of a static CPU manager node. Anyone who
// may write a node's status may write that annotation too, so the engine
// trusts it only in the direction that cannot overcommit a node further
// than its NodeOversell allows:
//
//   - a target ratio is clamped to [1, Policy.Ceiling], the ceiling coming
//     from the NodeOversell (spec.ratios, or status.ratioCeiling which only
//     the operator writes);
//   - exclusive CPUs G are clamped to [0, raw]; (raw - G) x r + G is then
//     at most raw x r and at least raw for every r >= 1.
//
// So the published allocatable stays within [raw, capacity x ceiling]
// whatever the annotation says.

// nodeTarget is what the engine reads of an OversellTarget for one policy.
type nodeTarget struct {
	ratio     [numResources]Ratio // unset: no target for that resource
	exclusive resource.Quantity   // zero: none
	hasExcl   bool
}

// readTarget parses the target annotation for policy name. A target for
// another NodeOversell, a corrupt annotation or one without a parsable
// ratio counts as absent for that part.
func readTarget(ann map[string]string, name string) nodeTarget {
	var t nodeTarget
	s, ok := ann[v1alpha1.OversellTargetKey]
	if !ok {
		return t
	}
	var v v1alpha1.OversellTarget
	if json.Unmarshal([]byte(s), &v) != nil || v.By != name {
		return t
	}
	for r, rt := range [numResources]*v1alpha1.OversellResourceTarget{CPU: v.CPU, Memory: v.Memory} {
		if rt == nil {
			continue
		}
		if x, err := ParseRatio(rt.Ratio); err == nil {
			t.ratio[r] = x
		}
	}
	if v.ExclusiveCPU != "" {
		if q, err := parseQuantity(v.ExclusiveCPU); err == nil {
			t.exclusive, t.hasExcl = q, true
		}
	}
	return t
}

// targetBy is the NodeOversell the target annotation names, "" when there
// is none or it does not parse.
func targetBy(ann map[string]string) string {
	s, ok := ann[v1alpha1.OversellTargetKey]
	if !ok {
		return ""
	}
	var v struct {
		By string `json:"by"`
	}
	if json.Unmarshal([]byte(s), &v) != nil {
		return ""
	}
	return v.By
}

// NodeRatios are the ratios the policy applies to a node with these
// annotations (its target for p, clamped; spec.ratios without one), for
// the operator's checks of what a node should publish.
func (p *Policy) NodeRatios(ann map[string]string) [numResources]Ratio {
	t := readTarget(ann, p.Name)
	var out [numResources]Ratio
	for r := Resource(0); r < numResources; r++ {
		out[r] = p.ratioFor(r, t)
	}
	return out
}

// ratioFor is the ratio of resource r for a node with target t: the
// target clamped to [1, ceiling] when both exist, else spec.ratios.
func (p *Policy) ratioFor(r Resource, t nodeTarget) Ratio {
	c := p.Ceiling[r]
	if !c.IsSet() {
		c = p.Ratios[r]
	}
	if !t.ratio[r].IsSet() || !c.IsSet() {
		return p.Ratios[r]
	}
	return Ratio{micro: min(t.ratio[r].micro, c.micro)}
}

// AmplifyExclusive is Amplify for a resource of which exclusive is held by
// exclusive CPUs (the static CPU manager's Guaranteed integer-cpu pods):
// (raw - exclusive) x ratio + exclusive, rounded down like Amplify, with
// exclusive clamped to [0, raw], so the result is never above Amplify's
// and never below raw. Only cpu has exclusive units; for memory, or a zero
// exclusive, it is Amplify.
func AmplifyExclusive(res Resource, raw resource.Quantity, capacity *resource.Quantity, r Ratio, exclusive resource.Quantity) resource.Quantity {
	if res != CPU || exclusive.Sign() <= 0 {
		return Amplify(res, raw, capacity, r)
	}
	if exclusive.Cmp(raw) >= 0 {
		// Everything is exclusive: nothing to amplify.
		return raw.DeepCopy()
	}
	shared := raw.DeepCopy()
	shared.Sub(exclusive)
	amp := Amplify(res, shared, nil, r)
	ac, ec := amp.AsDec(), exclusive.DeepCopy()
	sum := new(inf.Dec).Add(ac, ec.AsDec())
	sum.Round(sum, res.unitScale(), inf.RoundDown)
	out := fromDec(sum, resource.DecimalSI)
	// The capacity bound of Amplify; (raw - G) x r + G <= raw x r, so
	// the plain bound applies unchanged.
	if limit := Amplify(res, raw, capacity, r); out.Cmp(limit) > 0 {
		return limit
	}
	return out
}
