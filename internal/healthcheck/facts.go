package healthcheck

import (
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// Facts is everything the checks judge, as the command read it. A fact
// that could not be read carries its error, and the checks built on it
// fail naming that error instead of the finding.
type Facts struct {
	// Now is the time certificate lifetimes are measured from.
	Now time.Time
	// CertWarning is the remaining lifetime under which a certificate or
	// CA is a warning (30 days by default; linkerd warns under 60).
	CertWarning time.Duration
	// KubeletStatusTimeout is the kubelet's client timeout for a node
	// status update (10 s, kubelet nodeStatusUpdate; see docs/cli.md).
	KubeletStatusTimeout time.Duration

	// ServerVersion is the API server's gitVersion ("v1.37.2"); its error
	// makes the run stop after the first check (the API is unreachable).
	ServerVersion Got[string]
	// CLIVersion is this binary's version (internal/version.Version).
	CLIVersion string

	// CRDs are ours by name ("sidecarinjectors.admission.hookwright.io");
	// a NotFound error means the CRD is missing.
	CRDs map[string]Got[*apiextensionsv1.CustomResourceDefinition]

	// OperatorNamespace is where the operator runs.
	OperatorNamespace string
	// Operator is the operator's Deployment.
	Operator Got[*appsv1.Deployment]
	// Lease is the operator's leader election Lease.
	Lease Got[*coordinationv1.Lease]

	// CRs are every SidecarInjector and NodeOversell; the error is the
	// list's (a missing CRD gives NotFound).
	CRs Got[[]CR]

	// MutatingWebhooks are every MutatingWebhookConfiguration of the cluster.
	MutatingWebhooks Got[[]admissionregistrationv1.MutatingWebhookConfiguration]
	// EndpointSlices are the slices of each Service our webhooks call, by
	// "namespace/name".
	EndpointSlices map[string]Got[[]discoveryv1.EndpointSlice]

	// Pre holds the facts of `check --pre`.
	Pre PreFacts
}

// CR is one SidecarInjector or NodeOversell and what it owns.
type CR struct {
	// Kind is "SidecarInjector" or "NodeOversell".
	Kind       string
	Name       string
	Generation int64
	// ObservedGeneration is status.observedGeneration.
	ObservedGeneration int64
	Conditions         []metav1.Condition
	// Fleet is a SidecarInjector's status.fleet.
	Fleet *v1alpha1.FleetStatus
	// WebhookConfiguration is the name of the MutatingWebhookConfiguration
	// the operator creates for it.
	WebhookConfiguration string
	// ServingSecretNamespace is the server's namespace.
	ServingSecretNamespace string
	// ServingSecret is the Secret the server mounts (tls.crt).
	ServingSecret Got[*corev1.Secret]
	// Server is the server's Deployment.
	Server Got[*appsv1.Deployment]
}

// PreFacts are the facts of `check --pre`, read before an install.
type PreFacts struct {
	// Resources are the API server's discovery, by group version
	// ("v1", "certificates.k8s.io/v1beta1") to resource names
	// (subresources as "pods/resize").
	Resources Got[map[string][]string]
	// Access are the installer's rights, asked with SelfSubjectAccessReview.
	Access []Access
}

// Access is one SelfSubjectAccessReview's answer.
type Access struct {
	Verb, Group, Resource, Namespace string
	Allowed                          bool
	// Reason is the authorizer's reason, when it gave one.
	Reason string
	Err    error
}
