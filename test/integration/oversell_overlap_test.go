package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// overlapLabel marks this test's nodes; the shared oversell webhook
// (startOversell) excludes them, so only the overlapping NodeOversells'
// own webhooks see their writes.
const overlapLabel = "oversell-it-overlap"

// TestOversellOverlappingNodeOversells is issue 11 through the real API
// server: three NodeOversells select the same nodes, each with its own
// `hookwright oversell --node-oversell=<name>` server and the webhook
// configuration the operator builds for it (desired.BuildNodeOversell:
// objectSelector = nodeSelector), called in series in name order. Kubelet
// heartbeats (system:node:<name>, allocatable 3800m/7Gi below capacity
// 4/8Gi) and another user's writes must each end at raw × the winner's
// ratio with the raw recorded exactly, through 2 and 3 overlapping CRs,
// priority and ratio changes and deletions; a node no CR selects is never
// called and never changed.
func TestOversellOverlappingNodeOversells(t *testing.T) {
	ctx := cluster.TestContext(t, 6*time.Minute)
	startOversell(t)
	sel := map[string]string{overlapLabel: "pool"}
	capacity := corev1.ResourceList{corev1.ResourceCPU: mustQ("4"), corev1.ResourceMemory: mustQ("8Gi"), corev1.ResourcePods: mustQ("110")}
	real := corev1.ResourceList{corev1.ResourceCPU: mustQ("3800m"), corev1.ResourceMemory: mustQ("7Gi"), corev1.ResourcePods: mustQ("110")}
	nodes := []string{"ovl-1", "ovl-2"}
	hb, err := env.NewHeartbeater(ctx,
		cluster.KubeletNode{Name: "ovl-1", Labels: sel, Capacity: capacity, Allocatable: real},
		cluster.KubeletNode{Name: "ovl-2", Labels: sel, Capacity: capacity, Allocatable: real},
		cluster.KubeletNode{Name: "ovl-plain", Labels: map[string]string{overlapLabel: "other"}, Capacity: capacity, Allocatable: real},
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, n := range []string{"ovl-1", "ovl-2", "ovl-plain"} {
			_ = env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
		}
	})
	hb.Period = time.Hour // beats are sent by hand
	if err := hb.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer hb.Stop()
	ops, err := kubernetes.NewForConfig(env.Impersonate("ops-bot", "system:masters"))
	if err != nil {
		t.Fatal(err)
	}

	names := []string{"ovl-a", "ovl-b", "ovl-c"}
	servers := map[string]*webhookServer{}
	for _, n := range names {
		svc := "oversell-" + n
		servers[n] = startWebhookServer(t, false, "oversell", oversellNS, svc, "--node-oversell="+n)
	}
	live := map[string]bool{}

	// create makes a NodeOversell and, as the operator does, its webhook
	// configuration, pointed at the test's server for it.
	create := func(name, cpu, mem string, prio int32) {
		no := &v1alpha1.NodeOversell{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.NodeOversellSpec{
				NodeSelector: &metav1.LabelSelector{MatchLabels: sel},
				Ratios:       v1alpha1.OversellRatios{CPU: v1alpha1.Ratio(cpu), Memory: v1alpha1.Ratio(mem)},
				Priority:     prio,
			},
		}
		if err := env.Client.Create(ctx, no); err != nil {
			t.Fatal(err)
		}
		built := desired.BuildNodeOversell(no, desired.Settings{Namespace: oversellNS}).Webhook
		built.Webhooks[0].ClientConfig.CABundle = servers[name].ca.CertPEM
		mwc := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: built.Name}, Webhooks: built.Webhooks}
		mwc.Webhooks[0].ClientConfig.Service.Name = "oversell-" + name
		if err := env.Client.Create(ctx, mwc); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = env.Client.Delete(context.Background(), mwc)
			_ = env.Client.Delete(context.Background(), &v1alpha1.NodeOversell{ObjectMeta: metav1.ObjectMeta{Name: name}})
		})
		live[name] = true
	}
	// remove deletes a NodeOversell's webhook configuration, then the CR
	// (the operator's order, restoreNodes).
	remove := func(name string) {
		mwc := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: desired.OversellKind.BaseName(name)}}
		if err := env.Client.Delete(ctx, mwc); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Delete(ctx, &v1alpha1.NodeOversell{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
			t.Fatal(err)
		}
		delete(live, name)
	}
	edit := func(name string, f func(*v1alpha1.NodeOversell)) {
		no := &v1alpha1.NodeOversell{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, no); err != nil {
			t.Fatal(err)
		}
		f(no)
		if err := env.Client.Update(ctx, no); err != nil {
			t.Fatal(err)
		}
	}
	// converge waits until every server serves every live CR at its
	// generation and no deleted one.
	converge := func() {
		for _, s := range servers {
			for _, n := range names {
				waitServed(t, ctx, s, n, !live[n])
			}
		}
	}
	// state checks a node: a recorded raw is exactly the kubelet's (else
	// fatal: compounded), and the published value is want.
	state := func(step, node, cpu, mem string) error {
		t.Helper()
		n := getNode(t, ctx, node)
		if v, ok := n.Annotations[v1alpha1.OversellRawAllocatableKey]; ok {
			var raw map[string]string
			if err := json.Unmarshal([]byte(v), &raw); err != nil {
				t.Fatalf("%s: node %s raw-allocatable %q: %v", step, node, v, err)
			}
			rawCPU, rawMem := mustQ(raw["cpu"]), mustQ(raw["memory"])
			if rawCPU.Cmp(mustQ("3800m")) != 0 || rawMem.Cmp(mustQ("7Gi")) != 0 {
				t.Fatalf("%s: node %s raw-allocatable %v, want cpu 3800m memory 7Gi (compounded); annotations %v", step, node, raw, n.Annotations)
			}
		}
		return checkAlloc(n, cpu, mem, capacity)
	}
	check := func(step, node, cpu, mem string) {
		t.Helper()
		if err := state(step, node, cpu, mem); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	condPatch := func(i int) []byte {
		return fmt.Appendf(nil, `{"status":{"conditions":[{"type":"OpsCheck","status":"True","reason":"R%d","lastHeartbeatTime":%q}]}}`,
			i, time.Now().UTC().Format(time.RFC3339))
	}
	// phase sends kubelet heartbeats and other users' writes once the
	// servers have converged; every single write must end at want.
	writes := 0
	phase := func(what, cpu, mem string) {
		t.Helper()
		converge()
		// The API server's webhook configuration cache also follows a
		// watch: heartbeats until the new winner's webhook is called.
		for _, node := range nodes {
			beatUntil(t, ctx, hb, node, what, func(*corev1.Node) error { return state(what, node, cpu, mem) })
		}
		start := time.Now()
		for i := 0; i < 8; i++ {
			for _, node := range nodes {
				step := fmt.Sprintf("%s, write %d", what, i)
				switch i % 4 {
				case 0, 1: // kubelet heartbeats
					if err := hb.Beat(ctx, node); err != nil {
						t.Fatalf("%s: heartbeat: %v", step, err)
					}
				case 2: // another user, conditions only
					if _, err := ops.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, condPatch(writes), metav1.PatchOptions{}, "status"); err != nil {
						t.Fatal(err)
					}
				case 3: // another user writes an allocatable
					p := fmt.Appendf(nil, `{"status":{"allocatable":{"cpu":"%dm","memory":"%dMi"}}}`, 1000+writes, 2048+writes)
					if _, err := ops.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, p, metav1.PatchOptions{}, "status"); err != nil {
						t.Fatal(err)
					}
				}
				writes++
				check(step, node, cpu, mem)
			}
			if err := hb.Beat(ctx, "ovl-plain"); err != nil {
				t.Fatal(err)
			}
			if n := getNode(t, ctx, "ovl-plain"); checkAlloc(n, "3800m", "7Gi", capacity) != nil || n.Annotations[v1alpha1.OversellAppliedByKey] != "" {
				t.Fatalf("%s: unselected node changed: allocatable %v annotations %v", what, n.Status.Allocatable, n.Annotations)
			}
		}
		t.Logf("%s: 16 writes at cpu %s memory %s in %s", what, cpu, mem, time.Since(start).Round(time.Millisecond))
	}

	// Issue 11's reproduction: cpu 2 priority 0 and cpu 1.5 priority 10.
	create("ovl-a", "2", "1.5", 0)
	create("ovl-b", "1.5", "1.25", 10)
	phase("2 CRs, ovl-b wins (last in the chain)", "5700m", "8960Mi")
	create("ovl-c", "3", "2", 5)
	phase("3 CRs, ovl-b wins (middle)", "5700m", "8960Mi")
	edit("ovl-b", func(no *v1alpha1.NodeOversell) { no.Spec.Priority = 0 })
	phase("ovl-b priority 0, ovl-c wins (last)", "11400m", "14Gi")
	edit("ovl-a", func(no *v1alpha1.NodeOversell) { no.Spec.Priority = 20 })
	phase("ovl-a priority 20, ovl-a wins (first)", "7600m", "10752Mi")
	remove("ovl-a")
	phase("ovl-a deleted, ovl-c wins", "11400m", "14Gi")
	remove("ovl-c")
	phase("ovl-c deleted, ovl-b wins alone", "5700m", "8960Mi")
	edit("ovl-b", func(no *v1alpha1.NodeOversell) { no.Spec.Ratios.CPU = "2.5" })
	phase("ovl-b cpu ratio 2.5", "9500m", "8960Mi")
	remove("ovl-b")
	converge()
	// No webhook is called any more; the kubelet's own report publishes the
	// real value (the operator removes the bookkeeping: test/operator).
	for _, node := range nodes {
		if err := hb.Beat(ctx, node); err != nil {
			t.Fatal(err)
		}
		if err := checkAlloc(getNode(t, ctx, node), "3800m", "7Gi", capacity); err != nil {
			t.Fatalf("after the last NodeOversell was deleted: %v", err)
		}
	}
}
