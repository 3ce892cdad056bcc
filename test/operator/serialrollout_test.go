package operator

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// serverRolloutRecheckForTest is the operator's recheck of a held server
// Deployment (controllers.serverRolloutRecheck).
const serverRolloutRecheckForTest = 3 * time.Second

// deploymentRolling is this test's own reading of a rollout in progress,
// from the status the Deployment controller writes: a generation not yet
// observed, replicas of the old template left, or updated replicas not
// all available.
func deploymentRolling(d *appsv1.Deployment) bool {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	st := d.Status
	return st.ObservedGeneration < d.Generation || st.UpdatedReplicas < want || st.Replicas > st.UpdatedReplicas || st.AvailableReplicas < want
}

// An operator upgrade changes the server image of every CR at once (the
// server image follows the operator's). The server Deployments of two
// SidecarInjectors must still roll one at a time: the kwok nodes and
// kube-controller-manager's Deployment controller roll them for real, and
// a watch on the Deployments sees at most one rolling at any event. The
// CR held back says so in ServerRolloutWaiting and an Event.
func TestServerDeploymentsRollOneAtATime(t *testing.T) {
	ctx := cluster.TestContext(t, 3*time.Minute)
	c := env.Client
	const newImage = "ghcr.io/hookwright/hookwright:v0.0.1-test"
	names := []string{"roll-a", "roll-b"}
	deps := map[string]string{} // Deployment name -> CR name
	var sis []*v1alpha1.SidecarInjector
	for _, n := range names {
		si := cluster.SampleInjector(t, n)
		si.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"roll-test": "none"}}
		sis = append(sis, si)
		deps[desired.SidecarKind.BaseName(n)] = n
	}
	// Cleanups run last first: the CRs go before the default operator
	// (and image) comes back, so nothing rolls back.
	restartWithImage := func(image string) {
		stopOperator()
		operator.mu.Lock()
		operator.image = image
		operator.mu.Unlock()
		if err := runOperator(env.Config, allowedServerNamespaces); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { restartWithImage("") })
	for _, si := range sis {
		create(t, ctx, si)
	}

	steady := func(ctx context.Context, image string) (bool, error) {
		for d := range deps {
			dep := &appsv1.Deployment{}
			if err := c.Get(ctx, client.ObjectKey{Namespace: operatorNS, Name: d}, dep); err != nil {
				return false, client.IgnoreNotFound(err)
			}
			if dep.Spec.Template.Spec.Containers[0].Image != image || deploymentRolling(dep) {
				return false, nil
			}
		}
		return true, nil
	}
	if err := cluster.WaitFor(ctx, 2*time.Minute, "both server Deployments rolled out", func(ctx context.Context) (bool, error) {
		return steady(ctx, serverImage)
	}); err != nil {
		t.Fatal(err)
	}

	list := &appsv1.DeploymentList{}
	if err := c.List(ctx, list, client.InNamespace(operatorNS)); err != nil {
		t.Fatal(err)
	}
	rv := list.ResourceVersion
	// kwok makes a new pod Ready at once, so a rollout would end before
	// the other CR is reconciled: cordon the nodes so the first rollout's
	// new pod stays Pending (maxUnavailable 0 keeps the old ones serving),
	// and the second CR must be seen waiting for it.
	cordon := func(ctx context.Context, on bool) error {
		for _, n := range []string{"kwok-node-0", "kwok-node-1"} {
			patch := []byte(fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, on))
			if err := c.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, client.RawPatch(types.MergePatchType, patch)); err != nil {
				return err
			}
		}
		return nil
	}
	if err := cordon(ctx, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cordon(context.Background(), false) })
	start := time.Now()
	restartWithImage(newImage)
	var held *v1alpha1.SidecarInjector
	var cond *metav1.Condition
	err := cluster.WaitFor(ctx, 2*time.Minute, "a SidecarInjector waiting for the other's server rollout", func(ctx context.Context) (bool, error) {
		for _, si := range sis {
			if err := c.Get(ctx, client.ObjectKeyFromObject(si), si); err != nil {
				return false, err
			}
			if cond = apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionServerRolloutWaiting); cond != nil && cond.Status == metav1.ConditionTrue {
				held = si
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %s %s: %s", held.Name, cond.Type, cond.Reason, cond.Message)
	if cond.Reason != v1alpha1.ServerRolloutReasonWaiting {
		t.Errorf("reason %q, want %q", cond.Reason, v1alpha1.ServerRolloutReasonWaiting)
	}
	// While the first rollout cannot finish, the held server keeps its
	// template (through one recheck of the operator and then some).
	heldDep := client.ObjectKey{Namespace: operatorNS, Name: desired.SidecarKind.BaseName(held.Name)}
	if err := cluster.During(ctx, serverRolloutRecheckForTest+time.Second, 250*time.Millisecond, func(ctx context.Context) error {
		d := &appsv1.Deployment{}
		if err := c.Get(ctx, heldDep, d); err != nil {
			return err
		}
		if img := d.Spec.Template.Spec.Containers[0].Image; img != serverImage {
			return fmt.Errorf("held Deployment %s took %s while the other rollout could not finish", d.Name, img)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := cordon(ctx, false); err != nil {
		t.Fatal(err)
	}

	// Every Deployment event from before the upgrade, in order.
	rolling := map[string]bool{}
	done := map[string]bool{}
	most, events := 0, 0
	var order []string
	w := func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		return env.Clientset.AppsV1().Deployments(operatorNS).Watch(ctx, o)
	}
	err = cluster.Watch(ctx, 3*time.Minute, "both server Deployments rolled to "+newImage, rv, w, func(ev watch.Event) (bool, error) {
		d, ok := ev.Object.(*appsv1.Deployment)
		if !ok || deps[d.Name] == "" {
			return false, nil
		}
		events++
		r := ev.Type != watch.Deleted && deploymentRolling(d)
		if r && !rolling[d.Name] {
			order = append(order, d.Name)
		}
		rolling[d.Name] = r
		n := 0
		for _, v := range rolling {
			if v {
				n++
			}
		}
		if n > most {
			most = n
		}
		if n > 1 {
			return false, fmt.Errorf("%d server Deployments rolling at once (%v) at %s rv %s", n, rolling, d.Name, d.ResourceVersion)
		}
		done[d.Name] = d.Spec.Template.Spec.Containers[0].Image == newImage && !r
		for dn := range deps {
			if !done[dn] {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("figure: two server Deployments rolled to the new image one after the other (%v) in %s; %d Deployment events, at most %d rolling at once",
		order, time.Since(start).Round(time.Millisecond), events, most)

	// The CR held back said so in an Event too (sent asynchronously).
	reasons := map[string]map[string]int{}
	err = cluster.WaitFor(ctx, time.Minute, v1alpha1.ServerRolloutReasonWaiting+" Event on a SidecarInjector", func(ctx context.Context) (bool, error) {
		waited := 0
		for _, si := range sis {
			r, err := eventReasons(ctx, "SidecarInjector", si.Name)
			if err != nil {
				return false, err
			}
			reasons[si.Name] = r
			waited += r[v1alpha1.ServerRolloutReasonWaiting]
		}
		return waited > 0, nil
	})
	if err != nil {
		t.Fatalf("%v; events by reason: %v", err, reasons)
	}
	err = cluster.WaitFor(ctx, time.Minute, "ServerRolloutWaiting gone", func(ctx context.Context) (bool, error) {
		for _, si := range sis {
			if err := c.Get(ctx, client.ObjectKeyFromObject(si), si); err != nil {
				return false, err
			}
			if apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionServerRolloutWaiting) != nil {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
