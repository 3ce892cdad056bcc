package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/serverpolicy"
)

// Labels and names shared by every object the operator owns.
const (
	// FieldManager is the server-side apply field manager of every write.
	FieldManager = "hookwright"

	LabelName      = "app.kubernetes.io/name"
	LabelInstance  = "app.kubernetes.io/instance"
	LabelComponent = "app.kubernetes.io/component"
	// LabelManagedBy is set on every owned object and on the CA Secret; the
	// manager's cache only holds objects carrying it (see CacheByObject).
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedByValue = "hookwright"

	// CASecretName is the installation CA Secret in the operator namespace.
	CASecretName = "hookwright-ca"

	// ServerCertDir is where the serving certificate Secret is mounted in the
	// server pods: the webhook servers' default --cert-dir.
	ServerCertDir = "/tmp/k8s-webhook-server/serving-certs"
	// Ports of the server container (webhooks/serving and cmd defaults).
	WebhookPort = 9443
	ProbePort   = 8081
	MetricsPort = 8080

	// DefaultReplicas of a server Deployment when spec.server.replicas is unset.
	DefaultReplicas int32 = 2
)

// Kind is what differs between the two custom resources in the objects the
// lifecycle reconciler builds for them.
type Kind struct {
	// Short names the server in object names ("sidecar" or "oversell").
	Short string
	// Resource is the plural resource of the CR, for the server's ClusterRole.
	Resource string
	// WebhookName is the name of the single webhook in the configuration.
	WebhookName string
	// Path is the HTTP path the server serves admission reviews on.
	Path string
}

var (
	// SidecarKind describes SidecarInjector operands.
	SidecarKind = Kind{Short: "sidecar", Resource: "sidecarinjectors", WebhookName: "inject.sidecar.hookwright.io", Path: "/inject"}
	// OversellKind describes NodeOversell operands.
	OversellKind = Kind{Short: "oversell", Resource: "nodeoversells", WebhookName: "oversell.hookwright.io", Path: "/oversell"}
)

// BaseName is the name of every object owned by the CR named crName:
// "hookwright-<short>-<crName>". CR names are DNS subdomains of up to 253
// characters, while Service names must be DNS-1035 labels of at most 63, so
// dots become dashes and a name that is too long (or was changed) is cut and
// suffixed with 8 hex digits of the SHA-256 of the CR name, keeping it
// deterministic and unique.
func (k Kind) BaseName(crName string) string {
	name := "hookwright-" + k.Short + "-" + crName
	clean := strings.ReplaceAll(name, ".", "-")
	if clean == name && len(name) <= 63 {
		return name
	}
	sum := sha256.Sum256([]byte(crName))
	suffix := hex.EncodeToString(sum[:4])
	if len(clean) > 63-9 {
		clean = strings.TrimRight(clean[:63-9], "-")
	}
	return clean + "-" + suffix
}

// Operand is the kind-independent view of a SidecarInjector or NodeOversell.
type Operand struct {
	Object      client.Object
	Kind        Kind
	Server      v1alpha1.ServerSpec
	Certificate v1alpha1.CertificateSpec
	Conditions  *[]metav1.Condition
	// ObservedGeneration points into the CR's status.
	ObservedGeneration *int64
	// ServedGeneration points into the CR's status (ConfigLoaded).
	ServedGeneration *int64
}

// SidecarOperand views a SidecarInjector; the pointers alias si's status.
func SidecarOperand(si *v1alpha1.SidecarInjector) Operand {
	return Operand{
		Object: si, Kind: SidecarKind, Server: si.Spec.Server, Certificate: si.Spec.Certificate,
		Conditions: &si.Status.Conditions, ObservedGeneration: &si.Status.ObservedGeneration,
		ServedGeneration: &si.Status.ServedGeneration,
	}
}

// OversellOperand views a NodeOversell; the pointers alias no's status.
func OversellOperand(no *v1alpha1.NodeOversell) Operand {
	return Operand{
		Object: no, Kind: OversellKind, Server: no.Spec.Server, Certificate: no.Spec.Certificate,
		Conditions: &no.Status.Conditions, ObservedGeneration: &no.Status.ObservedGeneration,
		ServedGeneration: &no.Status.ServedGeneration,
	}
}

// Settings are the operator-wide inputs of the desired state.
type Settings struct {
	// Namespace is the operator's namespace: home of the CA Secret, default
	// server namespace, and excluded from injection.
	Namespace string
	// Image is the default server image (--server-image).
	Image string
	// AllowedNamespaces are the namespaces servers may run in
	// (--allowed-server-namespaces); empty means Namespace only. The cache
	// of namespaced objects is restricted to them (CacheOptions) and every
	// one is excluded from every SidecarInjector's namespaceSelector.
	AllowedNamespaces []string
	// AllowedImages are the server image patterns allowed besides Image
	// (--allowed-server-images; serverpolicy.MatchImage); empty means Image only.
	AllowedImages []string
	// Repairs limits drift repairs per owned object; zero values mean
	// DefaultRepairBudget.
	Repairs RepairBudget
	// Certificates tunes SelfSigned mode (CA and serving lifetimes,
	// rotation, clock, drain grace).
	Certificates CertificateSettings
	// CADir, if set, is a directory of CA files (*.crt, *.pem; in-cluster
	// the CA Secret mounted as a volume) whose CAs are published in every
	// SelfSigned caBundle together with the operator's own CAs.
	CADir string
	// Webhook configures the manager's validating webhook for the CRs
	// (validation.go); a zero value disables it.
	Webhook WebhookSettings
	// CSR configures mode CSR (csrmode.go).
	CSR CSRSettings
	// ProxyEnv is added to every server container: the cluster proxy
	// settings OLM gives the operator (HTTP_PROXY, HTTPS_PROXY, NO_PROXY
	// and their lower-case forms; operator-lib's proxy.ReadProxyVarsFromEnv).
	ProxyEnv []corev1.EnvVar
}

// RepairBudget bounds how often one owned object is repaired: at most Max
// repairs in any Window. Past that, another writer is fighting the operator
// (a GitOps tool or an injector rewriting caBundle): the operator stops,
// reports the writers from managedFields in a Warning Event and the Ready
// (and WebhookConfigured) condition, and tries again when the window allows.
type RepairBudget struct {
	Max    int
	Window time.Duration
}

// DefaultRepairBudget allows 5 repairs of one object per minute.
var DefaultRepairBudget = RepairBudget{Max: 5, Window: time.Minute}

// ServerPolicy is where and what the operator may run for a CR (the same
// policy the validating webhook enforces). Patterns are checked by the
// manager's flag parsing (serverpolicy.New); an invalid one here denies
// every image but the default.
func (s Settings) ServerPolicy() serverpolicy.Policy {
	p, err := serverpolicy.New(s.Namespace, s.Image, s.AllowedNamespaces, s.AllowedImages)
	if err != nil {
		p, _ = serverpolicy.New(s.Namespace, s.Image, s.AllowedNamespaces, nil)
	}
	return p
}
