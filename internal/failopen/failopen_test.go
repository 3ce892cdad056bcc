package failopen

import (
	"slices"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/json"
	"k8s.io/utils/ptr"
)

func TestOperatorGone(t *testing.T) {
	now := metav1.Now()
	for _, c := range []struct {
		name  string
		dep   *appsv1.Deployment
		found bool
		want  bool
	}{
		{"deleted", nil, false, true},
		{"being deleted", &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2)}}, true, true},
		{"scaled to zero", &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](0)}}, true, true},
		{"rolling or restarting", &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2)}}, true, false},
		{"replicas unset (defaults to 1)", &appsv1.Deployment{}, true, false},
	} {
		if got := OperatorGone(c.dep, c.found); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestMutatingPatch(t *testing.T) {
	fail, ignore := admissionregistrationv1.Fail, admissionregistrationv1.Ignore
	wh := func(name string, p *admissionregistrationv1.FailurePolicyType) admissionregistrationv1.MutatingWebhook {
		return admissionregistrationv1.MutatingWebhook{Name: name, FailurePolicy: p}
	}
	for _, c := range []struct {
		name     string
		webhooks []admissionregistrationv1.MutatingWebhook
		switched []string
	}{
		{"none", nil, nil},
		{"all Ignore: nothing to write", []admissionregistrationv1.MutatingWebhook{wh("a", &ignore), wh("b", &ignore)}, nil},
		{"one Fail", []admissionregistrationv1.MutatingWebhook{wh("a", &fail)}, []string{"a"}},
		{"only those not Ignore; unset counts as Fail", []admissionregistrationv1.MutatingWebhook{wh("a", &ignore), wh("b", &fail), wh("c", nil)}, []string{"b", "c"}},
	} {
		m := &admissionregistrationv1.MutatingWebhookConfiguration{Webhooks: c.webhooks}
		patch, switched := MutatingPatch(m)
		if !slices.Equal(switched, c.switched) {
			t.Errorf("%s: switched %v, want %v", c.name, switched, c.switched)
		}
		if (patch == nil) != (len(c.switched) == 0) {
			t.Errorf("%s: patch %s", c.name, patch)
			continue
		}
		if patch == nil {
			continue
		}
		// Applied, every webhook is Ignore and nothing else changed.
		doc, _ := json.Marshal(m)
		p, err := jsonpatch.DecodePatch(patch)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		out, err := p.Apply(doc)
		if err != nil {
			t.Fatalf("%s: apply %s: %v", c.name, patch, err)
		}
		var got admissionregistrationv1.MutatingWebhookConfiguration
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		for i, w := range got.Webhooks {
			if w.Name != c.webhooks[i].Name || w.FailurePolicy == nil || *w.FailurePolicy != ignore {
				t.Errorf("%s: webhook %d after the patch: %s %v", c.name, i, w.Name, w.FailurePolicy)
			}
		}
		// A configuration whose webhooks moved fails the patch whole.
		slices.Reverse(m.Webhooks)
		moved, _ := json.Marshal(m)
		if len(m.Webhooks) > 1 {
			if _, err := p.Apply(moved); err == nil {
				t.Errorf("%s: patch applied to reordered webhooks", c.name)
			}
		}
	}
}

func TestValidatingPatch(t *testing.T) {
	fail := admissionregistrationv1.Fail
	v := &admissionregistrationv1.ValidatingWebhookConfiguration{Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "validate.admission.hookwright.io", FailurePolicy: &fail}}}
	patch, switched := ValidatingPatch(v)
	want := `[{"op":"test","path":"/webhooks/0/name","value":"validate.admission.hookwright.io"},{"op":"add","path":"/webhooks/0/failurePolicy","value":"Ignore"}]`
	if string(patch) != want || !slices.Equal(switched, []string{"validate.admission.hookwright.io"}) {
		t.Fatalf("patch %s switched %v", patch, switched)
	}
}
