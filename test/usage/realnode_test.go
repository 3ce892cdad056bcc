package usage

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/test/cluster"
)

// The real node: capacity 2 CPUs, kubeReserved 500m, so raw allocatable
// cpu 1500m; cpuManagerPolicy static and the admin's node label saying so.

// TestRealNode runs the kubelet's side of issue 19 on one NodeOversell
// (cpu ratio 2 on the real node), in order.
func TestRealNode(t *testing.T) {
	t.Parallel()
	ctx := cluster.TestContext(t, 10*time.Minute)
	no := &v1alpha1.NodeOversell{
		ObjectMeta: metav1.ObjectMeta{Name: "real"},
		Spec: v1alpha1.NodeOversellSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "real"}},
			Ratios:       v1alpha1.OversellRatios{CPU: "2"},
		},
	}
	newOversell(t, ctx, no)
	waitNode(t, ctx, 3*time.Minute, realNode, "1500m x 2", func(s nodeState) bool { return s.cpu == "3" })

	t.Run("ExclusiveCPUsStayReal", func(t *testing.T) { exclusiveCPUs(t, ctx) })
	t.Run("CutHeldAcrossKubeletRestart", func(t *testing.T) { cutAcrossRestart(t, ctx, no) })
	t.Run("UsageAndPressureWithABurner", func(t *testing.T) { burner(t, ctx, no) })
}

// exclusiveCPUs (point 3): a Guaranteed pod with 1 CPU gets an exclusive
// CPU from the kubelet's static policy, and the node publishes
// (1500m - 1) x 2 + 1 = 2 instead of 3.
func exclusiveCPUs(t *testing.T, ctx context.Context) {
	start := time.Now()
	g := pod("guaranteed", realNode, cpuMem("1", "64Mi"), cpuMem("1", "64Mi"), nil)
	createPods(t, ctx, g)
	// The kubelet's own record of the assignment (cpu_manager_state).
	state := filepath.Join(node.Dir, "kubelet", "cpu_manager_state")
	waitFor(t, ctx, 30*time.Second, "exclusive CPU in "+state, func(ctx context.Context) (bool, error) {
		b, err := os.ReadFile(state)
		return err == nil && strings.Contains(string(b), string(g.UID)), nil
	})
	b, _ := os.ReadFile(state)
	t.Logf("kubelet cpu_manager_state: %s", b)
	s := waitNode(t, ctx, 30*time.Second, realNode, "(1500m - 1) x 2 + 1 = 2", func(s nodeState) bool {
		return s.cpu == "2" && s.target.ExclusiveCPU == "1" && strings.Contains(s.ratios, `"exclusiveCPU":"1"`)
	})
	t.Logf("figure: Guaranteed 1-cpu pod created -> node publishes %s (raw 1500m, ratio 2, 1 exclusive) in %s", s.cpu, time.Since(start).Round(100*time.Millisecond))
	deletePods(t, ctx, g)
	waitNode(t, ctx, 30*time.Second, realNode, "back to 1500m x 2", func(s nodeState) bool { return s.cpu == "3" && s.target.ExclusiveCPU == "" })
}

// cutAcrossRestart (point 2 on the kubelet): pods admitted at ratio 2
// request 2 CPUs of the raw 1500m; ratio 1 is requested: the cut is held
// at what they need (2), the node is tainted, the condition names it, and
// after a kubelet restart (which re-admits every pod against the node
// object, kubernetes#105523) no pod is rejected. Once pods go, released.
func cutAcrossRestart(t *testing.T, ctx context.Context, no *v1alpha1.NodeOversell) {
	wc, warnings := env.WarningsClient(t)
	var pods []*corev1.Pod
	for i := range 4 {
		pods = append(pods, pod(fmt.Sprintf("cut-%d", i), realNode, cpuMem("500m", "32Mi"), nil, nil))
	}
	createPods(t, ctx, pods...)
	warnings.Take()
	if err := update(ctx, wc, no, func() { no.Spec.Ratios.CPU = "1" }); err != nil {
		t.Fatal(err)
	}
	if w := strings.Join(warnings.Take(), "\n"); !strings.Contains(w, realNode+": cpu: pods request 2 > 1500m at 1; held at cpu 1.333334") {
		t.Errorf("apply warnings:\n%s", w)
	}
	waitNode(t, ctx, 30*time.Second, realNode, "held at 1.333334 (allocatable 2), tainted", func(s nodeState) bool {
		return s.cpu == "2" && s.target.CPU.Ratio == "1.333334" && s.taint == v1alpha1.OversellTaintRatioCut
	})
	waitCondition(t, ctx, 30*time.Second, no, v1alpha1.ConditionRatioHeld, metav1.ConditionTrue, "PodsExceedTarget", realNode, "pods request 2 > 1500m at 1")

	start := time.Now()
	if err := node.RestartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	// The restarted kubelet reports again (a fresh Ready heartbeat) and
	// re-admits its pods: none is rejected.
	restart := time.Now()
	waitFor(t, ctx, 2*time.Minute, "kubelet back with a fresh heartbeat", func(ctx context.Context) (bool, error) {
		n := &corev1.Node{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: realNode}, n); err != nil {
			return false, err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue && c.LastHeartbeatTime.After(restart.Add(-time.Second)), nil
			}
		}
		return false, nil
	})
	t.Logf("figure: kubelet restarted -> Ready again in %s", time.Since(start).Round(100*time.Millisecond))
	// The restarted kubelet re-admits its pods as it starts; two renewals
	// of its node Lease after Ready (4 s apart here, slower only if the
	// kubelet itself is) give a rejection every chance to show.
	if err := whileLeaseRenewed(ctx, realNode, 2, func(ctx context.Context) error {
		for _, p := range pods {
			got := &corev1.Pod{}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), got); err != nil {
				return err
			}
			if got.Status.Phase != corev1.PodRunning {
				return fmt.Errorf("pod %s after the kubelet restart: %s %s %s", p.Name, got.Status.Phase, got.Status.Reason, got.Status.Message)
			}
		}
		s, err := readNode(ctx, realNode)
		if err != nil {
			return err
		}
		if s.cpu != "2" {
			return fmt.Errorf("allocatable after the kubelet restart: %s", s)
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\nkubelet log:\n%s", err, tail(node.Log("kubelet"), 3000))
	}
	if strings.Contains(readFile(node.Log("kubelet")), "OutOfcpu") {
		t.Error("the restarted kubelet logged OutOfcpu")
	}

	// Two pods go: 1 CPU fits the raw 1500m, the hold ends.
	deletePods(t, ctx, pods[2:]...)
	waitNode(t, ctx, 30*time.Second, realNode, "released: ratio 1, untainted", func(s nodeState) bool {
		return s.cpu == "1500m" && s.target.CPU.Ratio == "1" && s.taint == ""
	})
	waitCondition(t, ctx, 30*time.Second, no, v1alpha1.ConditionRatioHeld, metav1.ConditionFalse, "NothingHeld")
	deletePods(t, ctx, pods[:2]...)
	if err := update(ctx, wc, no, func() { no.Spec.Ratios.CPU = "2" }); err != nil {
		t.Fatal(err)
	}
	waitNode(t, ctx, 30*time.Second, realNode, "x2 again", func(s nodeState) bool { return s.cpu == "3" })
}

// burner (points 1 and 4 on the kubelet): a real CPU burner's usage
// lowers the usage-aware ratio and its idling raises it again; with a
// pressure threshold, burning backs the node off to ratio 1 with our
// taint within a metrics period, evicts nothing, and the back-off ends
// once usage stayed below for the hold time.
func burner(t *testing.T, ctx context.Context, no *v1alpha1.NodeOversell) {
	wc := env.Client
	b := pod("burner", realNode, cpuMem("100m", "32Mi"), cpuMem("1", "64Mi"), nil, "burn", "--off")
	createPods(t, ctx, b)
	url := "http://" + b.Status.PodIP + ":8080"
	// Running means the container started, not that it listens yet: on a
	// loaded machine the first GET was refused (2026-12-06).
	waitFor(t, ctx, time.Minute, "burner serving "+url, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/healthz", nil)
		if err != nil {
			return false, cluster.Permanent(err)
		}
		res, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
		if err != nil {
			return false, err
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK, nil
	})
	if err := update(ctx, wc, no, func() {
		no.Spec.Usage = &v1alpha1.OversellUsage{
			TargetUtilization: &v1alpha1.TargetUtilization{CPU: ptrTo[int32](50)},
			Interval:          &metav1.Duration{Duration: 2 * time.Second},
			MinChangeInterval: &metav1.Duration{Duration: 4 * time.Second},
			MaxStep:           "1",
			StaleAfter:        &metav1.Duration{Duration: time.Minute},
		}
	}); err != nil {
		t.Fatal(err)
	}
	waitNode(t, ctx, 2*time.Minute, realNode, "idle burner: ratio 2 (static)", func(s nodeState) bool {
		return s.cpu == "3" && s.target.CPU.Source == v1alpha1.RatioSourceStatic
	})
	start := time.Now()
	httpGet(t, url+"/on")
	waitNode(t, ctx, 2*time.Minute, realNode, "burning: ratio 1 (usage)", func(s nodeState) bool {
		return s.cpu == "1500m" && s.target.CPU.Ratio == "1" && s.target.CPU.Source == v1alpha1.RatioSourceUsage
	})
	t.Logf("figure: burner on -> ratio 2 -> 1 (usage) in %s", time.Since(start).Round(100*time.Millisecond))
	start = time.Now()
	httpGet(t, url+"/off")
	waitNode(t, ctx, 2*time.Minute, realNode, "idle again: ratio 2", func(s nodeState) bool {
		return s.cpu == "3" && s.target.CPU.Source == v1alpha1.RatioSourceStatic
	})
	t.Logf("figure: burner off -> ratio 1 -> 2 in %s", time.Since(start).Round(100*time.Millisecond))

	// Pressure: 5 % of the raw 1500m is 75m, which the burner crosses
	// however loaded this machine is.
	const hold = 15 * time.Second
	if err := update(ctx, wc, no, func() {
		no.Spec.Usage.PressureThreshold = &v1alpha1.PressureThreshold{CPU: ptrTo[int32](5)}
		no.Spec.Usage.PressureHold = &metav1.Duration{Duration: hold}
	}); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	httpGet(t, url+"/on")
	waitNode(t, ctx, time.Minute, realNode, "pressure: ratio 1, tainted", func(s nodeState) bool {
		return s.cpu == "1500m" && s.target.CPU.Source == v1alpha1.RatioSourcePressure && s.taint == v1alpha1.OversellTaintPressure
	})
	t.Logf("figure: burner over the threshold -> ratio 1 and taint in %s (metrics-server resolution 10 s)", time.Since(start).Round(100*time.Millisecond))
	waitCondition(t, ctx, 30*time.Second, no, v1alpha1.ConditionPressure, metav1.ConditionTrue, "BackingOff", realNode)
	// The hold is judged by the operator's stamps: when it saw usage fall
	// below (belowSince) and when the ratio left pressure (changed).
	lctx, stopLog := context.WithCancel(ctx)
	defer stopLog()
	log, err := cluster.WatchRatios(lctx, env.Clientset, realNode)
	if err != nil {
		t.Fatal(err)
	}
	httpGet(t, url+"/off")
	start = time.Now()
	waitNode(t, ctx, 2*time.Minute, realNode, "back-off over: untainted, ratio up", func(s nodeState) bool {
		return s.taint == "" && s.target.CPU.Source != v1alpha1.RatioSourcePressure && s.target.PressureSince == ""
	})
	t.Logf("figure: burner off -> back-off released after %s (hold %s)", time.Since(start).Round(100*time.Millisecond), hold)
	var below, released string
	waitFor(t, ctx, time.Minute, "the release in the node's watch", func(context.Context) (bool, error) {
		below, released = "", ""
		for _, tg := range log.Targets() {
			switch {
			case tg.BelowSince != "":
				below = tg.BelowSince
			case tg.PressureSince == "" && below != "" && tg.CPU.Source != v1alpha1.RatioSourcePressure:
				released = tg.CPU.Changed
				return true, nil
			}
		}
		return false, nil
	})
	bt, err1 := time.Parse(time.RFC3339, below)
	rt, err2 := time.Parse(time.RFC3339, released)
	if err1 != nil || err2 != nil || rt.Sub(bt) < hold {
		t.Errorf("back-off released (stamp %q) after usage fell below (stamp %q): less than the %s hold", released, below, hold)
	}
	// Nothing was evicted: the burner ran throughout.
	got := &corev1.Pod{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(b), got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != corev1.PodRunning || got.DeletionTimestamp != nil || len(got.Status.ContainerStatuses) == 0 || got.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("burner after the back-off: %s, deleting %v, %+v", got.Status.Phase, got.DeletionTimestamp, got.Status.ContainerStatuses)
	}
	deletePods(t, ctx, b)
}

func httpGet(t *testing.T, url string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	res, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, res.Status)
	}
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

func tail(path string, n int) string {
	s := readFile(path)
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// whileLeaseRenewed calls check every second, from now until node's
// Lease (kube-node-lease) has been renewed n times, and returns check's
// first error: a window counted in the kubelet's own heartbeats rather
// than in seconds of a possibly loaded machine.
func whileLeaseRenewed(ctx context.Context, node string, n int, check func(context.Context) error) error {
	return whileStampMoves(ctx, "node "+node+"'s Lease renewals", n, check, func(ctx context.Context) (string, error) {
		l, err := env.Clientset.CoordinationV1().Leases("kube-node-lease").Get(ctx, node, metav1.GetOptions{})
		if err != nil || l.Spec.RenewTime == nil {
			return "", err
		}
		return l.Spec.RenewTime.Format(time.RFC3339Nano), nil
	})
}

// whileHeartbeats is whileLeaseRenewed for a node's status writes: the
// Ready condition's lastHeartbeatTime changing n times (kwok's heartbeat).
func whileHeartbeats(ctx context.Context, node string, n int, check func(context.Context) error) error {
	return whileStampMoves(ctx, "node "+node+"'s status heartbeats", n, check, func(ctx context.Context) (string, error) {
		nd := &corev1.Node{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, nd); err != nil {
			return "", err
		}
		for _, c := range nd.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.LastHeartbeatTime.Format(time.RFC3339Nano), nil
			}
		}
		return "", nil
	})
}

// whileStampMoves calls check every second until stamp has returned n
// values other than the first one it read, and returns check's first
// error or stamp's.
func whileStampMoves(ctx context.Context, what string, n int, check func(context.Context) error, stamp func(context.Context) (string, error)) error {
	moves, last := 0, ""
	for {
		if err := check(ctx); err != nil {
			return err
		}
		s, err := stamp(ctx)
		if err != nil {
			return err
		}
		if s != "" {
			if last != "" && s != last {
				moves++
			}
			last = s
		}
		if moves >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d %s seen: %w", moves, n, what, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}
