// Package controllers wires the operator's reconcilers: one lifecycle
// engine (lifecycle.go) that turns each SidecarInjector and NodeOversell
// into a running, self-healing webhook through named phases, the kind
// adapters it runs (sidecar.go, oversell.go), the reads behind the status
// checks (ServerPodsHealthy, ConfigLoaded, EndpointsOwned), OLM's
// Upgradeable gate, the manager's own validating webhook, and Setup.
//
// What is built lives in internal/desired, how it is written in
// internal/apply, certificates in internal/certificates/sources, NodeOversell's node
// work in internal/oversellnodes, spec.rollout in internal/rollout (run
// by fleet.go) and what the status checks decide in internal/health: this
// package only wires them. It
// must not be imported by those packages, nor by the webhook servers.
package controllers

// The operator reads its custom resources and writes their status.
// +kubebuilder:rbac:groups=admission.hookwright.io,resources=sidecarinjectors;nodeoversells,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=admission.hookwright.io,resources=sidecarinjectors/status;nodeoversells/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=admission.hookwright.io,resources=sidecarinjectors/finalizers;nodeoversells/finalizers,verbs=update
