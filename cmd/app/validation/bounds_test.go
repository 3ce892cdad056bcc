package validation

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// A template bomb is denied with the template and the limit named; before
// the render bounds, until 20000000 was admitted after seconds.
func TestTemplateBombDenied(t *testing.T) {
	si := &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: "mesh"}, Spec: v1alpha1.SidecarInjectorSpec{
		Templates: []v1alpha1.NamedTemplate{{Name: "bomb", Template: "metadata:\n  annotations:\n    x: \"{{ range until 20000000 }}x{{ end }}\"\n"}},
	}}
	r := review(t, admissionv1.Create, "SidecarInjector", si)
	for _, want := range []string{"SidecarInjector mesh", `template "bomb"`, "MaxValueBytes", "1048576"} {
		if r.Allowed || !strings.Contains(r.Result.Message, want) {
			t.Errorf("allowed=%t, message %q lacks %q", r.Allowed, r.Result.Message, want)
		}
	}
}

// The trial render stops with the request: a canceled context denies a
// template that would loop for minutes, at once.
func TestTrialRenderStopsWithRequest(t *testing.T) {
	si := &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: "mesh"}, Spec: v1alpha1.SidecarInjectorSpec{
		Templates: []v1alpha1.NamedTemplate{{Name: "loops", Template: "{{ $l := until 50000 }}{{ range $l }}{{ range $l }}{{ end }}{{ end }}"}},
	}}
	raw, err := json.Marshal(si)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := Handler{}.Handle(ctx, admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: admissionv1.Create, Kind: metav1.GroupVersionKind{Group: v1alpha1.GroupVersion.Group, Version: "v1alpha1", Kind: "SidecarInjector"},
		Object: runtime.RawExtension{Raw: raw},
	}})
	if r.Allowed || !strings.Contains(r.Result.Message, "context canceled") {
		t.Fatalf("allowed=%t %q", r.Allowed, r.Result.Message)
	}
}
