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
