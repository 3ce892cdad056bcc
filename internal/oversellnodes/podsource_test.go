package oversellnodes

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/internal/podindex"
)

type indexSource struct {
	x      *podindex.Index
	synced bool
}

func (s indexSource) Synced() bool { return s.synced }
func (s indexSource) NodePods(n string) (podindex.NodePods, bool) {
	return s.x.Node(n)
}

// With the pod index synced a pass reads each node's requests from it and
// lists no pod (APIReader is nil: a list would panic); the sums equal
// groupPods over the same pods.
func TestNodePodsFromTheIndex(t *testing.T) {
	mk := func(name, node, cpu, mem string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: name},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	}
	pods := []corev1.Pod{*mk("a", "n1", "250m", "64Mi"), *mk("b", "n1", "1", "1Gi"), *mk("c", "n2", "100m", "100M")}
	x := podindex.New()
	for i := range pods {
		x.Upsert(podindex.FromPod(&pods[i]))
	}
	n := &Nodes{Pods: indexSource{x: x, synced: true}}
	got, req, err := n.nodePods(context.Background(), true, slices.Values([]string{"n1", "n2", "n3"}))
	if err != nil {
		t.Fatal(err)
	}
	want := groupPods(pods)
	for _, node := range []string{"n1", "n2"} {
		g, w := got[node], want[node]
		if g == nil || g.requests[0].Cmp(w.requests[0]) != 0 || g.requests[1].Cmp(w.requests[1]) != 0 || !slices.Equal(g.names, w.names) {
			t.Fatalf("%s: index %+v, list %+v", node, g, w)
		}
	}
	if got["n3"] != nil {
		t.Fatal("n3 has no pods")
	}
	if r := req("apps/b"); r.Cpu().String() != "1" || r.Memory().String() != "1Gi" {
		t.Fatalf("apps/b requests %v", r)
	}
}
