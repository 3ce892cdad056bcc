package node

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/hack/ociimage"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// loadNS is the namespace of the dry-run pod creates the SidecarInjector
// of these tests intercepts.
const loadNS = "fault-load"

// realNodeOversell selects the real node with cpu ratio 2.
func realNodeOversell(name string, replicas int32) *v1alpha1.NodeOversell {
	return &v1alpha1.NodeOversell{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.NodeOversellSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "real"}},
			Ratios:       v1alpha1.OversellRatios{CPU: "2"},
			Server:       v1alpha1.ServerSpec{Replicas: ptr.To(replicas)},
		},
	}
}

// standinInjector is a SidecarInjector named name, failurePolicy Fail,
// that adds one stand-in container, extra, to the pods of the namespaces
// labelled label=enabled.
func standinInjector(name, label string) *v1alpha1.SidecarInjector {
	return &v1alpha1.SidecarInjector{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.SidecarInjectorSpec{
			Policy:            v1alpha1.PolicyEnabled,
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{label: "enabled"}},
			FailurePolicy:     v1alpha1.FailurePolicyFail,
			Templates:         []v1alpha1.NamedTemplate{{Name: "extra", Template: "spec:\n  containers:\n  - name: extra\n    image: " + ociimage.StandinName + "\n"}},
			DefaultTemplates:  []string{"extra"},
		},
	}
}

// waitAvailable waits until the CR's Deployment has want available
// replicas and returns it.
func waitAvailable(ctx context.Context, t *testing.T, kind desired.Kind, cr string, want int32) *appsv1.Deployment {
	t.Helper()
	dep := &appsv1.Deployment{}
	key := client.ObjectKey{Namespace: operatorNS, Name: kind.BaseName(cr)}
	if err := cluster.WaitFor(ctx, 4*time.Minute, fmt.Sprintf("Deployment %s: %d available", key, want), func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, key, dep)
		return err == nil && dep.Status.AvailableReplicas == want && dep.Status.UpdatedReplicas == want && dep.Status.Replicas == want, client.IgnoreNotFound(err)
	}); err != nil {
		var pods corev1.PodList
		_ = env.Client.List(ctx, &pods, client.InNamespace(operatorNS), client.MatchingLabels{desired.LabelInstance: key.Name})
		for _, p := range pods.Items {
			t.Logf("pod %s: %s %+v\n%s", p.Name, p.Status.Phase, p.Status.ContainerStatuses, podLog(ctx, &p))
		}
		t.Fatal(err)
	}
	return dep
}

// rawCPU is the node's raw cpu as the webhook recorded it.
func rawCPU(ctx context.Context, t *testing.T) string {
	t.Helper()
	n, err := env.Clientset.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]string
	if err := json.Unmarshal([]byte(n.Annotations[v1alpha1.OversellRawAllocatableKey]), &raw); err != nil || raw["cpu"] == "" {
		t.Fatalf("node %s records no raw cpu (%q): %v", nodeName, n.Annotations[v1alpha1.OversellRawAllocatableKey], err)
	}
	return raw["cpu"]
}

// outcomes counts the results of one kind of request by class.
type outcomes struct {
	mu     sync.Mutex
	counts map[string]int
	// sample is one error message per class.
	sample map[string]string
}

func (o *outcomes) add(class, msg string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.counts == nil {
		o.counts, o.sample = map[string]int{}, map[string]string{}
	}
	o.counts[class]++
	if _, ok := o.sample[class]; !ok && msg != "" {
		o.sample[class] = msg
	}
}

// total is the count of every class.
func (o *outcomes) total() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, v := range o.counts {
		n += v
	}
	return n
}

// waitLoad waits until both loads have counted more requests: pods more
// pod creates and beats more status patches than when it was called.
func waitLoad(ctx context.Context, t *testing.T, what string, podLoad *outcomes, pods int, beatLoad *outcomes, beats int) {
	t.Helper()
	p0, b0 := podLoad.total(), beatLoad.total()
	if err := cluster.WaitFor(ctx, 2*time.Minute, fmt.Sprintf("%d pod creates and %d status patches %s", pods, beats, what), func(context.Context) (bool, error) {
		return podLoad.total()-p0 >= pods && beatLoad.total()-b0 >= beats, nil
	}); err != nil {
		pc, _ := podLoad.get()
		bc, _ := beatLoad.get()
		t.Fatalf("%v (pod creates %s, status patches %s)", err, fmtCounts(pc), fmtCounts(bc))
	}
}

func (o *outcomes) get() (map[string]int, map[string]string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	c, s := map[string]int{}, map[string]string{}
	for k, v := range o.counts {
		c[k] = v
	}
	for k, v := range o.sample {
		s[k] = v
	}
	return c, s
}

// Killing a webhook server container (SIGKILL through containerd) under
// admission load: the kubelet restarts it in the same pod and the
// Deployment is available again, and what the API server does with the
// calls that reach no server follows the failurePolicy:
//   - SidecarInjector, Fail: a pod create is injected or rejected, never
//     admitted without its sidecar;
//   - SidecarInjector, Ignore: no pod create is rejected;
//   - NodeOversell (always Ignore): no kubelet status patch fails; one
//     that reached no server is stored raw, and the operator re-amplifies
//     the node once a server is ready (oversell_reamplify.go).
//
// The API server reaches the servers through their Service's ClusterIP,
// dialled in the node's namespace where kube-proxy sends each new
// connection to a ready endpoint (test/cluster, incluster.go); the
// container killed is the one serving the API server's connection (its
// request counter moves). With the default 2 replicas only the requests
// on the broken connection fail; with 1 every call until the restarted
// container is ready.
func TestKillServerContainerUnderLoad(t *testing.T) {
	ctx := cluster.TestContext(t, 20*time.Minute)
	startOperator(t)
	pushOperatorImage(ctx, t)
	if _, err := env.CreateNamespace(ctx, loadNS, map[string]string{"fault-injection": "enabled"}); err != nil {
		t.Fatal(err)
	}

	no := realNodeOversell("kill", 2)
	si := standinInjector("kill", "fault-injection")
	for _, o := range []client.Object{no, si} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { deleteAndWait(t, o) })
	}
	waitAvailable(ctx, t, desired.OversellKind, no.Name, 2)
	waitAvailable(ctx, t, desired.SidecarKind, si.Name, 2)
	raw := allocatableRawWhenAmplified(ctx, t)

	kubelet, err := kubernetes.NewForConfig(env.KubeletConfig(nodeName))
	if err != nil {
		t.Fatal(err)
	}
	rawQ := rawCPU(ctx, t)
	// The kubelet's status report as its patch carries it (raw
	// allocatable), four times a second on top of the real kubelet's.
	report := fmt.Appendf(nil, `{"status":{"allocatable":{"cpu":%q}}}`, rawQ)
	// The requests of each load counted before the kills and after the
	// recovery: about 3 s of them on an idle machine (status patches come
	// every 250 ms); a loaded machine takes longer for as many. Two pod
	// create loops, each pausing 20 ms after an answer, keep a create in
	// flight at every moment; HOOKWRIGHT_SCALE=full (make soak) runs three.
	const loadPods, loadBeats = 40, 12
	podWorkers := 2
	if full {
		podWorkers = 3
	}

	for _, tc := range []struct {
		fp       v1alpha1.FailurePolicy
		replicas int32
	}{{v1alpha1.FailurePolicyFail, 2}, {v1alpha1.FailurePolicyIgnore, 2}, {v1alpha1.FailurePolicyFail, 1}, {v1alpha1.FailurePolicyIgnore, 1}} {
		fp := tc.fp
		t.Run(fmt.Sprintf("%s/%d-replicas", fp, tc.replicas), func(t *testing.T) {
			setFailurePolicy(ctx, t, si, fp)
			setReplicas(ctx, t, si, no, tc.replicas)
			var pods, beats outcomes
			lctx, stop := context.WithCancel(ctx)
			var wg sync.WaitGroup
			defer func() { stop(); wg.Wait() }()
			var seq atomic.Int64
			for range podWorkers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					cluster.Every(lctx, 20*time.Millisecond, func(lctx context.Context) {
						p := &corev1.Pod{
							ObjectMeta: metav1.ObjectMeta{Namespace: loadNS, Name: fmt.Sprintf("load-%d", seq.Add(1))},
							Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: ociimage.StandinName}}},
						}
						err := env.Client.Create(lctx, p, client.DryRunAll)
						switch {
						case lctx.Err() != nil:
						case err != nil:
							pods.add("rejected", err.Error())
						case p.Annotations["sidecar.hookwright.io/status"] != "":
							pods.add("injected", "")
						default:
							pods.add("admitted unmutated", "")
						}
					})
				}()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				cluster.Every(lctx, 250*time.Millisecond, func(lctx context.Context) {
					n, err := kubelet.CoreV1().Nodes().Patch(lctx, nodeName, types.StrategicMergePatchType, report, metav1.PatchOptions{}, "status")
					switch {
					case lctx.Err() != nil:
					case err != nil:
						beats.add("failed", err.Error())
					case n.Status.Allocatable.Cpu().MilliValue() == 2*raw:
						beats.add("amplified", "")
					default:
						beats.add("stored raw", "")
					}
				})
			}()

			// Let the API server's connections settle (both loads
			// counted requests: what 3 s of them make on an idle
			// machine), then kill the containers they go to.
			waitLoad(ctx, t, "before the kills", &pods, loadPods, &beats, loadBeats)
			type victim struct {
				kind     desired.Kind
				cr, pod  string
				id       string
				restarts int32
			}
			var victims []victim
			for _, v := range []struct {
				kind desired.Kind
				cr   string
			}{{desired.SidecarKind, si.Name}, {desired.OversellKind, no.Name}} {
				p := busiestServerPod(ctx, t, v.kind, v.cr)
				cs := p.Status.ContainerStatuses[0]
				victims = append(victims, victim{v.kind, v.cr, p.Name, cs.ContainerID, cs.RestartCount})
			}
			killed := time.Now()
			for _, v := range victims {
				killContainer(ctx, t, v.id)
			}
			// The kubelet restarts each in its pod; both Deployments are
			// whole again.
			for _, v := range victims {
				waitPod(ctx, t, operatorNS, v.pod, "restarted and Ready", func(p *corev1.Pod) bool {
					return len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].RestartCount > v.restarts && cluster.PodReady(p)
				})
				waitAvailable(ctx, t, v.kind, v.cr, tc.replicas)
			}
			recovered := time.Since(killed)
			// The loads go on against the recovered servers.
			waitLoad(ctx, t, "after the recovery", &pods, loadPods, &beats, loadBeats)
			stop()
			wg.Wait()

			pc, ps := pods.get()
			bc, bs := beats.get()
			t.Logf("figure: failurePolicy %s, SidecarInjector: killed 1 of %d server containers, Deployment available again after %s; dry-run pod creates: %s",
				fp, tc.replicas, recovered.Round(100*time.Millisecond), fmtCounts(pc))
			t.Logf("figure: NodeOversell (Ignore): kubelet status patches during the same window: %s", fmtCounts(bc))
			for k, m := range ps {
				t.Logf("sample %s pod create: %s", k, m)
			}
			for k, m := range bs {
				t.Logf("sample %s status patch: %s", k, m)
			}
			if pc["injected"] == 0 {
				t.Errorf("no pod create was injected: %v", pc)
			}
			switch fp {
			case v1alpha1.FailurePolicyFail:
				if pc["admitted unmutated"] != 0 {
					t.Errorf("failurePolicy Fail admitted %d pods without their sidecar", pc["admitted unmutated"])
				}
				for _, m := range ps {
					if !strings.Contains(m, "failed calling webhook") {
						t.Errorf("a rejection that is not the webhook's failure: %s", m)
					}
				}
			case v1alpha1.FailurePolicyIgnore:
				if pc["rejected"] != 0 {
					t.Errorf("failurePolicy Ignore rejected %d pod creates: %s", pc["rejected"], ps["rejected"])
				}
			}
			if bc["failed"] != 0 {
				t.Errorf("%d kubelet status patches failed under failurePolicy Ignore: %s", bc["failed"], bs["failed"])
			}
		})
	}
	// Whatever was stored raw, the node is amplified again.
	if err := cluster.WaitFor(ctx, 2*time.Minute, "node amplified after the kills", func(ctx context.Context) (bool, error) {
		return allocatableCPU(ctx, t) == 2*raw, nil
	}); err != nil {
		t.Fatal(err)
	}
}

// allocatableRawWhenAmplified waits until the node publishes twice its
// raw cpu (the NodeOversell's resync touch went through its webhook) and
// returns the raw millicores.
func allocatableRawWhenAmplified(ctx context.Context, t *testing.T) int64 {
	t.Helper()
	var raw int64
	if err := cluster.WaitFor(ctx, 2*time.Minute, "node amplified ×2", func(ctx context.Context) (bool, error) {
		n, err := env.Clientset.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		var rec map[string]string
		if json.Unmarshal([]byte(n.Annotations[v1alpha1.OversellRawAllocatableKey]), &rec) != nil || rec["cpu"] == "" {
			return false, nil
		}
		q, err := resource.ParseQuantity(rec["cpu"])
		if err != nil {
			return false, err
		}
		raw = q.MilliValue()
		return n.Status.Allocatable.Cpu().MilliValue() == 2*raw, nil
	}); err != nil {
		t.Fatal(err)
	}
	return raw
}

// setFailurePolicy updates the SidecarInjector's failurePolicy and waits
// until its webhook configuration has it.
func setFailurePolicy(ctx context.Context, t *testing.T, si *v1alpha1.SidecarInjector, fp v1alpha1.FailurePolicy) {
	t.Helper()
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(si), si); err != nil {
		t.Fatal(err)
	}
	if si.Spec.FailurePolicy != fp {
		patch := client.MergeFrom(si.DeepCopy())
		si.Spec.FailurePolicy = fp
		if err := env.Client.Patch(ctx, si, patch); err != nil {
			t.Fatal(err)
		}
	}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := cluster.WaitFor(ctx, time.Minute, "webhook failurePolicy "+string(fp), func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKey{Name: desired.SidecarKind.BaseName(si.Name)}, mwc)
		return err == nil && len(mwc.Webhooks) == 1 && mwc.Webhooks[0].FailurePolicy != nil && string(*mwc.Webhooks[0].FailurePolicy) == string(fp), client.IgnoreNotFound(err)
	}); err != nil {
		t.Fatal(err)
	}
}

// busiestServerPod is the server pod of a CR whose webhook request count
// grows most until one has served busyRequests more: the one behind the
// API server's connection.
func busiestServerPod(ctx context.Context, t *testing.T, kind desired.Kind, cr string) *corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := env.Client.List(ctx, &pods, client.InNamespace(operatorNS), client.MatchingLabels{desired.LabelInstance: kind.BaseName(cr)}); err != nil {
		t.Fatal(err)
	}
	// Not those on their way out (a scale-down).
	pods.Items = slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil || !cluster.PodReady(&p) })
	before := map[string]float64{}
	for _, p := range pods.Items {
		before[p.Name] = webhookRequests(ctx, t, p.Status.PodIP, kind)
	}
	// Counted requests, not seconds: a loaded machine serves fewer per
	// second. busyRequests is 2 s of the status patches (4 a second).
	const busyRequests = 8
	var best *corev1.Pod
	var most float64
	if err := cluster.WaitFor(ctx, time.Minute, fmt.Sprintf("a %s server pod of %s serving %d requests", kind.Short, cr, busyRequests), func(ctx context.Context) (bool, error) {
		best, most = nil, 0
		for i, p := range pods.Items {
			if d := webhookRequests(ctx, t, p.Status.PodIP, kind) - before[p.Name]; d > most {
				best, most = &pods.Items[i], d
			}
		}
		return most >= busyRequests, nil
	}); err != nil {
		t.Fatalf("%v: the busiest served %v", err, most)
	}
	return best
}

// setReplicas sets spec.server.replicas of both CRs and waits for their
// Deployments.
func setReplicas(ctx context.Context, t *testing.T, si *v1alpha1.SidecarInjector, no *v1alpha1.NodeOversell, n int32) {
	t.Helper()
	patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"spec":{"server":{"replicas":%d}}}`, n))
	for _, o := range []client.Object{si, no} {
		if err := env.Client.Patch(ctx, o, patch); err != nil {
			t.Fatal(err)
		}
	}
	waitAvailable(ctx, t, desired.SidecarKind, si.Name, n)
	waitAvailable(ctx, t, desired.OversellKind, no.Name, n)
}
