package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// SimulatedKubeletTaint (NoSchedule) is on every Heartbeater node.
const SimulatedKubeletTaint = "hookwright.io/simulated-kubelet"

// KubeletNode is a node whose status a Heartbeater reports.
type KubeletNode struct {
	Name   string
	Labels map[string]string
	// Capacity is the machine's; Allocatable is capacity minus reservations,
	// what the kubelet computes (pkg/kubelet/nodestatus.MachineInfo).
	Capacity, Allocatable corev1.ResourceList
}

// Heartbeater reports node status the way the kubelet does
// (pkg/kubelet/kubelet_node_status.go, tryUpdateNodeStatus): it reads the
// node from an informer's lister, sets capacity, allocatable and the Ready
// heartbeat on a copy, and PATCHes nodes/status with a two-way strategic
// merge patch from the cached copy to the computed one, as system:node:<name>
// in group system:nodes. It patches when the status changed (heartbeat times
// ignored) or the report period passed, checking every Period.
type Heartbeater struct {
	Period time.Duration // nodeStatusUpdateFrequency, default 10 s
	Report time.Duration // nodeStatusReportFrequency, default 5 min

	c      *Cluster
	mu     sync.Mutex
	nodes  map[string]*hbNode
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type hbNode struct {
	spec       KubeletNode
	lister     listersv1.NodeLister
	client     kubernetes.Interface
	lastReport time.Time
	patches    int
	errors     int
	lastErr    error
}

// NewHeartbeater registers the nodes (creating missing Node objects with
// the given status) but does not start reporting; call Start.
func (c *Cluster) NewHeartbeater(ctx context.Context, nodes ...KubeletNode) (*Heartbeater, error) {
	h := &Heartbeater{Period: 10 * time.Second, Report: 5 * time.Minute, c: c, nodes: map[string]*hbNode{}}
	for _, n := range nodes {
		labels := map[string]string{"kubernetes.io/hostname": n.Name}
		for k, v := range n.Labels {
			labels[k] = v
		}
		node := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: labels},
			// Nothing runs pods on these nodes: keep other tests' pods off.
			Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: SimulatedKubeletTaint, Effect: corev1.TaintEffectNoSchedule}}},
			Status: corev1.NodeStatus{
				Capacity:    n.Capacity,
				Allocatable: n.Allocatable,
				Conditions:  []corev1.NodeCondition{readyCondition(time.Now())},
			},
		}
		if _, err := c.Clientset.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("create node %s: %w", n.Name, err)
		}
		cs, err := kubernetes.NewForConfig(c.KubeletConfig(n.Name))
		if err != nil {
			return nil, err
		}
		h.nodes[n.Name] = &hbNode{spec: n, client: cs}
	}
	return h, nil
}

// Start begins reporting every Period until Stop or ctx ends.
func (h *Heartbeater) Start(ctx context.Context) error {
	ctx, h.cancel = context.WithCancel(ctx)
	for name, n := range h.nodes {
		// The kubelet's informer watches only its own node.
		f := informers.NewSharedInformerFactoryWithOptions(n.client, 0,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
			}))
		inf := f.Core().V1().Nodes()
		n.lister = inf.Lister()
		f.Start(ctx.Done())
		if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
			return fmt.Errorf("heartbeater: node informer for %s did not sync", name)
		}
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			t := time.NewTicker(h.Period)
			defer t.Stop()
			for {
				h.beat(ctx, name, n)
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		}()
	}
	return nil
}

// Stop ends reporting and waits for the loops.
func (h *Heartbeater) Stop() {
	if h.cancel != nil {
		h.cancel()
	}
	h.wg.Wait()
}

// Beat reports node now, out of schedule (a kubelet restart does this).
func (h *Heartbeater) Beat(ctx context.Context, node string) error {
	n := h.nodes[node]
	if n == nil {
		return fmt.Errorf("heartbeater: unknown node %s", node)
	}
	h.mu.Lock()
	n.lastReport = time.Time{}
	h.mu.Unlock()
	h.beat(ctx, node, n)
	h.mu.Lock()
	defer h.mu.Unlock()
	return n.lastErr
}

// Stats are the patches sent and failed for node.
func (h *Heartbeater) Stats(node string) (patches, errors int, lastErr error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.nodes[node]
	return n.patches, n.errors, n.lastErr
}

func (h *Heartbeater) beat(ctx context.Context, name string, n *hbNode) {
	var cached *corev1.Node
	var err error
	if n.lister != nil {
		cached, err = n.lister.Get(name)
	} else {
		cached, err = n.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		h.record(n, false, err)
		return
	}
	now := time.Now()
	updated := cached.DeepCopy()
	updated.Status.Capacity = n.spec.Capacity.DeepCopy()
	updated.Status.Allocatable = n.spec.Allocatable.DeepCopy()
	setReady(updated, now)

	h.mu.Lock()
	due := now.Sub(n.lastReport) >= h.Report
	h.mu.Unlock()
	if !due && !statusChanged(&cached.Status, &updated.Status) {
		return
	}
	patch, err := nodeStatusPatch(cached, updated)
	if err != nil {
		h.record(n, false, err)
		return
	}
	_, err = n.client.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	h.record(n, err == nil, err)
	if err == nil {
		h.mu.Lock()
		n.lastReport = now
		h.mu.Unlock()
	}
}

func (h *Heartbeater) record(n *hbNode, ok bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ok {
		n.patches++
	} else if err != nil {
		n.errors++
	}
	n.lastErr = err
}

// nodeStatusPatch mirrors component-helpers/node/util.PatchNodeStatus: a
// two-way strategic merge patch from old to new, covering status only.
func nodeStatusPatch(oldNode, newNode *corev1.Node) ([]byte, error) {
	oldData, err := json.Marshal(oldNode)
	if err != nil {
		return nil, err
	}
	// Only status may differ: spec resets in the status strategy anyway.
	n := newNode.DeepCopy()
	n.Spec = oldNode.Spec
	newData, err := json.Marshal(n)
	if err != nil {
		return nil, err
	}
	return strategicpatch.CreateTwoWayMergePatch(oldData, newData, corev1.Node{})
}

// statusChanged ignores heartbeat times, like the kubelet's nodeStatusHasChanged.
func statusChanged(a, b *corev1.NodeStatus) bool {
	strip := func(s *corev1.NodeStatus) *corev1.NodeStatus {
		c := s.DeepCopy()
		for i := range c.Conditions {
			c.Conditions[i].LastHeartbeatTime = metav1.Time{}
		}
		return c
	}
	return !apiequality.Semantic.DeepEqual(strip(a), strip(b))
}

func readyCondition(now time.Time) corev1.NodeCondition {
	return corev1.NodeCondition{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status",
		LastHeartbeatTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(now),
	}
}

func setReady(n *corev1.Node, now time.Time) {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			n.Status.Conditions[i].LastHeartbeatTime = metav1.NewTime(now)
			return
		}
	}
	n.Status.Conditions = append(n.Status.Conditions, readyCondition(now))
}
