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
