package oversellnodes

import (
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// poolNode is a 4 CPU / 8Gi node of pool "a" publishing cpu and memory;
// ann are its oversell annotations (nil: none).
func poolNode(name, cpu, mem string, ann map[string]string) corev1.Node {
	return corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pool": "a"}, Annotations: ann},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi")},
			Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)},
		},
	}
}

func amplifiedBy(name, ratios string) map[string]string {
	return map[string]string{
		v1alpha1.OversellAppliedByKey:      name,
		v1alpha1.OversellRawAllocatableKey: `{"cpu":"3800m","memory":"7Gi"}`,
		v1alpha1.OversellRatiosKey:         ratios,
	}
}

func TestUnamplifiedNodes(t *testing.T) {
	no := &v1alpha1.NodeOversell{
		ObjectMeta: metav1.ObjectMeta{Name: "pool-a"},
		Spec: v1alpha1.NodeOversellSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "a"}},
			Ratios:       v1alpha1.OversellRatios{CPU: "2"},
		},
	}
	other := poolNode("other-pool", "3800m", "7Gi", nil)
	other.Labels["pool"] = "b"
	noAlloc := poolNode("no-allocatable", "1", "1", nil)
	noAlloc.Status.Allocatable = corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110")}
	nodes := []corev1.Node{
		// Amplified as the webhook publishes it: 3800m × 2.
		poolNode("amplified", "7600m", "7Gi", amplifiedBy("pool-a", `{"cpu":"2"}`)),
		// The same, spelled differently by the API server: equal quantities.
		poolNode("amplified-cores", "7.6", "7168Mi", amplifiedBy("pool-a", `{"cpu":"2.0"}`)),
		// The kubelet's raw report stored without the webhook (Ignore).
		poolNode("raw-stored", "3800m", "7Gi", amplifiedBy("pool-a", `{"cpu":"2"}`)),
		// A resync write that reached no server: old ratio still recorded.
		poolNode("old-ratio", "5700m", "7Gi", amplifiedBy("pool-a", `{"cpu":"1.5"}`)),
		// A memory ratio recorded that the spec no longer has.
		poolNode("extra-ratio", "7600m", "7Gi", amplifiedBy("pool-a", `{"cpu":"2","memory":"1.5"}`)),
		// Registered or reported while no server was reached.
		poolNode("never", "3800m", "7Gi", nil),
		// Another NodeOversell's (overlapping selectors): not ours.
		poolNode("theirs", "3800m", "7Gi", amplifiedBy("pool-b", `{"cpu":"3"}`)),
		// Amplified by a NodeOversell since deleted without its restore.
		poolNode("orphan", "7600m", "7Gi", amplifiedBy("gone", `{"cpu":"2"}`)),
		// An implausible record (raw above capacity): the kubelet's job.
		poolNode("untrusted", "3800m", "7Gi", map[string]string{
			v1alpha1.OversellAppliedByKey: "pool-a", v1alpha1.OversellRawAllocatableKey: `{"cpu":"64"}`, v1alpha1.OversellRatiosKey: `{"cpu":"2"}`,
		}),
		noAlloc,
		other,
	}
	sel, err := nodeSelector(no)
	if err != nil {
		t.Fatal(err)
	}
	exists := func(n string) bool { return n == "pool-a" || n == "pool-b" }
	got := unamplifiedNodes(nodes, no, sel, exists)
	want := []string{"extra-ratio", "never", "old-ratio", "orphan", "raw-stored"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("unamplifiedNodes = %v, want %v", got, want)
	}

	bad := no.DeepCopy()
	bad.Spec.Ratios.CPU = "0.5"
	if got := unamplifiedNodes(nodes, bad, sel, exists); got != nil {
		t.Errorf("with an invalid ratio: %v, want none", got)
	}
}

func TestLostAmplification(t *testing.T) {
	for _, tc := range []struct {
		name string
		node corev1.Node
		want bool
	}{
		{"amplified", poolNode("n", "7600m", "7Gi", amplifiedBy("x", `{"cpu":"2"}`)), false},
		{"raw stored", poolNode("n", "3800m", "7Gi", amplifiedBy("x", `{"cpu":"2"}`)), true},
		{"memory lost", poolNode("n", "7600m", "6Gi", amplifiedBy("x", `{"cpu":"2"}`)), true},
		{"never amplified", poolNode("n", "3800m", "7Gi", nil), false},
		{"unreadable record", poolNode("n", "3800m", "7Gi", map[string]string{v1alpha1.OversellAppliedByKey: "x", v1alpha1.OversellRawAllocatableKey: "{"}), false},
	} {
		if got := lostAmplification(&tc.node); got != tc.want {
			t.Errorf("%s: lostAmplification = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The node watch lets through the one status write the webhook would
// have changed, and no kubelet report it amplified.
func TestNodeWritelostAmplification(t *testing.T) {
	amp := poolNode("n", "7600m", "7Gi", amplifiedBy("x", `{"cpu":"2"}`))
	raw := poolNode("n", "3800m", "7Gi", amplifiedBy("x", `{"cpu":"2"}`))
	heartbeat := amp.DeepCopy()
	heartbeat.Annotations[v1alpha1.OversellResyncKey] = "2026-12-01T12:00:00Z"
	for _, tc := range []struct {
		name     string
		old, cur *corev1.Node
		want     bool
	}{
		{"amplified report stored amplified", &amp, heartbeat, false},
		{"raw report stored raw", &amp, &raw, true},
		{"raw again, allocatable unchanged", &raw, raw.DeepCopy(), false},
		{"re-amplified", &raw, &amp, false},
	} {
		if got := WriteLostAmplification(tc.old, tc.cur); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if WriteLostAmplification(&corev1.Pod{}, &raw) {
		t.Error("a non-node object passed")
	}
}

func TestNextReamplifyDelay(t *testing.T) {
	var got []time.Duration
	d := time.Duration(0)
	for range 11 {
		d = nextReamplifyDelay(d)
		got = append(got, d)
	}
	want := []time.Duration{1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300}
	for i := range want {
		want[i] *= time.Second
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("delays %v, want %v", got, want)
	}
}
