package scale

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hookwright/hookwright/test/cluster"
)

// TestScale is the 50-node fleet of `make test`: facts only, no timings.
// HOOKWRIGHT_SCALE=full runs the measurement instead (measure_test.go).
func TestScale(t *testing.T) {
	if os.Getenv("HOOKWRIGHT_SCALE") == "full" {
		measureFull(t)
		return
	}
	const n = 50
	// A short --max-heartbeat-age, so the test sees a due heartbeat go
	// through without waiting the 5 min default.
	const maxAge = 20 * time.Second
	ctx := cluster.TestContext(t, 4*time.Minute)
	certDir, svc := setup(t, ctx)
	srv := startServer(t, ctx, "hold", certDir, "--max-heartbeat-age="+maxAge.String())
	if err := env.RouteService(svc, srv.addr); err != nil {
		t.Fatal(err)
	}
	// 1. Every node is amplified by its kubelet's first report (a plain
	// node's next one comes only after the report period).
	no := createNodeOversell(t, ctx, "small", "2")
	waitServed(t, ctx, 1, srv)
	api0, err := readAPI(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hb := startFleet(t, ctx, "small", n)
	waitFleetCPU(t, ctx, "small", n, "7600m", time.Minute)

	// 2. A restatement (raw allocatable, new heartbeat times) is held:
	// the kubelet's PATCH succeeds and etcd stores nothing, so the node
	// keeps its resourceVersion. The first restatement after amplification
	// is written once (the kubelet's managedFields entry takes over
	// allocatable cpu), and a beat may fall due in between (its stored
	// heartbeat reached maxAge) and write for real; so try again.
	held := func(node string) {
		t.Helper()
		waitFor(t, ctx, time.Minute, "a forced kubelet restatement of "+node+" leaves its resourceVersion", func(ctx context.Context) (bool, error) {
			before, err := getNode(ctx, node)
			if err != nil {
				return false, err
			}
			if err := hb.Beat(ctx, node); err != nil {
				return false, err
			}
			after, err := getNode(ctx, node)
			if err != nil {
				return false, err
			}
			if q := after.Status.Allocatable.Cpu(); q.Cmp(resource.MustParse("7600m")) != 0 {
				return false, cluster.Permanent(fmt.Errorf("held node %s publishes cpu %s, want 7600m", node, q))
			}
			return after.ResourceVersion == before.ResourceVersion, nil
		})
	}
	node := "small-0000"
	held(node)

	// 3. A changed status goes through: the kubelet's raw cpu changes.
	before, err := getNode(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	changed := nodeAllocatable.DeepCopy()
	changed[corev1.ResourceCPU] = resource.MustParse("3")
	if err := hb.SetAllocatable(node, changed); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, 30*time.Second, node+" publishes its new raw cpu × 2", func(ctx context.Context) (bool, error) {
		if err := hb.Beat(ctx, node); err != nil {
			return false, err
		}
		after, err := getNode(ctx, node)
		if err != nil {
			return false, err
		}
		return after.ResourceVersion != before.ResourceVersion && after.Status.Allocatable.Cpu().Cmp(resource.MustParse("6")) == 0, nil
	})
	if err := hb.SetAllocatable(node, nodeAllocatable); err != nil {
		t.Fatal(err)
	}

	// 4. Heartbeats still go through once the stored one is maxAge old:
	// on a node whose restatements are held, the stored heartbeat still
	// advances.
	other := "small-0001"
	held(other)
	first, err := getNode(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	hb0 := readyHeartbeat(first)
	waitFor(t, ctx, maxAge+time.Minute, other+"'s stored heartbeat advances", func(ctx context.Context) (bool, error) {
		n, err := getNode(ctx, other)
		if err != nil {
			return false, err
		}
		return readyHeartbeat(n).After(hb0), nil
	})

	// 5. A ratio change reaches every node with its next report.
	setRatio(t, ctx, no, "3")
	waitFleetCPU(t, ctx, "small", n, "11400m", time.Minute)

	api1, err := readAPI(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := srv.read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sc.held == 0 {
		t.Fatalf("server counted no held review (%v reviews)", sc.reviews)
	}
	d := api1.minus(api0)
	if d.statusPatches == 0 || d.nodeWrites == 0 || d.leaseUpdates == 0 {
		t.Fatalf("no writes counted: %+v", d)
	}
	if d.nodeWrites >= d.statusPatches {
		t.Errorf("etcd node writes %v not below status patches %v: holding saved nothing", d.nodeWrites, d.statusPatches)
	}
	for _, name := range hb.Nodes() {
		if _, errs, last := hb.Stats(name); errs > 0 {
			t.Errorf("node %s: %d failed beats, last: %v", name, errs, last)
		}
	}
	t.Logf("%d nodes: %v status PATCHes, %v etcd node writes, %v held reviews, %v lease PUTs", n, d.statusPatches, d.nodeWrites, sc.held, d.leaseUpdates)
}
