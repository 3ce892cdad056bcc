package v1alpha1

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The CEL the API server runs is rendered from the same constants Spared
// reads.
func TestSpareMatchConditionsText(t *testing.T) {
	want := []struct{ name, expr string }{
		{MatchNotCritical, "!has(object.spec.priorityClassName) || !(object.spec.priorityClassName in ['" + PriorityNodeCritical + "', '" + PriorityClusterCritical + "'])"},
		{MatchNotMirror, "!has(object.metadata.annotations) || !('" + MirrorPodAnnotation + "' in object.metadata.annotations)"},
	}
	got := SpareMatchConditions()
	if len(got) != len(want) {
		t.Fatalf("%d conditions, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		if got[i].Name != w.name || got[i].Expression != w.expr {
			t.Errorf("condition %d: %s %q, want %s %q", i, got[i].Name, got[i].Expression, w.name, w.expr)
		}
	}
	if got[0].Expression != "!has(object.spec.priorityClassName) || !(object.spec.priorityClassName in ['system-node-critical', 'system-cluster-critical'])" ||
		got[1].Expression != "!has(object.metadata.annotations) || !('kubernetes.io/config.mirror' in object.metadata.annotations)" {
		t.Errorf("CEL changed: %+v", got)
	}
}

func TestSpared(t *testing.T) {
	spared := []string{"calico-system", "cert-manager"}
	cases := []struct {
		name, ns, priority string
		ann                map[string]string
		want               string
	}{
		{"node critical", "apps", PriorityNodeCritical, nil, "system-node-critical"},
		{"cluster critical", "apps", PriorityClusterCritical, nil, "system-cluster-critical"},
		{"other priority", "apps", "high", nil, ""},
		{"no priority", "apps", "", nil, ""},
		{"mirror", "apps", "", map[string]string{MirrorPodAnnotation: "abc"}, "mirror pod (annotation kubernetes.io/config.mirror)"},
		{"mirror empty value", "apps", "", map[string]string{MirrorPodAnnotation: ""}, "mirror pod (annotation kubernetes.io/config.mirror)"},
		{"other annotation", "apps", "", map[string]string{"kubernetes.io/config.source": "file"}, ""},
		{"excluded namespace", "calico-system", "", nil, "namespace calico-system excluded installation-wide"},
		{"cert-manager", "cert-manager", "", nil, "namespace cert-manager excluded installation-wide"},
		{"priority first", "calico-system", PriorityNodeCritical, map[string]string{MirrorPodAnnotation: "x"}, "system-node-critical"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: tc.ann}, Spec: corev1.PodSpec{PriorityClassName: tc.priority}}
			if got := Spared(p, tc.ns, spared); got != tc.want {
				t.Fatalf("Spared = %q, want %q", got, tc.want)
			}
		})
	}
	if got := Spared(&corev1.Pod{}, "calico-system", nil); got != "" {
		t.Fatalf("no spared namespaces given: %q", got)
	}
}
