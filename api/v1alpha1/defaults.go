package v1alpha1

import (
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The defaults of the API, once. The +kubebuilder:default markers on the
// fields put them in the CRD schema, where the API server applies them on
// every write and read (structural defaulting); Default applies the same
// values in Go, for objects that never went through an API server
// (kube-inject --config files, fake clients, tests). TestDefaultsMatchMarkers
// runs the API server's defaulting algorithm over the generated CRDs and
// fails when the two disagree.
const (
	// DefaultReplicas is spec.server.replicas when unset.
	DefaultReplicas int32 = 2
	// DefaultSidecarTimeoutSeconds is a SidecarInjector's spec.timeoutSeconds
	// (the reason is on the field).
	DefaultSidecarTimeoutSeconds int32 = 5
	// DefaultOversellTimeoutSeconds is a NodeOversell's spec.timeoutSeconds:
	// small, since the kubelet's heartbeat client gives up after 10 s.
	DefaultOversellTimeoutSeconds int32 = 2
	// DefaultIssuerKind and DefaultIssuerGroup complete a
	// spec.certificate.issuerRef: a cert-manager Issuer.
	DefaultIssuerKind  = "Issuer"
	DefaultIssuerGroup = "cert-manager.io"
)

// Reinvocation policies (admissionregistration.k8s.io/v1 names).
const (
	ReinvocationNever    ReinvocationPolicy = "Never"
	ReinvocationIfNeeded ReinvocationPolicy = "IfNeeded"
)

// Default sets every unset field of si that has a default to it, as the
// API server does; set fields are left alone. An object read from the API
// server already carries them, so Default changes nothing there.
func (si *SidecarInjector) Default() {
	s := &si.Spec
	setDefault(&s.Policy, PolicyEnabled)
	setDefault(&s.NativeSidecars, NativeSidecarAuto)
	setDefault(&s.FailurePolicy, FailurePolicyFail)
	setDefault(&s.WhenUnreachable, FailurePolicyFail)
	setDefault(&s.ReinvocationPolicy, ReinvocationIfNeeded)
	defaultInt32(&s.TimeoutSeconds, DefaultSidecarTimeoutSeconds)
	s.Server.setDefaults()
	s.Certificate.setDefaults()
	s.Rollout.setDefaults()
}

// DefaultRolloutReadyTimeoutSeconds is spec.rollout.readyTimeoutSeconds'
// default: the kubelet's image pull back-off reaches its 5 min cap by then.
const DefaultRolloutReadyTimeoutSeconds int32 = 300

func (r *RolloutSpec) setDefaults() {
	setDefault(&r.Strategy, RolloutNone)
	setDefault(&r.NamespaceOrder, NamespacesAll)
	if r.MaxUnavailable == nil {
		one := intstr.FromInt32(1)
		r.MaxUnavailable = &one
	}
	defaultInt32(&r.ReadyTimeoutSeconds, DefaultRolloutReadyTimeoutSeconds)
}

// WithDefaults returns a deep copy of si with Default applied, for objects
// that must not change (a cache's).
func (si *SidecarInjector) WithDefaults() *SidecarInjector {
	c := si.DeepCopy()
	c.Default()
	return c
}

// Default sets every unset field of no that has a default to it, as the API
// server does; set fields are left alone. spec.priority defaults to 0, its
// zero value.
func (no *NodeOversell) Default() {
	s := &no.Spec
	setDefault(&s.FailurePolicy, FailurePolicyIgnore)
	defaultInt32(&s.TimeoutSeconds, DefaultOversellTimeoutSeconds)
	s.Server.setDefaults()
	s.Certificate.setDefaults()
	if s.Usage != nil {
		s.Usage.setDefaults()
	}
}

// Defaults of spec.usage (see OversellUsage for why).
const (
	DefaultTargetCPUPercent    int32 = 60
	DefaultTargetMemoryPercent int32 = 80
	DefaultUsageInterval             = 30 * time.Second
	DefaultMinChangeInterval         = 2 * time.Minute
	DefaultMaxStep                   = "0.5"
	DefaultDeadBand                  = "0.1"
	DefaultFallbackRatio             = "1"
	DefaultStaleAfter                = 3 * time.Minute
	DefaultPressureHold              = 2 * time.Minute
)

func (u *OversellUsage) setDefaults() {
	if u.TargetUtilization == nil {
		u.TargetUtilization = &TargetUtilization{}
	}
	defaultInt32(&u.TargetUtilization.CPU, DefaultTargetCPUPercent)
	defaultInt32(&u.TargetUtilization.Memory, DefaultTargetMemoryPercent)
	defaultDuration(&u.Interval, DefaultUsageInterval)
	defaultDuration(&u.MinChangeInterval, DefaultMinChangeInterval)
	setDefault(&u.MaxStep, DefaultMaxStep)
	setDefault(&u.DeadBand, DefaultDeadBand)
	setDefault(&u.FallbackRatio, DefaultFallbackRatio)
	defaultDuration(&u.StaleAfter, DefaultStaleAfter)
	defaultDuration(&u.PressureHold, DefaultPressureHold)
}

func defaultDuration(f **metav1.Duration, d time.Duration) {
	if *f == nil {
		*f = &metav1.Duration{Duration: d}
	}
}

// WithDefaults returns a deep copy of no with Default applied.
func (no *NodeOversell) WithDefaults() *NodeOversell {
	c := no.DeepCopy()
	c.Default()
	return c
}

func (s *ServerSpec) setDefaults() { defaultInt32(&s.Replicas, DefaultReplicas) }

func (c *CertificateSpec) setDefaults() {
	setDefault(&c.Mode, CertificateSelfSigned)
	if c.IssuerRef != nil {
		setDefault(&c.IssuerRef.Kind, DefaultIssuerKind)
		setDefault(&c.IssuerRef.Group, DefaultIssuerGroup)
	}
}

func setDefault[T ~string](f *T, v T) {
	if *f == "" {
		*f = v
	}
}

func defaultInt32(f **int32, v int32) {
	if *f == nil {
		*f = &v
	}
}
