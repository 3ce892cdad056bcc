package oversellnodes

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
)

// Under failurePolicy Ignore a kubelet status patch that reaches no oversell
// server is stored as it is: the node publishes its raw allocatable. The
// kubelet then sees nothing to correct and writes its status again only
// after nodeStatusReportFrequency (5 min by default) plus a random delay
// of -50 %..+50 % of it, set because its last patch changed the status
// (k8s.io/kubernetes v1.37 pkg/kubelet/kubelet_node_status.go:
// tryUpdateNodeStatus, isUpdateStatusPeriodExpired, calculateDelay), so
// amplification would come back 2.5 to 7.5 minutes after the server.
// The operator closes that gap: once the server's Service has a ready
// endpoint again it touches (nodes/status) every selected node whose
// stored status is not what the webhook publishes, so the webhook
// re-evaluates it at once.

// EventNodesReamplified reports the nodes re-amplified after their status
// was stored without the webhook.
const EventNodesReamplified = "NodesReamplified"

// Bounds of the re-touch back-off while touched nodes stay unamplified (a
// server that is ready but not reached, or that declines them): past the
// maximum, the kubelet's own report period is as fast.
const (
	reamplifyMinDelay = time.Second
	reamplifyMaxDelay = 5 * time.Minute
)

// reamplifyState is one NodeOversell's back-off: the ready endpoints of its
// last touch (a change, such as the server coming back, touches at once),
// the delay and when the next touch is due.
type reamplifyState struct {
	endpoints string
	delay     time.Duration
	due       time.Time
}

// reamplifyBackoff holds reamplifyState per NodeOversell name.
type reamplifyBackoff struct {
	mu sync.Mutex
	m  map[string]reamplifyState
}

func (b *reamplifyBackoff) get(name string) reamplifyState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.m[name]
}

func (b *reamplifyBackoff) set(name string, s reamplifyState) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string]reamplifyState{}
	}
	b.m[name] = s
}

func (b *reamplifyBackoff) forget(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.m, name)
}

// readyEndpoints lists (sorted, from the cache) the ready endpoint
// addresses of the server Service of op.
func (n *Nodes) readyEndpoints(ctx context.Context, no *v1alpha1.NodeOversell) (string, error) {
	op := desired.OversellCR(no)
	var eps discoveryv1.EndpointSliceList
	if err := n.Client.List(ctx, &eps, client.InNamespace(desired.ServerNamespace(op, n.Settings)),
		client.MatchingLabels{discoveryv1.LabelServiceName: op.Base()}); err != nil {
		return "", err
	}
	var addrs []string
	for _, s := range eps.Items {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				addrs = append(addrs, e.Addresses...)
			}
		}
	}
	slices.Sort(addrs)
	return strings.Join(slices.Compact(addrs), ","), nil
}

// Reamplify touches the nodes unamplifiedNodes names once no's webhook is
// configured and its Service has a ready endpoint, and returns when to look
// again: never while none is left or the server is not ready (an
// EndpointSlice event brings the reconcile back), else after a back-off.
// It leaves a generation the resync has not yet acted on to syncNodes.
func (n *Nodes) Reamplify(ctx context.Context, no *v1alpha1.NodeOversell) (time.Duration, error) {
	if no.Status.ResyncedGeneration != no.Generation || !apimeta.IsStatusConditionTrue(no.Status.Conditions, v1alpha1.ConditionWebhookConfigured) {
		return 0, nil
	}
	sel, err := nodeSelector(no)
	if err != nil {
		return 0, nil // syncNodes reports it
	}
	nodes, err := n.listNodes(ctx)
	if err != nil {
		return 0, err
	}
	var all v1alpha1.NodeOversellList
	if err := n.Client.List(ctx, &all); err != nil {
		return 0, err
	}
	names := map[string]bool{}
	for _, o := range all.Items {
		names[o.Name] = true
	}
	exists := func(n string) bool { return names[n] }
	stale := unamplifiedNodes(nodes, no, sel, exists)
	if len(stale) == 0 {
		n.reamp.forget(no.Name)
		return 0, nil
	}
	eps, err := n.readyEndpoints(ctx, no)
	if err != nil {
		return 0, err
	}
	if eps == "" {
		return 0, nil
	}
	st, now := n.reamp.get(no.Name), n.now()
	if st.endpoints == eps && now.Before(st.due) {
		return st.due.Sub(now), nil
	}
	stamp := now.UTC().Format(time.RFC3339Nano)
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, v1alpha1.OversellResyncKey, stamp)
	var mu sync.Mutex
	var fixed, left []string
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(resyncWorkers)
	for _, name := range stale {
		g.Go(func() error {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
			if err := n.Client.Status().Patch(gctx, node, client.RawPatch(types.MergePatchType, patch)); err != nil {
				return client.IgnoreNotFound(err)
			}
			// The response is the stored node: did the webhook act?
			mu.Lock()
			defer mu.Unlock()
			if len(unamplifiedNodes([]corev1.Node{*node}, no, sel, exists)) == 0 {
				fixed = append(fixed, name)
			} else {
				left = append(left, name)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, fmt.Errorf("re-amplify nodes: %w", err)
	}
	slices.Sort(fixed)
	if len(fixed) > 0 {
		log.FromContext(ctx).Info("nodes re-amplified", "nodes", len(fixed), "endpoints", eps)
		n.Recorder.Eventf(no, nil, corev1.EventTypeNormal, EventNodesReamplified, "Reamplify",
			"%d nodes published their raw allocatable (status stored without the webhook) and were re-evaluated through nodes/status: %s", len(fixed), summarize(fixed, 10))
	}
	if len(left) == 0 {
		n.reamp.forget(no.Name)
		return 0, nil
	}
	delay := nextReamplifyDelay(st.delay)
	if st.endpoints != eps {
		delay = reamplifyMinDelay
	}
	n.reamp.set(no.Name, reamplifyState{endpoints: eps, delay: delay, due: now.Add(delay)})
	log.FromContext(ctx).Info("nodes still not amplified after a touch; retrying", "nodes", len(left), "after", delay)
	return delay, nil
}

// Forget drops the re-amplification back-off and the last samples of the
// NodeOversell name (it is being deleted).
func (n *Nodes) Forget(name string) {
	n.reamp.forget(name)
	n.samples.forget(name)
}
