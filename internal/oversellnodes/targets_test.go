package oversellnodes

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// targetsFixture is a NodeOversell at cpu ratio 1 (lowered from 2, ceiling
// 2) over one node whose pod requests 6 of its raw 4, on fake clients.
func targetsFixture(t *testing.T, forbidTaints bool) (*Nodes, client.Client, *v1alpha1.NodeOversell) {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	q := resource.MustParse
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"pool": "a"}, Annotations: map[string]string{
			v1alpha1.OversellRawAllocatableKey: `{"cpu":"4"}`, v1alpha1.OversellRatiosKey: `{"cpu":"2"}`, v1alpha1.OversellAppliedByKey: "pool",
		}},
		Spec:   corev1.NodeSpec{Taints: []corev1.Taint{{Key: "other", Value: "x", Effect: corev1.TaintEffectNoExecute}}},
		Status: corev1.NodeStatus{Capacity: corev1.ResourceList{"cpu": q("4")}, Allocatable: corev1.ResourceList{"cpu": q("8")}},
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "w", Name: "p"},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{"cpu": q("6")}}}}}}
	no := &v1alpha1.NodeOversell{
		ObjectMeta: metav1.ObjectMeta{Name: "pool", Generation: 2},
		Spec: v1alpha1.NodeOversellSpec{NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "a"}},
			Ratios: v1alpha1.OversellRatios{CPU: "1"}},
		Status: v1alpha1.NodeOversellStatus{RatioCeiling: &v1alpha1.RatioCeiling{CPU: "2"}, Conditions: []metav1.Condition{
			{Type: v1alpha1.ConditionWebhookConfigured, Status: metav1.ConditionTrue, Reason: "x", LastTransitionTime: metav1.Now()},
			{Type: v1alpha1.ConditionServerAvailable, Status: metav1.ConditionTrue, Reason: "x", LastTransitionTime: metav1.Now()},
		}},
	}
	funcs := interceptor.Funcs{
		// nodes/status may change metadata too (nodeStatusStrategy resets
		// only spec); the fake keeps a status patch to status.
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, _ ...client.SubResourcePatchOption) error {
			if _, ok := obj.(*corev1.Node); ok && sub == "status" {
				return c.Patch(ctx, obj, p)
			}
			return c.Status().Patch(ctx, obj, p)
		},
	}
	if forbidTaints {
		funcs.Patch = func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			if _, ok := obj.(*corev1.Node); ok && p.Type() == "application/merge-patch+json" && strings.Contains(string(mustData(p, obj)), `"taints"`) {
				return apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, obj.GetName(), fmt.Errorf("no patch on nodes"))
			}
			return c.Patch(ctx, obj, p, opts...)
		}
	}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(node, pod, no).WithInterceptorFuncs(funcs).Build()
	n := &Nodes{Client: c, APIReader: c, Recorder: events.NewFakeRecorder(100), Now: func() time.Time { return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) }}
	return n, c, no
}

func mustData(p client.Patch, obj client.Object) []byte {
	b, _ := p.Data(obj)
	return b
}

// TestTargetsHoldAndTaint: a lowered ratio the pods do not fit is held at
// their need, the node is tainted with our key only (others kept), the
// target records why, and the ceiling stays at what is in use.
func TestTargetsHoldAndTaint(t *testing.T) {
	n, c, no := targetsFixture(t, false)
	ctx := context.Background()
	_, held, written, err := n.Targets(ctx, no)
	if err != nil || held != 1 || !written["n1"] {
		t.Fatalf("Targets: held %d written %v err %v", held, written, err)
	}
	node := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: "n1"}, node); err != nil {
		t.Fatal(err)
	}
	tgt := readNodeTarget(node, "pool")
	if tgt == nil || tgt.CPU.Ratio != "1.5" || !strings.Contains(tgt.Held, "cpu: pods request 6 > 4 at 1") || node.Labels[v1alpha1.OversellNodeLabel] != "pool" {
		t.Fatalf("target %+v labels %v", tgt, node.Labels)
	}
	if len(node.Spec.Taints) != 2 || node.Spec.Taints[0].Key != "other" || node.Spec.Taints[1].Key != v1alpha1.OversellTaintKey || node.Spec.Taints[1].Value != v1alpha1.OversellTaintRatioCut {
		t.Fatalf("taints %+v", node.Spec.Taints)
	}
	if no.Status.RatioCeiling.CPU != "1.5" {
		t.Fatalf("ceiling %+v", no.Status.RatioCeiling)
	}
	if cd := apimeta.FindStatusCondition(no.Status.Conditions, v1alpha1.ConditionRatioHeld); cd == nil || cd.Status != metav1.ConditionTrue || !strings.Contains(cd.Message, "n1 (cpu: pods request 6 > 4 at 1)") {
		t.Fatalf("RatioHeld %+v", cd)
	}
	if len(no.Status.Nodes) != 1 || no.Status.NodesBySource["held"] != 1 {
		t.Fatalf("status nodes %+v by source %v", no.Status.Nodes, no.Status.NodesBySource)
	}
	// A second pass with nothing changed writes nothing.
	_, _, written, err = n.Targets(ctx, no)
	if err != nil || len(written) != 0 {
		t.Fatalf("idle pass wrote %v (%v)", written, err)
	}
}

// TestTargetsTaintNotPermitted: without patch on nodes the hold still
// applies its ratio and NodeTaints says NotPermitted, naming the node.
func TestTargetsTaintNotPermitted(t *testing.T) {
	n, c, no := targetsFixture(t, true)
	ctx := context.Background()
	if _, held, _, err := n.Targets(ctx, no); err != nil || held != 1 {
		t.Fatalf("Targets: held %d err %v", held, err)
	}
	cd := apimeta.FindStatusCondition(no.Status.Conditions, v1alpha1.ConditionNodeTaints)
	if cd == nil || cd.Status != metav1.ConditionFalse || cd.Reason != "NotPermitted" || !strings.Contains(cd.Message, "n1") || !strings.Contains(cd.Message, "config/node-taints") {
		t.Fatalf("NodeTaints %+v", cd)
	}
	node := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: "n1"}, node); err != nil {
		t.Fatal(err)
	}
	if tgt := readNodeTarget(node, "pool"); tgt == nil || tgt.CPU.Ratio != "1.5" {
		t.Fatalf("target %+v", tgt)
	}
}

// TestTaintRemovalRetriesAConflict: the node changing between setTaint's
// read and its patch (a heartbeat) does not leave our taint behind: the
// pass that releases a node is the last to find it ours.
func TestTaintRemovalRetriesAConflict(t *testing.T) {
	n, c, _ := targetsFixture(t, false)
	ctx := context.Background()
	node := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: "n1"}, node); err != nil {
		t.Fatal(err)
	}
	if err := n.setTaint(ctx, node, v1alpha1.OversellTaintRatioCut); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKey{Name: "n1"}, node); err != nil {
		t.Fatal(err)
	}
	patches := 0
	n.Client = interceptor.NewClient(c.(client.WithWatch), interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			if patches++; patches == 1 {
				return apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, obj.GetName(), fmt.Errorf("the object has been modified"))
			}
			return c.Patch(ctx, obj, p, opts...)
		},
	})
	if err := n.setTaint(ctx, node, ""); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKey{Name: "n1"}, node); err != nil {
		t.Fatal(err)
	}
	if _, has := ourTaint(node); has || patches != 2 || len(node.Spec.Taints) != 1 {
		t.Fatalf("after a conflict then a retry (%d patches): taints %+v, want only the other one", patches, node.Spec.Taints)
	}
}

// TestReleaseWaitsForTheUntaint: a node leaving the NodeOversell is
// untainted before its marks go. While the taint cannot be removed (here
// every patch conflicts, past retry.DefaultRetry's five tries) the marks
// stay, so the next pass still finds the node ours and finishes the job;
// releasing first would have left a NoSchedule taint nobody owns.
func TestReleaseWaitsForTheUntaint(t *testing.T) {
	n, c, no := targetsFixture(t, false)
	ctx := context.Background()
	if _, held, _, err := n.Targets(ctx, no); err != nil || held != 1 {
		t.Fatalf("first pass: held %d err %v", held, err)
	}
	// The pod goes and the node leaves the selector: nothing holds it.
	if err := c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "w", Name: "p"}}); err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: "n1"}, node); err != nil {
		t.Fatal(err)
	}
	node.Labels["pool"] = "b"
	if err := c.Update(ctx, node); err != nil {
		t.Fatal(err)
	}
	plain := n.Client
	taintPatches := 0
	n.Client = interceptor.NewClient(c.(client.WithWatch), interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			if strings.Contains(string(mustData(p, obj)), `"taints"`) {
				taintPatches++
				return apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, obj.GetName(), fmt.Errorf("the object has been modified"))
			}
			return c.Patch(ctx, obj, p, opts...)
		},
	})
	requeue, _, written, err := n.Targets(ctx, no)
	if err != nil || len(written) != 0 || requeue == 0 || taintPatches == 0 {
		t.Fatalf("pass with the untaint failing: written %v requeue %s taint patches %d err %v", written, requeue, taintPatches, err)
	}
	if err := c.Get(ctx, client.ObjectKey{Name: "n1"}, node); err != nil {
		t.Fatal(err)
	}
	if _, has := ourTaint(node); !has || node.Labels[v1alpha1.OversellNodeLabel] != "pool" || readNodeTarget(node, "pool") == nil {
		t.Fatalf("the marks went before the taint: taints %+v labels %v", node.Spec.Taints, node.Labels)
	}
	n.Client = plain
	if _, _, written, err = n.Targets(ctx, no); err != nil || !written["n1"] {
		t.Fatalf("next pass: written %v err %v", written, err)
	}
	if err := c.Get(ctx, client.ObjectKey{Name: "n1"}, node); err != nil {
		t.Fatal(err)
	}
	if _, has := ourTaint(node); has || len(node.Spec.Taints) != 1 || node.Labels[v1alpha1.OversellNodeLabel] != "" || readNodeTarget(node, "pool") != nil {
		t.Fatalf("after the next pass: taints %+v labels %v annotations %v", node.Spec.Taints, node.Labels, node.Annotations)
	}
}
