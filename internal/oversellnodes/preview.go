package oversellnodes

import (
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/usageratio"
	"github.com/hookwright/hookwright/webhooks/oversell"
)

// PreviewHolds answers, for the validating webhook, what an update of a
// NodeOversell from old to cur would hold: one line per node whose running
// pods request more than the allocatable cur's spec.ratios give it (a
// lowered ratio) or than its raw allocatable (a node cur's selector drops),
// naming the excess and the ratio the node is held at, sorted. Nothing is
// written; the nodes are read from the cache and the pods listed once.
func (n *Nodes) PreviewHolds(ctx context.Context, old, cur *v1alpha1.NodeOversell) ([]string, error) {
	pol, err := oversell.CompilePolicy(cur)
	if err != nil {
		return nil, nil // the webhook reports the compile error
	}
	sel, err := nodeSelector(cur)
	if err != nil {
		return nil, nil
	}
	oldSel, err := nodeSelector(old)
	if err != nil {
		oldSel = labels.Nothing()
	}
	nodes, err := n.listNodes(ctx)
	if err != nil {
		return nil, err
	}
	var todo []*corev1.Node
	for i := range nodes {
		nd := &nodes[i]
		ours := nd.Labels[v1alpha1.OversellNodeLabel] == cur.Name || nd.Annotations[v1alpha1.OversellAppliedByKey] == cur.Name
		if ours || oldSel.Matches(labels.Set(nd.Labels)) {
			todo = append(todo, nd)
		}
	}
	if len(todo) == 0 {
		return nil, nil
	}
	var pods corev1.PodList
	if err := n.APIReader.List(ctx, &pods); err != nil {
		return nil, err
	}
	byNode := groupPods(pods.Items)
	var out []string
	for _, nd := range todo {
		in := usageratio.Input{
			Static: pol.Ratios, Ceiling: pol.Ceiling, Raw: nodeRaw(nd), Capacity: nodeCapacity(nd),
			Leaving: !sel.Matches(labels.Set(nd.Labels)),
		}
		if np := byNode[nd.Name]; np != nil {
			in.Requests = np.requests
			if staticCPUManager(cur, nd) {
				in.Exclusive = np.exclusive
			}
		}
		d := usageratio.Decide(usageratio.Config{}, in)
		if len(d.Held) == 0 {
			continue
		}
		var at []string
		for r, x := range d.Ratio {
			if x.IsSet() {
				at = append(at, fmt.Sprintf("%s %s", oversell.Resource(r), x))
			}
		}
		line := fmt.Sprintf("%s: %s; held at %s", nd.Name, strings.Join(d.Held, "; "), strings.Join(at, ", "))
		if len(d.Stranded) > 0 {
			line += " (the most it can be held at: " + strings.Join(d.Stranded, "; ") + ")"
		}
		out = append(out, line)
	}
	sort.Strings(out)
	return out, nil
}
