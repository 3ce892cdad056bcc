package usage

import (
	"context"
	"encoding/json"
	"fmt"
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

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }

// TestUsageRatioKwok (point 1 on kwok nodes): a workload's usage (kwok's
// usage annotations, through metrics-server) rises: the node's ratio goes
// from spec.ratios down to 1 in steps of at most maxStep, at least
// minChangeInterval apart; it falls: the ratio goes back up. A metric
// 1000x the capacity, then metrics-server down, put the node on the
// fallback ratio, named in the condition UsageMetrics and status.nodes.
func TestUsageRatioKwok(t *testing.T) {
	t.Parallel()
	ctx := cluster.TestContext(t, 8*time.Minute)
	const n = "usage-0"
	var pods []*corev1.Pod
	for i := range 4 {
		pods = append(pods, pod(fmt.Sprintf("use-%d", i), n, cpuMem("1", "100Mi"), nil,
			map[string]string{cluster.KwokUsageCPUAnnotation: "100m", cluster.KwokUsageMemoryAnnotation: "50Mi"}))
	}
	createPods(t, ctx, pods...)
	// metrics-server needs two scrapes of a pod for its cpu rate, and
	// measures the pods of one node in different scrapes when kwok starts
	// them apart.
	for _, p := range pods {
		waitFor(t, ctx, 2*time.Minute, "pod metrics of "+p.Name, func(ctx context.Context) (bool, error) {
			b, err := env.Clientset.CoreV1().RESTClient().Get().AbsPath("/apis/metrics.k8s.io/v1beta1/namespaces/" + workNS + "/pods/" + p.Name).DoRaw(ctx)
			return err == nil && strings.Contains(string(b), `"cpu"`), nil
		})
	}
	const minInterval, staleAfter = 8 * time.Second, 15 * time.Second
	no := &v1alpha1.NodeOversell{
		ObjectMeta: metav1.ObjectMeta{Name: "usage"},
		Spec: v1alpha1.NodeOversellSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "usage"}},
			Ratios:       v1alpha1.OversellRatios{CPU: "2"},
			Usage: &v1alpha1.OversellUsage{
				TargetUtilization: &v1alpha1.TargetUtilization{CPU: ptrTo[int32](60)},
				Interval:          &metav1.Duration{Duration: 2 * time.Second},
				MinChangeInterval: &metav1.Duration{Duration: minInterval},
				MaxStep:           "0.5", DeadBand: "0.1", FallbackRatio: "1",
				StaleAfter: &metav1.Duration{Duration: staleAfter},
			},
		},
	}
	// Every ratio the node goes through, with the operator's own stamps,
	// from before the NodeOversell exists.
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	log, err := cluster.WatchRatios(wctx, env.Clientset, n)
	if err != nil {
		t.Fatal(err)
	}
	// setUsage sets every pod's cpu usage.
	setUsage := func(cpu string) {
		t.Helper()
		for _, p := range pods {
			if err := env.SetPodUsage(ctx, workNS, p.Name, cpu, ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	start := time.Now()
	newOversell(t, ctx, no)
	// Idle pods (usage 10% of requests): spec.ratios, 4 x 2.
	waitNode(t, ctx, time.Minute, n, "ratio 2 (static), allocatable 8", func(s nodeState) bool {
		return s.cpu == "8" && s.target != nil && s.target.CPU.Ratio == "2" && s.target.CPU.Source == v1alpha1.RatioSourceStatic
	})
	t.Logf("figure: usage-aware NodeOversell created -> node at spec.ratios: %s", time.Since(start).Round(100*time.Millisecond))
	waitCondition(t, ctx, 30*time.Second, no, v1alpha1.ConditionUsageMetrics, metav1.ConditionTrue, "Measured")
	// The changes up to here: the node may pass a cautious usage ratio
	// first (a pod metrics-server dropped from a scrape counts as its
	// requests), within the same steps and intervals.
	var before []string
	waitFor(t, ctx, time.Minute, "ratio log at 2 before the rise", func(context.Context) (bool, error) {
		c, err := log.Changes()
		before = before[:0]
		for _, x := range c {
			before = append(before, x.Ratio)
		}
		return len(c) > 0 && c[len(c)-1].Ratio == "2", err
	})
	if len(before) > 1 {
		t.Logf("figure: ratios after creation, before the rise: %v", before)
	}

	// Usage rises to 90% of the requests (3.6 of 4 cores).
	start = time.Now()
	setUsage("900m")
	waitNode(t, ctx, 2*time.Minute, n, "ratio 1 (usage), allocatable 4", func(s nodeState) bool {
		return s.cpu == "4" && s.target.CPU.Ratio == "1" && s.target.CPU.Source == v1alpha1.RatioSourceUsage
	})
	t.Logf("figure: usage 10%% -> 90%% of requests: ratio 2 -> 1 in %s", time.Since(start).Round(100*time.Millisecond))

	// And falls back.
	start = time.Now()
	setUsage("100m")
	waitNode(t, ctx, 2*time.Minute, n, "ratio 2 (static) again, allocatable 8", func(s nodeState) bool {
		return s.cpu == "8" && s.target.CPU.Ratio == "2" && s.target.CPU.Source == v1alpha1.RatioSourceStatic
	})
	t.Logf("figure: usage back to 10%%: ratio 1 -> 2 in %s", time.Since(start).Round(100*time.Millisecond))
	// The log's watch runs on its own: wait until it saw the last change.
	waitFor(t, ctx, time.Minute, "ratio log at 2", func(context.Context) (bool, error) {
		c, err := log.Changes()
		return len(c) > 1 && c[len(c)-1].Ratio == "2", err
	})
	changes, err := log.Changes()
	if err == nil {
		err = cluster.CheckRatioSteps(changes, append(before, "1.5", "1", "1.5", "2"), 500_000, minInterval)
	}
	if err != nil {
		t.Error(err)
	}
	t.Logf("ratio changes, by the operator's stamps: %s", cluster.FormatRatioSteps(changes))

	// A measurement 1000x the node's capacity is not believed.
	if err := env.SetPodUsage(ctx, workNS, "use-0", "4000", ""); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, ctx, time.Minute, no, v1alpha1.ConditionUsageMetrics, metav1.ConditionFalse, "OutOfRange", n, "above the capacity")
	waitNode(t, ctx, time.Minute, n, "fallback ratio", func(s nodeState) bool {
		return s.target.CPU.Source == v1alpha1.RatioSourceFallback && s.target.CPU.Ratio != "2"
	})
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(no), no); err != nil {
		t.Fatal(err)
	}
	if len(no.Status.Nodes) != 1 || no.Status.Nodes[0].Name != n || !strings.Contains(no.Status.Nodes[0].Message, "fallback") ||
		no.Status.NodesBySource[v1alpha1.RatioSourceFallback] != 1 {
		t.Fatalf("status.nodes %+v, nodesBySource %v", no.Status.Nodes, no.Status.NodesBySource)
	}
	if err := env.SetPodUsage(ctx, workNS, "use-0", "100m", ""); err != nil {
		t.Fatal(err)
	}

	// metrics-server down: the nodes keep their last measurement until it
	// is older than staleAfter, then fall back, never above spec.ratios.
	waitCondition(t, ctx, 2*time.Minute, no, v1alpha1.ConditionUsageMetrics, metav1.ConditionTrue, "Measured")
	if err := env.StopMetricsServer(); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if !restarted {
			_ = env.StartMetricsServer(context.Background())
		}
	}()
	down := time.Now()
	waitCondition(t, ctx, time.Minute, no, v1alpha1.ConditionUsageMetrics, metav1.ConditionFalse, "MetricsUnavailable", "keep their last measurement")
	c := waitCondition(t, ctx, time.Minute, no, v1alpha1.ConditionUsageMetrics, metav1.ConditionFalse, "MetricsUnavailable", n+": metrics.k8s.io unavailable", "older than 15s")
	t.Logf("figure: metrics-server down -> node on the fallback after %s (staleAfter %s): %s", time.Since(down).Round(100*time.Millisecond), staleAfter, c.Message)
	s, err := readNode(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	if s.cpu != "8" && s.cpu != "6" && s.cpu != "4" {
		t.Fatalf("allocatable %s on the fallback", s.cpu)
	}
	if err := env.StartMetricsServer(ctx); err != nil {
		t.Fatal(err)
	}
	restarted = true
	defer func() {
		if t.Failed() {
			nd := &corev1.Node{}
			_ = env.Client.Get(context.Background(), client.ObjectKey{Name: n}, nd)
			t.Logf("node %s addresses %v, conditions %v\nmetrics-server log:\n%s", n, nd.Status.Addresses, nd.Status.Conditions,
				tail(filepath.Join(env.Dir, "logs", "metrics-server.log"), 4000))
		}
	}()
	waitCondition(t, ctx, 2*time.Minute, no, v1alpha1.ConditionUsageMetrics, metav1.ConditionTrue, "Measured")
}

// TestHoldsKwok (point 2 on kwok nodes): a lowered ratio, a narrowed
// selector and a deletion never leave a node whose running pods request
// more than its allocatable: each such node is held (its ratio at what its
// pods need, our NoSchedule taint, RatioHeld naming it, a warning at
// apply time) and released once its pods fit.
func TestHoldsKwok(t *testing.T) {
	t.Parallel()
	ctx := cluster.TestContext(t, 6*time.Minute)
	wc, warnings := env.WarningsClient(t)
	var pods0, pods1 []*corev1.Pod
	for i := range 6 {
		pods0 = append(pods0, pod(fmt.Sprintf("hold0-%d", i), "hold-0", cpuMem("1", "100Mi"), nil, nil))
		pods1 = append(pods1, pod(fmt.Sprintf("hold1-%d", i), "hold-1", cpuMem("1", "100Mi"), nil, nil))
	}
	no := &v1alpha1.NodeOversell{
		ObjectMeta: metav1.ObjectMeta{Name: "hold"},
		Spec: v1alpha1.NodeOversellSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "hold"}},
			Ratios:       v1alpha1.OversellRatios{CPU: "2"},
		},
	}
	newOversell(t, ctx, no)
	for _, n := range []string{"hold-0", "hold-1"} {
		waitNode(t, ctx, time.Minute, n, "amplified x2", func(s nodeState) bool { return s.cpu == "8" && s.label == "hold" })
	}
	// 6 cores requested on each 4-core node: admitted at ratio 2.
	createPods(t, ctx, append(append([]*corev1.Pod(nil), pods0...), pods1...)...)

	// The ratio is lowered to 1: both nodes are held at 1.5, tainted.
	warnings.Take()
	start := time.Now()
	if err := update(ctx, wc, no, func() { no.Spec.Ratios.CPU = "1" }); err != nil {
		t.Fatal(err)
	}
	if w := strings.Join(warnings.Take(), "\n"); !strings.Contains(w, "2 nodes run pods that request more") ||
		!strings.Contains(w, "hold-0: cpu: pods request 6 > 4 at 1; held at cpu 1.5") || !strings.Contains(w, "hold-1") {
		t.Errorf("apply warnings:\n%s", w)
	}
	for _, n := range []string{"hold-0", "hold-1"} {
		waitNode(t, ctx, 30*time.Second, n, "held at 1.5, tainted", func(s nodeState) bool {
			return s.cpu == "6" && s.target.CPU.Ratio == "1.5" && s.taint == v1alpha1.OversellTaintRatioCut &&
				strings.Contains(s.target.Held, "cpu: pods request 6 > 4 at 1")
		})
	}
	t.Logf("figure: ratio 2 -> 1 applied: both nodes held and tainted in %s", time.Since(start).Round(100*time.Millisecond))
	waitCondition(t, ctx, 30*time.Second, no, v1alpha1.ConditionRatioHeld, metav1.ConditionTrue, "PodsExceedTarget", "hold-0", "hold-1")
	if no.Status.RatioCeiling == nil || no.Status.RatioCeiling.CPU != "1.5" {
		t.Errorf("ratioCeiling %+v, want cpu 1.5", no.Status.RatioCeiling)
	}
	// The pods go down to what the raw allocatable holds: released.
	deletePods(t, ctx, pods0[3:]...)
	waitNode(t, ctx, 30*time.Second, "hold-0", "released to ratio 1, untainted", func(s nodeState) bool {
		return s.cpu == "4" && s.target.CPU.Ratio == "1" && s.taint == "" && s.target.Held == ""
	})

	// The selector narrows to zone a: hold-1 leaves but stays held.
	warnings.Take()
	if err := update(ctx, wc, no, func() { no.Spec.NodeSelector.MatchLabels["zone"] = "a" }); err != nil {
		t.Fatal(err)
	}
	if w := strings.Join(warnings.Take(), "\n"); !strings.Contains(w, "1 nodes run pods") || !strings.Contains(w, "hold-1") {
		t.Errorf("narrowing warnings:\n%s", w)
	}
	waitCondition(t, ctx, 30*time.Second, no, v1alpha1.ConditionRatioHeld, metav1.ConditionTrue, "", "hold-1")
	// It keeps its amplification through status writes (kwok's heartbeats
	// every 10 s reach the server through the held-node webhook): two of
	// them, however long they take.
	if err := whileHeartbeats(ctx, "hold-1", 2, func(ctx context.Context) error {
		s, err := readNode(ctx, "hold-1")
		if err != nil {
			return err
		}
		if s.cpu != "6" || s.label != "hold" || s.taint != v1alpha1.OversellTaintRatioCut {
			return fmt.Errorf("deselected hold-1 not held: %s", s)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// Deleted: hold-0's pods fit, it is released; hold-1 keeps the
	// NodeOversell until its pods fit too.
	if err := env.Client.Delete(ctx, no); err != nil {
		t.Fatal(err)
	}
	waitNode(t, ctx, 30*time.Second, "hold-0", "restored at deletion", func(s nodeState) bool {
		return s.cpu == "4" && s.target == nil && s.label == "" && s.ratios == ""
	})
	waitCondition(t, ctx, 30*time.Second, no, v1alpha1.ConditionRatioHeld, metav1.ConditionTrue, "", "hold-1")
	if no.DeletionTimestamp == nil {
		t.Fatal("no deletionTimestamp")
	}
	if s, err := readNode(ctx, "hold-1"); err != nil || s.cpu != "6" {
		t.Fatalf("hold-1 while its NodeOversell is deleted: %s %v", s, err)
	}
	start = time.Now()
	deletePods(t, ctx, pods1[4:]...)
	waitFor(t, ctx, time.Minute, "NodeOversell hold gone", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(no), &v1alpha1.NodeOversell{})
		return err != nil && client.IgnoreNotFound(err) == nil, nil
	})
	waitNode(t, ctx, 30*time.Second, "hold-1", "restored", func(s nodeState) bool {
		return s.cpu == "4" && s.target == nil && s.label == "" && s.taint == "" && s.ratios == ""
	})
	t.Logf("figure: last held pods gone -> NodeOversell deleted and node restored in %s (held nodes are rechecked every 10 s)", time.Since(start).Round(100*time.Millisecond))
}

// update re-reads no, mutates it and writes it through c.
func update(ctx context.Context, c client.Client, no *v1alpha1.NodeOversell, mutate func()) error {
	for range 5 {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(no), no); err != nil {
			return err
		}
		mutate()
		err := c.Update(ctx, no)
		if err == nil || !strings.Contains(err.Error(), "the object has been modified") {
			return err
		}
	}
	return fmt.Errorf("update %s: conflicts", no.Name)
}
