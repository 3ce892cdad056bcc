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
	"github.com/hookwright/hookwright/internal/serverpolicy"
)

// A CR naming a server namespace, image or Secret the policy does not allow
// is denied 403 Forbidden, the message naming the field and the flag.
func TestServerPolicyDenials(t *testing.T) {
	pol, err := serverpolicy.New("hookwright-system", "ghcr.io/hookwright/hookwright:v1", []string{"hookwright-system", "mesh-servers"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := Handler{Servers: &pol}
	send := func(kind string, obj any) admission.Response {
		raw, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		return h.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Operation: admissionv1.Create, Kind: metav1.GroupVersionKind{Group: v1alpha1.GroupVersion.Group, Version: "v1alpha1", Kind: kind},
			Object: runtime.RawExtension{Raw: raw},
		}})
	}
	si := func(server v1alpha1.ServerSpec, cert v1alpha1.CertificateSpec) *v1alpha1.SidecarInjector {
		return &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: "mesh"}, Spec: v1alpha1.SidecarInjectorSpec{
			Server: server, Certificate: cert,
			Templates: []v1alpha1.NamedTemplate{{Name: "proxy", Template: "spec:\n  containers: []\n"}},
		}}
	}
	no := func(server v1alpha1.ServerSpec, cert v1alpha1.CertificateSpec) *v1alpha1.NodeOversell {
		return &v1alpha1.NodeOversell{ObjectMeta: metav1.ObjectMeta{Name: "pool"}, Spec: v1alpha1.NodeOversellSpec{
			Server: server, Certificate: cert, Ratios: v1alpha1.OversellRatios{CPU: "2"},
		}}
	}
	for _, c := range []struct {
		server v1alpha1.ServerSpec
		cert   v1alpha1.CertificateSpec
		want   []string // "" entries: allowed
	}{
		{v1alpha1.ServerSpec{}, v1alpha1.CertificateSpec{}, nil},
		{v1alpha1.ServerSpec{Namespace: "mesh-servers"}, v1alpha1.CertificateSpec{Mode: v1alpha1.CertificateSecret, SecretName: "mine"}, nil},
		{v1alpha1.ServerSpec{Namespace: "kube-system"}, v1alpha1.CertificateSpec{}, []string{"spec.server.namespace", `"kube-system"`, serverpolicy.NamespacesFlag}},
		{v1alpha1.ServerSpec{Image: "evil.example/x:1"}, v1alpha1.CertificateSpec{}, []string{"spec.server.image", serverpolicy.ImagesFlag}},
		{v1alpha1.ServerSpec{}, v1alpha1.CertificateSpec{Mode: v1alpha1.CertificateSecret, SecretName: "hookwright-ca"}, []string{"spec.certificate.secretName", "hookwright-ca"}},
		{v1alpha1.ServerSpec{Namespace: "kube-system", Image: "evil.example/x:1"}, v1alpha1.CertificateSpec{}, []string{"spec.server.namespace", "spec.server.image"}},
	} {
		for kind, obj := range map[string]any{"SidecarInjector": si(c.server, c.cert), "NodeOversell": no(c.server, c.cert)} {
			r := send(kind, obj)
			if len(c.want) == 0 {
				if !r.Allowed {
					t.Errorf("%s %+v %+v denied: %s", kind, c.server, c.cert, r.Result.Message)
				}
				continue
			}
			if r.Allowed || r.Result.Code != http.StatusForbidden {
				t.Errorf("%s %+v %+v: allowed=%t code %d, want a 403 denial", kind, c.server, c.cert, r.Allowed, r.Result.Code)
				continue
			}
			for _, w := range c.want {
				if !strings.Contains(r.Result.Message, w) {
					t.Errorf("%s: denial %q does not mention %q", kind, r.Result.Message, w)
				}
			}
		}
	}
}
