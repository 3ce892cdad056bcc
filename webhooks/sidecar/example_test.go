package sidecar_test

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

func exampleInjector() *v1alpha1.SidecarInjector {
	return &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: "mesh", Generation: 4},
		Spec: v1alpha1.SidecarInjectorSpec{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"sidecar-injection": "enabled"}},
			NativeSidecars:    v1alpha1.NativeSidecarEnabled,
			DefaultTemplates:  []string{"proxy"},
			Templates: []v1alpha1.NamedTemplate{{Name: "proxy",
				Template: "spec:\n  containers:\n  - name: proxy\n    image: ghcr.io/hookwright/proxy:1.4.2\n"}},
		}}
}

// Should a running pod carry the injector's sidecars? The operator asks
// the injector's own decision, with no client: the CR compiled once, the
// pod (a trimmed informer's copy is enough) and its namespace's labels.
func ExampleDecide() {
	cfg, err := sidecar.Compile(exampleInjector())
	if err != nil {
		panic(err)
	}
	p := sidecar.Params{OperatorNamespace: "hookwright-system"}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{"app": "web"}}}
	for _, ns := range []map[string]string{{"sidecar-injection": "enabled"}, {}} {
		d := sidecar.Decide(cfg, p, sidecar.DecideInput{Pod: pod, Namespace: "lab", NamespaceLabels: ns})
		fmt.Println(d.Inject, d.Code, d.Reason)
	}
	// Output:
	// true Policy pod says nothing and policy is Enabled
	// false NamespaceSelector namespace "lab" labels do not match namespaceSelector sidecar-injection=enabled
}

// What would the injector do to a pod now? Inject answers offline, as
// kube-inject does.
func ExampleInject() {
	cfg, err := sidecar.Compile(exampleInjector())
	if err != nil {
		panic(err)
	}
	pod := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web-1"},"spec":{"containers":[{"name":"web","image":"nginx"}]}}`)
	res, err := sidecar.Inject(cfg, sidecar.Params{OperatorNamespace: "hookwright-system"}, sidecar.Input{Raw: pod, Namespace: "lab", WantJSON: true})
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Injected, res.Templates, res.Status.InitContainers, res.Native)
	// Output:
	// true [proxy] [proxy] true
}
