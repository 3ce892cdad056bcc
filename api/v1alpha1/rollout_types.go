package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Keys the rollout writes on what it changes.
const (
	// SidecarRolloutKey is the pod annotation the rollout sets when it
	// changes a running pod in place: JSON {"revision","at","restarts"}
	// (the changed containers' restartCount before the change), so the
	// rollout knows after an operator restart which pods are in flight.
	SidecarRolloutKey = "sidecar.hookwright.io/rollout"
	// SidecarRestartedForKey is the annotation the rollout sets on a
	// Deployment, StatefulSet or DaemonSet it restarted: the revision it
	// restarted it for. The restart itself is the pod template annotation
	// RestartedAtKey, as kubectl rollout restart sets it.
	SidecarRestartedForKey = "sidecar.hookwright.io/restarted-for"
	// RestartedAtKey is kubectl rollout restart's pod template annotation
	// (k8s.io/kubectl/pkg/polymorphichelpers/objectrestarter.go).
	RestartedAtKey = "kubectl.kubernetes.io/restartedAt"
)

// RolloutStrategy is how the operator brings running pods to the current
// revision.
// +kubebuilder:validation:Enum=None;InPlace;Restart
type RolloutStrategy string

// Rollout strategies.
const (
	// RolloutNone only reports (status.fleet); no pod is touched.
	RolloutNone RolloutStrategy = "None"
	// RolloutInPlace changes a running pod where Kubernetes allows it:
	// images of injected containers and native sidecars by a pod patch
	// (ValidatePodUpdate lets spec.containers[*].image and
	// spec.initContainers[*].image change), resources through the resize
	// subresource (KEP-1287, GA in v1.35). Other pods (missing sidecars,
	// other changes) restart their owner only with fallbackToRestart.
	RolloutInPlace RolloutStrategy = "InPlace"
	// RolloutRestart restarts the owning Deployment, StatefulSet or
	// DaemonSet as kubectl rollout restart does.
	RolloutRestart RolloutStrategy = "Restart"
)

// NamespaceOrder is how a rollout walks namespaces.
// +kubebuilder:validation:Enum=All;OneAtATime
type NamespaceOrder string

// Namespace orders.
const (
	// NamespacesAll rolls every namespace at once (within maxUnavailable).
	NamespacesAll NamespaceOrder = "All"
	// NamespacesOneAtATime finishes one namespace before starting the
	// next: spec.rollout.namespaces first, in their order, then the rest
	// by name.
	NamespacesOneAtATime NamespaceOrder = "OneAtATime"
)

// RolloutSpec is how the operator brings running pods up to the current
// revision. Acting on pods needs the rights of config/rollout (not in the
// default RBAC); without them the CR reports RolloutNotPermitted.
// +kubebuilder:validation:XValidation:rule="!has(self.fallbackToRestart) || !self.fallbackToRestart || self.strategy == 'InPlace'",message="spec.rollout.fallbackToRestart applies only to strategy InPlace"
type RolloutSpec struct {
	// Strategy: None (report only), InPlace or Restart.
	// +optional
	// +kubebuilder:default=None
	Strategy RolloutStrategy `json:"strategy,omitempty"`
	// FallbackToRestart (InPlace only) restarts the owner of a pod whose
	// change cannot be made in place (missing sidecars, env, command);
	// without it such pods stay outdated or missing, with the reason.
	// +optional
	FallbackToRestart bool `json:"fallbackToRestart,omitempty"`
	// MaxUnavailable is how many pods may be unavailable because of the
	// rollout at once, fleet-wide: a count or a percent of the matched
	// pods (rounded down, at least 1). A pod changed in place counts until
	// its changed containers are Ready again; a restarted owner counts its
	// unavailable replicas (at least 1) until its own rollout completes.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 : self.matches('^[1-9][0-9]?%$|^100%$')",message="maxUnavailable must be a count of at least 1 or a percent from 1% to 100%"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
	// Partition is how many of the pods to roll stay at their revision: a
	// count or a percent of them (rounded up), the last in rollout order.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^[0-9]{1,2}%$|^100%$')",message="partition must be a count of at least 0 or a percent from 0% to 100%"
	Partition *intstr.IntOrString `json:"partition,omitempty"`
	// Selector limits the rollout to pods with these labels (a canary).
	// +optional
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
	// NamespaceSelector limits the rollout to namespaces with these labels.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// Paused stops the rollout where it is: nothing is touched; pods in
	// flight finish on their own.
	// +optional
	Paused bool `json:"paused,omitempty"`
	// NamespaceOrder: All (default) or OneAtATime.
	// +optional
	// +kubebuilder:default=All
	NamespaceOrder NamespaceOrder `json:"namespaceOrder,omitempty"`
	// Namespaces are rolled first, in this order (OneAtATime); the rest
	// follow by name.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	Namespaces []string `json:"namespaces,omitempty"`
	// ReadyTimeoutSeconds is how long a pod changed in place may take to
	// have its changed containers Ready again before the rollout stops
	// (RolloutBlocked). An image pull error stops it at once.
	// +optional
	// +kubebuilder:default=300
	// +kubebuilder:validation:Minimum=5
	// +kubebuilder:validation:Maximum=3600
	ReadyTimeoutSeconds *int32 `json:"readyTimeoutSeconds,omitempty"`
}

// RolloutCount is a number of pods for one reason.
type RolloutCount struct {
	Reason string `json:"reason"`
	Count  int32  `json:"count"`
	// Pods names up to 3 (namespace/name).
	// +optional
	// +kubebuilder:validation:MaxItems=3
	Pods []string `json:"pods,omitempty"`
}

// RolloutStatus is the progress of spec.rollout towards status.revision.
type RolloutStatus struct {
	// Revision being rolled out.
	Revision string `json:"revision"`
	// Strategy of the rollout.
	Strategy RolloutStrategy `json:"strategy"`
	// Started is when the rollout to Revision began.
	// +optional
	Started *metav1.Time `json:"started,omitempty"`
	// Total is how many pods the rollout concerns: matched pods in the
	// selector and namespace selector, without the partition and the
	// pods it never touches (bare and Job pods, the operator's own). While
	// an owner rolls, its surge pods are counted too.
	Total int32 `json:"total"`
	// Updated of them are current and Ready (a pod changed in place once
	// its changed containers are).
	Updated int32 `json:"updated"`
	// Unavailable is how many pods are unavailable because of the rollout.
	Unavailable int32 `json:"unavailable"`
	// Partitioned is how many pods the partition holds back.
	// +optional
	Partitioned int32 `json:"partitioned,omitempty"`
	// Namespace being rolled (NamespaceOrder OneAtATime).
	// +optional
	Namespace string `json:"namespace,omitempty"`
	// InProgress names the owners (Kind/namespace/name) restarting, at
	// most 50 at once, then the pods (namespace/name) changing in place,
	// 100 in all.
	// +optional
	// +kubebuilder:validation:MaxItems=100
	InProgress []string `json:"inProgress,omitempty"`
	// Changed names up to 20 pods changed in place for Revision, newest
	// last, so a blocked rollout says what it already changed.
	// +optional
	// +kubebuilder:validation:MaxItems=20
	Changed []string `json:"changed,omitempty"`
	// Blocked says why nothing more is done (empty while progressing).
	// +optional
	Blocked string `json:"blocked,omitempty"`
	// BlockedGeneration is the CR generation a stop on a failed pod
	// (image pull, timeout) was taken at: the rollout resumes once the CR
	// changes.
	// +optional
	BlockedGeneration int64 `json:"blockedGeneration,omitempty"`
	// Skipped are the pods the rollout leaves alone, by reason (opted out,
	// bare pod, Job pod, the operator's own, not possible in place).
	// +optional
	// +kubebuilder:validation:MaxItems=16
	Skipped []RolloutCount `json:"skipped,omitempty"`
}

// Rollout conditions (SidecarInjector only).
const (
	// ConditionRolloutBlocked is True while a rollout is stopped: a
	// PodDisruptionBudget allowing no disruption (reason
	// DisruptionBudget, naming it), a pod whose changed containers did
	// not become Ready (ImagePull, ReadyTimeout, with the kubelet's
	// reason), a webhook not Ready (WebhookNotReady), an owner whose new
	// pods still lack the revision (RestartIneffective); False (Progressing,
	// Complete, Paused) otherwise. Absent with strategy None.
	ConditionRolloutBlocked = "RolloutBlocked"
	// ConditionRolloutNotPermitted is True (reason MissingRights) naming
	// the first right the operator lacks for the rollout (bind
	// config/rollout), False (Permitted) otherwise. Absent with strategy
	// None.
	ConditionRolloutNotPermitted = "RolloutNotPermitted"
)
