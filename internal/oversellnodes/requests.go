package oversellnodes

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/usageratio"
	"github.com/hookwright/hookwright/webhooks/oversell"
)

// podRequests is usageratio.PodRequests.
func podRequests(p *corev1.Pod) corev1.ResourceList { return usageratio.PodRequests(p) }

// requestedOn sums what the non-terminated pods request.
func requestedOn(pods []corev1.Pod) corev1.ResourceList {
	requested := corev1.ResourceList{}
	for i := range pods {
		p := &pods[i]
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for k, q := range podRequests(p) {
			v := requested[k]
			v.Add(q)
			requested[k] = v
		}
	}
	return requested
}

// nodeOvercommit is one line per resource of node whose non-terminated
// pods request more than raw × the ratio of no (requested).
func nodeOvercommit(no *v1alpha1.NodeOversell, name string, node *corev1.Node, raw, requested corev1.ResourceList) []string {
	var out []string
	for _, res := range []oversell.Resource{oversell.CPU, oversell.Memory} {
		k := corev1.ResourceName(res.String())
		q, ok := raw[k]
		if !ok {
			continue
		}
		ratio, _ := oversell.ParseRatio(string(ratioOf(no, res)))
		var capQ *resource.Quantity
		if c, ok := node.Status.Capacity[k]; ok {
			capQ = &c
		}
		alloc := oversell.Amplify(res, q, capQ, ratio)
		if req := requested[k]; req.Cmp(alloc) > 0 {
			out = append(out, fmt.Sprintf("%s (%s requested %s > allocatable %s)", name, k, req.String(), alloc.String()))
		}
	}
	return out
}

func ratioOf(no *v1alpha1.NodeOversell, res oversell.Resource) v1alpha1.Ratio {
	if res == oversell.CPU {
		return no.Spec.Ratios.CPU
	}
	return no.Spec.Ratios.Memory
}
