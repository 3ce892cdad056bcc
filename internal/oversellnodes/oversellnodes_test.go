package oversellnodes

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

func TestRestorePatch(t *testing.T) {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{
			v1alpha1.OversellRawAllocatableKey: `{"cpu":"3800m","memory":"16Gi"}`,
			v1alpha1.OversellRatiosKey:         `{"cpu":"2"}`,
			v1alpha1.OversellAppliedByKey:      "pool",
		}},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("17Gi")},
			Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("7600m"), corev1.ResourceMemory: resource.MustParse("24Gi")},
		},
	}
	const dropAnnotations = `{"metadata":{"annotations":{"oversell.hookwright.io/applied-by":null,"oversell.hookwright.io/ratios":null,"oversell.hookwright.io/raw-allocatable":null}}`
	b, notes := restorePatch(node)
	if want := dropAnnotations + `,"status":{"allocatable":{"cpu":"3800m","memory":"16Gi"}}}`; string(b) != want || len(notes) != 0 {
		t.Fatalf("patch\n%s\nwant\n%s\nnotes %v", b, want, notes)
	}
	// Tampered, unparseable or missing records are never published: an
	// allocatable above capacity is lowered to capacity, the annotations go.
	for _, c := range []struct{ raw, want, note string }{
		{`{"cpu":"3800m","memory":"1e30"}`, `{"cpu":"3800m","memory":"17Gi"}`, `memory: recorded raw "1e30" is not plausible for capacity 17Gi; allocatable 24Gi lowered to capacity`},
		{`{"cpu":"0","memory":"16Gi"}`, `{"cpu":"4","memory":"16Gi"}`, `cpu: recorded raw "0" is not plausible for capacity 4`},
		{`{"cpu":"-1","memory":"16Gi"}`, `{"cpu":"4","memory":"16Gi"}`, `not plausible`},
		{`{"cpu":"lots"}`, `{"cpu":"4"}`, `cpu: recorded raw "lots" does not parse`},
		{``, `{"cpu":"4","memory":"17Gi"}`, `no oversell.hookwright.io/raw-allocatable annotation`},
		{`{`, `{"cpu":"4","memory":"17Gi"}`, `is not a JSON object`},
		{`null`, `{"cpu":"4","memory":"17Gi"}`, `is not a JSON object`},
	} {
		node.Annotations[v1alpha1.OversellRawAllocatableKey] = c.raw
		b, notes := restorePatch(node)
		if want := dropAnnotations + `,"status":{"allocatable":` + c.want + `}}`; string(b) != want {
			t.Errorf("raw %q: patch\n%s\nwant\n%s", c.raw, b, want)
		}
		if !strings.Contains(strings.Join(notes, "; "), c.note) {
			t.Errorf("raw %q: notes %q lack %q", c.raw, notes, c.note)
		}
	}
	// Allocatable already within capacity stays for the kubelet to correct.
	within := node.DeepCopy()
	within.Annotations[v1alpha1.OversellRawAllocatableKey] = `{"memory":"1e30"}`
	within.Status.Allocatable[corev1.ResourceMemory] = resource.MustParse("16Gi")
	b, notes = restorePatch(within)
	if string(b) != dropAnnotations+"}" || len(notes) != 1 || !strings.Contains(notes[0], "left until the kubelet's next report") {
		t.Fatalf("within capacity: %s %v", b, notes)
	}
	// No capacity: nothing can be checked, nothing is written.
	nocap := node.DeepCopy()
	nocap.Annotations[v1alpha1.OversellRawAllocatableKey] = `{"cpu":"3800m"}`
	nocap.Status.Capacity = nil
	if b, notes := restorePatch(nocap); string(b) != dropAnnotations+"}" || len(notes) != 1 {
		t.Fatalf("no capacity: %s %v", b, notes)
	}
	// Only memory recorded: only memory restored.
	node.Annotations[v1alpha1.OversellRawAllocatableKey] = `{"memory":"1.5e9"}`
	if b, notes := restorePatch(node); !strings.Contains(string(b), `"allocatable":{"memory":"1.5e9"}`) || len(notes) != 0 {
		t.Fatalf("memory only: %s %v", b, notes)
	}
}

func TestAmplifiedTotals(t *testing.T) {
	node := func(name string, ann map[string]string) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann}, Status: corev1.NodeStatus{Capacity: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi")}}}
	}
	nodes := []corev1.Node{
		node("a", map[string]string{
			v1alpha1.OversellAppliedByKey: "pool", v1alpha1.OversellRawAllocatableKey: `{"cpu":"3800m","memory":"7Gi"}`,
			v1alpha1.OversellRatiosKey: `{"cpu":"2","memory":"1.5"}`,
		}),
		node("b", map[string]string{
			v1alpha1.OversellAppliedByKey: "pool", v1alpha1.OversellRawAllocatableKey: `{"cpu":"1","memory":"1000Mi"}`,
			v1alpha1.OversellRatiosKey: `{"cpu":"1.333333"}`,
		}),
		node("other", map[string]string{
			v1alpha1.OversellAppliedByKey: "other", v1alpha1.OversellRawAllocatableKey: `{"cpu":"64"}`,
		}),
		node("broken", map[string]string{v1alpha1.OversellAppliedByKey: "pool", v1alpha1.OversellRawAllocatableKey: `{"cpu":"x"}`}),
		// Tampered records the engine would not trust stay out of the sums.
		node("tampered", map[string]string{v1alpha1.OversellAppliedByKey: "pool", v1alpha1.OversellRawAllocatableKey: `{"cpu":"1","memory":"1e30"}`}),
		node("zero", map[string]string{v1alpha1.OversellAppliedByKey: "pool", v1alpha1.OversellRawAllocatableKey: `{"cpu":"0"}`}),
		node("plain", nil),
	}
	nocap := node("nocap", map[string]string{v1alpha1.OversellAppliedByKey: "pool", v1alpha1.OversellRawAllocatableKey: `{"cpu":"1"}`})
	nocap.Status.Capacity = nil
	nodes = append(nodes, nocap)
	got := amplifiedTotals(nodes, "pool")
	if got.Nodes != 6 || len(got.Problems) != 4 || !strings.HasPrefix(got.Problems[0], "broken: ") ||
		!strings.Contains(got.Problems[2], `tampered: raw memory "1e30": not plausible for capacity 8Gi`) ||
		!strings.HasPrefix(got.Problems[1], "nocap: ") || !strings.HasPrefix(got.Problems[3], "zero: ") {
		t.Fatalf("nodes %d problems %q", got.Nodes, got.Problems)
	}
	// cpu: 3800m + 1 = 4800m raw; 7600m + 1333m (rounded down) effective.
	// memory: 7Gi + 1000Mi raw; 10.5Gi + 1000Mi (no memory ratio) effective.
	for _, c := range []struct {
		l    corev1.ResourceList
		k    corev1.ResourceName
		want string
	}{
		{got.Raw, corev1.ResourceCPU, "4800m"}, {got.Effective, corev1.ResourceCPU, "8933m"},
		{got.Raw, corev1.ResourceMemory, "8168Mi"}, {got.Effective, corev1.ResourceMemory, "11752Mi"},
	} {
		q := c.l[c.k]
		if want := resource.MustParse(c.want); q.Cmp(want) != 0 {
			t.Errorf("%s = %s, want %s", c.k, q.String(), c.want)
		}
	}
	if none := amplifiedTotals(nodes, "absent"); none.Nodes != 0 || none.Raw != nil || none.Effective != nil {
		t.Fatalf("no amplified node: %+v", none)
	}
}

func TestPodRequests(t *testing.T) {
	req := func(cpu, mem string) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}}
	}
	always := corev1.ContainerRestartPolicyAlways
	p := &corev1.Pod{Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Resources: req("500m", "1Gi")}, {Resources: req("250m", "256Mi")}},
		InitContainers: []corev1.Container{
			{Resources: req("2", "64Mi")},                             // before the sidecar: 2 cpu alone
			{Resources: req("100m", "128Mi"), RestartPolicy: &always}, // native sidecar, runs throughout
			{Resources: req("1", "4Gi")},                              // after it: 1.1 cpu, 4Gi+128Mi
		},
		Overhead: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")},
	}}
	got := podRequests(p)
	// cpu: max(0.75+0.1, 2, 1.1) + 0.01 = 2.01; memory: max(1.25Gi+128Mi, 64Mi, 4Gi+128Mi) = 4224Mi.
	if c, m := got[corev1.ResourceCPU], got[corev1.ResourceMemory]; c.Cmp(resource.MustParse("2010m")) != 0 || m.Cmp(resource.MustParse("4224Mi")) != 0 {
		t.Fatalf("podRequests = cpu %s memory %s", c.String(), m.String())
	}
}
