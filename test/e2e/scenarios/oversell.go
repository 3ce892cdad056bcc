package scenarios

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/test/cluster"
)

const (
	// OversellNamespace holds the 1-CPU workload (not labelled for injection,
	// so its pods request exactly 1 CPU).
	OversellNamespace = "oversell"
	// HeartbeatsWanted is how many heartbeats of each pool node scenario 2
	// watches for drift (kwok writes one every 10 s, like a kubelet). The
	// writes are counted, not timed: a loaded machine only stretches it.
	HeartbeatsWanted = 2
	rawAnnotation    = "oversell.hookwright.io/raw-allocatable"
	workload         = "cpu-hog"
	replicas         = 24
)

// SampleOversellName is the sample NodeOversell's name.
const SampleOversellName = "oversell-pool"

// poolAllocatable returns the pool nodes' allocatable and capacity cpu.
func poolCPU(ctx context.Context, e *Env) (alloc, capacity map[string]resource.Quantity, nodes map[string]*corev1.Node, err error) {
	alloc, capacity, nodes = map[string]resource.Quantity{}, map[string]resource.Quantity{}, map[string]*corev1.Node{}
	for _, n := range PoolNodes {
		node := &corev1.Node{}
		if err := e.Cluster.Client.Get(ctx, client.ObjectKey{Name: n}, node); err != nil {
			return nil, nil, nil, err
		}
		alloc[n], capacity[n], nodes[n] = node.Status.Allocatable[corev1.ResourceCPU], node.Status.Capacity[corev1.ResourceCPU], node
	}
	return alloc, capacity, nodes, nil
}

// waitPoolCPU polls every 10 ms until every pool node's allocatable cpu is
// want (and, if raw is set, carries / lacks the raw annotation) and returns
// how long it took.
func waitPoolCPU(ctx context.Context, e *Env, want string, annotated *bool, timeout time.Duration) (time.Duration, error) {
	q := resource.MustParse(want)
	var last string
	took, err := cluster.Poll(ctx, 10*time.Millisecond, timeout, "pool nodes' allocatable cpu "+want, func(ctx context.Context) (bool, error) {
		alloc, _, nodes, err := poolCPU(ctx, e)
		if err != nil {
			return false, nil
		}
		ok := true
		var parts []string
		for _, n := range PoolNodes {
			a := alloc[n]
			_, has := nodes[n].Annotations[rawAnnotation]
			parts = append(parts, fmt.Sprintf("%s=%s", n, a.String()))
			if a.Cmp(q) != 0 || (annotated != nil && has != *annotated) {
				ok = false
			}
		}
		last = strings.Join(parts, " ")
		return ok, nil
	})
	if err != nil {
		return 0, fmt.Errorf("pool nodes' allocatable cpu not %s within %s (last: %s)", want, timeout, last)
	}
	return took, nil
}

// scheduled counts the workload's pods bound to each node and the pods
// the scheduler reported Unschedulable.
func scheduled(ctx context.Context, e *Env) (perNode map[string]int, bound, unschedulable, total int, err error) {
	var pods corev1.PodList
	if err := e.Cluster.Client.List(ctx, &pods, client.InNamespace(OversellNamespace), client.MatchingLabels{"app": workload}); err != nil {
		return nil, 0, 0, 0, err
	}
	perNode = map[string]int{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		total++
		if p.Spec.NodeName != "" {
			perNode[p.Spec.NodeName]++
			bound++
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				unschedulable++
			}
		}
	}
	return perNode, bound, unschedulable, total, nil
}

func fmtPerNode(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s:%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

// patchRatios merge-patches the NodeOversell's ratios.
func patchRatios(ctx context.Context, e *Env, name, cpu, memory string) error {
	var parts []string
	if cpu != "" {
		parts = append(parts, fmt.Sprintf(`"cpu":%q`, cpu))
	}
	if memory != "" {
		parts = append(parts, fmt.Sprintf(`"memory":%q`, memory))
	}
	patch := fmt.Sprintf(`{"spec":{"ratios":{%s}}}`, strings.Join(parts, ","))
	no := &v1alpha1.NodeOversell{}
	no.Name = name
	return e.Cluster.Client.Patch(ctx, no, client.RawPatch(types.MergePatchType, []byte(patch)))
}

func workloadDeployment() *appsv1.Deployment {
	labels := map[string]string{"app": workload}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: workload, Namespace: OversellNamespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{PoolLabel: "oversell"},
					Tolerations:  []corev1.Toleration{{Key: PoolTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
					Containers: []corev1.Container{{
						Name: "hog", Image: "registry.k8s.io/pause:3.10",
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
							corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("64Mi"),
						}},
					}},
				},
			},
		},
	}
}

// Oversell is scenario 2. It starts from the sample NodeOversell with cpu
// ratio 1 (Start applies it so): 24 pods of 1 CPU fit 12 on the three 4-CPU
// nodes; at ratio 2 all 24 are scheduled by kube-scheduler, allocatable is
// 8 CPU and capacity 4; HeartbeatsWanted heartbeats of each node with no drift;
// deleting the NodeOversell restores 4 CPU on every node.
func Oversell(ctx context.Context, e *Env, r *Result) error {
	c := e.Cluster.Client
	if _, err := waitPoolCPU(ctx, e, "4", nil, 30*time.Second); err != nil {
		return err
	}
	r.check("NodeOversell %s at cpu ratio 1: pool nodes show 4 CPU allocatable", SampleOversellName)
	if _, err := e.Cluster.CreateNamespace(ctx, OversellNamespace, nil); err != nil {
		return err
	}
	start := time.Now()
	if err := c.Create(ctx, workloadDeployment()); err != nil {
		return err
	}
	var perNode map[string]int
	var bound, unsched int
	if err := cluster.WaitFor(ctx, 2*time.Minute, "12 pods bound and 12 Unschedulable", func(ctx context.Context) (bool, error) {
		var total int
		var err error
		perNode, bound, unsched, total, err = scheduled(ctx, e)
		return err == nil && total == replicas && bound == 12 && unsched == 12, err
	}); err != nil {
		return fmt.Errorf("%w; bound per node: %s, unschedulable: %d", err, fmtPerNode(perNode), unsched)
	}
	placed := time.Since(start)
	// Give the scheduler the chance to place more: every pool node reports
	// once more (a heartbeat: a Node update, which the scheduler hears),
	// counted by the nodes' writes, not timed.
	if _, _, err := awaitHeartbeats(ctx, e, 1, 0, 2*time.Minute, nil); err != nil {
		return err
	}
	if perNode, bound, unsched, _, _ = scheduled(ctx, e); bound != 12 {
		return fmt.Errorf("at ratio 1: %d pods bound (%s), want 12", bound, fmtPerNode(perNode))
	}
	for _, n := range PoolNodes {
		if perNode[n] != 4 {
			return fmt.Errorf("at ratio 1: pods per node %s, want 4 on each pool node", fmtPerNode(perNode))
		}
	}
	r.check("ratio 1: %d of %d 1-CPU pods scheduled, 4 per node (%s), %d Pending (Unschedulable)", bound, replicas, fmtPerNode(perNode), unsched)
	r.timing("24 × 1-CPU pods created and 12 placed by kube-scheduler", placed, 0)

	start = time.Now()
	if err := patchRatios(ctx, e, SampleOversellName, "2", ""); err != nil {
		return err
	}
	took, err := waitPoolCPU(ctx, e, "8", ptr.To(true), 60*time.Second)
	if err != nil {
		return err
	}
	r.timing("cpu ratio 1 → 2: every pool node shows 8 CPU", took, 5*time.Second)
	if err := cluster.WaitFor(ctx, 2*time.Minute, "all 24 pods bound", func(ctx context.Context) (bool, error) {
		var err error
		perNode, bound, _, _, err = scheduled(ctx, e)
		return err == nil && bound == replicas, err
	}); err != nil {
		return fmt.Errorf("%w; bound per node: %s", err, fmtPerNode(perNode))
	}
	r.timing("cpu ratio 1 → 2: all 24 pods bound by kube-scheduler", time.Since(start), 0)
	alloc, capacity, nodes, err := poolCPU(ctx, e)
	if err != nil {
		return err
	}
	for _, n := range PoolNodes {
		a, cp := alloc[n], capacity[n]
		if a.String() != "8" || cp.String() != "4" {
			return fmt.Errorf("node %s: allocatable cpu %s, capacity %s; want 8 and 4", n, a.String(), cp.String())
		}
	}
	r.check("ratio 2: all %d pods scheduled (%s); allocatable 8 CPU, capacity still 4 CPU; raw kept in %s=%s",
		replicas, fmtPerNode(perNode), rawAnnotation, nodes[PoolNodes[0]].Annotations[rawAnnotation])

	if err := watchHeartbeats(ctx, e, r, nodes); err != nil {
		return err
	}

	// The 24 pods need the amplification (8 CPU on each 4-CPU node): a
	// deletion now would be held until they are gone (scenario 9 shows a
	// held cut), so they go first.
	if err := c.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: OversellNamespace}}); err != nil {
		return err
	}
	if err := cluster.WaitFor(ctx, 2*time.Minute, "namespace "+OversellNamespace+" gone", func(ctx context.Context) (bool, error) {
		err := c.Get(ctx, client.ObjectKey{Name: OversellNamespace}, &corev1.Namespace{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}); err != nil {
		return err
	}
	r.check("the 24 pods deleted (namespace %s) before the NodeOversell, whose deletion would otherwise be held for them", OversellNamespace)
	if err := c.Delete(ctx, &v1alpha1.NodeOversell{ObjectMeta: metav1.ObjectMeta{Name: SampleOversellName}}); err != nil {
		return err
	}
	took, err = waitPoolCPU(ctx, e, "4", ptr.To(false), 60*time.Second)
	if err != nil {
		return err
	}
	r.timing("NodeOversell deleted: every pool node back to 4 CPU", took, 5*time.Second)
	if err := cluster.WaitFor(ctx, 60*time.Second, "NodeOversell gone (finalizer released)", func(ctx context.Context) (bool, error) {
		err := c.Get(ctx, client.ObjectKey{Name: SampleOversellName}, &v1alpha1.NodeOversell{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}); err != nil {
		return err
	}
	r.check("NodeOversell deleted: 4 CPU allocatable and no raw annotation on every node, finalizer released")
	return nil
}

// watchHeartbeats checks, until every pool node has written
// HeartbeatsWanted heartbeats, that kwok's node heartbeats
// (nodes/status writes, every 10 s like a kubelet) keep landing and that
// allocatable, capacity and the raw annotation never move, in any write.
func watchHeartbeats(ctx context.Context, e *Env, r *Result, start map[string]*corev1.Node) error {
	want := map[string]string{}
	for n, node := range start {
		want[n] = fingerprint(node)
	}
	watchStart := time.Now()
	beats, writes, err := awaitHeartbeats(ctx, e, HeartbeatsWanted, 0, 3*time.Minute, func(node *corev1.Node) error {
		if got := fingerprint(node); got != want[node.Name] {
			return fmt.Errorf("drift on %s after %s: %s, was %s", node.Name, time.Since(watchStart), got, want[node.Name])
		}
		return nil
	})
	if err != nil {
		return err
	}
	var counts []string
	for _, n := range PoolNodes {
		counts = append(counts, fmt.Sprintf("%s:%d", n, beats[n]))
	}
	r.check("%s of heartbeats (%s new lastHeartbeatTime per node), %d node writes: allocatable, capacity and raw annotation never moved",
		time.Since(watchStart).Round(time.Second), strings.Join(counts, " "), writes)
	return nil
}

// awaitHeartbeats watches the pool nodes' writes, each one, until every
// pool node has written n heartbeats (a new lastHeartbeatTime of Ready:
// the time the node's reporter stamps) and at least atLeast has passed, and
// returns the heartbeats per node and the writes seen. each, if set, is
// called on the pool nodes as listed first and on every write; its error
// ends the watch. The nodes' own writes are counted, not polled: a
// heartbeat is seen however slowly this process runs.
func awaitHeartbeats(ctx context.Context, e *Env, n int, atLeast, timeout time.Duration, each func(*corev1.Node) error) (map[string]int, int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	nodes := e.Cluster.Clientset.CoreV1().Nodes()
	sel := PoolLabel + "=oversell"
	list, err := nodes.List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, 0, err
	}
	pool := map[string]bool{}
	for _, name := range PoolNodes {
		pool[name] = true
	}
	last, beats := map[string]time.Time{}, map[string]int{}
	heartbeat := func(node *corev1.Node) time.Time {
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.LastHeartbeatTime.Time
			}
		}
		return time.Time{}
	}
	for i := range list.Items {
		node := &list.Items[i]
		if !pool[node.Name] {
			continue
		}
		if each != nil {
			if err := each(node); err != nil {
				return beats, 0, err
			}
		}
		last[node.Name] = heartbeat(node)
	}
	started, writes := time.Now(), 0
	done := func() bool {
		if time.Since(started) < atLeast {
			return false
		}
		for _, name := range PoolNodes {
			if beats[name] < n {
				return false
			}
		}
		return true
	}
	err = cluster.Watch(ctx, timeout, fmt.Sprintf("%d heartbeats of each pool node", n), list.ResourceVersion, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		o.LabelSelector = sel
		return nodes.Watch(ctx, o)
	}, func(ev watch.Event) (bool, error) {
		node, ok := ev.Object.(*corev1.Node)
		if !ok || ev.Type != watch.Modified || !pool[node.Name] {
			return done(), nil
		}
		writes++
		if each != nil {
			if err := each(node); err != nil {
				return false, err
			}
		}
		if hb := heartbeat(node); !hb.Equal(last[node.Name]) {
			last[node.Name] = hb
			beats[node.Name]++
		}
		return done(), nil
	})
	if err != nil {
		var counts []string
		for _, name := range PoolNodes {
			counts = append(counts, fmt.Sprintf("%s:%d", name, beats[name]))
		}
		return beats, writes, fmt.Errorf("%w (heartbeats seen in %s: %s)", err, time.Since(started).Round(time.Second), strings.Join(counts, " "))
	}
	return beats, writes, nil
}

func fingerprint(n *corev1.Node) string {
	a, m, c := n.Status.Allocatable[corev1.ResourceCPU], n.Status.Allocatable[corev1.ResourceMemory], n.Status.Capacity[corev1.ResourceCPU]
	return fmt.Sprintf("allocatable cpu %s memory %s, capacity cpu %s, raw %s", a.String(), m.String(), c.String(), n.Annotations[rawAnnotation])
}
