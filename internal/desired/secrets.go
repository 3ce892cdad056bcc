package desired

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SecretKeyCA is the trust bundle key of a serving Secret (as cert-manager
// writes it).
const SecretKeyCA = "ca.crt"

// ServingSecret is the kubernetes.io/tls Secret of a self-signed serving
// certificate: tls.crt, tls.key and ca.crt (PEM).
func ServingSecret(op CR, s Settings, certPEM, keyPEM, caPEM []byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: meta(op, ServingSecretName(op), ServerNamespace(op, s)),
		Type:       corev1.SecretTypeTLS,
		Data: map[string][]byte{
			corev1.TLSCertKey:       certPEM,
			corev1.TLSPrivateKeyKey: keyPEM,
			SecretKeyCA:             caPEM,
		},
	}
}

// CASecret is the installation CA Secret (CASecretName in namespace) with
// data, labelled so the manager's cache holds it.
func CASecret(namespace string, data map[string][]byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: CASecretName, Labels: map[string]string{
			LabelManagedBy: ManagedByValue, labelName: "hookwright", LabelComponent: "ca",
		}},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
}

// CSRKeySecretName is the Secret holding the private key of a mode CSR
// request in progress, next to the serving Secret.
func CSRKeySecretName(op CR) string { return ServingSecretName(op) + "-csr-key" }

// CSRKeySecret is that Secret with the key (PEM) as tls.key. It is not
// mounted: the server pods start once the serving Secret exists.
func CSRKeySecret(op CR, s Settings, keyPEM []byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: meta(op, CSRKeySecretName(op), ServerNamespace(op, s)),
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{corev1.TLSPrivateKeyKey: keyPEM},
	}
}

// CSRMeta is the metadata of a mode CSR CertificateSigningRequest of op
// (cluster-scoped, owned by the CR): generated name "<base>-<random>", the
// common labels plus labelCSROwner=ownerUID.
func CSRMeta(op CR, labelCSROwner string) metav1.ObjectMeta {
	m := meta(op, "", "")
	m.GenerateName = op.Base() + "-"
	m.Labels[labelCSROwner] = string(op.Object.GetUID())
	return m
}
