package oversellnodes

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/oversell"
)

// The pure decisions behind Nodes (nodes.go, reamplify.go): which nodes
// lost their amplification, the re-amplification back-off, the node
// selector and the conditions' wording. No API calls here.

// unamplifiedNodes names, sorted, the nodes sel selects whose stored status
// is not what no's webhook publishes, and which a nodes/status write
// through the webhook would fix:
//   - amplified by no (annotation applied-by) but with an allocatable cpu
//     or memory other than raw × ratio of its own annotations (a write
//     stored while no server was reached), or with ratios other than no's
//     spec (a resync write that reached no server);
//   - not amplified by any NodeOversell that exists (exists: nil means
//     every name does) while it publishes cpu or memory.
//
// Nodes another existing NodeOversell amplified are its own (overlapping
// selectors are resolved by the servers), and nodes whose annotations the
// engine would not trust (oversell.PlausibleRaw) are left to the kubelet.
func unamplifiedNodes(nodes []corev1.Node, no *v1alpha1.NodeOversell, sel labels.Selector, exists func(name string) bool) []string {
	pol, err := oversell.CompilePolicy(no)
	if err != nil {
		return nil // the validating webhook and the CRD pattern refuse it; the servers ignore it
	}
	var out []string
	for i := range nodes {
		n := &nodes[i]
		if !sel.Matches(labels.Set(n.Labels)) {
			continue
		}
		switch by := n.Annotations[v1alpha1.OversellAppliedByKey]; {
		case by == "" || by != no.Name && exists != nil && !exists(by):
			_, cpu := n.Status.Allocatable[corev1.ResourceCPU]
			_, mem := n.Status.Allocatable[corev1.ResourceMemory]
			if cpu || mem {
				out = append(out, n.Name)
			}
		case by == no.Name:
			// The ratios the server applies to this node: its target
			// (usage, held, pressure) within the ceiling, else spec.ratios.
			want := map[string]oversell.Ratio{}
			for r, x := range pol.NodeRatios(n.Annotations) {
				if x.IsSet() {
					want[oversell.Resource(r).String()] = x
				}
			}
			if lostAmplification(n) || !ratiosMatch(n.Annotations, want) {
				out = append(out, n.Name)
			}
		}
	}
	slices.Sort(out)
	return out
}

// lostAmplification reports whether a node amplified by a NodeOversell
// (annotation applied-by) publishes an allocatable cpu or memory other
// than the raw × ratio its annotations record: its status was written
// without the webhook. False when the annotations do not parse or record
// an implausible raw (nothing the webhook would fix).
func lostAmplification(n *corev1.Node) bool {
	if n.Annotations[v1alpha1.OversellAppliedByKey] == "" {
		return false
	}
	_, eff, err := nodeAmounts(n.Annotations, n.Status.Capacity)
	if err != nil {
		return false
	}
	for k, q := range eff {
		if cur, ok := n.Status.Allocatable[k]; !ok || cur.Cmp(q) != 0 {
			return true
		}
	}
	return false
}

// ratiosMatch reports whether the ratios annotation records exactly want
// for the resources the raw-allocatable annotation records.
func ratiosMatch(ann map[string]string, want map[string]oversell.Ratio) bool {
	var raw, got map[string]string
	if json.Unmarshal([]byte(ann[v1alpha1.OversellRawAllocatableKey]), &raw) != nil {
		return true // lostAmplification's business
	}
	if s := ann[v1alpha1.OversellRatiosKey]; s != "" && json.Unmarshal([]byte(s), &got) != nil {
		return false
	}
	for res := range raw {
		if res != oversell.CPU.String() && res != oversell.Memory.String() {
			continue
		}
		w, hasW := want[res]
		g, hasG := got[res]
		if hasW != hasG {
			return false
		}
		if hasG {
			r, err := oversell.ParseRatio(g)
			if err != nil || r != w {
				return false
			}
		}
	}
	return true
}

// WriteLostAmplification is the node watch's test for a status write
// that went past the webhook: allocatable changed and the node no longer
// publishes what its annotations record.
func WriteLostAmplification(old, cur client.Object) bool {
	o, ok1 := old.(*corev1.Node)
	n, ok2 := cur.(*corev1.Node)
	if !ok1 || !ok2 {
		return false
	}
	same := func(k corev1.ResourceName) bool {
		a, okA := o.Status.Allocatable[k]
		b, okB := n.Status.Allocatable[k]
		return okA == okB && a.Cmp(b) == 0
	}
	return !(same(corev1.ResourceCPU) && same(corev1.ResourceMemory)) && lostAmplification(n)
}

// nextReamplifyDelay doubles the previous back-off within
// [reamplifyMinDelay, reamplifyMaxDelay].
func nextReamplifyDelay(prev time.Duration) time.Duration {
	return min(max(2*prev, reamplifyMinDelay), reamplifyMaxDelay)
}

// setCondition sets a condition of no at its generation.
func setCondition(no *v1alpha1.NodeOversell, typ string, ok bool, reason, msg string) {
	st := metav1.ConditionFalse
	if ok {
		st = metav1.ConditionTrue
	}
	apimeta.SetStatusCondition(&no.Status.Conditions, metav1.Condition{Type: typ, Status: st, Reason: reason, Message: msg, ObservedGeneration: no.Generation})
}

func summarize(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:n], ", ") + fmt.Sprintf(" and %d more", len(items)-n)
}

// nodeSelector converts spec.nodeSelector; absent means every node, as the
// API documents (metav1.LabelSelectorAsSelector(nil) would mean none).
func nodeSelector(no *v1alpha1.NodeOversell) (labels.Selector, error) {
	if no.Spec.NodeSelector == nil {
		return labels.Everything(), nil
	}
	return metav1.LabelSelectorAsSelector(no.Spec.NodeSelector)
}
