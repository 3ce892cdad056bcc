package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Annotation keys written on nodes by the oversell webhook.
const (
	// OversellRawAllocatableKey holds the node's real allocatable as a JSON
	// object of exact quantities, e.g. {"cpu":"3800m","memory":"16Gi"}.
	OversellRawAllocatableKey = "oversell.hookwright.io/raw-allocatable"
	// OversellRatiosKey holds the ratios applied, e.g. {"cpu":"2","memory":"1.5"}.
	OversellRatiosKey = "oversell.hookwright.io/ratios"
	// OversellAppliedByKey names the NodeOversell that amplified the node.
	OversellAppliedByKey = "oversell.hookwright.io/applied-by"
	// OversellResyncKey is patched through nodes/status by the operator to make
	// the webhook re-evaluate a node at once.
	OversellResyncKey = "oversell.hookwright.io/resync"
)

// Ratio is a decimal from 1 to 10 with at most 6 fractional digits, e.g. "1.5".
// A CEL rule rather than a Pattern so a rejection reads as a sentence, not
// the regex; "[.]" is a literal dot without escaping through two grammars.
// +kubebuilder:validation:XValidation:rule=`self.matches('^([1-9]([.][0-9]{1,6})?|10([.]0{1,6})?)$')`,message=`must be a decimal from 1 to 10 with at most 6 fractional digits, e.g. "1.5"`
// +kubebuilder:validation:MaxLength=9
type Ratio string

// OversellRatios are the amplification ratios per resource. Only cpu and
// memory can be inflated; pods, ephemeral-storage, hugepages and extended
// resources never are.
// +kubebuilder:validation:XValidation:rule="has(self.cpu) || has(self.memory)",message="at least one of cpu or memory is required"
type OversellRatios struct {
	// CPU ratio, e.g. "2" doubles allocatable cpu.
	// +optional
	CPU Ratio `json:"cpu,omitempty"`
	// Memory ratio.
	// +optional
	Memory Ratio `json:"memory,omitempty"`
}

// NodeOversellSpec selects nodes and the ratios their allocatable is inflated by.
type NodeOversellSpec struct {
	// NodeSelector selects the nodes. An empty selector selects every node.
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Node Selector",xDescriptors="urn:alm:descriptor:com.tectonic.ui:selector:core:v1:Node"
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`

	// Ratios per resource.
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Ratios"
	Ratios OversellRatios `json:"ratios"`

	// Priority decides overlaps: when several NodeOversell objects select one
	// node, the highest priority applies, then the oldest, then the name.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=-1000
	// +kubebuilder:validation:Maximum=1000
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Priority",xDescriptors="urn:alm:descriptor:com.tectonic.ui:number"
	Priority int32 `json:"priority,omitempty"`

	// TrustedReporters are extra user names whose nodes/status writes carry the
	// node's real allocatable, as the node's own kubelet (system:node:<name>) does.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=253
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Trusted Reporters"
	TrustedReporters []string `json:"trustedReporters,omitempty"`

	// FailurePolicy of the webhook configuration: only Ignore is accepted.
	// With Fail a server outage rejects every kubelet's nodes/status write:
	// a new or restarted node cannot report Ready, node conditions and
	// volumesInUse freeze (the kubelet mounts an attachable volume only once
	// its status lists it), and when the nodes the server needs are not
	// Ready it cannot come back. Ignore costs only the inflation: the node
	// publishes its real allocatable until the server returns. Objects
	// stored with Fail stay updatable (CRD validation ratcheting, KEP-4008).
	// +optional
	// +kubebuilder:default=Ignore
	// +kubebuilder:validation:XValidation:rule="self == 'Ignore'",message="must be Ignore: with Fail a webhook server outage blocks every node's status writes (nodes cannot report Ready)"
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Failure Policy",xDescriptors={"urn:alm:descriptor:com.tectonic.ui:select:Ignore"}
	FailurePolicy FailurePolicy `json:"failurePolicy,omitempty"`

	// TimeoutSeconds of the webhook configuration, in seconds. The kubelet's
	// heartbeat client times out after 10 s, so this stays small.
	// +optional
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=5
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Timeout Seconds",xDescriptors="urn:alm:descriptor:com.tectonic.ui:number"
	TimeoutSeconds *int32 `json:"timeoutSeconds,omitempty"`

	// Server is the webhook server Deployment the operator runs.
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Webhook Server"
	Server ServerSpec `json:"server,omitempty"`

	// Certificate is the server's serving certificate.
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Serving Certificate"
	Certificate CertificateSpec `json:"certificate,omitempty"`
}

// NodeOversellStatus is filled by the operator.
type NodeOversellStatus struct {
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=status,displayName="Observed Generation"
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// ServedGeneration is the generation the webhook servers report serving.
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=status,displayName="Served Generation"
	ServedGeneration int64 `json:"servedGeneration,omitempty"`
	// ResyncedGeneration is the generation for which the operator last
	// touched every selected (and formerly amplified) node through
	// nodes/status, so the webhook re-evaluated them without waiting for the
	// kubelet's next report.
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=status,displayName="Resynced Generation"
	ResyncedGeneration int64 `json:"resyncedGeneration,omitempty"`
	// NodesMatched is the number of nodes the selector matches.
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=status,displayName="Nodes Matched",xDescriptors="urn:alm:descriptor:text"
	NodesMatched int32 `json:"nodesMatched,omitempty"`
	// NodesAmplified is the number of nodes this object currently amplifies.
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=status,displayName="Nodes Amplified",xDescriptors="urn:alm:descriptor:text"
	NodesAmplified int32 `json:"nodesAmplified,omitempty"`
	// RawAllocatable is the sum of the real allocatable of amplified nodes.
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=status,displayName="Raw Allocatable"
	RawAllocatable corev1.ResourceList `json:"rawAllocatable,omitempty"`
	// EffectiveAllocatable is the sum of the published allocatable of amplified nodes.
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=status,displayName="Effective Allocatable"
	EffectiveAllocatable corev1.ResourceList `json:"effectiveAllocatable,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	// +operator-sdk:csv:customresourcedefinitions:type=status,displayName="Conditions",xDescriptors="urn:alm:descriptor:io.kubernetes.conditions"
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// NodeOversell inflates the allocatable of selected nodes.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +operator-sdk:csv:customresourcedefinitions:displayName="Node Oversell",resources={{Deployment,v1,"hookwright-oversell-<name>"},{Service,v1,"hookwright-oversell-<name>"},{Secret,v1,"hookwright-oversell-<name>-tls"},{MutatingWebhookConfiguration,v1,"hookwright-oversell-<name>"}}
// +kubebuilder:resource:scope=Cluster,shortName=nos,categories=hookwright
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="CPU",type=string,JSONPath=`.spec.ratios.cpu`
// +kubebuilder:printcolumn:name="Memory",type=string,JSONPath=`.spec.ratios.memory`
// +kubebuilder:printcolumn:name="Matched",type=integer,JSONPath=`.status.nodesMatched`
// +kubebuilder:printcolumn:name="Amplified",type=integer,JSONPath=`.status.nodesAmplified`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeOversell struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   NodeOversellSpec   `json:"spec"`
	Status NodeOversellStatus `json:"status,omitempty"`
}

// NodeOversellList is a list of NodeOversell.
// +kubebuilder:object:root=true
type NodeOversellList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeOversell `json:"items"`
}

func init() {
	SchemeBuilder.Register(&NodeOversell{}, &NodeOversellList{})
}
