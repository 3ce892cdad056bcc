package controllers

import (
	"context"
	"encoding/json"
	"sort"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/webhooks/oversell"
)

var (
	_ probing = sidecarKind{}
	_ probing = oversellKind{}
)

func failsOpen(wh *admissionregistrationv1.MutatingWebhookConfiguration) bool {
	return len(wh.Webhooks) > 0 && wh.Webhooks[0].FailurePolicy != nil && *wh.Webhooks[0].FailurePolicy == admissionregistrationv1.Ignore
}

// ProbeObjects: the CR's probe namespace (desired.ProbeNamespace).
func (sidecarKind) ProbeObjects(cr v1alpha1.Object, _ desired.Settings) ([]client.Object, error) {
	ns, err := desired.ProbeNamespace(cr.(*v1alpha1.SidecarInjector))
	if err != nil {
		return nil, err
	}
	return []client.Object{ns}, nil
}

// Probe: a server-side dry-run create (dryRun=All: admission runs, nothing
// is stored) of desired.ProbePod in the probe namespace; the pod the API
// server returns must carry this injector's status annotation.
func (sidecarKind) Probe(c client.Client, cr v1alpha1.Object, wh *admissionregistrationv1.MutatingWebhookConfiguration, s desired.Settings) probeFunc {
	si := cr.(*v1alpha1.SidecarInjector)
	open := failsOpen(wh)
	return func(ctx context.Context) probeOutcome {
		pod, err := desired.ProbePod(si, s.Image)
		if err != nil {
			return probeOutcome{Unknown: true, Reason: v1alpha1.WebhookProbeReasonNoTarget, Message: err.Error()}
		}
		what := "dry-run pod create in namespace " + pod.Namespace
		if err := c.Create(ctx, pod, client.DryRunAll); err != nil {
			return probeError(desired.SidecarKind.WebhookName, what, err)
		}
		st, ok := pod.Annotations[v1alpha1.SidecarStatusKey]
		if !ok {
			if open {
				return probeFailed(v1alpha1.WebhookProbeReasonNotCalled,
					"%s: admitted without injection; with failurePolicy Ignore the API server admits a pod when the webhook call fails", what)
			}
			return probeFailed(v1alpha1.WebhookProbeReasonWrongAnswer, "%s: admitted without the %s annotation: the webhook did not inject the probe pod", what, v1alpha1.SidecarStatusKey)
		}
		var status struct {
			Injector string `json:"injector"`
		}
		if json.Unmarshal([]byte(st), &status) != nil || status.Injector != si.Name {
			return probeFailed(v1alpha1.WebhookProbeReasonWrongAnswer, "%s: annotation %s is %q, not this injector's", what, v1alpha1.SidecarStatusKey, st)
		}
		return probeOK("%s was injected by the webhook", what)
	}
}

// ProbeObjects: none (the probe patches a selected node with dryRun=All).
func (oversellKind) ProbeObjects(v1alpha1.Object, desired.Settings) ([]client.Object, error) {
	return nil, nil
}

// Probe: a dry-run (dryRun=All) merge patch of nodes/status of one
// selected node this NodeOversell wins, setting its cpu allocatable 1m
// lower (or its memory 1 byte lower). The webhook answers every status
// write of a selected node, and a write by the operator (a writer whose
// allocatable is not trusted) must come back with what the engine decides
// for it (webhooks/oversell Decide, computed here too): the allocatable
// from the recorded raw times the ratios and the bookkeeping annotations.
// Came back as sent: not called (failurePolicy is always Ignore). A dry
// run reaches neither etcd nor the node's resourceVersion, so the
// kubelet's heartbeats (patches without a precondition) and its Lease are
// untouched; a probe node object would be a real write and a fake node in
// every node list. With no selected node there is nothing the webhook
// would be called for: Unknown (NoProbeTarget).
func (oversellKind) Probe(c client.Client, cr v1alpha1.Object, _ *admissionregistrationv1.MutatingWebhookConfiguration, _ desired.Settings) probeFunc {
	no := cr.(*v1alpha1.NodeOversell)
	return func(ctx context.Context) probeOutcome {
		node, want, applied, sent, err := oversellProbeTarget(ctx, c, no)
		if err != nil {
			return probeFailed(v1alpha1.WebhookProbeReasonProbeFailed, "choose a node to probe: %v", err)
		}
		if node == nil {
			return probeOutcome{Unknown: true, Reason: v1alpha1.WebhookProbeReasonNoTarget, Message: "no selected node this NodeOversell wins: nothing to probe"}
		}
		what := "dry-run nodes/status patch of node " + node.Name
		body, _ := json.Marshal(map[string]any{"status": map[string]any{"allocatable": sent}})
		got := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node.Name}}
		if err := c.Status().Patch(ctx, got, client.RawPatch(types.MergePatchType, body),
			&client.SubResourcePatchOptions{PatchOptions: client.PatchOptions{DryRun: []string{metav1.DryRunAll}}}); err != nil {
			return probeError(desired.OversellKind.WebhookName, what, err)
		}
		asSent, asWanted := true, true
		for res, q := range sent {
			if g := got.Status.Allocatable[corev1.ResourceName(res)]; g.Cmp(resource.MustParse(q)) != 0 {
				asSent = false
			}
		}
		for res, q := range want {
			if g := got.Status.Allocatable[res]; g.Cmp(q) != 0 {
				asWanted = false
			}
		}
		if asWanted && got.Annotations[v1alpha1.OversellAppliedByKey] == applied {
			return probeOK("%s was answered by the webhook", what)
		}
		if asSent {
			return probeFailed(v1alpha1.WebhookProbeReasonNotCalled,
				"%s came back as sent: the API server did not call the webhook (failurePolicy Ignore admits the write when the call fails)", what)
		}
		return probeFailed(v1alpha1.WebhookProbeReasonWrongAnswer, "%s: allocatable %v and %s=%q, want %v and %q", what,
			got.Status.Allocatable, v1alpha1.OversellAppliedByKey, got.Annotations[v1alpha1.OversellAppliedByKey], want, applied)
	}
}

// oversellProbeTarget picks the first selected node (by name) that no
// wins and whose write the engine would change, with the allocatable to
// send and the one to expect.
func oversellProbeTarget(ctx context.Context, c client.Client, no *v1alpha1.NodeOversell) (node *corev1.Node, want corev1.ResourceList, applied string, sent map[string]string, err error) {
	var all v1alpha1.NodeOversellList
	if err := c.List(ctx, &all); err != nil {
		return nil, nil, "", nil, err
	}
	objs := make([]*v1alpha1.NodeOversell, 0, len(all.Items))
	for i := range all.Items {
		objs = append(objs, &all.Items[i])
	}
	snap := oversell.BuildSnapshot(objs, nil, true)
	nodeSel := no.Spec.NodeSelector
	if nodeSel == nil {
		nodeSel = &metav1.LabelSelector{}
	}
	sel, err := metav1.LabelSelectorAsSelector(nodeSel)
	if err != nil {
		return nil, nil, "", nil, err
	}
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes, client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return nil, nil, "", nil, err
	}
	sort.Slice(nodes.Items, func(i, j int) bool { return nodes.Items[i].Name < nodes.Items[j].Name })
	for i := range nodes.Items {
		n := &nodes.Items[i]
		p, act := snap.Route(n.Labels, no.Name)
		if !act || p == nil || p.Name != no.Name {
			continue
		}
		sent = map[string]string{}
		for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			q, ok := n.Status.Allocatable[res]
			if !ok {
				continue
			}
			one := resource.MustParse("1m")
			if res == corev1.ResourceMemory {
				one = resource.MustParse("1")
			}
			if q.Cmp(one) <= 0 {
				continue
			}
			q.Sub(one)
			sent[string(res)] = q.String()
			break
		}
		if len(sent) == 0 {
			continue
		}
		state := func(alloc map[string]string) oversell.NodeState {
			return oversell.NodeState{Labels: n.Labels, Annotations: n.Annotations, Capacity: quantities(n.Status.Capacity), Allocatable: alloc}
		}
		stored := state(quantities(n.Status.Allocatable))
		after := quantities(n.Status.Allocatable)
		for k, v := range sent {
			after[k] = v
		}
		d := oversell.Decide(oversell.Input{Writer: oversell.WriterOther, Object: state(after), Old: &stored, Policy: p})
		if !d.Apply || d.Restore {
			continue
		}
		want = corev1.ResourceList{}
		for r, name := range map[oversell.Resource]corev1.ResourceName{oversell.CPU: corev1.ResourceCPU, oversell.Memory: corev1.ResourceMemory} {
			if d.Present[r] {
				want[name] = d.Effective[r]
			}
		}
		return n, want, d.Annotations[2], sent, nil
	}
	return nil, nil, "", nil, nil
}

func quantities(l corev1.ResourceList) map[string]string {
	m := make(map[string]string, len(l))
	for k, v := range l {
		m[string(k)] = v.String()
	}
	return m
}
