package explain

import (
	"bytes"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

func TestExplainNode(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	q := resource.MustParse
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"pool": "a", v1alpha1.OversellNodeLabel: "pool-a", v1alpha1.CPUManagerPolicyLabel: "static"},
			Annotations: map[string]string{
				v1alpha1.OversellRawAllocatableKey: `{"cpu":"4","memory":"8Gi"}`,
				v1alpha1.OversellRatiosKey:         `{"cpu":"1.5","memory":"1","exclusiveCPU":"1"}`,
				v1alpha1.OversellAppliedByKey:      "pool-a",
				v1alpha1.OversellTargetKey:         `{"by":"pool-a","cpu":{"ratio":"1.5","source":"usage","changed":"2026-01-01T11:00:00Z"},"memory":{"ratio":"1","source":"static"},"exclusiveCPU":"1","held":"cpu: pods request 6 > 5500m at 1.5"}`,
			}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: v1alpha1.OversellTaintKey, Value: v1alpha1.OversellTaintRatioCut, Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{"cpu": q("4"), "memory": q("8Gi")},
			Allocatable: corev1.ResourceList{"cpu": q("5500m"), "memory": q("8Gi")},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.NewTime(now.Add(-8 * time.Second))}},
		},
	}
	mk := func(name string, prio int32, age time.Duration) v1alpha1.NodeOversell {
		return v1alpha1.NodeOversell{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(now.Add(-age))},
			Spec: v1alpha1.NodeOversellSpec{NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "a"}}, Ratios: v1alpha1.OversellRatios{CPU: "2"}, Priority: prio}}
	}
	pod := corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{"cpu": q("6"), "memory": q("1Gi")}}}}}}
	r := Node(Input{Node: node, NodeOversells: []v1alpha1.NodeOversell{mk("pool-a", 10, time.Hour), mk("pool-b", 5, 2*time.Hour)},
		Pods: []corev1.Pod{pod}, Now: now, UsageProblem: "not served"})
	var b bytes.Buffer
	if err := r.Write(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"raw allocatable:", "cpu 4, memory 8Gi (the kubelet's last report",
		"effective allocatable:", "cpu 5500m",
		"cpu 1.5 (usage, since 2026-01-01T11:00:00Z); memory 1 (static)",
		"held for running pods: cpu: pods request 6 > 5500m at 1.5",
		"pool-a (highest priority 10 (next: pool-b with 5); 2 select the node: pool-a, pool-b)",
		"exclusive CPUs subtracted:", "1 (Guaranteed pods",
		"last status heartbeat 2026-01-01T11:59:52Z (8s ago)",
		"1, requesting cpu 6, memory 1Gi",
		"cpu -500m of the published, -2 of the raw (the pods rely on the amplification",
		"oversell.hookwright.io/held=ratio-cut:NoSchedule: cpu: pods request 6",
		"usage (metrics.k8s.io):", "not served",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	// Same priority: the older wins; and a node only held through its label.
	r = Node(Input{Node: node, NodeOversells: []v1alpha1.NodeOversell{mk("pool-a", 0, time.Hour), mk("pool-b", 0, 2*time.Hour)}, Now: now})
	if got := lineOf(r, "deciding NodeOversell"); !strings.Contains(got, "pool-b (same priority 0 as pool-a, created first") {
		t.Errorf("tie: %s", got)
	}
	held := mk("pool-a", 0, time.Hour)
	held.Spec.NodeSelector.MatchLabels = map[string]string{"pool": "other"}
	r = Node(Input{Node: node, NodeOversells: []v1alpha1.NodeOversell{held}, Now: now})
	if got := lineOf(r, "deciding NodeOversell"); !strings.Contains(got, "no longer selects the node, but holds it") {
		t.Errorf("held: %s", got)
	}
	plain := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{"cpu": q("2")}}}
	r = Node(Input{Node: plain, Now: now})
	if got := lineOf(r, "deciding NodeOversell"); got != "none selects the node" {
		t.Errorf("plain: %s", got)
	}
}

func lineOf(r Report, key string) string {
	for _, l := range r.Lines {
		if l[0] == key {
			return l[1]
		}
	}
	return ""
}
