// Package oversellnodes is NodeOversell's work on nodes: the status
// totals of the nodes one NodeOversell amplifies, the overcommit check
// before new ratios apply, the resync that has the webhook re-evaluate every
// affected node, and the restore of raw allocatable when a node leaves the
// selector or the NodeOversell is deleted, the re-amplification of
// nodes whose status was stored while no oversell server answered, and
// each node's target (targets.go: the usage-aware ratio of
// internal/usageratio, cuts held for running pods, the pressure back-off,
// our taint, the releases), previewed for the validating webhook
// (preview.go).
//
// totals.go, restore.go, requests.go, targetsplan.go and reamplify.go's
// planning are pure functions of nodes, pods and metrics; nodes.go and
// targets.go are the I/O shell (Nodes). It must not import controllers/:
// the NodeOversell adapter there calls it.
package oversellnodes
