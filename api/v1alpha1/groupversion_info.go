// Package v1alpha1 contains the hookwright API: SidecarInjector and
// NodeOversell, both cluster-scoped, in group admission.hookwright.io.
//
// It holds types, constants and the defaulting function (defaults.go) only:
// it must not import any other hookwright package, nor a Kubernetes client.
// +kubebuilder:object:generate=true
// +groupName=admission.hookwright.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of every hookwright kind.
	GroupVersion = schema.GroupVersion{Group: "admission.hookwright.io", Version: "v1alpha1"}

	// SchemeBuilder registers the kinds of this package with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the kinds of this package to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
