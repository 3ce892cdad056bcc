package oversellnodes

import (
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/oversell"
)

// totals are the sums over the nodes one NodeOversell amplifies.
type totals struct {
	Nodes int32
	// Raw sums the oversell.hookwright.io/raw-allocatable annotations;
	// Effective sums raw × ratio (oversell.Amplify, exact, rounded down to
	// whole millicores and bytes, capped at capacity × ratio) with the
	// ratios of each node's oversell.hookwright.io/ratios annotation. nil
	// when no node is amplified.
	Raw, Effective corev1.ResourceList
	// Problems names nodes whose annotations do not parse or record a raw
	// value the webhook engine would not trust (oversell.PlausibleRaw: not
	// 0 < raw ≤ capacity); they count in Nodes but not in the sums.
	Problems []string
}

// amplifiedTotals computes totals from the nodes' annotations, which the
// webhook writes with the raw values and ratios, checked against each
// node's status.capacity as the engine checks them.
func amplifiedTotals(nodes []corev1.Node, name string) totals {
	var t totals
	add := func(l *corev1.ResourceList, k corev1.ResourceName, q resource.Quantity) {
		if *l == nil {
			*l = corev1.ResourceList{}
		}
		sum := (*l)[k]
		sum.Add(q)
		(*l)[k] = sum
	}
	for _, n := range nodes {
		if n.Annotations[v1alpha1.OversellAppliedByKey] != name {
			continue
		}
		t.Nodes++
		raw, eff, err := nodeAmounts(n.Annotations, n.Status.Capacity)
		if err != nil {
			t.Problems = append(t.Problems, n.Name+": "+err.Error())
			continue
		}
		for k, q := range raw {
			add(&t.Raw, k, q)
			add(&t.Effective, k, eff[k])
		}
	}
	slices.Sort(t.Problems)
	return t
}

// nodeAmounts reads one node's raw allocatable and computes its effective
// allocatable from the oversell annotations.
func nodeAmounts(ann map[string]string, capacity corev1.ResourceList) (raw, eff corev1.ResourceList, err error) {
	var rawS, ratioS map[string]string
	var excl resource.Quantity
	if err := json.Unmarshal([]byte(ann[v1alpha1.OversellRawAllocatableKey]), &rawS); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", v1alpha1.OversellRawAllocatableKey, err)
	}
	if s := ann[v1alpha1.OversellRatiosKey]; s != "" {
		if err := json.Unmarshal([]byte(s), &ratioS); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", v1alpha1.OversellRatiosKey, err)
		}
	}
	// The exclusive CPUs the engine subtracted (AmplifyExclusive).
	if g := ratioS["exclusiveCPU"]; g != "" {
		q, err := resource.ParseQuantity(g)
		if err != nil {
			return nil, nil, fmt.Errorf("exclusiveCPU %q: %w", g, err)
		}
		excl = q
	}
	raw, eff = corev1.ResourceList{}, corev1.ResourceList{}
	for _, res := range []oversell.Resource{oversell.CPU, oversell.Memory} {
		v, ok := rawS[res.String()]
		if !ok {
			continue
		}
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return nil, nil, fmt.Errorf("raw %s %q: %w", res, v, err)
		}
		k := corev1.ResourceName(res.String())
		var capQ *resource.Quantity
		if c, ok := capacity[k]; ok {
			capQ = &c
		}
		if !oversell.PlausibleRaw(q, capQ) {
			if capQ == nil {
				return nil, nil, fmt.Errorf("raw %s %q: no capacity to check it against", res, v)
			}
			return nil, nil, fmt.Errorf("raw %s %q: not plausible for capacity %s", res, v, capQ.String())
		}
		// An absent ratio leaves the resource at raw (an unset Ratio).
		var ratio oversell.Ratio
		if rs := ratioS[res.String()]; rs != "" {
			if ratio, err = oversell.ParseRatio(rs); err != nil {
				return nil, nil, fmt.Errorf("ratio %s %q: %w", res, rs, err)
			}
		}
		raw[k], eff[k] = q, oversell.AmplifyExclusive(res, q, capQ, ratio, excl)
	}
	return raw, eff, nil
}
