package fleet

import (
	"encoding/json"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// BenchmarkWhatIf10k plans an image change for 10,000 injected pods in
// 100 namespaces (every pod rendered by the engine and diffed), as
// `hookwright status --what-if` does once.
func BenchmarkWhatIf10k(b *testing.B) {
	t := &testing.T{}
	now := testInjector(t, "proxy:2")
	next := testInjector(t, "proxy:3")
	one := realisticPod(t, now, 0)
	pods := make([]*corev1.Pod, 10000)
	labels := map[string]map[string]string{}
	for i := range pods {
		p := &corev1.Pod{}
		if err := json.Unmarshal(one, p); err != nil {
			b.Fatal(err)
		}
		p.Name = fmt.Sprintf("web-%05d", i)
		p.Namespace = fmt.Sprintf("ns-%d", i%100)
		labels[p.Namespace] = map[string]string{"inject": "on"}
		pods[i] = p
	}
	b.ReportAllocs()
	for b.Loop() {
		if w := PlanWhatIf(&now, next, pods, labels); w.InPlace != 10000 {
			b.Fatalf("%+v", w)
		}
	}
}
