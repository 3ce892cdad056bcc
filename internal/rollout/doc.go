// Package rollout carries out a SidecarInjector's spec.rollout: the code
// that changes users' running pods. Each fleet reconcile runs one Step,
// which brings the CR's pods towards its current revision by at most
// maxUnavailable pods in flight, in place (new images, pods/resize) or by
// restarting their owner, and writes status.rollout, the conditions
// RolloutBlocked and RolloutNotPermitted, Events and metrics.
//
// What to do is decided by internal/fleet's pure functions (PlanBatch,
// PlanPod, Actions, BlockingPDB, OwnerProgress, InPlaceProgress); this
// package is the shell that reads the cluster for them and writes what
// they say. By concern:
//
//   - step.go: Roller, Step, and the step's in-flight bookkeeping (what
//     counts against maxUnavailable) in one place;
//   - inplace.go: pods changed in place and their progress;
//   - restart.go: owner restarts, each written ahead into
//     status.rollout.inProgress, and the owners a restarted operator
//     resumes from (the record, and discovery of unrecorded restarts);
//   - workload.go: Deployment, StatefulSet and DaemonSet as one table;
//   - access.go: the rights the strategy needs (SelfSubjectAccessReview);
//   - disruption.go: what holds a disruption back (PodDisruptionBudgets,
//     a webhook not ready to inject the restarted pods);
//   - memo.go: every cache kept between steps, behind one mutex;
//   - status.go: status.rollout, the conditions, Events and metrics, and
//     the fleet's share of the status (Status, FieldManager) that the
//     fleet reconciler and the write-ahead apply.
//
// The rollout's state lives in the cluster (the pods' rollout
// annotation, the owners' restarted-for annotation, status.rollout), so
// a restarted or new leader resumes it without exceeding maxUnavailable;
// the memo only saves reads.
//
// It may use a Kubernetes client (controller-runtime's client, client-go's
// discovery and events). It must not import the operator, the oversell
// engine, image tooling or the test harness: controllers/fleet.go wires it
// (internal/importrules checks the whole closure).
package rollout
