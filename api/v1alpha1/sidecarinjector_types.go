package v1alpha1

import (
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Label and annotation keys read and written by the sidecar injector.
const (
	// SidecarInjectKey is the per-pod opt-in/out, as a label (wins) or an annotation.
	SidecarInjectKey = "sidecar.hookwright.io/inject"
	// SidecarStatusKey records what was injected, so re-injection is idempotent.
	SidecarStatusKey = "sidecar.hookwright.io/status"
	// SidecarRevisionKey is the pod label naming the revision of the
	// injector's output the pod got (16 hex digits, the status
	// annotation's configHash), so pods are selectable by revision.
	SidecarRevisionKey = "sidecar.hookwright.io/revision"
	// SidecarInjectorLabelKey labels a SidecarInjector's ControllerRevisions
	// with its name.
	SidecarInjectorLabelKey = "sidecar.hookwright.io/injector"
	// SidecarTemplatesKey is a comma-separated list of template names to apply
	// instead of spec.defaultTemplates.
	SidecarTemplatesKey = "sidecar.hookwright.io/templates"
	// SidecarNativeKey overrides spec.nativeSidecars per pod ("true"/"false").
	SidecarNativeKey = "sidecar.hookwright.io/native-sidecar"
)

// SidecarOptOutLabelValues are the common spellings of a SidecarInjectKey
// label value that opts a pod out (the injector reads true, y, yes, on and
// false, n, no, off in any case). The operator excludes them in the
// webhook's objectSelector, so an opted-out pod is created without calling
// the injector and survives its outage. Label selectors compare exactly,
// so rarer spellings ("fALSE") still reach the webhook, which skips them by
// the same rule; the result is the same since the label opt-out wins over
// every selector and the policy.
var SidecarOptOutLabelValues = []string{"false", "False", "FALSE", "n", "N", "no", "No", "NO", "off", "Off", "OFF"}

// InjectionPolicy is what a pod that says nothing about injection gets.
// +kubebuilder:validation:Enum=Enabled;Disabled
type InjectionPolicy string

// Injection policies.
const (
	PolicyEnabled  InjectionPolicy = "Enabled"
	PolicyDisabled InjectionPolicy = "Disabled"
)

// NativeSidecarMode controls whether sidecars go into initContainers with
// restartPolicy Always (KEP-753, SidecarContainers, on by default since v1.29).
// +kubebuilder:validation:Enum=Auto;Enabled;Disabled
type NativeSidecarMode string

// Native sidecar modes.
const (
	NativeSidecarAuto     NativeSidecarMode = "Auto"
	NativeSidecarEnabled  NativeSidecarMode = "Enabled"
	NativeSidecarDisabled NativeSidecarMode = "Disabled"
)

// ReinvocationPolicy is the reinvocationPolicy of the webhook configuration.
// +kubebuilder:validation:Enum=Never;IfNeeded
type ReinvocationPolicy string

// NamedTemplate is a Go text/template (with sprig functions) that renders a
// partial pod spec in YAML, merged onto the pod with strategic-merge-patch.
type NamedTemplate struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// Template text. It renders YAML with optional top-level keys metadata and spec.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=262144
	Template string `json:"template"`
	// InitContainerPlacement places the init containers this template
	// injects among the pod's own. Without it they go ahead of the pod's
	// init containers with native sidecars, and after them without.
	// +optional
	InitContainerPlacement *InitContainerPlacement `json:"initContainerPlacement,omitempty"`
}

// InitContainerPosition is where a template's injected init containers go.
// +kubebuilder:validation:Enum=First;After
type InitContainerPosition string

// Init container positions.
const (
	// InitContainersFirst puts them ahead of every init container of the pod.
	InitContainersFirst InitContainerPosition = "First"
	// InitContainersAfter puts them right after the pod's own init
	// container named by InitContainerPlacement.After.
	InitContainersAfter InitContainerPosition = "After"
)

// InitContainerPlacement places the init containers a template injects: its
// spec.initContainers and, with native sidecars, its sidecars (which become
// init containers with restartPolicy Always, KEP-753). Init containers
// start in list order, the next once a regular one has exited successfully
// or a native sidecar has started (its startupProbe, if any, passed), so
// After lets the pod's own agent start before the injected proxy
// (istio/istio#53920).
// A container the pod already declares stays where the pod put it.
// +kubebuilder:validation:XValidation:rule="self.position == 'After' ? has(self.after) : !has(self.after)",message="initContainerPlacement.after is required with position After and not allowed with position First"
type InitContainerPlacement struct {
	// Position is First (ahead of all of the pod's init containers) or
	// After (right after the pod's init container named by after).
	Position InitContainerPosition `json:"position"`
	// After names the pod's own init container the injected ones follow,
	// in template order. When the pod has no init container of that name
	// they go where they would without a placement (ahead of the pod's
	// init containers with native sidecars, after them without), and the
	// admission answer carries a warning naming the template.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	After string `json:"after,omitempty"`
}

// SidecarInjectorSpec defines what is injected into which pods.
// +kubebuilder:validation:XValidation:rule="!has(self.defaultTemplates) || self.defaultTemplates.all(d, has(self.templates) && self.templates.exists(t, t.name == d))",messageExpression="'spec.defaultTemplates names no template in spec.templates: ' + self.defaultTemplates.filter(d, !has(self.templates) || !self.templates.exists(t, t.name == d))[0]",message="every spec.defaultTemplates entry must name a template in spec.templates"
type SidecarInjectorSpec struct {
	// Policy for pods that carry no inject label or annotation.
	// +optional
	// +kubebuilder:default=Enabled
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Policy",xDescriptors={"urn:alm:descriptor:com.tectonic.ui:select:Enabled","urn:alm:descriptor:com.tectonic.ui:select:Disabled"}
	Policy InjectionPolicy `json:"policy,omitempty"`

	// NamespaceSelector of the webhook configuration. kube-system, kube-public,
	// kube-node-lease and the operator's namespace are always excluded.
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Namespace Selector",xDescriptors="urn:alm:descriptor:com.tectonic.ui:selector:core:v1:Namespace"
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`

	// ObjectSelector of the webhook configuration.
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Object Selector",xDescriptors="urn:alm:descriptor:com.tectonic.ui:selector:core:v1:Pod"
	ObjectSelector *metav1.LabelSelector `json:"objectSelector,omitempty"`

	// NeverInjectSelector: pods matching any of these are not injected unless they
	// opt in explicitly. Wins over AlwaysInjectSelector.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Never Inject Selector"
	NeverInjectSelector []metav1.LabelSelector `json:"neverInjectSelector,omitempty"`

	// AlwaysInjectSelector: pods matching any of these are injected unless they
	// opt out explicitly.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Always Inject Selector"
	AlwaysInjectSelector []metav1.LabelSelector `json:"alwaysInjectSelector,omitempty"`

	// InjectHostNetwork allows injection into hostNetwork pods.
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Inject Host Network Pods",xDescriptors="urn:alm:descriptor:com.tectonic.ui:booleanSwitch"
	InjectHostNetwork bool `json:"injectHostNetwork,omitempty"`

	// Templates by name.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=32
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Templates"
	Templates []NamedTemplate `json:"templates,omitempty"`

	// DefaultTemplates are applied, in order, when the pod names none. Each
	// name may appear once (a repeat would inject twice).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Default Templates"
	DefaultTemplates []string `json:"defaultTemplates,omitempty"`

	// Values is free-form data handed to templates as .Values.
	// +optional
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Type=object
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Template Values"
	Values *apiextensionsv1.JSON `json:"values,omitempty"`

	// NativeSidecars puts injected sidecars into initContainers with
	// restartPolicy Always. Auto enables it when the API server is v1.29 or later.
	// +optional
	// +kubebuilder:default=Auto
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Native Sidecars",xDescriptors={"urn:alm:descriptor:com.tectonic.ui:select:Auto","urn:alm:descriptor:com.tectonic.ui:select:Enabled","urn:alm:descriptor:com.tectonic.ui:select:Disabled"}
	NativeSidecars NativeSidecarMode `json:"nativeSidecars,omitempty"`

	// FailurePolicy of the webhook configuration. Fail takes effect only
	// once the server Deployment is Available and the operator's probe saw
	// a real call answered (WebhookReachable True): until then the
	// configuration is published with Ignore, so a server that cannot
	// start never blocks the pods in scope (the FailurePolicyEnforced
	// condition shows the policy in effect and why). Istio's validation
	// webhook and Kyverno start the same way.
	// +optional
	// +kubebuilder:default=Fail
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Failure Policy",xDescriptors={"urn:alm:descriptor:com.tectonic.ui:select:Fail","urn:alm:descriptor:com.tectonic.ui:select:Ignore"}
	FailurePolicy FailurePolicy `json:"failurePolicy,omitempty"`

	// WhenUnreachable is the failurePolicy published, after Fail took
	// effect, while the server is not Available or the probe fails
	// (WebhookReachable False). Fail (default) keeps refusing pods in
	// scope: a user who asked for Fail wants a pod refused rather than
	// created without its sidecar (a security or mesh proxy), and a
	// replica outage is what replicas, the PodDisruptionBudget and the
	// drain are for. Ignore falls back to admitting pods uninjected until
	// the probe succeeds again, as Kyverno does when its health Lease goes
	// stale: availability over injection (the fleet status and rollouts
	// then restart what was created uninjected). Either way the
	// FailurePolicyEnforced condition says which is in effect.
	// +optional
	// +kubebuilder:default=Fail
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Failure Policy When Unreachable",xDescriptors={"urn:alm:descriptor:com.tectonic.ui:select:Fail","urn:alm:descriptor:com.tectonic.ui:select:Ignore"}
	WhenUnreachable FailurePolicy `json:"whenUnreachable,omitempty"`

	// TimeoutSeconds of the webhook configuration, in seconds: how long
	// the API server waits for the injector before the failure policy
	// applies (Fail refuses the pod, Ignore creates it without sidecars).
	// 5 by default, from the latency measured on a real node
	// (docs/failsafe.md): the API server's calls took at most 0.1 s (mean
	// 6 ms) at 45 pod creates a second, and no create took over 2.5 s on a
	// 2-core machine at load 60 to 90. Twice that worst case, and half the
	// API server's own default of 10 s, so a hung server holds each pod
	// create in scope 5 s, not 10. Raise it on control planes slower than
	// that.
	// +optional
	// +kubebuilder:default=5
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=30
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Timeout Seconds",xDescriptors="urn:alm:descriptor:com.tectonic.ui:number"
	TimeoutSeconds *int32 `json:"timeoutSeconds,omitempty"`

	// ReinvocationPolicy of the webhook configuration.
	// +optional
	// +kubebuilder:default=IfNeeded
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Reinvocation Policy",xDescriptors={"urn:alm:descriptor:com.tectonic.ui:select:Never","urn:alm:descriptor:com.tectonic.ui:select:IfNeeded"}
	ReinvocationPolicy ReinvocationPolicy `json:"reinvocationPolicy,omitempty"`

	// Server is the webhook server Deployment the operator runs.
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Webhook Server"
	Server ServerSpec `json:"server,omitempty"`

	// Certificate is the server's serving certificate.
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Serving Certificate"
	Certificate CertificateSpec `json:"certificate,omitempty"`

	// Revision pins what the servers inject to a kept revision (the
	// status.revision of an earlier spec, kept as ControllerRevision
	// <name>-<revision>): its templates, default templates, values and
	// native sidecar mode replace the spec's. Empty: the spec's own.
	// +optional
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{16}$`
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Pinned Revision"
	Revision string `json:"revision,omitempty"`

	// Rollout brings running pods up to status.revision. Default: report
	// only.
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=spec,displayName="Rollout"
	Rollout RolloutSpec `json:"rollout,omitempty"`
}

// PinnedRevision is the content of a pinned revision, copied by the
// operator from its ControllerRevision so the servers, which read only
// their CR, inject it.
type PinnedRevision struct {
	// Revision is spec.revision.
	Revision string `json:"revision"`
	// +optional
	Templates []NamedTemplate `json:"templates,omitempty"`
	// +optional
	DefaultTemplates []string `json:"defaultTemplates,omitempty"`
	// +optional
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Type=object
	Values *apiextensionsv1.JSON `json:"values,omitempty"`
	// +optional
	NativeSidecars NativeSidecarMode `json:"nativeSidecars,omitempty"`
}

// SidecarInjectorStatus is filled by the operator.
type SidecarInjectorStatus struct {
	// ObservedGeneration is the generation the operator last reconciled.
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=status,displayName="Observed Generation"
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// ServedGeneration is the generation the webhook servers report serving.
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=status,displayName="Served Generation"
	ServedGeneration int64 `json:"servedGeneration,omitempty"`
	// Revision is the revision the servers inject (16 hex digits, the
	// pod label sidecar.hookwright.io/revision of pods injected with it):
	// spec.revision when pinned, else the spec's own. The operator keeps the last 10 revisions as ControllerRevisions
	// named <name>-<revision> in its namespace, owned by this CR.
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=status,displayName="Revision"
	Revision string `json:"revision,omitempty"`
	// Pinned is the content of spec.revision while it is set and kept.
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=status,displayName="Pinned Revision"
	Pinned *PinnedRevision `json:"pinned,omitempty"`
	// Fleet counts the running pods by what they carry of this injector's
	// sidecars, as the operator's pod informer last saw them.
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=status,displayName="Fleet"
	Fleet *FleetStatus `json:"fleet,omitempty"`
	// Rollout is the progress of spec.rollout (absent with strategy None).
	// +optional
	// +operator-sdk:csv:customresourcedefinitions:type=status,displayName="Rollout"
	Rollout *RolloutStatus `json:"rollout,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	// +operator-sdk:csv:customresourcedefinitions:type=status,displayName="Conditions",xDescriptors="urn:alm:descriptor:io.kubernetes.conditions"
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// FleetCounts are pod counts by state. A pod is matched when the
// injector's own decision (namespace and object selectors, never/always
// selectors, inject label and annotation, hostNetwork rule, policy) says it
// should carry the sidecars; injected when it carries them (this
// injector's status annotation, its containers present). Matched and
// injected pods are current (at status.revision) or outdated (another
// revision); matched pods without them are missing; injected pods that no
// longer match are orphaned. Pods that have finished (Succeeded, Failed)
// or are being deleted are not counted.
type FleetCounts struct {
	MatchedPods  int32 `json:"matchedPods"`
	InjectedPods int32 `json:"injectedPods"`
	CurrentPods  int32 `json:"currentPods"`
	OutdatedPods int32 `json:"outdatedPods"`
	MissingPods  int32 `json:"missingPods"`
	OrphanedPods int32 `json:"orphanedPods"`
}

// NamespaceFleet is one namespace's counts.
type NamespaceFleet struct {
	Name        string `json:"name"`
	FleetCounts `json:",inline"`
}

// FleetStatus is the state of the pods running with or without this
// injector's sidecars.
type FleetStatus struct {
	FleetCounts `json:",inline"`
	// Namespaces are the 20 namespaces with the most outdated plus missing
	// pods (then by name), among those with a matched or injected pod.
	// +optional
	// +kubebuilder:validation:MaxItems=20
	Namespaces []NamespaceFleet `json:"namespaces,omitempty"`
	// NamespacesTotal is how many namespaces have a matched or injected pod.
	NamespacesTotal int32 `json:"namespacesTotal"`
}

// SidecarInjector injects sidecar containers into pods at CREATE.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +operator-sdk:csv:customresourcedefinitions:displayName="Sidecar Injector",resources={{Deployment,v1,"hookwright-sidecar-<name>"},{Service,v1,"hookwright-sidecar-<name>"},{Secret,v1,"hookwright-sidecar-<name>-tls"},{MutatingWebhookConfiguration,v1,"hookwright-sidecar-<name>"}}
// +kubebuilder:resource:scope=Cluster,shortName=sci,categories=hookwright
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Policy",type=string,JSONPath=`.spec.policy`
// +kubebuilder:printcolumn:name="Served",type=integer,JSONPath=`.status.servedGeneration`
// +kubebuilder:printcolumn:name="Revision",type=string,JSONPath=`.status.revision`,priority=1
// +kubebuilder:printcolumn:name="Matched",type=integer,JSONPath=`.status.fleet.matchedPods`
// +kubebuilder:printcolumn:name="Current",type=integer,JSONPath=`.status.fleet.currentPods`
// +kubebuilder:printcolumn:name="Outdated",type=integer,JSONPath=`.status.fleet.outdatedPods`
// +kubebuilder:printcolumn:name="Missing",type=integer,JSONPath=`.status.fleet.missingPods`
// +kubebuilder:printcolumn:name="Orphaned",type=integer,JSONPath=`.status.fleet.orphanedPods`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SidecarInjector struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SidecarInjectorSpec   `json:"spec,omitempty"`
	Status SidecarInjectorStatus `json:"status,omitempty"`
}

// SidecarInjectorList is a list of SidecarInjector.
// +kubebuilder:object:root=true
type SidecarInjectorList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SidecarInjector `json:"items"`
}

func init() {
	SchemeBuilder.Register(&SidecarInjector{}, &SidecarInjectorList{})
}
