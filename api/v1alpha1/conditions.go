package v1alpha1

// Every condition type the operator sets in a CR's status.conditions.

// Condition types shared by both kinds.
const (
	ConditionReady             = "Ready"
	ConditionCertificateReady  = "CertificateReady"
	ConditionWebhookConfigured = "WebhookConfigured"
	ConditionServerAvailable   = "ServerAvailable"
	ConditionConfigLoaded      = "ConfigLoaded"
	// ConditionEndpointsOwned is True when every endpoint behind the
	// server's Service is a pod of the server's Deployment, False (reason
	// ForeignEndpoints) naming the others, e.g. a pod that copied the
	// server pods' labels.
	ConditionEndpointsOwned = "EndpointsOwned"
)

// ConditionOvercommitted (NodeOversell only) is True when, at the last new generation of a
// NodeOversell, some selected node had more cpu or memory requested by its
// pods than the allocatable the new ratios give it (e.g. after lowering a
// ratio); the kubelet then rejects new pods there with OutOfcpu/OutOfmemory
// as soon as it sees the real values.
const ConditionOvercommitted = "Overcommitted"

// ConditionServerPodsHealthy is True when no server pod reports a
// failure, False with the kubelet's (or scheduler's, or ReplicaSet
// controller's) reason otherwise, e.g. CreateContainerConfigError.
const ConditionServerPodsHealthy = "ServerPodsHealthy"

// ConditionWebhookReachable is True when the operator's last live check
// proved that the API server calls the webhook and the webhook answers as
// it should: a server-side dry-run pod create in the CR's probe namespace
// comes back injected (SidecarInjector), a dry-run nodes/status patch of a
// selected node comes back amplified (NodeOversell). False names the
// failing step in the reason (WebhookProbeReason*) and the last success in
// the message; Unknown while there is nothing to probe yet.
const ConditionWebhookReachable = "WebhookReachable"

// ConditionFailurePolicyEnforced (SidecarInjector) is True when the
// webhook configuration carries the failurePolicy the spec asks for, False
// when it carries Ignore though the spec asks for Fail (the server is not
// yet Available or not yet reached, or whenUnreachable Ignore fell back).
// The message names the policy in effect.
const ConditionFailurePolicyEnforced = "FailurePolicyEnforced"

// Reasons of ConditionFailurePolicyEnforced.
const (
	FailurePolicyReasonAsRequested       = "AsRequested"
	FailurePolicyReasonServerUnavailable = "ServerNotAvailable"
	FailurePolicyReasonNotYetReachable   = "NotYetReachable"
	FailurePolicyReasonKeptUnreachable   = "FailKeptWhileUnreachable"
	FailurePolicyReasonFellBack          = "FellBackToIgnore"
)

// Reasons of ConditionWebhookReachable.
const (
	WebhookProbeReasonReachable     = "Reachable"
	WebhookProbeReasonTLSError      = "TLSError"
	WebhookProbeReasonTimeout       = "Timeout"
	WebhookProbeReasonUnreachable   = "Unreachable"
	WebhookProbeReasonWrongAnswer   = "WrongAnswer"
	WebhookProbeReasonNotCalled     = "NotCalled"
	WebhookProbeReasonProbeFailed   = "ProbeFailed"
	WebhookProbeReasonNotConfigured = "NotConfigured"
	WebhookProbeReasonNoTarget      = "NoProbeTarget"
	WebhookProbeReasonPending       = "ProbePending"
)

// Conditions of a NodeOversell's usage-aware ratio and of its holds.
const (
	// ConditionUsageMetrics (spec.usage only) is True when every selected
	// node had fresh, plausible metrics at the last evaluation; False
	// names the nodes on spec.usage.fallbackRatio and why (reason
	// MetricsUnavailable, StaleMetrics or OutOfRange).
	ConditionUsageMetrics = "UsageMetrics"
	// ConditionRatioHeld is True while some node's ratio is held above its
	// target because its running pods request more than the target would
	// give (a lowered ratio, a narrowed selector, a deletion, a usage or
	// pressure cut): the message names the nodes and the excess. Such
	// nodes carry the NoSchedule taint OversellTaintKey=ratio-cut.
	ConditionRatioHeld = "RatioHeld"
	// ConditionPressure (spec.usage.pressureThreshold only) is True while
	// some node backs off under pressure, naming them.
	ConditionPressure = "Pressure"
	// ConditionNodeTaints is False (reason NotPermitted) when the operator
	// could not set or remove its taint because it lacks patch on nodes
	// (bind config/node-taints); True otherwise, while it needs taints.
	ConditionNodeTaints = "NodeTaints"
)

// Fleet conditions (SidecarInjector only), from status.fleet.
// ConditionPodsUpToDate is True when no injected pod is outdated
// (reason UpToDate), False (reason Outdated) naming up to 5 outdated pods.
// ConditionPodsMissingSidecars is True (reason Missing) naming up to 5
// pods that should carry the sidecars and do not, False (reason
// NoneMissing) otherwise.
const (
	ConditionPodsUpToDate        = "PodsUpToDate"
	ConditionPodsMissingSidecars = "PodsMissingSidecars"
)

// ConditionServerRolloutWaiting is True while the operator holds back a
// change to this CR's server pod template (a new server image after an
// operator upgrade, a spec edit) because another hookwright server
// Deployment is still rolling: server Deployments of different CRs roll one
// at a time, so at most one webhook runs on a fresh, unproven set of pods.
// The message names the Deployment waited for. It is removed once the
// change is applied; a CR whose server never waited has none.
const ConditionServerRolloutWaiting = "ServerRolloutWaiting"

// ServerRolloutReasonWaiting is the reason of ConditionServerRolloutWaiting
// and of the Normal Event sent when the wait starts.
const ServerRolloutReasonWaiting = "WaitingForOtherServerRollout"
