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

	// PriorityClassName of the server pods: a scheduling.k8s.io/v1
	// PriorityClass, so the servers are scheduled ahead of (and may
	// preempt) ordinary pods when nodes are full. The API server's Priority
	// admission plugin (plugin/pkg/admission/priority) resolves it into
	// each pod's spec.priority when the ReplicaSet creates the pod, and
	// refuses the pod while no class of that name exists. Empty: the
	// cluster's globalDefault class, else priority 0.
	//
	// system-cluster-critical and system-node-critical are allowed outside
	// kube-system since Kubernetes 1.17 (kubernetes#76310), unless the
	// cluster limits them with the ResourceQuota admission plugin's
	// limitedResources ("Limit Priority Class consumption by default",
	// as GKE does): then the server namespace needs a ResourceQuota whose
	// scopeSelector has PriorityClass In [that class], or no server pod is
	// created. Other names starting with "system-" are reserved and can
	// never exist (pkg/apis/scheduling/validation), so they are refused.
	// See docs/failsafe.md#server-priority-class.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('system-') || self in ['system-node-critical', 'system-cluster-critical']",message="priority class names starting with system- are reserved: only system-node-critical and system-cluster-critical exist"
	PriorityClassName string `json:"priorityClassName,omitempty"`

	// TopologySpreadConstraints of the server pods. Absent or empty: the
	// replicas spread over nodes (kubernetes.io/hostname) and zones
	// (topology.kubernetes.io/zone), each with maxSkew 1 and
	// whenUnsatisfiable ScheduleAnyway, so a single-node or single-zone
	// cluster, or nodes without the zone label, still run every replica.
	// Set: these replace the defaults, and a constraint without
	// labelSelector gets the server Deployment's selector, so it counts
	// this server's replicas only. DoNotSchedule can leave replicas
	// Pending, and a rollout (maxUnavailable 0) waiting on them.
	// See docs/failsafe.md#server-topology-spread.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	TopologySpreadConstraints []corev1.TopologySpreadConstraint `json:"topologySpreadConstraints,omitempty"`
}

// CertificateMode selects who issues the server's serving certificate.
// +kubebuilder:validation:Enum=SelfSigned;CertManager;Secret;CSR
type CertificateMode string

const (
	// CertificateSelfSigned means the operator's own CA issues and rotates the certificate.
	CertificateSelfSigned CertificateMode = "SelfSigned"
	// CertificateCertManager means a cert-manager Certificate issues it.
	CertificateCertManager CertificateMode = "CertManager"
	// CertificateSecret means the user provides a kubernetes.io/tls Secret with ca.crt.
	CertificateSecret CertificateMode = "Secret"
	// CertificateCSR means a certificates.k8s.io/v1 CertificateSigningRequest
	// for spec.certificate.csr.signerName issues it; the caBundle comes
	// from that signer's ClusterTrustBundles.
	CertificateCSR CertificateMode = "CSR"
)

// DefaultCSRSignerName is the operator's own signer: it signs approved
// CertificateSigningRequests for it with the installation CA and publishes
// that CA as ClusterTrustBundles (--csr-signer-name changes it).
const DefaultCSRSignerName = "hookwright.io/webhook-serving"

// CSRCertificate configures mode CSR (certificates.k8s.io/v1,
// CertificateSigningRequest; trust from ClusterTrustBundles, KEP-3257).
type CSRCertificate struct {
	// SignerName of the CertificateSigningRequests, <domain>/<path> as in
	// certificates.k8s.io/v1 (e.g. hookwright.io/webhook-serving, the
	// operator's own signer, or clusterissuers.cert-manager.io/<name>).
	// Its ClusterTrustBundles become the caBundle.
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=571
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	SignerName string `json:"signerName"`
	// Approve makes the operator approve its own requests (RBAC approve on
	// signers/<signerName>); false leaves approval to a person or an
	// external approver, and CertificateReady names the request waiting.
	// +optional
	Approve bool `json:"approve,omitempty"`
	// ExpirationSeconds requested for the certificate (the signer may
	// issue a shorter one). Default: the signer's choice.
	// +optional
	// +kubebuilder:validation:Minimum=600
	// +kubebuilder:validation:Maximum=31536000
	ExpirationSeconds *int32 `json:"expirationSeconds,omitempty"`
}

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
// +kubebuilder:validation:XValidation:rule="self.mode != 'CSR' || has(self.csr)",message="csr is required when mode is CSR"
// +kubebuilder:validation:XValidation:rule="!has(self.csr) || self.mode == 'CSR'",message="csr is only used when mode is CSR"
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
	// CSR for mode CSR: the signer of the CertificateSigningRequests the
	// operator creates for the server's Service DNS names.
	// +optional
	CSR *CSRCertificate `json:"csr,omitempty"`
}

// Rotate-now requests (hookwright rotate-ca, hookwright renew-certificate).
// The value is a token, by convention the request time (RFC 3339); the
// operator acts once per new token and records the token it handled.
const (
	// AnnotationRotateCA on the installation CA Secret (hookwright-ca)
	// starts a CA rotation at once, with the usual overlap: the next CA is
	// published everywhere before it signs, the old one stays trusted until
	// nothing it signed is served.
	AnnotationRotateCA = "admission.hookwright.io/rotate-ca"
	// AnnotationRenewCertificate on a SidecarInjector or NodeOversell
	// re-issues its server's serving certificate at once (mode SelfSigned:
	// from the installation CA; mode CSR: a new CertificateSigningRequest).
	AnnotationRenewCertificate = "admission.hookwright.io/renew-certificate"
)
