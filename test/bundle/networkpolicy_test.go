package bundle

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
)

// TestNetworkPolicy checks the optional config/networkpolicy: one Ingress
// policy whose selector matches the pod template of every server Deployment
// the operator builds (so a label change cannot silently leave servers
// open) and admits TCP to the webhook port only.
func TestNetworkPolicy(t *testing.T) {
	objs := kustomizeBuild(t, "config/networkpolicy")
	if len(objs) != 1 {
		t.Fatalf("%d objects, want one NetworkPolicy", len(objs))
	}
	raw, err := json.Marshal(objs[0])
	if err != nil {
		t.Fatal(err)
	}
	var np networkingv1.NetworkPolicy
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&np); err != nil {
		t.Fatalf("not a NetworkPolicy: %v", err)
	}
	if np.Kind != "NetworkPolicy" || np.Namespace != "hookwright-system" {
		t.Fatalf("got %s in %q", np.Kind, np.Namespace)
	}
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil || sel.Empty() {
		t.Fatalf("pod selector %v: %v", np.Spec.PodSelector, err)
	}
	s := desired.Settings{Namespace: "hookwright-system", Image: "example.com/hookwright:v1"}
	si := &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: "sidecar-injector"}}
	no := &v1alpha1.NodeOversell{ObjectMeta: metav1.ObjectMeta{Name: "oversell-pool"}}
	for name, d := range map[string]*desired.Desired{
		"SidecarInjector": desired.BuildSidecarInjector(si, s),
		"NodeOversell":    desired.BuildNodeOversell(no, s),
	} {
		tmpl := d.Deployment.Spec.Template
		if !sel.Matches(labels.Set(tmpl.Labels)) {
			t.Errorf("%s server pod labels %v not selected by %v", name, tmpl.Labels, sel)
		}
		var webhookPort int32
		for _, p := range tmpl.Spec.Containers[0].Ports {
			if p.Name == "webhook" {
				webhookPort = p.ContainerPort
			}
		}
		want := []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{
			Protocol: ptrTo(corev1.ProtocolTCP), Port: ptrTo(intstr.FromInt32(webhookPort)),
		}}}}
		got, _ := json.Marshal(np.Spec.Ingress)
		wantJSON, _ := json.Marshal(want)
		if string(got) != string(wantJSON) {
			t.Errorf("%s: ingress %s, want only %s", name, got, wantJSON)
		}
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("policy types %v, want [Ingress]", np.Spec.PolicyTypes)
	}
}

func ptrTo[T any](v T) *T { return &v }
