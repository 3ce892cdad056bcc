// Package fleet classifies running pods by what they carry of one
// SidecarInjector's sidecars (current, outdated, missing, orphaned), sums
// them into the CR's status.fleet and its conditions, trims pods to what
// the classification reads (the operator's pod informer transform), plans
// the CR's revision history (ControllerRevisions kept), and tells what a
// revision would change on a running pod (PlanPod: the container diff
// against the engine's own sidecar.Inject, in place or by restart) and on
// the whole fleet as if a CR were applied (PlanWhatIf).
//
// Whether a pod should carry the sidecars is sidecar.Decide, the very
// function the webhook runs at admission: this package never decides on
// its own. NewInjector is the one place a SidecarInjector becomes the
// compiled injector that the operator and the CLI classify with.
//
// It is pure: every function is a function of its arguments. It must not
// import a Kubernetes client (controller-runtime's client or cache,
// client-go's clientsets), the operator or the oversell engine
// (internal/importrules checks the whole closure). It may import
// internal/desired, itself pure, for the webhook configuration's
// excluded namespaces.
package fleet
