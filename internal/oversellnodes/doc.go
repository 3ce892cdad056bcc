// Package oversellnodes is NodeOversell's work on nodes: the status
// totals of the nodes one NodeOversell amplifies, the overcommit check
// before new ratios apply, the resync that has the webhook re-evaluate every
// affected node, and the restore of raw allocatable when a node leaves the
// selector or the NodeOversell is deleted.
//
// totals.go, restore.go and requests.go are pure functions of nodes and
// pods; nodes.go is the I/O shell (Nodes). It must not import controllers/:
// the NodeOversell adapter there calls it.
package oversellnodes
