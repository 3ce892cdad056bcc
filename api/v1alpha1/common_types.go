package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
)

// FailurePolicy is the failurePolicy written into the webhook configuration.
// +kubebuilder:validation:Enum=Fail;Ignore
type FailurePolicy string

// Failure policies (admissionregistration.k8s.io/v1 names).
const (
	FailurePolicyFail   FailurePolicy = "Fail"
	FailurePolicyIgnore FailurePolicy = "Ignore"
)

// ServerSpec describes the webhook server Deployment the operator runs for a CR.
type ServerSpec struct {
	// Namespace the server's Deployment, Service and certificate live in.
	// Defaults to the operator's own namespace.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespace string `json:"namespace,omitempty"`

	// Replicas of the server Deployment.
	// +optional
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=20
	Replicas *int32 `json:"replicas,omitempty"`

	// Image of the server. Defaults to the operator's own image.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Image string `json:"image,omitempty"`

	// Resources of the server container.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
}

// CertificateMode selects who issues the server's serving certificate.
// +kubebuilder:validation:Enum=SelfSigned;CertManager;Secret
type CertificateMode string

const (
	// CertificateSelfSigned means the operator's own CA issues and rotates the certificate.
	CertificateSelfSigned CertificateMode = "SelfSigned"
	// CertificateCertManager means a cert-manager Certificate issues it.
	CertificateCertManager CertificateMode = "CertManager"
	// CertificateSecret means the user provides a kubernetes.io/tls Secret with ca.crt.
	CertificateSecret CertificateMode = "Secret"
)

// IssuerReference names a cert-manager Issuer or ClusterIssuer.
type IssuerReference struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Kind is Issuer or ClusterIssuer.
	// +optional
	// +kubebuilder:default=Issuer
	// +kubebuilder:validation:Enum=Issuer;ClusterIssuer
	Kind string `json:"kind,omitempty"`
	// Group of the issuer kind: cert-manager.io, or an external issuer's.
	// +optional
	// +kubebuilder:default=cert-manager.io
	// +kubebuilder:validation:MaxLength=253
	Group string `json:"group,omitempty"`
}

// CertificateSpec configures the webhook server's serving certificate.
// +kubebuilder:validation:XValidation:rule="self.mode != 'Secret' || has(self.secretName)",message="secretName is required when mode is Secret"
// +kubebuilder:validation:XValidation:rule="!has(self.issuerRef) || self.mode == 'CertManager'",message="issuerRef is only used when mode is CertManager"
type CertificateSpec struct {
	// +optional
	// +kubebuilder:default=SelfSigned
	Mode CertificateMode `json:"mode,omitempty"`
	// SecretName of the kubernetes.io/tls Secret (in the server namespace) that
	// holds tls.crt, tls.key and ca.crt. Required for mode Secret.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	SecretName string `json:"secretName,omitempty"`
	// IssuerRef for mode CertManager: the cert-manager Issuer (in the server
	// namespace) or ClusterIssuer that signs the serving certificate. Its
	// Secret must carry ca.crt, which becomes the caBundle. When empty the
	// operator creates a cert-manager SelfSigned Issuer named after the
	// server.
	// +optional
	IssuerRef *IssuerReference `json:"issuerRef,omitempty"`
}
