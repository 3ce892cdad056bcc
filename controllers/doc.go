// Package controllers holds the operator's reconcilers: they turn each
// SidecarInjector and NodeOversell into a running, self-healing webhook.
package controllers

// The operator reads its custom resources and writes their status.
// +kubebuilder:rbac:groups=admission.hookwright.io,resources=sidecarinjectors;nodeoversells,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=admission.hookwright.io,resources=sidecarinjectors/status;nodeoversells/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=admission.hookwright.io,resources=sidecarinjectors/finalizers;nodeoversells/finalizers,verbs=update
