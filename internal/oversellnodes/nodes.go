package oversellnodes

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/podindex"
)

// Event reasons of NodeOversell.
const (
	EventNodesRestored = "NodesRestored"
	eventRestoreGaveUp = "RestoreIncomplete"
	// eventRestoreUntrusted names nodes whose recorded raw allocatable was
	// implausible (see restorePatch).
	eventRestoreUntrusted = "RestoreUntrusted"
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

// Reasons of v1alpha1.ConditionOvercommitted, and its Event.
const (
	reasonRequestsExceed   = "RequestsExceedAllocatable"
	reasonWithinAllocation = "WithinAllocatable"
	eventOvercommitted     = "Overcommitted"
)

// Nodes does one NodeOversell's work on nodes through the API.
type Nodes struct {
	// Client reads nodes from the cache (slimmed to labels, annotations,
	// capacity and allocatable) and writes nodes/status.
	Client client.Client
	// APIReader reads a node uncached before it is restored, and lists pods.
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Now is the clock of the restore deadline and resync stamps; nil means time.Now.
	Now func() time.Time
	// Settings name the server namespace (the server's EndpointSlices).
	Settings desired.Settings
	// Pods is the operator's pod index (what each node's running pods
	// request): with it synced a pass lists no pod. Nil or not synced (a
	// standby replica's validating webhook, a test) falls back to
	// listing pods with APIReader.
	Pods PodSource

	// reamp is the re-amplification back-off (reamplify.go).
	reamp reamplifyBackoff
	// samples keep each NodeOversell's last measurement per node, for a
	// pass that cannot read metrics.k8s.io (targets.go).
	samples lastSamples
}

// PodSource is what a pass reads of the operator's pod index.
type PodSource interface {
	// Synced reports whether the index holds every pod.
	Synced() bool
	// NodePods tells what the running pods on one node request.
	NodePods(node string) (podindex.NodePods, bool)
}

func (n *Nodes) indexed() bool { return n.Pods != nil && n.Pods.Synced() }

func (n *Nodes) now() time.Time {
	if n.Now != nil {
		return n.Now()
	}
	return time.Now()
}

// listNodes lists the nodes from the cache, slimmed to labels,
// annotations, capacity and allocatable (see CacheOptions).
func (n *Nodes) listNodes(ctx context.Context) ([]corev1.Node, error) {
	list := &corev1.NodeList{}
	if err := n.Client.List(ctx, list); err != nil {
		return nil, err
	}
	return list.Items, nil
}

// Sync sets nodesMatched/nodesAmplified and, once per generation and
// only when the webhook is configured and served, touches every selected or
// formerly amplified node through nodes/status so the webhook re-evaluates
// it at once instead of at the kubelet's next report (up to 5 min).
//
// Nodes in written (Targets just wrote them through nodes/status, so the
// webhook re-evaluated them already) are not touched again. Nodes that
// left the selector are Targets' to release or hold.
func (n *Nodes) Sync(ctx context.Context, no *v1alpha1.NodeOversell, written map[string]bool) (time.Duration, error) {
	sel, err := nodeSelector(no)
	if err != nil {
		return 0, fmt.Errorf("spec.nodeSelector: %w", err)
	}
	nodes, err := n.listNodes(ctx)
	if err != nil {
		return 0, err
	}
	var matched int32
	var touch, selected []string
	byName := map[string]*corev1.Node{}
	for i := range nodes {
		n := &nodes[i]
		m := sel.Matches(labels.Set(n.Labels))
		if m {
			matched++
			selected = append(selected, n.Name)
			byName[n.Name] = n
		}
		if (m || n.Annotations[v1alpha1.OversellAppliedByKey] == no.Name) && !written[n.Name] {
			touch = append(touch, n.Name)
		}
	}
	var pendingRestore time.Duration
	t := amplifiedTotals(nodes, no.Name)
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
	over, err := n.overcommitted(ctx, no, selected, byName)
	if err != nil {
		return 0, err
	}
	if len(over) > 0 {
		msg := fmt.Sprintf("generation %d: %d nodes have more requested than their new allocatable: %s", no.Generation, len(over), summarize(over, 10))
		setCondition(no, v1alpha1.ConditionOvercommitted, true, reasonRequestsExceed, msg)
		n.Recorder.Eventf(no, nil, corev1.EventTypeWarning, eventOvercommitted, "Resync", msg)
	} else {
		setCondition(no, v1alpha1.ConditionOvercommitted, false, reasonWithinAllocation,
			fmt.Sprintf("generation %d: pod requests fit the new allocatable of every selected node", no.Generation))
	}
	slices.Sort(touch)
	stamp := n.now().UTC().Format(time.RFC3339Nano)
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, v1alpha1.OversellResyncKey, stamp)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(resyncWorkers)
	for _, name := range touch {
		g.Go(func() error {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
			if err := n.Client.Status().Patch(gctx, node, client.RawPatch(types.MergePatchType, patch)); client.IgnoreNotFound(err) != nil {
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
		n.Recorder.Eventf(no, nil, corev1.EventTypeNormal, EventNodesResynced, "Resync",
			"generation %d: %d nodes re-evaluated through nodes/status: %s", no.Generation, len(touch), summarize(touch, 10))
	}
	return pendingRestore, nil
}

// overcommitted checks every selected node that carries a recorded raw
// allocatable against the new ratios of no: it returns one line per node
// whose pods request more than raw × ratio, sorted. The nodes' pods are
// listed resyncWorkers at a time (one uncached list per node: the resync
// that follows waits for this).
func (n *Nodes) overcommitted(ctx context.Context, no *v1alpha1.NodeOversell, nodes []string, byName map[string]*corev1.Node) ([]string, error) {
	lines := make([][]string, len(nodes))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(resyncWorkers)
	for i, name := range nodes {
		raw, _, err := nodeAmounts(byName[name].Annotations, byName[name].Status.Capacity)
		if err != nil {
			continue // not amplified yet: the kubelet's value is already real
		}
		if n.indexed() {
			np, _ := n.Pods.NodePods(name)
			lines[i] = nodeOvercommit(no, name, byName[name], raw, corev1.ResourceList{corev1.ResourceCPU: np.CPU, corev1.ResourceMemory: np.Memory})
			continue
		}
		g.Go(func() error {
			var pods corev1.PodList
			if err := n.APIReader.List(gctx, &pods, client.MatchingFields{"spec.nodeName": name}); err != nil {
				return fmt.Errorf("list pods on %s: %w", name, err)
			}
			lines[i] = nodeOvercommit(no, name, byName[name], raw, requestedOn(pods.Items))
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	out := slices.Concat(lines...)
	slices.Sort(out)
	return out, nil
}

// Restore runs while a NodeOversell is being deleted, once its webhook
// configuration has lost its webhooks (so its server no longer rewrites
// node status; the garbage collector deletes the configuration with the
// CR). It restores every node the CR amplified, and reports done once no
// node carries applied-by=<name> any more (or the deadline passed).
func (n *Nodes) Restore(ctx context.Context, no *v1alpha1.NodeOversell) (bool, time.Duration, error) {
	nodes, err := n.listNodes(ctx)
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
		if err := n.APIReader.Get(ctx, client.ObjectKey{Name: m.Name}, node); err != nil {
			if client.IgnoreNotFound(err) == nil {
				continue
			}
			return false, 0, err
		}
		if node.Annotations[v1alpha1.OversellAppliedByKey] != no.Name {
			continue // the cache was behind
		}
		pending++
		patch, notes := restorePatch(node)
		if len(notes) > 0 {
			untrusted = append(untrusted, node.Name+": "+strings.Join(notes, ", "))
		}
		if err := n.Client.Status().Patch(ctx, node, client.RawPatch(types.MergePatchType, patch)); client.IgnoreNotFound(err) != nil {
			return false, 0, fmt.Errorf("restore node %s: %w", node.Name, err)
		}
		if node.Annotations[v1alpha1.OversellAppliedByKey] == no.Name {
			// A webhook the API server still called put it back.
			continue
		}
		restored = append(restored, node.Name)
	}
	if len(restored) > 0 {
		n.Recorder.Eventf(no, nil, corev1.EventTypeNormal, EventNodesRestored, "Restore",
			"raw allocatable restored on %d nodes: %s", len(restored), summarize(restored, 10))
	} else if pending == 0 && no.Status.NodesAmplified > 0 {
		// A node status write (the kubelet's, kwok's) reached the webhook
		// after the deletion began: a NodeOversell being deleted is no
		// policy any more, so the server itself gave the raw values back.
		n.Recorder.Eventf(no, nil, corev1.EventTypeNormal, EventNodesRestored, "Restore",
			"the %d amplified nodes already have their raw allocatable back (re-evaluated by the webhook once this NodeOversell was being deleted)", no.Status.NodesAmplified)
	}
	if len(untrusted) > 0 {
		n.Recorder.Eventf(no, nil, corev1.EventTypeWarning, eventRestoreUntrusted, "Restore",
			"recorded raw allocatable not trusted on %d nodes: %s", len(untrusted), summarize(untrusted, 5))
	}
	if pending == len(restored) {
		return true, 0, nil
	}
	if since := n.now().Sub(no.DeletionTimestamp.Time); since > restoreDeadline {
		msg := fmt.Sprintf("%d of %d nodes not restored after %s (re-amplified by a webhook still called); releasing the finalizer, their next kubelet report restores them",
			pending-len(restored), pending, since.Round(time.Second))
		n.Recorder.Eventf(no, nil, corev1.EventTypeWarning, eventRestoreGaveUp, "Restore", msg)
		return true, 0, nil
	}
	return false, time.Second, nil
}
