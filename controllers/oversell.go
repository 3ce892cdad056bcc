package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/webhooks/oversell"
)

// The NodeOversell reconciler reads nodes and writes their status (resync
// touches and restores on deletion).
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes/status,verbs=patch

// OversellFinalizer holds a NodeOversell until every node it amplified has
// its raw allocatable back.
const OversellFinalizer = "oversell.hookwright.io/restore"

// Event reasons of NodeOversell.
const (
	EventNodesRestored = "NodesRestored"
	EventRestoreGaveUp = "RestoreIncomplete"
	// EventRestoreUntrusted names nodes whose recorded raw allocatable was
	// implausible (see RestorePatch).
	EventRestoreUntrusted = "RestoreUntrusted"
	EventNodesResynced    = "NodesResynced"
)

// restoreDeadline bounds how long a deleting NodeOversell waits for its
// nodes to stay restored. A webhook server that has not yet seen the
// deletion (or one run without --node-oversell) may re-amplify a node after
// the restore; past the deadline the finalizer is released and the nodes'
// next kubelet report (no policy any more) restores them.
const restoreDeadline = 30 * time.Second

// resyncWorkers bounds the concurrent nodes/status writes of one resync.
// Each write also goes through the oversell webhook, so one costs a round
// trip of ~10-25 ms on a loaded control plane; 8 in flight keep 100 nodes
// well inside the 5 s goal without a burst the API server's priority and
// fairness would queue.
const resyncWorkers = 8

// NewOversellReconciler reconciles NodeOversell objects: the common
// lifecycle, plus a finalizer that restores amplified nodes, a nodes/status
// touch of every affected node on each new generation, and nodesMatched.
func NewOversellReconciler(mgr ctrl.Manager, s Settings) *Reconciler {
	r := newReconciler(mgr, s, desired.OversellKind)
	r.newObject = func() client.Object { return &v1alpha1.NodeOversell{} }
	r.newList = func() client.ObjectList { return &v1alpha1.NodeOversellList{} }
	r.operand = func(o client.Object) desired.CR { return desired.OversellCR(o.(*v1alpha1.NodeOversell)) }
	r.build = func(o client.Object, s desired.Settings) *desired.Desired {
		return desired.BuildNodeOversell(o.(*v1alpha1.NodeOversell), s)
	}
	r.finalizer = OversellFinalizer
	r.watchNodes = true
	r.finalize = func(ctx context.Context, o client.Object) (bool, time.Duration, error) {
		return r.restoreNodes(ctx, o.(*v1alpha1.NodeOversell))
	}
	r.afterApply = func(ctx context.Context, o client.Object) (time.Duration, error) {
		return r.syncNodes(ctx, o.(*v1alpha1.NodeOversell))
	}
	return r
}

// NodeSelector converts spec.nodeSelector; absent means every node, as the
// API documents (metav1.LabelSelectorAsSelector(nil) would mean none).
func NodeSelector(no *v1alpha1.NodeOversell) (labels.Selector, error) {
	if no.Spec.NodeSelector == nil {
		return labels.Everything(), nil
	}
	return metav1.LabelSelectorAsSelector(no.Spec.NodeSelector)
}

// listNodes lists the nodes from the cache, slimmed to labels,
// annotations, capacity and allocatable (see CacheOptions).
func (r *Reconciler) listNodes(ctx context.Context) ([]corev1.Node, error) {
	list := &corev1.NodeList{}
	if err := r.Client.List(ctx, list); err != nil {
		return nil, err
	}
	return list.Items, nil
}

// syncNodes sets nodesMatched/nodesAmplified and, once per generation and
// only when the webhook is configured and served, touches every selected or
// formerly amplified node through nodes/status so the webhook re-evaluates
// it at once instead of at the kubelet's next report (up to 5 min).
func (r *Reconciler) syncNodes(ctx context.Context, no *v1alpha1.NodeOversell) (time.Duration, error) {
	sel, err := NodeSelector(no)
	if err != nil {
		return 0, fmt.Errorf("spec.nodeSelector: %w", err)
	}
	nodes, err := r.listNodes(ctx)
	if err != nil {
		return 0, err
	}
	var matched int32
	var touch, selected, deselected []string
	byName := map[string]*corev1.Node{}
	for i := range nodes {
		n := &nodes[i]
		m := sel.Matches(labels.Set(n.Labels))
		if m {
			matched++
			selected = append(selected, n.Name)
			byName[n.Name] = n
		}
		if m || n.Annotations[v1alpha1.OversellAppliedByKey] == no.Name {
			touch = append(touch, n.Name)
		}
		if !m && n.Annotations[v1alpha1.OversellAppliedByKey] == no.Name {
			deselected = append(deselected, n.Name)
		}
	}
	// The webhook's objectSelector is the nodeSelector: a node that left it
	// (label changed through nodes, selector narrowed) reaches this server
	// no more, so the operator gives it back. A restore write that another
	// NodeOversell's webhook receives is amplified by that one instead.
	pendingRestore, err := r.restoreDeselected(ctx, no, sel, deselected)
	if err != nil {
		return 0, err
	}
	t := AmplifiedTotals(nodes, no.Name)
	no.Status.NodesMatched, no.Status.NodesAmplified = matched, t.Nodes
	no.Status.RawAllocatable, no.Status.EffectiveAllocatable = t.Raw, t.Effective
	if len(t.Problems) > 0 {
		log.FromContext(ctx).Info("nodes with unreadable oversell annotations left out of the totals", "problems", t.Problems)
	}

	if no.Status.ResyncedGeneration == no.Generation {
		return pendingRestore, nil
	}
	ready := func(t string) bool {
		for _, c := range no.Status.Conditions {
			if c.Type == t {
				return c.Status == metav1.ConditionTrue
			}
		}
		return false
	}
	if !ready(v1alpha1.ConditionWebhookConfigured) || !ready(v1alpha1.ConditionServerAvailable) {
		return pendingRestore, nil // the Deployment becoming available re-triggers us
	}
	// Before the new ratios apply: would any node end up with more
	// requested than allocatable?
	over, err := r.overcommitted(ctx, no, selected, byName)
	if err != nil {
		return 0, err
	}
	op := desired.OversellCR(no)
	if len(over) > 0 {
		msg := fmt.Sprintf("generation %d: %d nodes have more requested than their new allocatable: %s", no.Generation, len(over), summarize(over, 10))
		r.setCondition(op, ConditionOvercommitted, true, ReasonRequestsExceed, msg)
		r.Recorder.Eventf(no, nil, corev1.EventTypeWarning, EventOvercommitted, "Resync", msg)
	} else {
		r.setCondition(op, ConditionOvercommitted, false, ReasonWithinAllocation,
			fmt.Sprintf("generation %d: pod requests fit the new allocatable of every selected node", no.Generation))
	}
	slices.Sort(touch)
	stamp := r.now().UTC().Format(time.RFC3339Nano)
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, v1alpha1.OversellResyncKey, stamp)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(resyncWorkers)
	for _, name := range touch {
		g.Go(func() error {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
			if err := r.Client.Status().Patch(gctx, node, client.RawPatch(types.MergePatchType, patch)); client.IgnoreNotFound(err) != nil {
				return fmt.Errorf("resync node %s: %w", name, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	no.Status.ResyncedGeneration = no.Generation
	if len(touch) > 0 {
		log.FromContext(ctx).Info("nodes resynced", "generation", no.Generation, "nodes", len(touch))
		r.Recorder.Eventf(no, nil, corev1.EventTypeNormal, EventNodesResynced, "Resync",
			"generation %d: %d nodes re-evaluated through nodes/status: %s", no.Generation, len(touch), summarize(touch, 10))
	}
	return pendingRestore, nil
}

// restoreDeselected writes RestorePatch to each named node that still
// carries applied-by=<no> and that no's selector no longer matches (both
// re-read from the API server). It returns a requeue delay while a node
// still carries applied-by=<no> after the write (a webhook server with a
// stale snapshot amplified it again).
func (r *Reconciler) restoreDeselected(ctx context.Context, no *v1alpha1.NodeOversell, sel labels.Selector, names []string) (time.Duration, error) {
	var restored, untrusted []string
	pending := false
	for _, name := range names {
		node := &corev1.Node{}
		if err := r.APIReader.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
			if client.IgnoreNotFound(err) == nil {
				continue
			}
			return 0, err
		}
		if node.Annotations[v1alpha1.OversellAppliedByKey] != no.Name || sel.Matches(labels.Set(node.Labels)) {
			continue // the cache was behind
		}
		patch, notes := RestorePatch(node)
		if len(notes) > 0 {
			untrusted = append(untrusted, node.Name+": "+strings.Join(notes, ", "))
		}
		if err := r.Client.Status().Patch(ctx, node, client.RawPatch(types.MergePatchType, patch)); err != nil {
			if client.IgnoreNotFound(err) == nil {
				continue
			}
			return 0, fmt.Errorf("restore deselected node %s: %w", node.Name, err)
		}
		if node.Annotations[v1alpha1.OversellAppliedByKey] == no.Name {
			pending = true
			continue
		}
		restored = append(restored, node.Name)
	}
	if len(restored) > 0 {
		log.FromContext(ctx).Info("deselected nodes restored", "nodes", restored)
		r.Recorder.Eventf(no, nil, corev1.EventTypeNormal, EventNodesRestored, "Restore",
			"raw allocatable restored on %d nodes the selector no longer matches: %s", len(restored), summarize(restored, 10))
	}
	if len(untrusted) > 0 {
		r.Recorder.Eventf(no, nil, corev1.EventTypeWarning, EventRestoreUntrusted, "Restore",
			"recorded raw allocatable not trusted on %d deselected nodes: %s", len(untrusted), summarize(untrusted, 5))
	}
	if pending {
		return time.Second, nil
	}
	return 0, nil
}

// Totals are the sums over the nodes one NodeOversell amplifies.
type Totals struct {
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

// AmplifiedTotals computes Totals from the nodes' annotations, which the
// webhook writes with the raw values and ratios, checked against each
// node's status.capacity as the engine checks them.
func AmplifiedTotals(nodes []corev1.Node, name string) Totals {
	var t Totals
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
	if err := json.Unmarshal([]byte(ann[v1alpha1.OversellRawAllocatableKey]), &rawS); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", v1alpha1.OversellRawAllocatableKey, err)
	}
	if s := ann[v1alpha1.OversellRatiosKey]; s != "" {
		if err := json.Unmarshal([]byte(s), &ratioS); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", v1alpha1.OversellRatiosKey, err)
		}
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
		raw[k], eff[k] = q, oversell.Amplify(res, q, capQ, ratio)
	}
	return raw, eff, nil
}

// RestorePatch is the JSON merge patch of nodes/status that gives a node its
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
func RestorePatch(node *corev1.Node) (patch []byte, notes []string) {
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

// restoreNodes runs while a NodeOversell is being deleted. It empties the
// CR's webhook configuration first (so its server no longer rewrites node
// status; the garbage collector deletes the configuration with the CR),
// then restores every node the CR amplified, and reports done once no node
// carries applied-by=<name> any more (or the deadline passed).
func (r *Reconciler) restoreNodes(ctx context.Context, no *v1alpha1.NodeOversell) (bool, time.Duration, error) {
	op := desired.OversellCR(no)
	if _, _, err := r.disarm(ctx, op, op.Kind.BaseName(no.Name)); err != nil {
		return false, 0, err
	}
	nodes, err := r.listNodes(ctx)
	if err != nil {
		return false, 0, err
	}
	var restored, untrusted []string
	pending := 0
	for _, m := range nodes {
		if m.Annotations[v1alpha1.OversellAppliedByKey] != no.Name {
			continue
		}
		node := &corev1.Node{}
		if err := r.APIReader.Get(ctx, client.ObjectKey{Name: m.Name}, node); err != nil {
			if client.IgnoreNotFound(err) == nil {
				continue
			}
			return false, 0, err
		}
		if node.Annotations[v1alpha1.OversellAppliedByKey] != no.Name {
			continue // the cache was behind
		}
		pending++
		patch, notes := RestorePatch(node)
		if len(notes) > 0 {
			untrusted = append(untrusted, node.Name+": "+strings.Join(notes, ", "))
		}
		if err := r.Client.Status().Patch(ctx, node, client.RawPatch(types.MergePatchType, patch)); client.IgnoreNotFound(err) != nil {
			return false, 0, fmt.Errorf("restore node %s: %w", node.Name, err)
		}
		if node.Annotations[v1alpha1.OversellAppliedByKey] == no.Name {
			// A webhook the API server still called put it back.
			continue
		}
		restored = append(restored, node.Name)
	}
	if len(restored) > 0 {
		r.Recorder.Eventf(no, nil, corev1.EventTypeNormal, EventNodesRestored, "Restore",
			"raw allocatable restored on %d nodes: %s", len(restored), summarize(restored, 10))
	} else if pending == 0 && no.Status.NodesAmplified > 0 {
		// A node status write (the kubelet's, kwok's) reached the webhook
		// after the deletion began: a NodeOversell being deleted is no
		// policy any more, so the server itself gave the raw values back.
		r.Recorder.Eventf(no, nil, corev1.EventTypeNormal, EventNodesRestored, "Restore",
			"the %d amplified nodes already have their raw allocatable back (re-evaluated by the webhook once this NodeOversell was being deleted)", no.Status.NodesAmplified)
	}
	if len(untrusted) > 0 {
		r.Recorder.Eventf(no, nil, corev1.EventTypeWarning, EventRestoreUntrusted, "Restore",
			"recorded raw allocatable not trusted on %d nodes: %s", len(untrusted), summarize(untrusted, 5))
	}
	if pending == len(restored) {
		return true, 0, nil
	}
	if since := r.now().Sub(no.DeletionTimestamp.Time); since > restoreDeadline {
		msg := fmt.Sprintf("%d of %d nodes not restored after %s (re-amplified by a webhook still called); releasing the finalizer, their next kubelet report restores them",
			pending-len(restored), pending, since.Round(time.Second))
		r.Recorder.Eventf(no, nil, corev1.EventTypeWarning, EventRestoreGaveUp, "Restore", msg)
		return true, 0, nil
	}
	return false, time.Second, nil
}
