package desired

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// ServerNamespace is spec.server.namespace, or the operator namespace.
func ServerNamespace(op CR, s Settings) string {
	if op.Server.Namespace != "" {
		return op.Server.Namespace
	}
	return s.Namespace
}

// CertificateMode is spec.certificate.mode with its default (SelfSigned).
func CertificateMode(op CR) v1alpha1.CertificateMode {
	if op.Certificate.Mode == "" {
		return v1alpha1.CertificateSelfSigned
	}
	return op.Certificate.Mode
}

// ServingSecretName is the Secret the server mounts: the user's in mode
// Secret, cert-manager's in mode CertManager (certManagerSecretName), else
// "<base>-tls", written by the operator.
func ServingSecretName(op CR) string {
	switch CertificateMode(op) {
	case v1alpha1.CertificateSecret:
		return op.Certificate.SecretName
	case v1alpha1.CertificateCertManager:
		return certManagerSecretName(op)
	}
	return op.Base() + "-tls"
}

// SelectorLabels select the server pods of op.
func SelectorLabels(op CR) map[string]string {
	return map[string]string{
		labelName:     "hookwright-" + op.Kind.Short,
		LabelInstance: op.Base(),
	}
}

// commonLabels are on every owned object.
func commonLabels(op CR) map[string]string {
	l := SelectorLabels(op)
	l[LabelComponent] = "webhook-server"
	l[LabelManagedBy] = ManagedByValue
	return l
}

// ownerReference makes op's CR the controller of an owned object, so the
// garbage collector deletes the object with the CR. Namespaced dependents of
// a cluster-scoped owner are valid (KEP-1465 "owner references": only
// cluster-scoped dependents of namespaced owners are not).
func ownerReference(op CR) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion:         v1alpha1.GroupVersion.String(),
		Kind:               op.Kind.Name,
		Name:               op.Object.GetName(),
		UID:                op.Object.GetUID(),
		Controller:         ptr.To(true),
		BlockOwnerDeletion: ptr.To(true),
	}
}

func meta(op CR, name, namespace string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name: name, Namespace: namespace,
		Labels:          commonLabels(op),
		OwnerReferences: []metav1.OwnerReference{ownerReference(op)},
	}
}
