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
	// OversellTargetKey holds the operator's decision for one node, an
	// OversellTarget as JSON: the ratio per resource and its source, the
	// exclusive CPUs subtracted, why the node is held. The servers apply it
	// only within [1, ceiling] (NodeOversellStatus.RatioCeiling), so a
	// forged value can lower a node's allocatable but never raise it.
	OversellTargetKey = "oversell.hookwright.io/target"
)

// OversellNodeLabel is set by the operator, with the NodeOversell's name,
// on every node it manages for that NodeOversell (with the target
// annotation OversellTargetKey). Each NodeOversell's webhook configuration
// has a second webhook selecting it, so a node that leaves the
// nodeSelector (narrowed selector, changed label) or whose NodeOversell is
// being deleted still reaches that server, which keeps applying the
// target until the operator releases the node (removing both): only once
// its running pods fit the raw allocatable, so the kubelet never re-admits
// them against a smaller one (kubernetes/kubernetes#105523).
const OversellNodeLabel = "oversell.hookwright.io/node-oversell"

// OversellTaintKey is the NoSchedule taint the operator puts on a node
// held above its target ratio (a ratio cut its pods do not fit yet) or
// backing off under pressure; its value is "ratio-cut" or "pressure". The
// operator touches no other taint.
const OversellTaintKey = "oversell.hookwright.io/held"

// Values of OversellTaintKey.
const (
	OversellTaintRatioCut = "ratio-cut"
	OversellTaintPressure = "pressure"
)

// CPUManagerPolicyLabel is the node label an admin sets to "static" to say
// the node's kubelet runs cpuManagerPolicy static: the CPUs of Guaranteed pods with
// integer cpu requests are exclusive and never amplified.
const CPUManagerPolicyLabel = "oversell.hookwright.io/cpu-manager-policy"

// Sources of a node's ratio (OversellResourceTarget.Source).
const (
	// RatioSourceStatic is spec.ratios (no usage, or usage allows more).
	RatioSourceStatic = "static"
	// RatioSourceUsage is the usage-derived ratio, lower than spec.ratios.
	RatioSourceUsage = "usage"
	// RatioSourceFallback is spec.usage.fallbackRatio: metrics missing,
	// stale or out of range.
	RatioSourceFallback = "fallback"
	// RatioSourcePressure is the back-off while usage crossed
	// spec.usage.pressureThreshold.
	RatioSourcePressure = "pressure"
)

// OversellTarget is the JSON of the OversellTargetKey node annotation. It
// changes only with a decision (a ratio, a source, a hold, the pressure
// state), never with each measurement, so a node costs a write only when
// its ratio moves; the last measurement is in the NodeOversell's status.
type OversellTarget struct {
	// By names the NodeOversell the decision is for; a server applies a
	// target only when it acts for that NodeOversell.
	By string `json:"by"`
	// CPU and Memory are the per-resource decisions; absent: spec.ratios.
	CPU    *OversellResourceTarget `json:"cpu,omitempty"`
	Memory *OversellResourceTarget `json:"memory,omitempty"`
	// ExclusiveCPU is the cpu (a quantity, whole CPUs) held by Guaranteed
	// pods with integer cpu requests on a node whose kubelet runs the
	// static CPU manager policy: allocatable cpu = (raw - G) x ratio + G.
	ExclusiveCPU string `json:"exclusiveCPU,omitempty"`
	// Held says why the ratio is above its target: the running pods'
	// requests and what the target would give, e.g.
	// "cpu: pods request 6 > 4 at 1". Empty when not held.
	Held string `json:"held,omitempty"`
	// PressureSince is when usage crossed spec.usage.pressureThreshold
	// (RFC 3339); BelowSince when it fell below while the back-off lasts.
	PressureSince string `json:"pressureSince,omitempty"`
	BelowSince    string `json:"belowSince,omitempty"`
}

// OversellResourceTarget is the decision for one resource of one node.
type OversellResourceTarget struct {
	// Ratio is the ratio the servers apply (within [1, ceiling]).
	Ratio string `json:"ratio"`
	// Source is static, usage, fallback or pressure.
	Source string `json:"source"`
	// Changed is when Ratio last changed (RFC 3339, truncated to the
	// second): the hysteresis interval counts from the end of that second.
	Changed string `json:"changed,omitempty"`
}

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

	// Usage, when set, makes each node's ratio follow its measured usage
	// (metrics.k8s.io): at most spec.ratios, lower where the node's pods
	// use more, with hysteresis, a fallback without metrics and an
	// optional pressure back-off.
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Usage-aware Ratio"
	Usage *OversellUsage `json:"usage,omitempty"`

	// StaticCPUManagerNodes selects, among the selected nodes, those whose
	// kubelet runs cpuManagerPolicy static (nodes labelled
	// oversell.hookwright.io/cpu-manager-policy=static count too): there
	// the CPUs of Guaranteed pods with integer cpu requests are not
	// amplified, allocatable cpu = (raw - exclusive) x ratio + exclusive.
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Static CPU Manager Nodes",xDescriptors="urn:alm:descriptor:com.tectonic.ui:selector:core:v1:Node"
	StaticCPUManagerNodes *metav1.LabelSelector `json:"staticCPUManagerNodes,omitempty"`
}

// RatioStep is a ratio difference from 0 to 9 with at most 6 fractional
// digits, e.g. "0.5".
// +kubebuilder:validation:XValidation:rule=`self.matches('^[0-9]([.][0-9]{1,6})?$')`,message=`must be a decimal from 0 to 9 with at most 6 fractional digits, e.g. "0.5"`
// +kubebuilder:validation:MaxLength=8
type RatioStep string

// TargetUtilization is the usage, in percent of a node's raw allocatable,
// that the usage-derived ratio aims at when the node is fully allocated.
type TargetUtilization struct {
	// CPU percent. Default 60: cpu usage is bursty (short peaks well above
	// the average a metrics window shows), and cpu beyond it is only
	// throttled.
	// +optional
	// +kubebuilder:default=60
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	CPU *int32 `json:"cpu,omitempty"`
	// Memory percent. Default 80: the working set is steadier than cpu,
	// but memory is not compressible (beyond it pods are OOM-killed).
	// +optional
	// +kubebuilder:default=80
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	Memory *int32 `json:"memory,omitempty"`
}

// PressureThreshold is the usage, in percent of a node's raw allocatable,
// above which the node backs off.
// +kubebuilder:validation:XValidation:rule="has(self.cpu) || has(self.memory)",message="at least one of cpu or memory is required"
type PressureThreshold struct {
	// CPU percent.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	CPU *int32 `json:"cpu,omitempty"`
	// Memory percent.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	Memory *int32 `json:"memory,omitempty"`
}

// OversellUsage configures the usage-aware ratio (docs/nodeoversell.md,
// usage-aware ratio).
type OversellUsage struct {
	// TargetUtilization per resource.
	// +optional
	// +kubebuilder:default={}
	TargetUtilization *TargetUtilization `json:"targetUtilization,omitempty"`

	// Interval between two evaluations (one read of metrics.k8s.io and of
	// the nodes' pods). metrics-server refreshes every --metric-resolution
	// (60 s by default, 10 s at least), so a shorter interval only re-reads.
	// +optional
	// +kubebuilder:default="30s"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('10m')",message="must be from 1s to 10m"
	Interval *metav1.Duration `json:"interval,omitempty"`

	// MinChangeInterval is the least time between two ratio changes of one
	// node (pressure back-off and a lowered spec.ratios do not wait).
	// +optional
	// +kubebuilder:default="2m"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('24h')",message="must be from 0s to 24h"
	MinChangeInterval *metav1.Duration `json:"minChangeInterval,omitempty"`

	// MaxStep is the largest change of a ratio in one step.
	// +optional
	// +kubebuilder:default="0.5"
	// +kubebuilder:validation:XValidation:rule="self != '0' && !self.matches('^0[.]0*$')",message="must be above 0"
	MaxStep RatioStep `json:"maxStep,omitempty"`

	// DeadBand: a usage-derived ratio closer than this to the ratio in use
	// changes nothing.
	// +optional
	// +kubebuilder:default="0.1"
	DeadBand RatioStep `json:"deadBand,omitempty"`

	// FallbackRatio applies (never above spec.ratios) to a node whose
	// metrics are missing, older than StaleAfter or out of range (negative,
	// above capacity). Default 1: without a measurement no overcommit is
	// justified; running pods keep their room (the cut is held), and the
	// change is spread by MaxStep and MinChangeInterval like any other.
	// +optional
	// +kubebuilder:default="1"
	FallbackRatio Ratio `json:"fallbackRatio,omitempty"`

	// StaleAfter is the age past which a node's metrics are stale.
	// Default 3m, three metrics-server resolutions.
	// +optional
	// +kubebuilder:default="3m"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('1h')",message="must be from 1s to 1h"
	StaleAfter *metav1.Duration `json:"staleAfter,omitempty"`

	// PressureThreshold, when set, makes a node whose usage crosses it back
	// off: ratio 1 (or the least its running pods need) and the NoSchedule
	// taint oversell.hookwright.io/held=pressure, until usage stays below
	// for PressureHold. Nothing is evicted. Tainting needs the ClusterRole
	// of config/node-taints bound to the operator.
	// +optional
	PressureThreshold *PressureThreshold `json:"pressureThreshold,omitempty"`

	// PressureHold is how long usage must stay below the threshold before
	// the back-off ends.
	// +optional
	// +kubebuilder:default="2m"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('24h')",message="must be from 0s to 24h"
	PressureHold *metav1.Duration `json:"pressureHold,omitempty"`
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
	// RatioCeiling is the highest ratio per resource the servers apply to
	// this NodeOversell's nodes: spec.ratios, or after spec.ratios was
	// lowered the ratios in use before, until no node's running pods need
	// more than spec.ratios. Written by the operator only (the status
	// subresource), so a node annotation cannot raise a node above it.
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=status,displayName="Ratio Ceiling"
	RatioCeiling *RatioCeiling `json:"ratioCeiling,omitempty"`
	// NodesBySource counts the nodes per ratio source (static, usage,
	// fallback, pressure) and held (above their target for their pods).
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=status,displayName="Nodes By Source"
	NodesBySource map[string]int32 `json:"nodesBySource,omitempty"`
	// Nodes lists, at most 50, the nodes whose ratio is not spec.ratios
	// (held first, then pressure, fallback and usage), with the ratio in
	// use and why; NodesBySource has the counts.
	// +optional
	// +kubebuilder:validation:MaxItems=50
	// +listType=map
	// +listMapKey=name
	// +operator-sdk:csv:customresourcedefinitions:type=status,displayName="Nodes"
	Nodes []NodeRatioStatus `json:"nodes,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	// +operator-sdk:csv:customresourcedefinitions:type=status,displayName="Conditions",xDescriptors="urn:alm:descriptor:io.kubernetes.conditions"
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// RatioCeiling is NodeOversellStatus.RatioCeiling: ratios, without the
// at-least-one rule of spec.ratios.
type RatioCeiling struct {
	// +optional
	CPU Ratio `json:"cpu,omitempty"`
	// +optional
	Memory Ratio `json:"memory,omitempty"`
}

// NodeRatioStatus is one node's ratio in NodeOversellStatus.Nodes.
type NodeRatioStatus struct {
	// Name of the node.
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// CPU and Memory are the ratios the operator set for the node.
	// +optional
	CPU string `json:"cpu,omitempty"`
	// +optional
	Memory string `json:"memory,omitempty"`
	// Source of the cpu ratio (static, usage, fallback, pressure), and of
	// the memory ratio when it differs ("cpu/memory").
	// +optional
	Source string `json:"source,omitempty"`
	// Message says why, e.g. what the pods request when held.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Message string `json:"message,omitempty"`
}

// NodeOversell inflates the allocatable of selected nodes. Its name is at
// most 63 characters: the operator puts it in the node label
// OversellNodeLabel.
// +kubebuilder:object:root=true
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63",message="metadata.name must be at most 63 characters (it is a node label value)"
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
