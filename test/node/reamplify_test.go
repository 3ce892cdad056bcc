package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/controllers"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/oversellnodes"
	"github.com/hookwright/hookwright/test/cluster"
)

// The oversell server stops (its one replica scaled to 0 while the CR is
// paused, so the operator does not put it back) under failurePolicy
// Ignore: the real kubelet's next status patch, every status period while its
// allocatable differs from the Node's, is stored raw, and the node stays
// Ready. The kubelet would then write again only after
// nodeStatusReportFrequency (5 min) ± 50 % (pkg/kubelet/kubelet_node_status.go,
// tryUpdateNodeStatus): once the CR is unpaused, the operator brings the
// server back and, as soon as its Service has a ready endpoint, touches
// the node, which the webhook amplifies again (Event NodesReamplified).
func TestOversellReamplifiesWhenTheServerReturns(t *testing.T) {
	ctx := cluster.TestContext(t, 15*time.Minute)
	startOperator(t)
	pushOperatorImage(ctx, t)
	no := realNodeOversell("reamp", 1)
	if err := env.Client.Create(ctx, no); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteAndWait(t, no) })
	waitAvailable(ctx, t, desired.OversellKind, no.Name, 1)
	raw := allocatableRawWhenAmplified(ctx, t)

	// Stop the server.
	setPaused(ctx, t, no.Name, true)
	waitCondition(ctx, t, no, func() []metav1.Condition { return no.Status.Conditions }, v1alpha1.ConditionReady,
		func(c *metav1.Condition) bool { return c.Reason == controllers.ReasonPaused }, time.Minute)
	dep := &appsv1.Deployment{}
	key := client.ObjectKey{Namespace: operatorNS, Name: desired.OversellKind.BaseName(no.Name)}
	if err := env.Client.Get(ctx, key, dep); err != nil {
		t.Fatal(err)
	}
	scale := client.MergeFrom(dep.DeepCopy())
	dep.Spec.Replicas = new(int32)
	if err := env.Client.Patch(ctx, dep, scale); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	if err := cluster.WaitFor(ctx, 2*time.Minute, "allocatable raw with the server stopped", func(ctx context.Context) (bool, error) {
		ready, err := env.NodeReady(ctx, nodeName)
		if err != nil || !ready {
			return false, cluster.Permanent(fmt.Errorf("node not Ready with the server stopped (%v)", err))
		}
		return allocatableCPU(ctx, t) == raw, nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("figure: oversell server stopped -> the kubelet's raw allocatable stored in %s", time.Since(down).Round(100*time.Millisecond))

	// The server returns: the operator repairs replicas 0 -> 1. The Event
	// below is judged against an instant taken before the unpause, which
	// no scheduling delay of this goroutine can place after the Event.
	asked := time.Now()
	setPaused(ctx, t, no.Name, false)
	unpaused := time.Now()
	var readyAt time.Time
	if err := cluster.WaitFor(ctx, 4*time.Minute, "node amplified again", func(ctx context.Context) (bool, error) {
		if readyAt.IsZero() {
			if n, err := readyEndpoints(ctx, operatorNS, key.Name); err == nil && n > 0 {
				readyAt = time.Now()
			}
		}
		return allocatableCPU(ctx, t) == 2*raw, nil
	}); err != nil {
		t.Fatal(err)
	}
	amplified := time.Now()
	if readyAt.IsZero() {
		readyAt = amplified
	}
	t.Logf("figure: re-amplification: CR unpaused -> server endpoint ready %s -> node amplified %s (the kubelet alone: its next report, 2.5-7.5 min after its raw patch)",
		readyAt.Sub(unpaused).Round(100*time.Millisecond), amplified.Sub(readyAt).Round(100*time.Millisecond))

	// It was the operator's touch, not a kubelet report. The Event is
	// written by the recorder's broadcaster, a moment after the touch.
	err := cluster.WaitFor(ctx, 2*time.Minute, "a "+oversellnodes.EventNodesReamplified+" Event for NodeOversell "+no.Name, func(ctx context.Context) (bool, error) {
		var evs eventsv1.EventList
		if err := env.Client.List(ctx, &evs, client.InNamespace(corev1.NamespaceDefault)); err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Reason == oversellnodes.EventNodesReamplified && e.Regarding.Name == no.Name && e.EventTime.After(asked) {
				t.Logf("event %s: %s", e.Reason, e.Note)
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Error(err)
	}
}

// setPaused sets or removes the pause-reconcile annotation of a NodeOversell.
func setPaused(ctx context.Context, t *testing.T, name string, paused bool) {
	t.Helper()
	v := `null`
	if paused {
		v = `"true"`
	}
	patch := []byte(`{"metadata":{"annotations":{"` + controllers.PauseReconcileAnnotation + `":` + v + `}}}`)
	no := realNodeOversell(name, 1)
	if err := env.Client.Patch(ctx, no, client.RawPatch("application/merge-patch+json", patch)); err != nil {
		t.Fatal(err)
	}
}
