package desired

import (
	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	cmmeta "github.com/cert-manager/cert-manager/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/internal/certificates/pki"
)

// certManagerSecretName is the Secret cert-manager writes for op's
// Certificate and the server mounts: "<base>-cm-tls", distinct from the
// SelfSigned "<base>-tls" so a mode switch never has the operator prune a
// Secret cert-manager is writing.
func certManagerSecretName(op CR) string {
	return op.Base() + "-cm-tls"
}

// certManagerIssuer is the Issuer the operator creates when
// spec.certificate.issuerRef is empty: a cert-manager SelfSigned Issuer
// named after op in the server namespace (the serving certificate is then
// its own CA, so ca.crt is the certificate). Nil when the CR names one.
func certManagerIssuer(op CR, s Settings) *cmapi.Issuer {
	if op.Certificate.IssuerRef != nil {
		return nil
	}
	return &cmapi.Issuer{
		ObjectMeta: meta(op, op.Base(), ServerNamespace(op, s)),
		Spec:       cmapi.IssuerSpec{IssuerConfig: cmapi.IssuerConfig{SelfSigned: &cmapi.SelfSignedIssuer{}}},
	}
}

// CertManagerCertificate is the cert-manager Certificate of op's server:
// the Service DNS names ("<svc>.<ns>.svc" and ".svc.cluster.local"), an
// ECDSA P-256 key regenerated on every issuance, server auth usage, written
// to certManagerSecretName in the server namespace, issued by the CR's
// issuerRef or by certManagerIssuer.
func CertManagerCertificate(op CR, s Settings) *cmapi.Certificate {
	base, ns := op.Base(), ServerNamespace(op, s)
	ref := cmmeta.IssuerReference{Name: base, Kind: cmapi.IssuerKind, Group: cmapi.SchemeGroupVersion.Group}
	if r := op.Certificate.IssuerRef; r != nil {
		ref = cmmeta.IssuerReference{Name: r.Name, Kind: or(r.Kind, cmapi.IssuerKind), Group: or(r.Group, cmapi.SchemeGroupVersion.Group)}
	}
	return &cmapi.Certificate{
		ObjectMeta: meta(op, base, ns),
		Spec: cmapi.CertificateSpec{
			SecretName: certManagerSecretName(op),
			DNSNames:   pki.ServingDNSNames(base, ns, ""),
			IssuerRef:  ref,
			Usages:     []cmapi.KeyUsage{cmapi.UsageDigitalSignature, cmapi.UsageKeyEncipherment, cmapi.UsageServerAuth},
			PrivateKey: &cmapi.CertificatePrivateKey{
				Algorithm: cmapi.ECDSAKeyAlgorithm, Size: 256, RotationPolicy: cmapi.RotationPolicyAlways,
			},
		},
	}
}

// CertManagerObjects are the cert-manager objects op owns in mode
// CertManager, in apply order: the Issuer (when the CR names none), then
// the Certificate.
func CertManagerObjects(op CR, s Settings) []Object {
	var out []Object
	if iss := certManagerIssuer(op, s); iss != nil {
		out = append(out, iss)
	}
	return append(out, CertManagerCertificate(op, s))
}
