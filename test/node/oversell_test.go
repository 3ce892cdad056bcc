package node

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/test/cluster"
)

const oversellNS = "hookwright-oversell"

// startOversellServer runs `hookwright oversell` on the host behind Service
// hookwright-oversell/oversell (reached by the API server through the
// harness's egress proxy) with a MutatingWebhookConfiguration on
// nodes/status UPDATE, failurePolicy Ignore, as the operator deploys it.
func startOversellServer(t *testing.T, ctx context.Context) (*cluster.Process, string) {
	t.Helper()
	bin := cluster.MustHookwrightBinary(t)
	dir := t.TempDir()
	ca, err := cluster.NewTestCA("oversell-ca")
	if err != nil {
		t.Fatal(err)
	}
	certs := filepath.Join(dir, "certs")
	if err := ca.WriteServing(certs, cluster.ServiceDNSNames(oversellNS, "oversell")...); err != nil {
		t.Fatal(err)
	}
	port, probe, metrics := cluster.MustFreePort(t), cluster.MustFreePort(t), cluster.MustFreePort(t)
	p, err := cluster.StartProcess("oversell", dir, bin, []string{"oversell",
		"--webhook-host=127.0.0.1", fmt.Sprintf("--webhook-port=%d", port), "--cert-dir=" + certs,
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metrics), fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probe),
	}, []string{"KUBECONFIG=" + env.Kubeconfig})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(5 * time.Second) })
	if err := cluster.WaitFor(ctx, time.Minute, "oversell /readyz", p.ProbeOK(probe, "/readyz")); err != nil {
		t.Fatal(err)
	}
	createNS(ctx, t, oversellNS)
	if _, err := env.ExposeLocal(ctx, oversellNS, "oversell", 443, fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
		t.Fatal(err)
	}
	mwc := cluster.OversellWebhook("hookwright-oversell-node", "oversell.hookwright.io", oversellNS, "oversell", ca.CertPEM, 2)
	if err := env.Client.Create(ctx, mwc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), mwc) })
	return p, fmt.Sprintf("http://127.0.0.1:%d/metrics", metrics)
}

// kubeletReviews reads the server's count of the kubelet's status reports
// it reviewed (hookwright_oversell_mutations_total{writer="kubelet"}, any
// outcome) and of those it held (outcome "held"). It returns an error
// rather than failing t, so a poll can go on.
func kubeletReviews(ctx context.Context, url string) (reviewed, held int, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, 0, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, 0, err
	}
	var r, h float64
	for _, l := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(l, "hookwright_oversell_mutations_total{") || !strings.Contains(l, `writer="kubelet"`) {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, 0, fmt.Errorf("metric line %q: %w", l, err)
		}
		r += v
		if strings.Contains(l, `outcome="held"`) {
			h += v
		}
	}
	return int(r), int(h), nil
}

// mustKubeletReviews is kubeletReviews for the test's goroutine.
func mustKubeletReviews(ctx context.Context, t *testing.T, url string) (reviewed, held int) {
	t.Helper()
	r, h, err := kubeletReviews(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	return r, h
}

// nodeWritesWhile counts the writes of the Node object (each is an etcd
// write: a patch that changes nothing is not stored) from before span is
// called until after it returns: every write stored by then is counted,
// however late the watch delivers it.
func nodeWritesWhile(ctx context.Context, t *testing.T, span func(context.Context)) int {
	t.Helper()
	n, err := env.Clientset.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := env.Clientset.CoreV1().Nodes().Watch(wctx, metav1.ListOptions{
		FieldSelector: "metadata.name=" + nodeName, ResourceVersion: n.ResourceVersion,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	span(ctx)
	// The node's last write when the span ended: the watch has delivered
	// every write up to it once it delivers that one.
	end, err := env.Clientset.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if end.ResourceVersion == n.ResourceVersion {
		return 0
	}
	dctx, dcancel := context.WithTimeout(ctx, time.Minute)
	defer dcancel()
	count := 0
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch of node %s closed after %d writes, before the write %s", nodeName, count, end.ResourceVersion)
			}
			if ev.Type != watch.Modified {
				continue
			}
			count++
			if o, ok := ev.Object.(*corev1.Node); ok && o.ResourceVersion == end.ResourceVersion {
				return count
			}
		case <-dctx.Done():
			t.Fatalf("watch of node %s: write %s not delivered (%d counted)", nodeName, end.ResourceVersion, count)
		}
	}
}

// waitKubeletReports waits until the server has reviewed n status
// reports of the kubelet beyond since (a count from kubeletReviews),
// calling check, whose error stops the wait, at each poll. The kubelet
// sends its next report only once the last one returned, so when report
// since+n is reviewed the writes of the n-1 before it are stored.
func waitKubeletReports(ctx context.Context, url string, since, n int, timeout time.Duration, what string, check func(context.Context) error) error {
	seen := 0
	_, err := cluster.Poll(ctx, 200*time.Millisecond, timeout, fmt.Sprintf("%d kubelet status reports %s", n, what), func(ctx context.Context) (bool, error) {
		if check != nil {
			if err := check(ctx); err != nil {
				return false, cluster.Permanent(err)
			}
		}
		r, _, err := kubeletReviews(ctx, url)
		if err != nil {
			return false, err
		}
		seen = r - since
		return seen >= n, nil
	})
	if err != nil {
		return fmt.Errorf("%w (%d seen)", err, seen)
	}
	return nil
}

// waitLeaseRenewals waits until the kubelet has renewed its node Lease
// (kube-node-lease/<node>, every quarter of its duration: 4 s under this
// package's kubelet options) n
// times after resourceVersion rv, each renewal one watch event.
func waitLeaseRenewals(ctx context.Context, rv string, n int, timeout time.Duration) error {
	leases := env.Clientset.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	renewals := 0
	err := cluster.Watch(ctx, timeout, fmt.Sprintf("%d renewals of the kubelet's Lease %s", n, nodeName), rv,
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = "metadata.name=" + nodeName
			return leases.Watch(ctx, o)
		}, func(ev watch.Event) (bool, error) {
			if ev.Type == watch.Modified {
				renewals++
			}
			return renewals >= n, nil
		})
	if err != nil {
		return fmt.Errorf("%w (%d seen)", err, renewals)
	}
	return nil
}

func allocatableCPU(ctx context.Context, t *testing.T) int64 {
	t.Helper()
	n, err := env.Clientset.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Status.Allocatable.Cpu().MilliValue()
}

// touchNode writes nodes/status as the operator does on a new NodeOversell
// generation, so the webhook evaluates the node now rather than at the
// kubelet's next report (nodeStatusReportFrequency, 5 min).
func touchNode(ctx context.Context, t *testing.T) {
	t.Helper()
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, v1alpha1.OversellResyncKey, time.Now().UTC().Format(time.RFC3339Nano))
	if _, err := env.Clientset.CoreV1().Nodes().Patch(ctx, nodeName, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
}

// boundPod requests cpu and is bound to the node directly (spec.nodeName):
// the kubelet's own admission decides, not the scheduler.
func boundPod(ns, name string, cpu resource.Quantity) *corev1.Pod {
	p := hardenedPod(ns, name, nil)
	p.Spec.NodeSelector = nil
	p.Spec.NodeName = nodeName
	p.Spec.Containers[0].Resources = corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: cpu, corev1.ResourceMemory: resource.MustParse("16Mi")},
	}
	return p
}

// A NodeOversell of cpu ratio 2 makes the real kubelet admit pods whose cpu
// requests add up to more than its real allocatable: the kubelet checks a
// new pod against the Node object's allocatable it reads from the API
// (pkg/kubelet/lifecycle/predicate.go, Admit: getNodeAnyWayFunc), which the
// webhook inflated. Without it, the same pods get OutOfcpu.
func TestOversellRatio2LetsTheKubeletAdmitBeyondItsCPU(t *testing.T) {
	ctx := cluster.TestContext(t, 8*time.Minute)
	raw := allocatableCPU(ctx, t)
	if raw < 1000 {
		t.Fatalf("node allocatable cpu %dm: this test wants at least 1 cpu", raw)
	}
	// Three pods of raw/2 each: two fit the real allocatable, three need
	// 1.5 × raw.
	per := *resource.NewMilliQuantity(raw/2, resource.DecimalSI)
	runPods := func(ns string) map[string]*corev1.Pod {
		createNS(ctx, t, ns)
		for i := 0; i < 3; i++ {
			if _, err := env.Clientset.CoreV1().Pods(ns).Create(ctx, boundPod(ns, fmt.Sprintf("cpu-%d", i), per), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			// The kubelet admits pods in the order it sees them; one at a
			// time keeps the order (and so which one is rejected) fixed.
			waitPod(ctx, t, ns, fmt.Sprintf("cpu-%d", i), "admitted or rejected", func(p *corev1.Pod) bool {
				return p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodFailed
			})
		}
		out := map[string]*corev1.Pod{}
		for i := 0; i < 3; i++ {
			name := fmt.Sprintf("cpu-%d", i)
			p, err := env.Clientset.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			out[name] = p
		}
		return out
	}
	deletePods := func(ns string) {
		if err := env.Clientset.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](1)}, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := cluster.WaitFor(ctx, 2*time.Minute, "pods of "+ns+" gone", func(ctx context.Context) (bool, error) {
			l, err := env.Clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			return err == nil && len(l.Items) == 0, err
		}); err != nil {
			t.Fatal(err)
		}
	}

	// Ratio 1 (no NodeOversell): the third pod is rejected by the kubelet.
	plain := runPods("oversell-off")
	for _, name := range []string{"cpu-0", "cpu-1"} {
		if p := plain[name]; p.Status.Phase != corev1.PodRunning {
			t.Errorf("without oversell, %s: phase %s (%s), want Running", name, p.Status.Phase, p.Status.Reason)
		}
	}
	if p := plain["cpu-2"]; p.Status.Phase != corev1.PodFailed || p.Status.Reason != "OutOfcpu" {
		t.Errorf("without oversell, cpu-2: phase %s reason %q, want Failed OutOfcpu", p.Status.Phase, p.Status.Reason)
	}
	deletePods("oversell-off")

	// Ratio 2: the webhook doubles the Node's allocatable, the kubelet
	// admits all three.
	server, metricsURL := startOversellServer(t, ctx)
	no := &v1alpha1.NodeOversell{
		ObjectMeta: metav1.ObjectMeta{Name: "real-node"},
		Spec: v1alpha1.NodeOversellSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "real"}},
			Ratios:       v1alpha1.OversellRatios{CPU: "2"},
		},
	}
	if err := env.Client.Create(ctx, no); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), no) })
	if err := cluster.WaitFor(ctx, 2*time.Minute, fmt.Sprintf("allocatable cpu %dm -> %dm", raw, 2*raw), func(ctx context.Context) (bool, error) {
		touchNode(ctx, t)
		return allocatableCPU(ctx, t) == 2*raw, nil
	}); err != nil {
		t.Fatal(err)
	}
	over := runPods("oversell-on")
	for name, p := range over {
		if p.Status.Phase != corev1.PodRunning {
			t.Errorf("with ratio 2, %s: phase %s reason %q (%s), want Running", name, p.Status.Phase, p.Status.Reason, p.Status.Message)
		}
	}
	// They keep running while the kubelet's status reports (raw) are
	// amplified again by the webhook: two reports, counted by the server
	// that reviews them (the kubelet patches every status period while its
	// allocatable differs from the Node's), and the third, which the
	// kubelet sends only once the second returned.
	// A report stored raw would end them (the kubelet then has nothing to
	// correct): the wait stops there, and the checks below say so.
	reviewed, _ := mustKubeletReviews(ctx, t, metricsURL)
	if err := waitKubeletReports(ctx, metricsURL, reviewed, 3, 3*time.Minute, "reviewed by the server", func(ctx context.Context) error {
		if got := allocatableCPU(ctx, t); got != 2*raw {
			return fmt.Errorf("allocatable cpu %dm, want %dm", got, 2*raw)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	for name := range over {
		p, err := env.Clientset.CoreV1().Pods("oversell-on").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase != corev1.PodRunning {
			t.Errorf("with ratio 2, %s after two of the kubelet's status reports: phase %s reason %q", name, p.Status.Phase, p.Status.Reason)
		}
	}
	if got := allocatableCPU(ctx, t); got != 2*raw {
		t.Errorf("allocatable cpu after the kubelet's reports: %dm, want %dm", got, 2*raw)
	}

	// Restart the kubelet while the node is oversold (kubernetes #52902,
	// #105523): a restarted kubelet re-admits the pods it finds. It waits
	// for its Node informer before it watches pods
	// (pkg/kubelet/config/apiserver.go, NewSourceApiserver), so it admits
	// them against the amplified allocatable, not its own raw one: every
	// pod keeps its container, none is rejected with OutOfcpu.
	before := map[string]string{}
	for name, p := range over {
		before[name] = p.Status.ContainerStatuses[0].ContainerID
	}
	if err := node.RestartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	// The new kubelet has taken the pods from the API server once it logs
	// their SyncLoop ADD; a rejection would follow at once.
	if err := cluster.WaitFor(ctx, 2*time.Minute, "restarted kubelet adding the oversold pods", func(context.Context) (bool, error) {
		b, err := os.ReadFile(node.Log("kubelet"))
		return err == nil && strings.Contains(string(b), `"SyncLoop ADD" source="api"`) && strings.Contains(string(b), "oversell-on/cpu-2"), err
	}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitFor(ctx, 2*time.Minute, "node Ready after the kubelet restart", func(ctx context.Context) (bool, error) {
		return env.NodeReady(ctx, nodeName)
	}); err != nil {
		t.Fatal(err)
	}
	// No rejection follows: the restarted kubelet runs on for two
	// renewals of its node Lease (4 s apart here) and the pods are as they
	// were. The Lease is the kubelet's own clock, not the test's: a
	// kubelet slowed by the machine's load takes as long to renew it.
	lease, err := env.Clientset.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := waitLeaseRenewals(ctx, lease.ResourceVersion, 2, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	for name := range over {
		p, err := env.Clientset.CoreV1().Pods("oversell-on").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cs := p.Status.ContainerStatuses
		if p.Status.Phase != corev1.PodRunning || len(cs) == 0 || cs[0].ContainerID != before[name] || cs[0].RestartCount != 0 {
			t.Errorf("after the kubelet restart, %s: phase %s reason %q, containers %+v; want Running with container %s",
				name, p.Status.Phase, p.Status.Reason, cs, before[name])
		}
	}
	if b, err := os.ReadFile(node.Log("kubelet")); err == nil && strings.Contains(string(b), "OutOfcpu") {
		t.Errorf("restarted kubelet logged OutOfcpu:\n%s", tail(node.Log("kubelet"), 3000))
	}
	deletePods("oversell-on")

	// The kubelet's real status loop while amplified: every
	// nodeStatusUpdateFrequency (4 s here) it finds its raw allocatable differs
	// from the Node's and patches (pkg/kubelet/kubelet_node_status.go,
	// tryUpdateNodeStatus). Such a patch only restates raw allocatable and
	// heartbeat times, so the server answers it with the stored values
	// (webhooks/oversell/hold.go): the API server stores nothing.
	// The span is four of the kubelet's reports (16 s at its 4 s period),
	// counted by the server, or 4 min if they do not come (a patch stored
	// raw ends the kubelet's corrections): under the 5 min heartbeat age.
	reviewedBefore, heldBefore := mustKubeletReviews(ctx, t, metricsURL)
	var spanErr error
	spanStart := time.Now()
	amplified := nodeWritesWhile(ctx, t, func(ctx context.Context) {
		spanErr = waitKubeletReports(ctx, metricsURL, reviewedBefore, 4, 4*time.Minute, "while amplified", nil)
	})
	span := time.Since(spanStart)
	reviewedAfter, heldAfter := mustKubeletReviews(ctx, t, metricsURL)
	reports, held := reviewedAfter-reviewedBefore, heldAfter-heldBefore
	t.Logf("figure: while amplified, over %d kubelet status reports (%s): %d Node writes; kubelet patches held by the server: %d",
		reports, span.Round(time.Second), amplified, held)
	if spanErr != nil {
		t.Logf("the span ended at its deadline: %v", spanErr)
	}
	// At most one real heartbeat (--max-heartbeat-age, 5 min) and one
	// managedFields change after the kubelet restart go through.
	if held < 2 || amplified > 2 {
		t.Errorf("while amplified: %d Node writes, %d held kubelet patches over %d kubelet reports (%s); want the kubelet's patches held (at least 2) and at most 2 writes",
			amplified, held, reports, span.Round(time.Second))
	}

	// The server stops; under failurePolicy Ignore the kubelet's next
	// patch is stored as it is: the node stays Ready, allocatable is raw.
	if err := server.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	if err := cluster.WaitFor(ctx, 2*time.Minute, fmt.Sprintf("allocatable cpu back to %dm with the server down", raw), func(ctx context.Context) (bool, error) {
		ready, err := env.NodeReady(ctx, nodeName)
		if err != nil || !ready {
			return false, cluster.Permanent(fmt.Errorf("node not Ready with the server down (err %v)", err))
		}
		return allocatableCPU(ctx, t) == raw, nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("figure: oversell server down -> allocatable raw in %s", time.Since(down).Round(time.Second))

	if ready, err := env.NodeReady(ctx, nodeName); err != nil || !ready {
		t.Errorf("node Ready = %v (%v) with the server down, want true", ready, err)
	}
}
