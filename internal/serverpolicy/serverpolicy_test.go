package serverpolicy

import (
	"strings"
	"testing"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

const (
	opNS  = "hookwright-system"
	image = "ghcr.io/hookwright/hookwright:v1.2.3"
)

func TestDefaultsAllowOnlyTheOperatorsNamespaceAndImage(t *testing.T) {
	p, err := New(opNS, image, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		server v1alpha1.ServerSpec
		cert   v1alpha1.CertificateSpec
		field  string // "" when allowed
	}{
		{"empty spec", v1alpha1.ServerSpec{}, v1alpha1.CertificateSpec{}, ""},
		{"operator namespace spelled out", v1alpha1.ServerSpec{Namespace: opNS, Image: image}, v1alpha1.CertificateSpec{}, ""},
		{"kube-system", v1alpha1.ServerSpec{Namespace: "kube-system"}, v1alpha1.CertificateSpec{}, "spec.server.namespace"},
		{"default", v1alpha1.ServerSpec{Namespace: "default"}, v1alpha1.CertificateSpec{}, "spec.server.namespace"},
		{"other image", v1alpha1.ServerSpec{Image: "evil.example/miner:latest"}, v1alpha1.CertificateSpec{}, "spec.server.image"},
		{"other tag of our image", v1alpha1.ServerSpec{Image: "ghcr.io/hookwright/hookwright:v9"}, v1alpha1.CertificateSpec{}, "spec.server.image"},
		{"CA secret", v1alpha1.ServerSpec{}, v1alpha1.CertificateSpec{Mode: v1alpha1.CertificateSecret, SecretName: "hookwright-ca"}, "spec.certificate.secretName"},
		{"manager cert", v1alpha1.ServerSpec{}, v1alpha1.CertificateSpec{Mode: v1alpha1.CertificateSecret, SecretName: "hookwright-webhook-server-cert"}, "spec.certificate.secretName"},
		{"another CR's key", v1alpha1.ServerSpec{}, v1alpha1.CertificateSpec{Mode: v1alpha1.CertificateSecret, SecretName: "hookwright-oversell-pool-tls"}, "spec.certificate.secretName"},
		{"user secret", v1alpha1.ServerSpec{}, v1alpha1.CertificateSpec{Mode: v1alpha1.CertificateSecret, SecretName: "mesh-serving"}, ""},
	}
	for _, c := range cases {
		errs := p.Check(c.server, c.cert)
		switch {
		case c.field == "" && len(errs) > 0:
			t.Errorf("%s: denied: %v", c.name, errs)
		case c.field != "" && (len(errs) != 1 || errs[0].Field != c.field):
			t.Errorf("%s: want one error on %s, got %v", c.name, c.field, errs)
		case c.field != "":
			msg := errs[0].Error()
			if !strings.Contains(msg, c.field) || !strings.Contains(msg, "Forbidden") {
				t.Errorf("%s: message %q does not name the field", c.name, msg)
			}
			if c.field != "spec.certificate.secretName" && !strings.Contains(msg, "--allowed-server-") {
				t.Errorf("%s: message %q does not name the rule", c.name, msg)
			}
		}
	}
}

func TestImagePatterns(t *testing.T) {
	p, err := New(opNS, image, []string{"hookwright-system", " mesh-servers ", "mesh-servers"}, []string{"registry.example.com/mesh/*", "ghcr.io/hookwright/hookwright:*", "quay.io/x/y@sha256:abc"})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Namespaces) != 2 {
		t.Fatalf("namespaces %v", p.Namespaces)
	}
	for img, ok := range map[string]bool{
		image:                                   true, // the default is always allowed
		"registry.example.com/mesh/injector:v2": true,
		"registry.example.com/mesh/a/b:v2":      true,
		"registry.example.com/meshx/injector":   false,
		"registry.example.com/mesh":             false,
		"ghcr.io/hookwright/hookwright:v9":      true,
		"ghcr.io/hookwright/hookwright-evil:v9": false,
		"quay.io/x/y@sha256:abc":                true,
		"quay.io/x/y@sha256:abd":                false,
	} {
		if got := len(p.Check(v1alpha1.ServerSpec{Image: img, Namespace: "mesh-servers"}, v1alpha1.CertificateSpec{})) == 0; got != ok {
			t.Errorf("image %s: allowed=%t, want %t", img, got, ok)
		}
	}
	any, err := New(opNS, image, nil, []string{"*"})
	if err != nil || len(any.Check(v1alpha1.ServerSpec{Image: "anything:1"}, v1alpha1.CertificateSpec{})) != 0 {
		t.Fatalf("\"*\" should allow any image: %v", err)
	}
}

func TestBadPatternsAreFlagErrors(t *testing.T) {
	for _, pat := range []string{"ghcr.io/org*", "ghcr.io/*/x", "*evil", "registry.example.com*"} {
		if _, err := New(opNS, image, nil, []string{pat}); err == nil || !strings.Contains(err.Error(), ImagesFlag) {
			t.Errorf("pattern %q: err %v", pat, err)
		}
	}
}
