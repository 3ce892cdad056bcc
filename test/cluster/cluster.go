package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	hookwrightv1alpha1 "github.com/hookwright/hookwright/api/v1alpha1"
)

// Options selects the components to start.
type Options struct {
	// Dir holds kubeconfig, logs, sockets and certificates. Empty: a new temp
	// dir, removed by Stop.
	Dir string
	// CRDDirectoryPaths are installed before Start returns. Default: the
	// repository's config/crd/bases.
	CRDDirectoryPaths []string
	// ControllerManager starts kube-controller-manager (Deployments make
	// ReplicaSets make Pods, namespaces get ServiceAccounts, GC runs).
	ControllerManager bool
	// Scheduler starts kube-scheduler.
	Scheduler bool
	// Nodes are simulated by kwok, which is started when the list is not empty.
	Nodes []NodeSpec
	// NodeHeartbeat is the period of kwok's node status heartbeat; the
	// kubelet's default nodeStatusUpdateFrequency is 10 s. Default 10 s.
	NodeHeartbeat time.Duration
	// APIServerArgs are extra kube-apiserver flags (name without dashes).
	APIServerArgs map[string][]string
	// APIServerEnv are extra environment variables of kube-apiserver
	// ("NAME=value"), e.g. a GOMEMLIMIT that keeps a large store from
	// taking a shared machine's memory: it is started through a small
	// exec wrapper in Dir.
	APIServerEnv []string
	// EtcdArgs are extra etcd flags (name without dashes), e.g.
	// quota-backend-bytes for more than about 100,000 pods (etcd's default
	// quota is 2 GiB).
	EtcdArgs map[string][]string
	// ServiceAccountTokens turns on the ServiceAccount admission plugin
	// (envtest turns it off), as in every real cluster: pods get their
	// ServiceAccount's projected token (kube-api-access-*) and are refused
	// while the ServiceAccount does not exist. Pods on real nodes need it
	// for in-cluster API access; it needs ControllerManager.
	ServiceAccountTokens bool
	// MetricsServer serves metrics.k8s.io with metrics-server v0.9.0 through
	// the aggregation layer (metrics.go): it scrapes the real nodes'
	// kubelets and kwok's emulation for the kwok nodes, whose pods report
	// the usage of their kwok.x-k8s.io/usage-cpu and usage-memory
	// annotations (SetPodUsage).
	MetricsServer bool
	// MetricsResolution is metrics-server's --metric-resolution; default
	// 10 s, its minimum (60 s in a default install).
	MetricsResolution time.Duration
	// AuditPolicy, when not empty, is an audit.k8s.io/v1 Policy (YAML):
	// the API server writes the events it selects as JSON lines to
	// AuditLogPath (--audit-log-path, the log backend in blocking mode,
	// each event written before the request answers).
	AuditPolicy string
	// Logf receives progress lines; nil discards them.
	Logf func(format string, args ...any)
}

// Cluster is a running local control plane.
type Cluster struct {
	// Config is an admin (system:masters) client config.
	Config *rest.Config
	// Client is a controller-runtime client on Config with hookwright's,
	// client-go's and apiextensions' kinds registered.
	Client client.Client
	// Clientset is a client-go clientset on Config.
	Clientset kubernetes.Interface
	// Scheme has client-go's and hookwright's kinds.
	Scheme *runtime.Scheme
	// Kubeconfig is the path of an admin kubeconfig file usable by bin/kubectl.
	Kubeconfig string
	// Dir is the working directory (logs under Dir/logs).
	Dir string
	// Egress is the CONNECT proxy the API server uses to reach Services.
	Egress *EgressProxy
	// Bin is the directory holding the built binaries (bin/ of the repo).
	Bin string

	opts    Options
	ca      *TestCA
	ownDir  bool
	env     *envtest.Environment
	procs   []*Process
	nodesMu sync.Mutex // nodes and their stopped flags (the egress dialer reads them)
	nodes   []*RealNode
	stopped bool
	// metrics-server (Options.MetricsServer): its CA, port and process.
	metricsCA   *TestCA
	metricsPort int
	metricsProc *Process
	kwokPort    int
	// minor of the control plane and its bin directory ("" for bin/k8s),
	// chosen by KubeVersionEnv.
	minor int
	cpDir string
}

// NoControlPlaneEnv names the variable `make test-unit` sets: the unit
// suite promises no control plane, so while it is set New refuses to
// start one and RequireControlPlane skips the few tests outside test/
// that need one (they run in `make test`).
const NoControlPlaneEnv = "HOOKWRIGHT_NO_CONTROL_PLANE"

// ErrNoControlPlane is New's error while NoControlPlaneEnv is set.
var ErrNoControlPlane = errors.New(NoControlPlaneEnv + " is set (make test-unit): no control plane may start; " +
	"a test that needs one lives under test/ or calls cluster.RequireControlPlane")

// RequireControlPlane skips t while NoControlPlaneEnv is set: for a test
// outside test/ that starts a control plane.
func RequireControlPlane(t testing.TB) {
	t.Helper()
	if os.Getenv(NoControlPlaneEnv) != "" {
		t.Skipf("starts a control plane; %s is set (make test-unit), make test runs it", NoControlPlaneEnv)
	}
}

// New starts a cluster. Call Stop to end every process and remove temp
// files. While NoControlPlaneEnv is set it returns ErrNoControlPlane.
func New(ctx context.Context, opts Options) (c *Cluster, err error) {
	if os.Getenv(NoControlPlaneEnv) != "" {
		return nil, ErrNoControlPlane
	}
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	c = &Cluster{opts: opts, Bin: filepath.Join(root, "bin")}
	if opts.Logf == nil {
		c.opts.Logf = func(string, ...any) {}
	}
	cl := c // "return nil, err" clears c before the deferred cleanup runs
	if c.opts.NodeHeartbeat == 0 {
		c.opts.NodeHeartbeat = 10 * time.Second
	}
	defer func() {
		if err != nil {
			_ = cl.Stop()
		}
	}()
	if opts.Dir == "" {
		// Short path: the egress unix socket path must fit in 107 bytes.
		if c.Dir, err = os.MkdirTemp("", "hw-"); err != nil {
			return nil, err
		}
		c.ownDir = true
	} else {
		c.Dir = opts.Dir
		if err = os.MkdirAll(c.Dir, 0o755); err != nil {
			return nil, err
		}
	}
	if err = os.MkdirAll(filepath.Join(c.Dir, "logs"), 0o755); err != nil {
		return nil, err
	}

	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		assets = filepath.Join(c.Bin, "k8s")
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kubectl"} {
		if _, err = os.Stat(filepath.Join(assets, b)); err != nil {
			return nil, fmt.Errorf("%s not built in %s: run hack/tools.sh (make tools): %w", b, assets, err)
		}
	}

	if c.Egress, err = NewEgressProxy(filepath.Join(c.Dir, "egress.sock")); err != nil {
		return nil, err
	}
	egressCfg := filepath.Join(c.Dir, "egress-selector.yaml")
	if err = os.WriteFile(egressCfg, []byte(egressSelectorConfig(c.Egress.Socket())), 0o644); err != nil {
		return nil, err
	}

	c.Scheme = runtime.NewScheme()
	if err = clientgoscheme.AddToScheme(c.Scheme); err != nil {
		return nil, err
	}
	if err = hookwrightv1alpha1.AddToScheme(c.Scheme); err != nil {
		return nil, err
	}

	crds := opts.CRDDirectoryPaths
	if crds == nil {
		crds = []string{filepath.Join(root, "config", "crd", "bases")}
	}
	c.env = &envtest.Environment{
		BinaryAssetsDirectory:    assets,
		CRDDirectoryPaths:        crds,
		ErrorIfCRDPathMissing:    true,
		Scheme:                   c.Scheme,
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	apiLog, err := os.Create(filepath.Join(c.Dir, "logs", "kube-apiserver.log"))
	if err != nil {
		return nil, err
	}
	svcIP, err := firstIP(c.ServiceCIDR())
	if err != nil {
		return nil, err
	}
	pki := filepath.Join(c.Dir, "pki")
	if c.ca, err = writeClusterPKI(pki, svcIP); err != nil {
		return nil, err
	}
	api := c.env.ControlPlane.GetAPIServer()
	if c.cpDir, c.minor, err = controlPlaneDir(c.Bin); err != nil {
		return nil, err
	}
	if c.cpDir != "" {
		api.Path = filepath.Join(c.cpDir, "kube-apiserver")
	}
	api.Out, api.Err = apiLog, apiLog
	if len(opts.APIServerEnv) > 0 {
		real := api.Path
		if real == "" {
			real = filepath.Join(assets, "kube-apiserver")
		}
		wrapper := filepath.Join(c.Dir, "kube-apiserver")
		script := "#!/bin/sh\nexec env"
		for _, e := range opts.APIServerEnv {
			script += " " + shellQuote(e)
		}
		script += " " + shellQuote(real) + " \"$@\"\n"
		if err = os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
			return nil, err
		}
		api.Path = wrapper
	}
	// envtest keeps the certificates it finds there and hands out
	// SecureServing.CA to every client config it makes.
	api.CertDir = pki
	api.SecureServing.CA = c.ca.CertPEM
	args := api.Configure()
	args.Set("egress-selector-config-file", egressCfg)
	// Nodes and kubelets are simulated: let the NodeRestriction-free RBAC
	// authorizer and the node authorizer both exist, as in a real cluster.
	args.Set("authorization-mode", "Node,RBAC")
	args.Set("enable-admission-plugins", "NodeRestriction")
	if opts.ServiceAccountTokens {
		args.Disable("disable-admission-plugins")
	}
	// The harness owns the kubernetes Service's endpoints: each real node's
	// relay (publishAPIEndpoint), not the API server's loopback address.
	args.Set("endpoint-reconciler-type", "none")
	args.Set("kubelet-client-certificate", filepath.Join(pki, pkiKubeletClient))
	args.Set("kubelet-client-key", filepath.Join(pki, pkiKubeletKey))
	args.Set("kubelet-certificate-authority", filepath.Join(pki, pkiCA))
	// kubeadm's choice: a node's name needs no resolver.
	args.Set("kubelet-preferred-address-types", "InternalIP,Hostname")
	if opts.MetricsServer {
		fp, err := frontProxyArgs(pki)
		if err != nil {
			return nil, err
		}
		for k, v := range fp {
			args.Set(k, v...)
		}
	}
	if opts.AuditPolicy != "" {
		policy := filepath.Join(c.Dir, "audit-policy.yaml")
		if err = os.WriteFile(policy, []byte(opts.AuditPolicy), 0o644); err != nil {
			return nil, err
		}
		args.Set("audit-policy-file", policy)
		args.Set("audit-log-path", c.AuditLogPath())
		args.Set("audit-log-format", "json")
	}
	for k, v := range opts.APIServerArgs {
		args.Set(k, v...)
	}
	if len(opts.EtcdArgs) > 0 {
		if c.env.ControlPlane.Etcd == nil {
			c.env.ControlPlane.Etcd = &envtest.Etcd{}
		}
		etcdArgs := c.env.ControlPlane.Etcd.Configure()
		for k, v := range opts.EtcdArgs {
			etcdArgs.Set(k, v...)
		}
	}

	c.opts.Logf("cluster: starting etcd and kube-apiserver (Kubernetes 1.%d)", c.minor)
	start := time.Now()
	if c.Config, err = c.env.Start(); err != nil {
		return nil, fmt.Errorf("start etcd and kube-apiserver (log: %s): %w", apiLog.Name(), err)
	}
	c.opts.Logf("cluster: kube-apiserver ready in %s at %s", time.Since(start).Round(time.Millisecond), c.Config.Host)
	c.Config.QPS, c.Config.Burst = 200, 400

	admin, err := c.env.AddUser(envtest.User{Name: "hookwright-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, err
	}
	kc, err := admin.KubeConfig()
	if err != nil {
		return nil, err
	}
	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	if err = os.WriteFile(c.Kubeconfig, kc, 0o600); err != nil {
		return nil, err
	}
	if c.Client, err = client.New(c.Config, client.Options{Scheme: c.Scheme}); err != nil {
		return nil, err
	}
	if c.Clientset, err = kubernetes.NewForConfig(c.Config); err != nil {
		return nil, err
	}
	// The binary's version stamp (hack/tools.sh) must be the minor asked for.
	sv, err := c.Clientset.Discovery().ServerVersion()
	if err != nil {
		return nil, fmt.Errorf("server version: %w", err)
	}
	if sv.Minor != strconv.Itoa(c.minor) {
		return nil, fmt.Errorf("kube-apiserver reports %s, want minor 1.%d (%s)", sv.GitVersion, c.minor, KubeVersionEnv)
	}
	if err = c.publishAPIEndpoint(ctx); err != nil {
		return nil, err
	}
	c.Egress.SetDialer(c.dialCluster)

	if opts.ControllerManager {
		if err = c.startControllerManager(ctx); err != nil {
			return nil, err
		}
	}
	if opts.Scheduler {
		if err = c.startScheduler(ctx); err != nil {
			return nil, err
		}
	}
	if len(opts.Nodes) > 0 {
		if err = c.startKwok(ctx); err != nil {
			return nil, err
		}
	}
	if opts.MetricsServer {
		if err = c.startMetricsServer(ctx); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Stop ends every process in reverse start order and removes the temp dir
// (if New made it). It is safe to call twice.
func (c *Cluster) Stop() error {
	if c.stopped {
		return nil
	}
	c.stopped = true
	var errs []error
	// Real nodes first: their pods are deleted through the API server.
	for i := len(c.nodes) - 1; i >= 0; i-- {
		if err := c.nodes[i].Stop(context.Background()); err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", c.nodes[i].Name, err))
		}
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		if err := c.procs[i].Stop(10 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if c.env != nil {
		if err := c.env.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Egress != nil {
		_ = c.Egress.Close()
	}
	if c.ownDir && c.Dir != "" {
		if err := os.RemoveAll(c.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// AuditLogPath is the API server's audit log (Options.AuditPolicy), one
// audit.k8s.io/v1 Event a line.
func (c *Cluster) AuditLogPath() string {
	return filepath.Join(c.Dir, "logs", "audit.log")
}

// ServiceCIDR is the API server's --service-cluster-ip-range.
func (c *Cluster) ServiceCIDR() string {
	if v := c.opts.APIServerArgs["service-cluster-ip-range"]; len(v) > 0 {
		return v[0]
	}
	return "10.0.0.0/24" // envtest's default
}

// StopChecked stops c and writes to w, one line each, what Stop failed at
// and what it left behind (Leaks, and the temp dir if New made it); a
// TestMain fails when it returns false. Nothing may outlive Stop.
func (c *Cluster) StopChecked(w io.Writer) bool {
	ok := true
	if err := c.Stop(); err != nil {
		fmt.Fprintln(w, "stop cluster:", err)
		ok = false
	}
	for _, l := range c.Leaks() {
		fmt.Fprintln(w, "leak:", l)
		ok = false
	}
	if c.ownDir {
		if _, err := os.Stat(c.Dir); !os.IsNotExist(err) {
			fmt.Fprintf(w, "leak: %s still exists after Stop (%v)\n", c.Dir, err)
			ok = false
		}
	}
	return ok
}

// Processes are the components New started besides etcd and kube-apiserver.
func (c *Cluster) Processes() []*Process { return c.procs }

// Leaks lists what the cluster left on the machine after Stop: component
// processes still running and, for every real node, what RealNode.Leaks
// names, plus kube-proxy or CNI chains in the host's packet filter. TestMain
// of a package that starts real nodes fails when it is not empty.
func (c *Cluster) Leaks() []string {
	var out []string
	for _, p := range c.procs {
		if done, _ := p.Exited(); !done {
			out = append(out, "process "+p.Name+" still running")
		}
	}
	for _, n := range c.nodes {
		for _, l := range n.Leaks() {
			out = append(out, "node "+n.Name+": "+l)
		}
	}
	if len(c.nodes) > 0 {
		out = append(out, HostPacketFilterLeaks()...)
	}
	return out
}

// APIServerCertDir is where envtest keeps the API server's certificates and
// the service-account signing key (sa-signer.key, sa-signer.crt).
func (c *Cluster) APIServerCertDir() string {
	return c.env.ControlPlane.GetAPIServer().CertDir
}

// RestartAPIServer stops kube-apiserver (SIGTERM, as a rolling update of
// the control plane does) and starts it again on the same port, flags,
// certificates and etcd, then waits until it serves. Every watch ends; a
// client resuming from a resourceVersion older than the new server's watch
// cache gets 410 Gone and lists again (the watch cache starts at etcd's
// current revision: k8s.io/apiserver storage/cacher). It returns how long
// the server was away.
func (c *Cluster) RestartAPIServer(ctx context.Context) (time.Duration, error) {
	api := c.env.ControlPlane.GetAPIServer()
	start := time.Now()
	// envtest SIGKILLs the server when it has not stopped within
	// ControlPlaneStopTimeout (30 s), then reports the timeout: with
	// 50,000 pods a graceful stop took longer. A killed server restarts
	// as well (a control-plane node that crashed).
	if err := api.Stop(); err != nil && !strings.Contains(err.Error(), "timeout waiting for process") {
		return 0, fmt.Errorf("stop kube-apiserver: %w", err)
	}
	if err := api.Start(); err != nil {
		return 0, fmt.Errorf("start kube-apiserver again: %w", err)
	}
	err := WaitFor(ctx, 2*time.Minute, "kube-apiserver serves after its restart", func(context.Context) (bool, error) {
		_, err := c.Clientset.Discovery().ServerVersion()
		return err == nil, nil
	})
	return time.Since(start), err
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
