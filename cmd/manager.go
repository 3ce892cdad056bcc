package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/operator-framework/operator-lib/proxy"
	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/cmd/app"
	"github.com/hookwright/hookwright/controllers"
	"github.com/hookwright/hookwright/controllers/csrsigner"
	"github.com/hookwright/hookwright/internal/certificates/csrsign"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/serverpolicy"
	"github.com/hookwright/hookwright/internal/version"
	"github.com/hookwright/hookwright/webhooks/listener"
)

type managerOptions struct {
	metricsAddr      string
	metricsSecure    bool
	metricsCertPath  string
	metricsCertName  string
	metricsCertKey   string
	probeAddr        string
	pprofAddr        string
	leaderElect      bool
	leaderElectionNS string
	namespace        string
	serverImage      string
	allowedNS        []string
	allowedImages    []string
	caDir            string
	webhookPort      int
	webhookService   string
	csrSignerName    string
	csrMaxValidity   time.Duration
	drainPeriod      time.Duration
	excludedNS       []string
	operatorDeploy   string
	zap              zap.Options
	cluster          clusterFlags
}

func init() {
	subcommands = append(subcommands, func() *cobra.Command {
		o := &managerOptions{}
		cmd := &cobra.Command{
			Use:   "manager",
			Short: "Run the operator: reconcile SidecarInjector and NodeOversell into running webhooks",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				return runManager(cmd, o)
			},
		}
		fs := cmd.Flags()
		fs.StringVar(&o.metricsAddr, "metrics-bind-address", "0",
			"address of the metrics endpoint, e.g. :8443 with --metrics-secure (config/manager) or :8080 without; 0 (default) disables it")
		fs.BoolVar(&o.metricsSecure, "metrics-secure", true,
			"serve metrics over HTTPS, each request authenticated (TokenReview) and authorized (SubjectAccessReview: get on the non-resource URL /metrics, "+
				"e.g. ClusterRole hookwright-metrics-reader) by the API server; false serves plain HTTP to anyone (local runs only)")
		fs.StringVar(&o.metricsCertPath, "metrics-cert-path", "",
			"directory of the metrics serving certificate (--metrics-cert-name, --metrics-cert-key; reloaded when they change); empty (default): a self-signed certificate generated at start")
		fs.StringVar(&o.metricsCertName, "metrics-cert-name", "tls.crt", "certificate file in --metrics-cert-path")
		fs.StringVar(&o.metricsCertKey, "metrics-cert-key", "tls.key", "private key file in --metrics-cert-path")
		fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "address of the /healthz and /readyz endpoints")
		fs.StringVar(&o.pprofAddr, "pprof-bind-address", "0",
			"address of Go's /debug/pprof endpoints (heap and CPU profiles; plain HTTP, unauthenticated: bind to 127.0.0.1 and reach it with kubectl port-forward); 0 (default) disables them")
		fs.BoolVar(&o.leaderElect, "leader-elect", true, "elect a leader through a Lease so only one replica reconciles")
		gfs := flag.NewFlagSet("zap", flag.ContinueOnError)
		o.zap.BindFlags(gfs)
		fs.AddGoFlagSet(gfs)
		fs.StringVar(&o.leaderElectionNS, "leader-election-namespace", "", "namespace of the leader election Lease (default: the pod's namespace)")
		fs.StringVar(&o.namespace, "namespace", envOr("POD_NAMESPACE", "hookwright-system"),
			"operator namespace: holds the CA Secret, is the default server namespace and is never injected")
		fs.StringVar(&o.serverImage, "server-image", defaultServerImage(),
			"image of the webhook server Deployments (spec.server.image overrides it per CR); default: $RELATED_IMAGE_SERVER, else the release image of this build")
		// Also from the environment: OLM's Subscription spec.config sets
		// env, not arguments.
		fs.StringSliceVar(&o.allowedNS, serverpolicy.NamespacesFlag[2:], envList("ALLOWED_SERVER_NAMESPACES"),
			"namespaces (exact names, comma-separated) a CR's spec.server.namespace may name; the operator needs the namespaced RBAC of "+
				"ClusterRole hookwright-server-namespace-role (config/server-namespace) in each other one (a RoleBinding), caches only them, and excludes all of them from every "+
				"SidecarInjector; default: $ALLOWED_SERVER_NAMESPACES, else --namespace only")
		fs.StringSliceVar(&o.allowedImages, serverpolicy.ImagesFlag[2:], envList("ALLOWED_SERVER_IMAGES"),
			"images a CR's spec.server.image may name besides --server-image (always allowed), comma-separated: exact references, "+
				"or prefixes ending in \"*\" right after \"/\", \":\" or \"@\" (e.g. registry.example.com/mesh/*, ghcr.io/hookwright/hookwright:*; "+
				"\"*\" alone allows any image); default: $ALLOWED_SERVER_IMAGES, else --server-image only")
		fs.StringVar(&o.caDir, "ca-dir", "",
			"directory of CA files (*.crt, *.pem; in-cluster the hookwright-ca Secret mounted as a volume) to publish in every SelfSigned caBundle "+
				"together with the operator's own CAs (the union, deduplicated, newest first); watched, a change is published within about a second (default: none)")
		fs.IntVar(&o.webhookPort, "webhook-port", desired.ManagerWebhookPort,
			"port of the manager's validating webhook server for SidecarInjector and NodeOversell (TLS, certificate issued by the operator's CA)")
		fs.StringVar(&o.webhookService, "webhook-service", "",
			"Service in --namespace (port 443) in front of --webhook-port, e.g. "+desired.DefaultWebhookService+" (config/manager sets it): "+
				"the manager serves a validating webhook for its CRs and manages the ValidatingWebhookConfiguration "+
				desired.ValidatingConfigName+" pointing at it and its serving certificate; empty (default, e.g. `make run` out of cluster, "+
				"where no Service reaches this process) serves none")
		fs.StringVar(&o.csrSignerName, "csr-signer-name", v1alpha1.DefaultCSRSignerName,
			"signerName the operator signs approved CertificateSigningRequests for (with the installation CA; only serving certificates for Services in "+
				"--allowed-server-namespaces) and publishes that CA as a ClusterTrustBundle for; another name needs the RBAC of config/rbac's "+
				"signers rules for it; empty: no signer (an external signer serves mode CSR)")
		fs.DurationVar(&o.csrMaxValidity, "csr-max-validity", csrsign.DefaultMaxValidity,
			"longest certificate the signer issues; a request with a longer spec.expirationSeconds is refused, one without gets this")
		fs.StringSliceVar(&o.excludedNS, "excluded-namespaces", envList("EXCLUDED_NAMESPACES"),
			"namespaces (comma-separated) no SidecarInjector's webhook is ever called for, besides kube-system, kube-public, kube-node-lease and the server "+
				"namespaces: what the cluster needs to recover (CNI, CSI, service mesh control planes); default: $EXCLUDED_NAMESPACES")
		fs.StringVar(&o.operatorDeploy, "operator-deployment", os.Getenv("OPERATOR_DEPLOYMENT"),
			"Deployment in --namespace running the operator: when the manager exits and it is gone, being deleted or scaled to 0 (an uninstall), "+
				"every webhook configuration the operator manages is switched to failurePolicy Ignore, and each injector server is told to do the same for its own "+
				"(--operator-deployment); default: $OPERATOR_DEPLOYMENT; empty: off")
		fs.DurationVar(&o.drainPeriod, "drain-period", listener.DefaultDrainPeriod,
			"after SIGTERM the validating webhook keeps serving this long with readiness failing and every answer closing its connection, "+
				"then finishes in-flight reviews (keep terminationGracePeriodSeconds above it plus 31s); 0: none")
		o.cluster.addServerFlags(fs)
		return cmd
	})
}

// envList splits the comma-separated environment variable key (nil when unset).
func envList(key string) []string {
	if v := os.Getenv(key); v != "" {
		return strings.Split(v, ",")
	}
	return nil
}

// metricsOptions is the metrics server of the flags: with --metrics-secure
// HTTPS (HTTP/1.1 only, as kubebuilder's scaffold: HTTP/2 rapid reset,
// CVE-2023-44487) behind controller-runtime's authentication and
// authorization filter, which asks the API server (TokenReview,
// SubjectAccessReview; ClusterRole hookwright-metrics-auth-role) whether the
// bearer token may get /metrics. An error when --metrics-cert-path lacks the
// files (controller-runtime would silently fall back to a self-signed one).
func (o *managerOptions) metricsOptions() (metricsserver.Options, error) {
	m := metricsserver.Options{BindAddress: o.metricsAddr, SecureServing: o.metricsSecure}
	if !o.metricsSecure {
		return m, nil
	}
	m.FilterProvider = filters.WithAuthenticationAndAuthorization
	m.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
	if o.metricsCertPath != "" {
		for _, f := range []string{o.metricsCertName, o.metricsCertKey} {
			if _, err := os.Stat(filepath.Join(o.metricsCertPath, f)); err != nil {
				return m, fmt.Errorf("--metrics-cert-path: %w", err)
			}
		}
		m.CertDir, m.CertName, m.KeyName = o.metricsCertPath, o.metricsCertName, o.metricsCertKey
	}
	return m, nil
}

// releaseImageRepository is where release images are published (the
// Makefile's IMAGE_TAG_BASE); the tag is the stamped version.
const releaseImageRepository = "ghcr.io/hookwright/hookwright"

// defaultServerImage is the operator's own image: OLM passes it as
// RELATED_IMAGE_SERVER (the relatedImages convention for disconnected
// installs); otherwise the release image of this build's version, which is
// what `make docker-build` tags.
func defaultServerImage() string {
	if v := os.Getenv("RELATED_IMAGE_SERVER"); v != "" {
		return v
	}
	return releaseImageRepository + ":" + version.Version
}

func runManager(cmd *cobra.Command, o *managerOptions) error {
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&o.zap)))
	limit, err := app.SetSoftMemoryLimit()
	if err != nil {
		return err
	}
	if limit > 0 {
		ctrl.Log.WithName("setup").Info("Go soft memory limit set from the container's", "bytes", limit)
	}
	if o.serverImage == "" {
		return errors.New("--server-image must not be empty")
	}
	servers, err := serverpolicy.New(o.namespace, o.serverImage, o.allowedNS, o.allowedImages)
	if err != nil {
		return err
	}
	ctrl.Log.WithName("setup").Info("server policy", "namespaces", servers.Namespaces, "images", servers.Images)
	cfg, err := o.cluster.restConfig()
	if err != nil {
		return err
	}
	metrics, err := o.metricsOptions()
	if err != nil {
		return err
	}
	var signer *csrsigner.Options
	if o.csrSignerName != "" {
		signer = &csrsigner.Options{SignerName: o.csrSignerName, MaxValidity: o.csrMaxValidity}
	}
	mo := app.Options{
		Metrics: metrics, ProbeAddr: o.probeAddr, PprofAddr: o.pprofAddr,
		LeaderElection: o.leaderElect, LeaderElectionNamespace: o.leaderElectionNS,
		WebhookPort: o.webhookPort, WebhookService: o.webhookService, WebhookDrainPeriod: o.drainPeriod,
		OperatorDeployment: o.operatorDeploy,
		Servers:            servers,
		Signer:             signer,
		Settings: controllers.Settings{
			Settings: desired.Settings{
				Namespace: o.namespace, Image: o.serverImage,
				AllowedNamespaces: servers.Namespaces, AllowedImages: servers.Images,
				// OLM passes the cluster proxy to the operator; the servers get it too.
				ProxyEnv:           proxy.ReadProxyVarsFromEnv(),
				ExcludedNamespaces: o.excludedNS,
				// The injector servers switch their own configurations
				// to Ignore once this Deployment is gone (cmd/failopen.go).
				OperatorDeployment: o.operatorDeploy,
			},
			CADir: o.caDir,
		},
	}
	if pod, ok := app.LeaseOwnerFromEnv(); ok {
		mo.LeaseOwner = &pod
	}
	mgr, err := app.New(cfg, mo)
	if err != nil {
		return err
	}
	return app.Run(cmd.Context(), cfg, mgr, mo)
}
