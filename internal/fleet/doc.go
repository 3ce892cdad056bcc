// Package fleet classifies running pods by what they carry of one
// SidecarInjector's sidecars (current, outdated, missing, orphaned), sums
// them into the CR's status.fleet and its conditions, trims pods to what
// the classification reads (the operator's pod informer transform), and
// plans the CR's revision history (ControllerRevisions kept).
//
// Whether a pod should carry the sidecars is sidecar.Decide, the very
// function the webhook runs at admission: this package never decides on
// its own. It is pure: every function is a function of its arguments. It
// must not import a Kubernetes client (controller-runtime's client or
// cache, client-go's clientsets), the operator or the oversell engine
// (internal/importrules checks the whole closure).
package fleet
