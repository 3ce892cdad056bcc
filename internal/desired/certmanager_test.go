package desired

import (
	"slices"
	"testing"

	cmmeta "github.com/cert-manager/cert-manager/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

func certManagerInjector(ref *v1alpha1.IssuerReference) CR {
	si := testInjector()
	si.Spec.Certificate = v1alpha1.CertificateSpec{Mode: v1alpha1.CertificateCertManager, IssuerRef: ref}
	return SidecarCR(si)
}

func TestCertManagerObjects(t *testing.T) {
	op := certManagerInjector(nil)
	iss := certManagerIssuer(op, testSettings)
	if iss == nil || iss.Spec.SelfSigned == nil || iss.Name != "hookwright-sidecar-mesh" || iss.Namespace != "hookwright-system" {
		t.Fatalf("issuer %+v", iss)
	}
	crt := CertManagerCertificate(op, testSettings)
	want := []string{"hookwright-sidecar-mesh.hookwright-system.svc", "hookwright-sidecar-mesh.hookwright-system.svc.cluster.local"}
	if !slices.Equal(crt.Spec.DNSNames, want) || crt.Spec.SecretName != "hookwright-sidecar-mesh-cm-tls" ||
		crt.Spec.IssuerRef != (cmmeta.IssuerReference{Name: "hookwright-sidecar-mesh", Kind: "Issuer", Group: "cert-manager.io"}) {
		t.Fatalf("certificate spec %+v", crt.Spec)
	}
	if ServingSecretName(op) != crt.Spec.SecretName {
		t.Fatalf("server mounts %s, Certificate writes %s", ServingSecretName(op), crt.Spec.SecretName)
	}
	if d := BuildSidecarInjector(op.Object.(*v1alpha1.SidecarInjector), testSettings); d.Deployment.Spec.Template.Spec.Volumes[0].Secret.SecretName != crt.Spec.SecretName {
		t.Fatalf("Deployment mounts %s", d.Deployment.Spec.Template.Spec.Volumes[0].Secret.SecretName)
	}

	// A named issuer: no Issuer of our own, kind and group defaulted.
	op = certManagerInjector(&v1alpha1.IssuerReference{Name: "corp-ca", Kind: "ClusterIssuer"})
	if certManagerIssuer(op, testSettings) != nil {
		t.Fatal("an Issuer is created although the CR names one")
	}
	if ref := CertManagerCertificate(op, testSettings).Spec.IssuerRef; ref != (cmmeta.IssuerReference{Name: "corp-ca", Kind: "ClusterIssuer", Group: "cert-manager.io"}) {
		t.Fatalf("issuerRef %+v", ref)
	}
}
