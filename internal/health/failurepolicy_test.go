package health

import (
	"testing"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

func TestDecideFailurePolicy(t *testing.T) {
	const (
		fail   = v1alpha1.FailurePolicyFail
		ignore = v1alpha1.FailurePolicyIgnore
	)
	for _, c := range []struct {
		name       string
		in         FailurePolicyInput
		want       v1alpha1.FailurePolicy
		enforced   bool
		wantReason string
	}{
		{"ignore asked", FailurePolicyInput{Requested: ignore}, ignore, true, v1alpha1.FailurePolicyReasonAsRequested},
		{"ignore asked, server down", FailurePolicyInput{Requested: ignore, Reachable: "False"}, ignore, true, v1alpha1.FailurePolicyReasonAsRequested},
		{"new CR, nothing known", FailurePolicyInput{Requested: fail}, ignore, false, v1alpha1.FailurePolicyReasonServerUnavailable},
		{"unschedulable server", FailurePolicyInput{Requested: fail, Reachable: "False"}, ignore, false, v1alpha1.FailurePolicyReasonServerUnavailable},
		{"available, probe pending", FailurePolicyInput{Requested: fail, ServerAvailable: true, Reachable: "Unknown"}, ignore, false, v1alpha1.FailurePolicyReasonNotYetReachable},
		{"available, probe failed", FailurePolicyInput{Requested: fail, ServerAvailable: true, Reachable: "False"}, ignore, false, v1alpha1.FailurePolicyReasonNotYetReachable},
		{"reachable but not available", FailurePolicyInput{Requested: fail, Reachable: "True"}, ignore, false, v1alpha1.FailurePolicyReasonServerUnavailable},
		{"arms", FailurePolicyInput{Requested: fail, ServerAvailable: true, Reachable: "True"}, fail, true, v1alpha1.FailurePolicyReasonAsRequested},
		{"armed, healthy", FailurePolicyInput{Requested: fail, ServerAvailable: true, Reachable: "True", Armed: true}, fail, true, v1alpha1.FailurePolicyReasonAsRequested},
		{"armed, new config probe pending", FailurePolicyInput{Requested: fail, ServerAvailable: true, Reachable: "Unknown", Armed: true}, fail, true, v1alpha1.FailurePolicyReasonAsRequested},
		{"armed, unreachable, keep", FailurePolicyInput{Requested: fail, ServerAvailable: true, Reachable: "False", Armed: true}, fail, true, v1alpha1.FailurePolicyReasonKeptUnreachable},
		{"armed, unavailable, keep (default)", FailurePolicyInput{Requested: fail, WhenUnreachable: "", Reachable: "True", Armed: true}, fail, true, v1alpha1.FailurePolicyReasonKeptUnreachable},
		{"armed, unreachable, fall back", FailurePolicyInput{Requested: fail, WhenUnreachable: ignore, ServerAvailable: true, Reachable: "False", Armed: true}, ignore, false, v1alpha1.FailurePolicyReasonFellBack},
		{"armed, unavailable, fall back", FailurePolicyInput{Requested: fail, WhenUnreachable: ignore, Reachable: "True", Armed: true}, ignore, false, v1alpha1.FailurePolicyReasonFellBack},
		{"fell back, reachable again: re-arms", FailurePolicyInput{Requested: fail, WhenUnreachable: ignore, ServerAvailable: true, Reachable: "True"}, fail, true, v1alpha1.FailurePolicyReasonAsRequested},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := DecideFailurePolicy(c.in)
			if d.Effective != c.want || d.Enforced != c.enforced || d.Reason != c.wantReason || d.Message == "" {
				t.Fatalf("got %+v, want %s enforced=%v reason %s", d, c.want, c.enforced, c.wantReason)
			}
		})
	}
}
