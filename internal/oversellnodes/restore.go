package oversellnodes

import (
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/oversell"
)

// restorePatch is the JSON merge patch of nodes/status that gives a node its
// raw allocatable back (from the oversell.hookwright.io/raw-allocatable
// annotation: a JSON object of exact quantities such as
// {"cpu":"3800m","memory":"16Gi"}) and removes the oversell annotations.
//
// A recorded value is written back only if the webhook engine would trust it
// (oversell.PlausibleRaw: 0 < raw ≤ the node's status.capacity): whoever can
// annotate a node could otherwise publish any allocatable, such as memory
// "1e30", through the operator. For a resource whose record is implausible,
// unparseable, or whose capacity is unknown (or when the whole annotation is
// missing or not a JSON object), nothing larger than the node already
// publishes is written: allocatable is lowered to capacity if it is above
// it, and otherwise left as it is; the kubelet's next status report (the
// webhook configuration is deleted before the restore) then publishes the
// real value. Notes describes each such resource, for an Event.
func restorePatch(node *corev1.Node) (patch []byte, notes []string) {
	raw := node.Annotations[v1alpha1.OversellRawAllocatableKey]
	var vals map[string]string
	recordErr := ""
	switch err := json.Unmarshal([]byte(raw), &vals); {
	case raw == "":
		recordErr = "no " + v1alpha1.OversellRawAllocatableKey + " annotation"
	case err != nil || vals == nil:
		recordErr = fmt.Sprintf("%s is not a JSON object of quantities", v1alpha1.OversellRawAllocatableKey)
	}
	alloc := map[string]string{}
	for _, k := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		why := recordErr
		if why == "" {
			v, ok := vals[string(k)]
			if !ok {
				continue // not recorded: the engine left it at raw
			}
			var capacity *resource.Quantity
			if c, ok := node.Status.Capacity[k]; ok {
				capacity = &c
			}
			q, err := resource.ParseQuantity(v)
			switch {
			case err != nil:
				why = fmt.Sprintf("recorded raw %q does not parse", v)
			case capacity == nil:
				why = fmt.Sprintf("recorded raw %q cannot be checked without a capacity", v)
			case !oversell.PlausibleRaw(q, capacity):
				why = fmt.Sprintf("recorded raw %q is not plausible for capacity %s", v, capacity.String())
			default:
				// Trusted, then written as recorded: the API server canonicalises.
				alloc[string(k)] = v
				continue
			}
		}
		cur, hasCur := node.Status.Allocatable[k]
		capacity, hasCap := node.Status.Capacity[k]
		switch {
		case hasCur && hasCap && cur.Cmp(capacity) > 0:
			alloc[string(k)] = capacity.String()
			notes = append(notes, fmt.Sprintf("%s: %s; allocatable %s lowered to capacity %s until the kubelet's next report", k, why, cur.String(), capacity.String()))
		case hasCur:
			notes = append(notes, fmt.Sprintf("%s: %s; allocatable %s left until the kubelet's next report", k, why, cur.String()))
		default:
			notes = append(notes, fmt.Sprintf("%s: %s; no allocatable to restore", k, why))
		}
	}
	p := map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{
			v1alpha1.OversellRawAllocatableKey: nil,
			v1alpha1.OversellRatiosKey:         nil,
			v1alpha1.OversellAppliedByKey:      nil,
		}},
	}
	if len(alloc) > 0 {
		p["status"] = map[string]any{"allocatable": alloc}
	}
	patch, _ = json.Marshal(p) // maps of strings and nil: cannot fail
	return patch, notes
}
