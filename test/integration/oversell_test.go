package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/test/cluster"
	"github.com/hookwright/hookwright/webhooks/oversell"
)

const oversellNS = "hookwright-oversell"

// oversellSrv is shared by the oversell tests and stopped by TestMain.
var (
	oversellMu  sync.Mutex
	oversellSrv *webhookServer
)

// startOversell runs `hookwright oversell` behind Service
// hookwright-oversell/oversell with a MutatingWebhookConfiguration on
// nodes/status UPDATE (failurePolicy Ignore, timeout 2 s), once per binary.
func startOversell(t *testing.T) *webhookServer {
	t.Helper()
	oversellMu.Lock()
	defer oversellMu.Unlock()
	if oversellSrv != nil {
		return oversellSrv
	}
	ctx := cluster.TestContext(t, time.Minute)
	if _, err := env.CreateNamespace(ctx, oversellNS, nil); err != nil {
		t.Fatal(err)
	}
	s := startWebhookServer(t, true, "oversell", oversellNS, "oversell")
	mwc := cluster.OversellWebhook("hookwright-oversell-it", "oversell.hookwright.io", oversellNS, "oversell", s.ca.CertPEM, 2)
	// TestOversellOverlappingNodeOversells' nodes have their own webhooks.
	mwc.Webhooks[0].ObjectSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: overlapLabel, Operator: metav1.LabelSelectorOpDoesNotExist}}}
	if err := env.Client.Create(ctx, mwc); err != nil {
		t.Fatal(err)
	}
	oversellSrv = s
	return s
}

// handBeats plays node's kubelet with beats the test sends by hand (Beat;
// the period is an hour); the kubelet's node informer keeps running. The
// caller stops it.
func handBeats(t *testing.T, ctx context.Context, node cluster.KubeletNode) *cluster.Heartbeater {
	t.Helper()
	hb, err := env.NewHeartbeater(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	hb.Period = time.Hour
	if err := hb.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return hb
}

func createNodeOversell(t *testing.T, ctx context.Context, name string, sel map[string]string, cpu, mem string) *v1alpha1.NodeOversell {
	t.Helper()
	no := &v1alpha1.NodeOversell{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.NodeOversellSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: sel},
			Ratios:       v1alpha1.OversellRatios{CPU: v1alpha1.Ratio(cpu), Memory: v1alpha1.Ratio(mem)},
		},
	}
	if err := env.Client.Create(ctx, no); err != nil {
		t.Fatal(err)
	}
	return no
}

// waitServed waits until the server serves NodeOversell name at its current
// generation (or, with gone, no longer serves it).
func waitServed(t *testing.T, ctx context.Context, s *webhookServer, name string, gone bool) {
	t.Helper()
	no := &v1alpha1.NodeOversell{}
	var gen int64
	if !gone {
		if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, no); err != nil {
			t.Fatal(err)
		}
		gen = no.Generation
	}
	err := cluster.WaitFor(ctx, 60*time.Second, fmt.Sprintf("oversell server serving %s (gone=%v)", name, gone), func(context.Context) (bool, error) {
		var cz oversell.Configz
		if err := s.configz(&cz); err != nil {
			return false, err
		}
		for _, p := range cz.NodeOversells {
			if p.Name == name {
				return !gone && p.Generation == gen, nil
			}
		}
		return gone, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func getNode(t *testing.T, ctx context.Context, name string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
		t.Fatal(err)
	}
	return n
}

func mustQ(s string) resource.Quantity { return resource.MustParse(s) }

// checkAlloc compares stored allocatable cpu/memory and capacity with want.
func checkAlloc(n *corev1.Node, cpu, mem string, capacity corev1.ResourceList) error {
	a := n.Status.Allocatable
	if a.Cpu().Cmp(mustQ(cpu)) != 0 || a.Memory().Cmp(mustQ(mem)) != 0 {
		return fmt.Errorf("node %s allocatable cpu=%s memory=%s, want cpu=%s memory=%s (annotations %v)",
			n.Name, a.Cpu(), a.Memory(), cpu, mem, n.Annotations)
	}
	for r, q := range capacity {
		got := n.Status.Capacity[r]
		if got.Cmp(q) != 0 {
			return fmt.Errorf("node %s capacity %s = %s, want %s (capacity must never change)", n.Name, r, got.String(), q.String())
		}
	}
	return nil
}

// beatUntil sends kubelet heartbeats until the stored node satisfies check.
func beatUntil(t *testing.T, ctx context.Context, hb *cluster.Heartbeater, node string, what string, check func(*corev1.Node) error) {
	t.Helper()
	var last error
	err := cluster.WaitFor(ctx, 60*time.Second, what, func(ctx context.Context) (bool, error) {
		if err := hb.Beat(ctx, node); err != nil {
			return false, err
		}
		last = check(getNode(t, ctx, node))
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("%v: %v", err, last)
	}
}

func TestOversellWritersOutageRatioAndDeletion(t *testing.T) {
	ctx := cluster.TestContext(t, 4*time.Minute)
	srv := startOversell(t)
	sel := map[string]string{"oversell-it": "writers"}
	capacity := corev1.ResourceList{corev1.ResourceCPU: mustQ("4"), corev1.ResourceMemory: mustQ("8Gi"), corev1.ResourcePods: mustQ("110")}
	real := corev1.ResourceList{corev1.ResourceCPU: mustQ("3800m"), corev1.ResourceMemory: mustQ("7Gi"), corev1.ResourcePods: mustQ("110")}
	hb := handBeats(t, ctx, cluster.KubeletNode{Name: "n1", Labels: sel, Capacity: capacity, Allocatable: real})
	defer hb.Stop()

	createNodeOversell(t, ctx, "writers", sel, "2", "1.5")
	waitServed(t, ctx, srv, "writers", false)

	// 1. The node's own kubelet reports real values: stored = raw × ratio.
	start := time.Now()
	beatUntil(t, ctx, hb, "n1", "kubelet heartbeat amplified", func(n *corev1.Node) error {
		return checkAlloc(n, "7600m", "10752Mi", capacity)
	})
	t.Logf("first amplification after %s", time.Since(start).Round(time.Millisecond))
	n := getNode(t, ctx, "n1")
	var raw map[string]string
	if err := json.Unmarshal([]byte(n.Annotations[v1alpha1.OversellRawAllocatableKey]), &raw); err != nil {
		t.Fatalf("raw-allocatable annotation: %v (%q)", err, n.Annotations[v1alpha1.OversellRawAllocatableKey])
	}
	rawCPU, rawMem := mustQ(raw["cpu"]), mustQ(raw["memory"])
	if rawCPU.Cmp(mustQ("3800m")) != 0 || rawMem.Cmp(mustQ("7Gi")) != 0 {
		t.Fatalf("raw-allocatable = %v, want cpu 3800m memory 7Gi", raw)
	}

	// 2. Another writer changes only a condition: no compounding.
	ops, err := kubernetes.NewForConfig(env.Impersonate("ops-bot", "system:masters"))
	if err != nil {
		t.Fatal(err)
	}
	condPatch := func(i int) []byte {
		return []byte(fmt.Sprintf(`{"status":{"conditions":[{"type":"OpsCheck","status":"True","reason":"R%d","lastHeartbeatTime":%q}]}}`,
			i, time.Now().UTC().Format(time.RFC3339)))
	}
	if _, err := ops.CoreV1().Nodes().Patch(ctx, "n1", types.StrategicMergePatchType, condPatch(0), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	if err := checkAlloc(getNode(t, ctx, "n1"), "7600m", "10752Mi", capacity); err != nil {
		t.Fatalf("after a conditions-only write by another user: %v", err)
	}
	// ... or writes the amplified value back, or any other allocatable.
	allocPatch := func(cpu, mem string) []byte {
		return []byte(fmt.Sprintf(`{"status":{"allocatable":{"cpu":%q,"memory":%q}}}`, cpu, mem))
	}
	for _, p := range [][2]string{{"7600m", "10752Mi"}, {"64", "1Ti"}, {"1", "1Gi"}} {
		if _, err := ops.CoreV1().Nodes().Patch(ctx, "n1", types.StrategicMergePatchType, allocPatch(p[0], p[1]), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatal(err)
		}
		if err := checkAlloc(getNode(t, ctx, "n1"), "7600m", "10752Mi", capacity); err != nil {
			t.Fatalf("after another user wrote allocatable %v: %v", p, err)
		}
	}

	// 3. 1,000 mixed writes in random order end exactly at raw × ratio.
	rng := rand.New(rand.NewSource(1))
	start = time.Now()
	kubelet, other := 0, 0
	for i := 0; i < 1000; i++ {
		switch rng.Intn(3) {
		case 0:
			kubelet++
			if err := hb.Beat(ctx, "n1"); err != nil {
				t.Fatalf("write %d (kubelet): %v", i, err)
			}
		case 1:
			other++
			if _, err := ops.CoreV1().Nodes().Patch(ctx, "n1", types.StrategicMergePatchType, condPatch(i), metav1.PatchOptions{}, "status"); err != nil {
				t.Fatalf("write %d (conditions): %v", i, err)
			}
		default:
			other++
			cpu := fmt.Sprintf("%dm", 1000+rng.Intn(20000))
			mem := fmt.Sprintf("%dMi", 512+rng.Intn(20000))
			if _, err := ops.CoreV1().Nodes().Patch(ctx, "n1", types.StrategicMergePatchType, allocPatch(cpu, mem), metav1.PatchOptions{}, "status"); err != nil {
				t.Fatalf("write %d (allocatable): %v", i, err)
			}
		}
	}
	elapsed := time.Since(start)
	if err := checkAlloc(getNode(t, ctx, "n1"), "7600m", "10752Mi", capacity); err != nil {
		t.Fatalf("after 1,000 mixed writes (%d kubelet, %d other): %v", kubelet, other, err)
	}
	t.Logf("1,000 mixed writes (%d kubelet, %d other) in %s (%.0f writes/s)", kubelet, other, elapsed.Round(time.Millisecond), 1000/elapsed.Seconds())

	// 4. Lowering the ratio converges on the next kubelet heartbeat.
	no := &v1alpha1.NodeOversell{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "writers"}, no); err != nil {
		t.Fatal(err)
	}
	no.Spec.Ratios.CPU = "1.5"
	if err := env.Client.Update(ctx, no); err != nil {
		t.Fatal(err)
	}
	waitServed(t, ctx, srv, "writers", false)
	beatUntil(t, ctx, hb, "n1", "lowered ratio applied", func(n *corev1.Node) error {
		return checkAlloc(n, "5700m", "10752Mi", capacity)
	})

	// 5. Webhook down under failurePolicy Ignore: the heartbeat goes through
	// with the kubelet's real values; the next one after restart re-amplifies.
	srv.stop()
	if err := hb.Beat(ctx, "n1"); err != nil {
		t.Fatalf("heartbeat with the webhook down must not fail (Ignore): %v", err)
	}
	if err := checkAlloc(getNode(t, ctx, "n1"), "3800m", "7Gi", capacity); err != nil {
		t.Fatalf("with the webhook down the kubelet's real values are stored: %v", err)
	}
	srv.start(t)
	beatUntil(t, ctx, hb, "n1", "re-amplified after restart", func(n *corev1.Node) error {
		return checkAlloc(n, "5700m", "10752Mi", capacity)
	})

	// 6. Deleting the NodeOversell: the next status write restores raw values
	// and removes every oversell annotation.
	if err := env.Client.Delete(ctx, no); err != nil {
		t.Fatal(err)
	}
	waitServed(t, ctx, srv, "writers", true)
	beatUntil(t, ctx, hb, "n1", "raw restored after deletion", func(n *corev1.Node) error {
		if err := checkAlloc(n, "3800m", "7Gi", capacity); err != nil {
			return err
		}
		for k := range n.Annotations {
			if len(k) > len("oversell.hookwright.io/") && k[:len("oversell.hookwright.io/")] == "oversell.hookwright.io/" {
				return fmt.Errorf("annotation %s still present", k)
			}
		}
		return nil
	})
}

// TestOversellHeartbeatsNoDrift runs kubelet-faithful heartbeaters and kwok
// nodes under a NodeOversell until each inflated node was patched 5 times
// and kwok heartbeated once (about 10 s) and samples the stored
// allocatable every second: it must stay exactly raw × ratio. It also
// measures the cost the design doc warns about: an inflated node is
// patched every nodeStatusUpdateFrequency, a plain one only every report
// period.
func TestOversellHeartbeatsNoDrift(t *testing.T) {
	t.Parallel()
	ctx := cluster.TestContext(t, 5*time.Minute)
	srv := startOversell(t)
	capacity := corev1.ResourceList{corev1.ResourceCPU: mustQ("4"), corev1.ResourceMemory: mustQ("8Gi"), corev1.ResourcePods: mustQ("110")}
	sel := map[string]string{"oversell-it": "drift"}
	hb, err := env.NewHeartbeater(ctx,
		cluster.KubeletNode{Name: "hb-1", Labels: sel, Capacity: capacity, Allocatable: capacity},
		cluster.KubeletNode{Name: "hb-2", Labels: sel, Capacity: capacity, Allocatable: capacity},
		cluster.KubeletNode{Name: "hb-plain", Capacity: capacity, Allocatable: capacity},
	)
	if err != nil {
		t.Fatal(err)
	}
	// A 2 s nodeStatusUpdateFrequency: 5 patches take 10 s, not 50 s, and
	// are still far from the plain node's 5 min report period.
	hb.Period = 2 * time.Second
	createNodeOversell(t, ctx, "drift", sel, "2", "1.5")
	// kwok nodes (pool=test) are written by kwok's own user, not a kubelet:
	// the webhook adopts their first allocatable as raw.
	createNodeOversell(t, ctx, "drift-kwok", map[string]string{"pool": "test"}, "2", "1.5")
	waitServed(t, ctx, srv, "drift", false)
	waitServed(t, ctx, srv, "drift-kwok", false)
	t.Cleanup(func() {
		for _, n := range []string{"drift", "drift-kwok"} {
			_ = env.Client.Delete(context.Background(), &v1alpha1.NodeOversell{ObjectMeta: metav1.ObjectMeta{Name: n}})
		}
	})

	if err := hb.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer hb.Stop()
	amplified := func(n *corev1.Node) error { return checkAlloc(n, "8", "12Gi", capacity) }
	// Settle: the first heartbeat of each node (kwok's come every ~10 s).
	// Every heartbeater node reports at its first beat (a kubelet's first
	// report), each at its own offset within the period: the plain node's
	// must be before the measured window too.
	err = cluster.WaitFor(ctx, 30*time.Second, "all selected nodes amplified and the plain node's first report", func(ctx context.Context) (bool, error) {
		if p, _, _ := hb.Stats("hb-plain"); p == 0 {
			return false, nil
		}
		for _, name := range []string{"hb-1", "hb-2", "kwok-node-0", "kwok-node-1"} {
			if err := amplified(getNode(t, ctx, name)); err != nil {
				return false, err
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	p0 := map[string]int{}
	for _, n := range []string{"hb-1", "hb-2", "hb-plain"} {
		p0[n], _, _ = hb.Stats(n)
	}
	kwokBefore := heartbeatOf(getNode(t, ctx, "kwok-node-0"))
	start := time.Now()
	samples := 0
	// The window is counted in reports, not slept: it ends once each
	// inflated node was patched 5 times (every 2 s, so about 10 s on an
	// idle machine) and kwok heartbeated at least once. The limit,
	// 150 s, is well under the plain node's 5 min report period, so a node
	// patched only then could not reach 5 patches in it.
	const inflatedPatches = 5
	var missing string
	_, err = cluster.Poll(ctx, time.Second, 150*time.Second, fmt.Sprintf("%d patches of each inflated node and a kwok heartbeat", inflatedPatches), func(ctx context.Context) (bool, error) {
		for _, name := range []string{"hb-1", "hb-2", "kwok-node-0", "kwok-node-1"} {
			if err := amplified(getNode(t, ctx, name)); err != nil {
				t.Fatalf("drift after %s: %v", time.Since(start).Round(time.Second), err)
			}
		}
		if err := checkAlloc(getNode(t, ctx, "hb-plain"), "4", "8Gi", capacity); err != nil {
			t.Fatalf("unselected node changed: %v", err)
		}
		samples++
		missing = ""
		for _, n := range []string{"hb-1", "hb-2"} {
			if p, _, _ := hb.Stats(n); p-p0[n] < inflatedPatches {
				missing += fmt.Sprintf("; %s patched %d times", n, p-p0[n])
			}
		}
		if !heartbeatOf(getNode(t, ctx, "kwok-node-0")).After(kwokBefore) {
			missing += "; kwok heartbeats stopped during the run"
		}
		return missing == "", nil
	})
	window := time.Since(start)
	if err != nil {
		t.Errorf("an inflated node should be patched about every 2 s, and kwok keep heartbeating: %v%s", err, missing)
	}
	for _, n := range []string{"hb-1", "hb-2", "hb-plain"} {
		p, e, last := hb.Stats(n)
		if e > 0 {
			t.Errorf("node %s: %d failed heartbeats, last: %v", n, e, last)
		}
		t.Logf("figure: node %s: %d status patches in %s", n, p-p0[n], window.Round(time.Second))
	}
	if p, _, _ := hb.Stats("hb-plain"); p-p0["hb-plain"] != 0 {
		t.Errorf("a plain node should not be patched within the 5 min report period; got %d", p-p0["hb-plain"])
	}
	t.Logf("%d samples over %s, no drift", samples, window.Round(time.Second))
}

// TestOversellHotReloadLatency measures how long a ratio change takes to
// reach the next status write (goal: p99 ≤ 1 s, recorded, not asserted
// tightly: timing goals are figures, not pass/fail conditions here).
func TestOversellHotReloadLatency(t *testing.T) {
	t.Parallel()
	ctx := cluster.TestContext(t, 2*time.Minute)
	startOversell(t)
	sel := map[string]string{"oversell-it": "reload"}
	capacity := corev1.ResourceList{corev1.ResourceCPU: mustQ("4"), corev1.ResourceMemory: mustQ("8Gi"), corev1.ResourcePods: mustQ("110")}
	hb := handBeats(t, ctx, cluster.KubeletNode{Name: "reload-1", Labels: sel, Capacity: capacity, Allocatable: capacity})
	defer hb.Stop()
	no := createNodeOversell(t, ctx, "reload", sel, "2", "1")
	defer func() { _ = env.Client.Delete(context.Background(), no) }()

	var lat []time.Duration
	for i := 0; i < 20; i++ {
		ratio := []string{"3", "2"}[i%2]
		want := map[string]string{"3": "12", "2": "8"}[ratio]
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(no), no); err != nil {
			t.Fatal(err)
		}
		no.Spec.Ratios.CPU = v1alpha1.Ratio(ratio)
		if err := env.Client.Update(ctx, no); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := cluster.Poll(ctx, 5*time.Millisecond, 10*time.Second, "ratio "+ratio+" applied", func(ctx context.Context) (bool, error) {
			if err := hb.Beat(ctx, "reload-1"); err != nil {
				t.Fatal(err)
			}
			return checkAlloc(getNode(t, ctx, "reload-1"), want, "8Gi", capacity) == nil, nil
		}); err != nil {
			t.Fatalf("ratio %s not applied within 10 s", ratio)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	// The goal is 1 s; each step's poll fails past 10 s (ten times it), so
	// on a loaded machine the times are figures, not a bound.
	t.Logf("figure: CR update -> first status write using it: p50 %s, p99(max of %d) %s (goal 1 s, limit 10 s)",
		lat[len(lat)/2].Round(time.Millisecond), len(lat), lat[len(lat)-1].Round(time.Millisecond))
}
