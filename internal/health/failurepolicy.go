package health

import (
	"github.com/hookwright/hookwright/api/v1alpha1"
)

// FailurePolicyInput is what decides the failurePolicy a webhook
// configuration is published with.
type FailurePolicyInput struct {
	// Requested is spec.failurePolicy; WhenUnreachable spec.whenUnreachable
	// ("" means Fail).
	Requested, WhenUnreachable v1alpha1.FailurePolicy
	// ServerAvailable is the ServerAvailable condition being True.
	ServerAvailable bool
	// Reachable is the WebhookReachable condition: "True", "False" or
	// "Unknown" ("" when absent).
	Reachable string
	// Armed is the previous decision: Fail was in effect
	// (FailurePolicyEnforced True with Fail requested).
	Armed bool
}

// FailurePolicyDecision is the policy to publish and the
// FailurePolicyEnforced condition that reports it.
type FailurePolicyDecision struct {
	Effective v1alpha1.FailurePolicy
	// Enforced is the condition's status: Effective is what was requested.
	Enforced bool
	Reason   string
	Message  string
}

// DecideFailurePolicy publishes Fail only once it cannot take the cluster
// down by itself: the server Deployment is Available and the probe saw a
// real call answered. Until then Ignore (a configuration published before
// its server runs refused every pod in scope: kruise #1521). Once armed,
// an unavailable or unreachable server keeps Fail unless WhenUnreachable is
// Ignore, which falls back to Ignore and re-arms on the next success.
func DecideFailurePolicy(in FailurePolicyInput) FailurePolicyDecision {
	if in.Requested != v1alpha1.FailurePolicyFail {
		return FailurePolicyDecision{Effective: in.Requested, Enforced: true, Reason: v1alpha1.FailurePolicyReasonAsRequested,
			Message: "failurePolicy " + string(in.Requested) + " as requested"}
	}
	reachable := in.Reachable == "True"
	healthy := in.ServerAvailable && reachable
	switch {
	case healthy:
		return FailurePolicyDecision{Effective: v1alpha1.FailurePolicyFail, Enforced: true, Reason: v1alpha1.FailurePolicyReasonAsRequested,
			Message: "failurePolicy Fail in effect: the server is Available and the probe saw a call answered"}
	case !in.Armed && !in.ServerAvailable:
		return FailurePolicyDecision{Effective: v1alpha1.FailurePolicyIgnore, Reason: v1alpha1.FailurePolicyReasonServerUnavailable,
			Message: "failurePolicy Ignore until the server Deployment is Available (see ServerAvailable), then Fail as requested: pods in scope are admitted uninjected meanwhile"}
	case !in.Armed:
		return FailurePolicyDecision{Effective: v1alpha1.FailurePolicyIgnore, Reason: v1alpha1.FailurePolicyReasonNotYetReachable,
			Message: "failurePolicy Ignore until the probe sees the webhook answer a call (see WebhookReachable), then Fail as requested"}
	case in.WhenUnreachable == v1alpha1.FailurePolicyIgnore && (!in.ServerAvailable || in.Reachable == "False"):
		return FailurePolicyDecision{Effective: v1alpha1.FailurePolicyIgnore, Reason: v1alpha1.FailurePolicyReasonFellBack,
			Message: "failurePolicy Ignore: the server is not Available or not reachable and whenUnreachable is Ignore; Fail again once the probe succeeds"}
	case !in.ServerAvailable || in.Reachable == "False":
		return FailurePolicyDecision{Effective: v1alpha1.FailurePolicyFail, Enforced: true, Reason: v1alpha1.FailurePolicyReasonKeptUnreachable,
			Message: "failurePolicy Fail kept though the server is not Available or not reachable (whenUnreachable Fail): pods in scope are refused until it answers"}
	}
	// Armed, available, probe pending or unknown (a new configuration): stay.
	return FailurePolicyDecision{Effective: v1alpha1.FailurePolicyFail, Enforced: true, Reason: v1alpha1.FailurePolicyReasonAsRequested,
		Message: "failurePolicy Fail in effect: the server is Available; the probe of the current configuration is pending"}
}
