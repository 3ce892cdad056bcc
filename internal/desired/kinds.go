package desired

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/serverpolicy"
)

// Labels and names shared by every object the operator owns.
const (
	labelName      = "app.kubernetes.io/name"
	LabelInstance  = "app.kubernetes.io/instance"
	LabelComponent = "app.kubernetes.io/component"
	// LabelManagedBy is set on every owned object and on the CA Secret; the
	// manager's cache only holds objects carrying it.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedByValue = "hookwright"

	// CASecretName is the installation CA Secret in the operator namespace.
	CASecretName = "hookwright-ca"

	// serverCertDir is where the serving certificate Secret is mounted in the
	// server pods: the webhook servers' default --cert-dir.
	serverCertDir = "/tmp/k8s-webhook-server/serving-certs"
	// Ports of the server container (webhooks/serving and cmd defaults).
	WebhookPort = 9443
	probePort   = 8081
	MetricsPort = 8080

	// defaultReplicas of a server Deployment when spec.server.replicas is unset.
	defaultReplicas int32 = 2

	// ServerDrainPeriod is the servers' --drain-period: after SIGTERM a
	// server fails readiness and keeps serving this long, each answer
	// closing its connection, so the endpoint removal reaches kube-proxy
	// and the API server and their pooled connections move before the
	// listener closes (webhooks/listener.DefaultDrainPeriod says why 5 s).
	ServerDrainPeriod = 5 * time.Second
	// ServerCloseWait is the servers' --drain-close-wait: after the drain
	// period a server keeps serving until the API server has closed every
	// connection it still holds, at most this long, because a server that
	// closes an idle keep-alive connection races a call the API server
	// sends on it, and the API server does not retry a POST that got EOF
	// (kubernetes #127335). 90 s is the API server's idle timeout for
	// webhook connections (webhooks/listener.DefaultCloseWait).
	ServerCloseWait = 90 * time.Second
	// ServerTerminationGracePeriodSeconds is above what a server needs to
	// stop: the drain, the close wait, in-flight reviews up to the 30 s
	// request timeout plus 1 s (listener.Options.ShutdownBound: 126 s),
	// and a few seconds for the manager's other runnables. No preStop
	// hook: the process drains by itself on SIGTERM, and the image has no
	// shell to sleep in.
	ServerTerminationGracePeriodSeconds int64 = 135

	// serverFSGroup is the server pods' fsGroup: the group of the
	// operator image's user (65532:65532) and of the mounted serving Secret.
	serverFSGroup int64 = 65532
)

// Object is what every owned object is: Kubernetes metadata and a runtime
// type (the same method set as controller-runtime's client.Object).
type Object interface {
	metav1.Object
	runtime.Object
}

// Kind is what differs between the two custom resources in the objects
// built for them.
type Kind struct {
	// Name is the CR's API kind ("SidecarInjector" or "NodeOversell").
	Name string
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
	// SidecarKind describes SidecarInjector CRs.
	SidecarKind = Kind{Name: "SidecarInjector", Short: "sidecar", Resource: "sidecarinjectors", WebhookName: "inject.sidecar.hookwright.io", Path: "/inject"}
	// OversellKind describes NodeOversell CRs.
	OversellKind = Kind{Name: "NodeOversell", Short: "oversell", Resource: "nodeoversells", WebhookName: "oversell.hookwright.io", Path: "/oversell"}
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

// CR is the kind-independent view of a SidecarInjector or NodeOversell.
type CR struct {
	// Object is the CR itself; its status is written through its accessors.
	Object v1alpha1.Object
	Kind   Kind
	// Server and Certificate are its spec.server and spec.certificate.
	Server      v1alpha1.ServerSpec
	Certificate v1alpha1.CertificateSpec
}

// NewCR views o, a CR of kind k.
func NewCR(k Kind, o v1alpha1.Object) CR {
	return CR{Object: o, Kind: k, Server: o.ServerSpec(), Certificate: o.CertificateSpec()}
}

// SidecarCR views a SidecarInjector.
func SidecarCR(si *v1alpha1.SidecarInjector) CR { return NewCR(SidecarKind, si) }

// OversellCR views a NodeOversell.
func OversellCR(no *v1alpha1.NodeOversell) CR { return NewCR(OversellKind, no) }

// Conditions are the CR's status.conditions.
func (cr CR) Conditions() []metav1.Condition { return *cr.Object.StatusConditions() }

// Base is the name of every object cr owns (Kind.BaseName).
func (cr CR) Base() string { return cr.Kind.BaseName(cr.Object.GetName()) }

// Settings are the operator-wide inputs of the desired objects.
type Settings struct {
	// Namespace is the operator's namespace: home of the CA Secret, default
	// server namespace, and excluded from injection.
	Namespace string
	// Image is the default server image (--server-image).
	Image string
	// AllowedNamespaces are the namespaces servers may run in
	// (--allowed-server-namespaces); empty means Namespace only. Every one
	// is excluded from every SidecarInjector's namespaceSelector.
	AllowedNamespaces []string
	// AllowedImages are the server image patterns allowed besides Image
	// (--allowed-server-images; serverpolicy.MatchImage); empty means Image only.
	AllowedImages []string
	// ProxyEnv is added to every server container: the cluster proxy
	// settings OLM gives the operator (HTTP_PROXY, HTTPS_PROXY, NO_PROXY
	// and their lower-case forms; operator-lib's proxy.ReadProxyVarsFromEnv).
	ProxyEnv []corev1.EnvVar
	// ExcludedNamespaces (--excluded-namespaces) are kept from every
	// SidecarInjector's webhook besides the system and server namespaces:
	// the installation-wide list of what the cluster needs to recover
	// (CNI, CSI, service mesh control planes), as Linkerd excludes its CNI.
	ExcludedNamespaces []string
	// OperatorDeployment is the name of the operator's own Deployment in
	// Namespace ($OPERATOR_DEPLOYMENT). When set, every injector server
	// gets --operator-deployment=<Namespace>/<name> and the RBAC to read
	// that one Deployment and switch its own configuration (and the
	// manager's validating one) to Ignore once the operator is gone
	// (cmd/failopen.go). Empty: off.
	OperatorDeployment string
}

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
