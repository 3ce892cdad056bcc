package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Object is what SidecarInjector and NodeOversell have in common for the
// operator: the server and certificate specs, the conditions and the
// generations it reports in status.
// +kubebuilder:object:generate=false
type Object interface {
	metav1.Object
	runtime.Object
	// ServerSpec is spec.server.
	ServerSpec() ServerSpec
	// CertificateSpec is spec.certificate.
	CertificateSpec() CertificateSpec
	// StatusConditions points at status.conditions, for
	// k8s.io/apimachinery/pkg/api/meta.SetStatusCondition.
	StatusConditions() *[]metav1.Condition
	// SetObservedGeneration sets status.observedGeneration.
	SetObservedGeneration(int64)
	// SetServedGeneration sets status.servedGeneration.
	SetServedGeneration(int64)
	// StatusValue is a copy of status, to compare before and after a reconcile.
	StatusValue() any
}

var (
	_ Object = &SidecarInjector{}
	_ Object = &NodeOversell{}
)

// ServerSpec is spec.server.
func (si *SidecarInjector) ServerSpec() ServerSpec { return si.Spec.Server }

// CertificateSpec is spec.certificate.
func (si *SidecarInjector) CertificateSpec() CertificateSpec { return si.Spec.Certificate }

// StatusConditions points at status.conditions.
func (si *SidecarInjector) StatusConditions() *[]metav1.Condition { return &si.Status.Conditions }

// SetObservedGeneration sets status.observedGeneration.
func (si *SidecarInjector) SetObservedGeneration(g int64) { si.Status.ObservedGeneration = g }

// SetServedGeneration sets status.servedGeneration.
func (si *SidecarInjector) SetServedGeneration(g int64) { si.Status.ServedGeneration = g }

// StatusValue is a copy of status.
func (si *SidecarInjector) StatusValue() any { return *si.Status.DeepCopy() }

// ServerSpec is spec.server.
func (no *NodeOversell) ServerSpec() ServerSpec { return no.Spec.Server }

// CertificateSpec is spec.certificate.
func (no *NodeOversell) CertificateSpec() CertificateSpec { return no.Spec.Certificate }

// StatusConditions points at status.conditions.
func (no *NodeOversell) StatusConditions() *[]metav1.Condition { return &no.Status.Conditions }

// SetObservedGeneration sets status.observedGeneration.
func (no *NodeOversell) SetObservedGeneration(g int64) { no.Status.ObservedGeneration = g }

// SetServedGeneration sets status.servedGeneration.
func (no *NodeOversell) SetServedGeneration(g int64) { no.Status.ServedGeneration = g }

// StatusValue is a copy of status.
func (no *NodeOversell) StatusValue() any { return *no.Status.DeepCopy() }
