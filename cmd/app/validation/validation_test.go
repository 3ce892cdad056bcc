package validation

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

func review(t *testing.T, op admissionv1.Operation, kind string, obj any) admission.Response {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return Handler{}.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: op, Kind: metav1.GroupVersionKind{Group: v1alpha1.GroupVersion.Group, Version: "v1alpha1", Kind: kind},
		Object: runtime.RawExtension{Raw: raw},
	}})
}

func TestSidecarInjectorTemplates(t *testing.T) {
	si := &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: "mesh"}, Spec: v1alpha1.SidecarInjectorSpec{
		Templates: []v1alpha1.NamedTemplate{{Name: "proxy", Template: "spec:\n  containers:\n  - name: proxy\n    image: {{ .Values.image | default \"envoy\" }}\n"}},
	}}
	if r := review(t, admissionv1.Create, "SidecarInjector", si); !r.Allowed {
		t.Fatalf("good injector denied: %+v", r.Result)
	}
	si.Spec.Templates[0].Template = "spec:\n  containers:\n  - name: proxy\n    image: {{ nosuchfunc }}\n"
	r := review(t, admissionv1.Update, "SidecarInjector", si)
	if r.Allowed || !strings.Contains(r.Result.Message, `proxy:4:`) || !strings.Contains(r.Result.Message, "SidecarInjector mesh") {
		t.Fatalf("bad template: allowed=%t %q", r.Allowed, r.Result.Message)
	}
	if r.Result.Code != http.StatusUnprocessableEntity || r.Result.Reason != metav1.StatusReasonInvalid {
		t.Fatalf("denial is %d %s, want 422 Invalid", r.Result.Code, r.Result.Reason)
	}
	t.Logf("denied: %s", r.Result.Message)
	// Parses but does not render to a partial pod.
	si.Spec.Templates[0].Template = "spec:\n  containers: {{ fail \"no\" }}\n"
	if r := review(t, admissionv1.Create, "SidecarInjector", si); r.Allowed || !strings.Contains(r.Result.Message, "proxy") {
		t.Fatalf("failing template: %+v", r.Result)
	}
	// A bad selector operator.
	si.Spec.Templates[0].Template = "spec:\n  containers: []\n"
	si.Spec.ObjectSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Near"}}}
	if r := review(t, admissionv1.Create, "SidecarInjector", si); r.Allowed || !strings.Contains(r.Result.Message, "spec.objectSelector") {
		t.Fatalf("bad selector: %+v", r.Result)
	}
	// A metadata-only update of an object whose spec is bad (admitted
	// before the webhook existed): the operator's finalizer, a label.
	old, _ := json.Marshal(si)
	si.Labels = map[string]string{"x": "y"}
	raw, _ := json.Marshal(si)
	r = Handler{}.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: admissionv1.Update, Kind: metav1.GroupVersionKind{Group: v1alpha1.GroupVersion.Group, Version: "v1alpha1", Kind: "SidecarInjector"},
		Object: runtime.RawExtension{Raw: raw}, OldObject: runtime.RawExtension{Raw: old},
	}})
	if !r.Allowed {
		t.Fatalf("metadata-only update denied: %+v", r.Result)
	}
	// Being deleted: allowed whatever the spec (its finalizer must go).
	now := metav1.Now()
	si.DeletionTimestamp = &now
	if r := review(t, admissionv1.Update, "SidecarInjector", si); !r.Allowed {
		t.Fatalf("deleting object denied: %+v", r.Result)
	}
}

func TestNodeOversellRatiosAndSelector(t *testing.T) {
	no := &v1alpha1.NodeOversell{ObjectMeta: metav1.ObjectMeta{Name: "pool"}, Spec: v1alpha1.NodeOversellSpec{
		Ratios: v1alpha1.OversellRatios{CPU: "2"},
	}}
	if r := review(t, admissionv1.Create, "NodeOversell", no); !r.Allowed {
		t.Fatalf("good: %+v", r.Result)
	}
	no.Spec.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "pool", Operator: metav1.LabelSelectorOpIn}}}
	if r := review(t, admissionv1.Create, "NodeOversell", no); r.Allowed || !strings.Contains(r.Result.Message, "spec.nodeSelector") {
		t.Fatalf("In without values: %+v", r.Result)
	}
	no.Spec.NodeSelector = nil
	no.Spec.Ratios = v1alpha1.OversellRatios{CPU: "11"}
	if r := review(t, admissionv1.Create, "NodeOversell", no); r.Allowed || !strings.Contains(r.Result.Message, "spec.ratios.cpu") {
		t.Fatalf("ratio 11: %+v", r.Result)
	}
}

func TestUndecodableAndOtherRequests(t *testing.T) {
	r := Handler{}.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: admissionv1.Create, Kind: metav1.GroupVersionKind{Group: v1alpha1.GroupVersion.Group, Version: "v1alpha1", Kind: "NodeOversell"},
		Object: runtime.RawExtension{Raw: []byte(`{"spec":`)},
	}})
	if r.Allowed || r.Result.Code != 400 {
		t.Fatalf("undecodable: %+v", r.Result)
	}
	if r := review(t, admissionv1.Delete, "NodeOversell", map[string]any{}); !r.Allowed {
		t.Fatal("DELETE denied")
	}
}
