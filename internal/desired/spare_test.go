package desired

import (
	"encoding/json"
	"testing"

	"github.com/google/cel-go/cel"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

// The matchConditions the configuration carries, evaluated by CEL on the
// pod as the API server sends it (JSON, empty fields omitted), agree with
// v1alpha1.Spared, and so with sidecar.Decide's CodeSpared: a pod is
// spared by the CEL exactly when Decide says so.
func TestMatchConditionsAgreeWithDecide(t *testing.T) {
	s := testSettings
	s.ExcludedNamespaces = []string{"calico-system"}
	si := testInjector()
	wh := BuildSidecarInjector(si, s).Webhook.Webhooks[0]
	env, err := cel.NewEnv(cel.Variable("object", cel.DynType))
	if err != nil {
		t.Fatal(err)
	}
	var progs []cel.Program
	for _, m := range wh.MatchConditions {
		ast, iss := env.Compile(m.Expression)
		if iss.Err() != nil {
			t.Fatalf("%s: %v", m.Name, iss.Err())
		}
		prg, err := env.Program(ast)
		if err != nil {
			t.Fatal(err)
		}
		progs = append(progs, prg)
	}
	cfg, err := sidecar.Compile(si)
	if err != nil {
		t.Fatal(err)
	}
	p := sidecar.Params{OperatorNamespace: s.Namespace, ExcludedNamespaces: InjectorExcludedNamespaces(si, s), SparedNamespaces: InjectorSparedNamespaces(si, s)}
	for _, priority := range []string{"", "high", v1alpha1.PriorityNodeCritical, v1alpha1.PriorityClusterCritical} {
		for _, ann := range []map[string]string{nil, {"a": "b"}, {v1alpha1.MirrorPodAnnotation: "0a1b"}, {v1alpha1.MirrorPodAnnotation: ""}} {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "apps", Annotations: ann},
				Spec: corev1.PodSpec{PriorityClassName: priority, Containers: []corev1.Container{{Name: "app", Image: "app:1"}}}}
			raw, _ := json.Marshal(pod)
			var obj map[string]any
			if err := json.Unmarshal(raw, &obj); err != nil {
				t.Fatal(err)
			}
			admitted := true
			for _, prg := range progs {
				out, _, err := prg.Eval(map[string]any{"object": obj})
				if err != nil {
					t.Fatalf("priority %q annotations %v: %v", priority, ann, err)
				}
				admitted = admitted && out.Value() == true
			}
			d := sidecar.Decide(cfg, p, sidecar.DecideInput{Pod: pod, Namespace: "apps"})
			if spared := d.Code == sidecar.CodeSpared; spared == admitted {
				t.Errorf("priority %q annotations %v: CEL calls the webhook %t, Decide %s (%s)", priority, ann, admitted, d.Code, d.Reason)
			}
		}
	}
	// The namespaces spared installation-wide are the namespaceSelector's.
	d := sidecar.Decide(cfg, p, sidecar.DecideInput{Pod: &corev1.Pod{}, Namespace: "calico-system"})
	if d.Code != sidecar.CodeSpared || d.Reason != "spared: namespace calico-system excluded installation-wide" {
		t.Errorf("calico-system: %s %q", d.Code, d.Reason)
	}
}
