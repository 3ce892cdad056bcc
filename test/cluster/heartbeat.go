package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/component-helpers/apimachinery/lease"
	"k8s.io/utils/clock"
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
// (pkg/kubelet/kubelet_node_status.go, tryUpdateNodeStatus): every Period
// (with the kubelet's 4 % jitter) it GETs the node from the API server's
// cache (resourceVersion "0"), sets capacity, allocatable and the
// heartbeats of its four conditions (MemoryPressure, DiskPressure,
// PIDPressure, Ready) on a copy, and PATCHes nodes/status with a two-way
// strategic merge patch from the read copy to the computed one
// (component-helpers/node/util.PatchNodeStatus), as system:node:<name> in
// group system:nodes. It patches only when the status changed, heartbeat
// times ignored (nodeStatusHasChanged), or Report passed since its last
// successful patch, plus, after a change, the kubelet's one-time random
// delay of -50 %..+50 % of Report (delayAfterNodeStatusChange). Like the kubelet's NodeLease controller
// (pkg/kubelet/nodelease, built on component-helpers/apimachinery/lease) it
// renews the Lease kube-node-lease/<name> every Lease/4 with a 40 s
// duration, owned by the Node. The nodes start at random offsets within
// Period, as a fleet's kubelets do.
type Heartbeater struct {
	Period time.Duration // nodeStatusUpdateFrequency, default 10 s
	Report time.Duration // nodeStatusReportFrequency, default 5 min
	// Lease is the node lease duration (default 40 s, renewed every
	// quarter); zero or negative runs no lease.
	Lease time.Duration

	c      *Cluster
	mu     sync.Mutex
	nodes  map[string]*hbNode
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type hbNode struct {
	spec       KubeletNode
	uid        types.UID
	client     kubernetes.Interface
	lastReport time.Time
	delay      time.Duration // delayAfterNodeStatusChange
	patches    int
	errors     int
	lastErr    error
}

// NewHeartbeater registers the nodes (creating missing Node objects with
// the given status) but does not start reporting; call Start.
func (c *Cluster) NewHeartbeater(ctx context.Context, nodes ...KubeletNode) (*Heartbeater, error) {
	h := &Heartbeater{Period: 10 * time.Second, Report: 5 * time.Minute, Lease: 40 * time.Second, c: c, nodes: map[string]*hbNode{}}
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
				Conditions:  kubeletConditions(time.Now()),
			},
		}
		created, err := c.Clientset.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("create node %s: %w", n.Name, err)
		}
		cs, err := kubernetes.NewForConfig(c.KubeletConfig(n.Name))
		if err != nil {
			return nil, err
		}
		h.nodes[n.Name] = &hbNode{spec: n, uid: created.UID, client: cs}
	}
	return h, nil
}

// Start begins reporting every Period, and renewing each node's Lease,
// until Stop or ctx ends.
func (h *Heartbeater) Start(ctx context.Context) error {
	ctx, h.cancel = context.WithCancel(ctx)
	for name, n := range h.nodes {
		if h.Lease > 0 {
			lc := lease.NewController(clock.RealClock{}, n.client, name, int32(h.Lease/time.Second), nil, h.Lease/4,
				name, corev1.NamespaceNodeLease, h.leaseOwner(name, n))
			h.wg.Add(1)
			go func() {
				defer h.wg.Done()
				// Run, not Start: the kubelet keeps its lease across restarts.
				lc.Run(ctx)
			}()
		}
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			// Kubelets start at unrelated times; a fleet started at once
			// would otherwise beat in step.
			offset := time.Duration(rand.Int64N(int64(h.Period) + 1))
			select {
			case <-ctx.Done():
				return
			case <-time.After(offset):
			}
			wait.JitterUntilWithContext(ctx, func(ctx context.Context) { h.beat(ctx, name, n) }, h.Period, 0.04, true)
		}()
	}
	return nil
}

// leaseOwner makes the Node own its Lease, as the kubelet's
// setNodeOwnerFunc does, so deleting the node lets the garbage collector
// remove the lease.
func (h *Heartbeater) leaseOwner(name string, n *hbNode) lease.ProcessLeaseFunc {
	return func(l *coordinationv1.Lease) error {
		if len(l.OwnerReferences) == 0 {
			l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: name, UID: n.uid}}
		}
		return nil
	}
}

// Stop ends reporting and waits for the loops.
func (h *Heartbeater) Stop() {
	if h.cancel != nil {
		h.cancel()
	}
	h.wg.Wait()
}

// Delete stops h and deletes its nodes and their Leases.
func (h *Heartbeater) Delete(ctx context.Context) error {
	h.Stop()
	var errs []error
	for name := range h.nodes {
		if err := h.c.Clientset.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
		if err := h.c.Clientset.CoordinationV1().Leases(corev1.NamespaceNodeLease).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Nodes are the names of h's nodes.
func (h *Heartbeater) Nodes() []string {
	out := make([]string, 0, len(h.nodes))
	for name := range h.nodes {
		out = append(out, name)
	}
	return out
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

// SetAllocatable changes the allocatable node's kubelet computes from its
// next beat on (a changed reservation or a resized machine).
func (h *Heartbeater) SetAllocatable(node string, alloc corev1.ResourceList) error {
	n := h.nodes[node]
	if n == nil {
		return fmt.Errorf("heartbeater: unknown node %s", node)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	n.spec.Allocatable = alloc.DeepCopy()
	return nil
}

// Stats are the patches sent and failed for node.
func (h *Heartbeater) Stats(node string) (patches, errors int, lastErr error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.nodes[node]
	return n.patches, n.errors, n.lastErr
}

func (h *Heartbeater) beat(ctx context.Context, name string, n *hbNode) {
	// The kubelet's first try reads from the API server's cache.
	cached, err := n.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{ResourceVersion: "0"})
	if err != nil {
		h.record(n, false, err)
		return
	}
	now := time.Now()
	updated := cached.DeepCopy()
	h.mu.Lock()
	updated.Status.Capacity = n.spec.Capacity.DeepCopy()
	updated.Status.Allocatable = n.spec.Allocatable.DeepCopy()
	h.mu.Unlock()
	setHeartbeats(updated, now)

	changed := statusChanged(&cached.Status, &updated.Status)
	h.mu.Lock()
	due := now.Sub(n.lastReport) >= h.Report+n.delay
	if changed || due {
		// A change draws a new delay so a fleet's reports spread; a
		// periodic report keeps the plain cadence.
		n.delay = 0
		if changed {
			n.delay = time.Duration(float64(h.Report) * (rand.Float64() - 0.5))
		}
	}
	h.mu.Unlock()
	if !due && !changed {
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

// kubeletConditions are the conditions the kubelet's setters own
// (pkg/kubelet/nodestatus/setters.go), all healthy.
func kubeletConditions(now time.Time) []corev1.NodeCondition {
	t := metav1.NewTime(now)
	c := func(typ corev1.NodeConditionType, st corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: typ, Status: st, Reason: reason, Message: msg, LastHeartbeatTime: t, LastTransitionTime: t}
	}
	return []corev1.NodeCondition{
		c(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
		c(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
		c(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
		c(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "kubelet is posting ready status"),
	}
}

// setHeartbeats sets the heartbeat of every kubelet condition to now, as
// each setter does on every status update, adding missing ones.
func setHeartbeats(n *corev1.Node, now time.Time) {
	for _, want := range kubeletConditions(now) {
		found := false
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == want.Type {
				n.Status.Conditions[i].LastHeartbeatTime = want.LastHeartbeatTime
				found = true
			}
		}
		if !found {
			n.Status.Conditions = append(n.Status.Conditions, want)
		}
	}
}
