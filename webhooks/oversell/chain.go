package oversell

import "github.com/hookwright/hookwright/api/v1alpha1"

// Overlapping NodeOversells.
//
// Every NodeOversell has its own server and its own
// MutatingWebhookConfiguration, whose objectSelector is the CR's
// nodeSelector (controllers.BuildNodeOversell). A node status write is sent
// to the webhook of every NodeOversell whose selector matches the node's
// labels before or after the write (the objectSelector is evaluated against
// the object and the old object: k8s.io/apiserver
// pkg/admission/plugin/webhook/predicates/object/matcher.go,
// MatchObjectSelector). The API server calls these webhooks one after
// another, in configuration name order (pkg/admission/configuration/
// mutating_webhook_manager.go sorts by name; plugin/webhook/mutating/
// dispatcher.go calls them in that order), and each sees the object as the
// previous one left it. Two rules keep that chain from compounding:
//
//   - Only the server of the winning NodeOversell changes the node (Route);
//     the others pass the write through unchanged. When no NodeOversell
//     selects the node any server restores it.
//   - The engine never takes an earlier webhook's output for the writer's
//     report (Decide reads a reporting writer's recorded raw from the
//     admitted object), so servers whose snapshots disagree for a moment
//     (two both believing they win during a priority change) still record
//     the raw exactly; the node then carries the last one's ratio until the
//     next write.

// reasonOtherWinner means another NodeOversell wins the node; its own server
// applies it, this one passes the write through.
const reasonOtherWinner Reason = "other-nodeoversell"

// Route tells the server of NodeOversell owner what to do for a node with
// these labels: act is false when another NodeOversell wins the node (pass
// the write through unchanged); otherwise p is the policy to apply, nil when
// none selects the node (restore it). An empty owner is a server acting for
// every NodeOversell (one server behind one webhook): it always acts.
// RouteNode also routes the nodes an operator still manages.
func (s *Snapshot) Route(nodeLabels map[string]string, owner string) (p *Policy, act bool) {
	return s.RouteNode(NodeState{Labels: nodeLabels}, owner)
}

// RouteNode is Route for a node with its annotations. A node no
// NodeOversell selects, labelled v1alpha1.OversellNodeLabel=<name> and
// carrying a target (v1alpha1.OversellTargetKey) for that name, is still
// that NodeOversell's (Snapshot.Holders), being deleted or not: the
// operator has not released it, because its running pods need the ratio
// (a narrowed selector, a changed label, a deletion). The operator
// releases a node by removing both in the patch that restores it.
func (s *Snapshot) RouteNode(n NodeState, owner string) (p *Policy, act bool) {
	p = s.policyFor(n.Labels)
	if p == nil {
		if by := n.Labels[v1alpha1.OversellNodeLabel]; by != "" && targetBy(n.Annotations) == by {
			p = s.Holders[by]
		}
	}
	if p != nil && owner != "" && p.Name != owner {
		return p, false
	}
	return p, true
}
