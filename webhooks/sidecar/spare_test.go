package sidecar

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// A pod the webhook configuration spares (v1alpha1.Spared) is decided as
// not injected, by CodeSpared, after the system and operator namespaces.
func TestDecideSpares(t *testing.T) {
	cfg := sampleConfig(t)
	params := testParams
	params.ExcludedNamespaces = []string{"edge-servers", "calico-system"}
	params.SparedNamespaces = []string{"calico-system"}
	in := map[string]string{v1alpha1.SidecarInjectKey: "true"}
	cases := []struct {
		name, ns, priority string
		labels, ann        map[string]string
		code               Code
		reason             string
	}{
		{name: "node critical", ns: "apps", priority: v1alpha1.PriorityNodeCritical, labels: in, code: CodeSpared, reason: "spared: system-node-critical"},
		{name: "cluster critical", ns: "apps", priority: v1alpha1.PriorityClusterCritical, code: CodeSpared, reason: "spared: system-cluster-critical"},
		{name: "mirror pod", ns: "apps", ann: map[string]string{v1alpha1.MirrorPodAnnotation: "0a1b"}, labels: in, code: CodeSpared, reason: "spared: mirror pod"},
		{name: "spared namespace", ns: "calico-system", labels: in, code: CodeSpared, reason: "spared: namespace calico-system excluded installation-wide"},
		{name: "server namespace stays the operator's", ns: "edge-servers", code: CodeOperatorNamespace},
		{name: "operator namespace first", ns: "hookwright-system", priority: v1alpha1.PriorityNodeCritical, code: CodeOperatorNamespace},
		{name: "system namespace first", ns: "kube-system", priority: v1alpha1.PriorityNodeCritical, code: CodeSystemNamespace},
		{name: "already injected first", ns: "apps", priority: v1alpha1.PriorityNodeCritical, ann: map[string]string{v1alpha1.SidecarStatusKey: "{}"}, code: CodeAlreadyInjected},
		{name: "other priority class", ns: "apps", priority: "high", labels: in, code: CodeLabel},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: tc.labels, Annotations: tc.ann},
				Spec: corev1.PodSpec{PriorityClassName: tc.priority, Containers: []corev1.Container{{Name: "app"}}}}
			d := Decide(cfg, params, DecideInput{Pod: p, Namespace: tc.ns})
			if d.Code != tc.code || (tc.code == CodeSpared && d.Inject) || !strings.HasPrefix(d.Reason, tc.reason) {
				t.Fatalf("got inject=%v %s %q, want %s %q", d.Inject, d.Code, d.Reason, tc.code, tc.reason)
			}
		})
	}
}

// The webhook path (Inject, which decodes only what Decide reads when no
// template reads the spec) spares a critical pod too.
func TestInjectSparesCriticalPod(t *testing.T) {
	cfg := sampleConfig(t)
	for _, spec := range []corev1.PodSpec{
		{PriorityClassName: v1alpha1.PriorityNodeCritical, Containers: []corev1.Container{{Name: "app", Image: "app:1"}}},
		{Containers: []corev1.Container{{Name: "app", Image: "app:1"}}},
	} {
		p := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "apps"}, Spec: spec}
		raw, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Inject(cfg, testParams, Input{Raw: raw, Namespace: "apps", WantPatch: true})
		if err != nil {
			t.Fatal(err)
		}
		if want := spec.PriorityClassName == ""; res.Injected != want {
			t.Fatalf("priority %q: injected %v, want %v (%s)", spec.PriorityClassName, res.Injected, want, res.Decision.Reason)
		}
	}
}
