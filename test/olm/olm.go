// Package olm runs the Operator Lifecycle Manager (OLM v0.33.0) against a
// test/cluster harness cluster and installs operator bundles through it, the
// way `operator-sdk run bundle` does on a real cluster, but without images:
//
//   - the olm and catalog operators run as local processes (bin/olm,
//     bin/catalog, built by hack/tools.sh from the Go module proxy) with the
//     harness's admin kubeconfig;
//   - OLM's CRDs come from github.com/operator-framework/api/crds at the
//     version OLM requires (bin/olm-crds writes them);
//   - a bundle directory is rendered by `opm render` into a file-based catalog
//     (olm.package, olm.channel, olm.bundle) and served by `opm serve` on
//     localhost; a CatalogSource of sourceType grpc points at that address.
//
// The catalog carries the bundle's manifests inline (olm.bundle.object
// properties) and no bundle image: operator-registry's gRPC API then sends
// the objects with each bundle (pkg/api/model_to_api.go: BundlePath is the
// olm.bundle image), and OLM's resolver builds the InstallPlan steps from them
// instead of a BundleLookup that would unpack an image in a Job
// (operator-lifecycle-manager pkg/controller/registry/resolver/
// source_registry.go and step_resolver.go). No registry pod, no image pull.
//
// The harness cluster needs kube-controller-manager, kube-scheduler and kwok
// nodes so the operator Deployment OLM creates gets Pods that become Ready.
// Leave out the operator's CRDs (cluster.Options.CRDDirectoryPaths:
// []string{}) to have OLM create them. Usage:
//
//	o, err := olm.Start(ctx, c, olm.Options{Logf: t.Logf})
//	defer o.Stop()
//	in, err := o.InstallBundle(ctx, "bundle", olm.InstallOptions{Namespace: "hookwright-system"})
//	_, err = olmbundle.Derive("bundle", next, olmbundle.Options{Version: "0.1.1"}) // replaces in.CSV()
//	err = in.Upgrade(ctx, next)
//
// The image path, as users run it (`make run-bundle`, hack/runbundle:
// bin/operator-sdk with images from hack/ociimage and pods on a real
// node), is tested against the demo's stack by test/e2e, which runs the
// block of docs/install.md; Snapshot and NewObjects (snapshot.go) find what an
// uninstall left of any kind.
//
// It must not import controllers or webhooks: OLM installs the operator
// from bundle/ as a cluster would.
package olm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	operatorsv1 "github.com/operator-framework/api/pkg/operators/v1"
	operatorsv1alpha1 "github.com/operator-framework/api/pkg/operators/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hookwrightv1alpha1 "github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/test/cluster"
)

// DefaultNamespace is OLM's own namespace: the catalog operator's global
// catalog namespace (its --namespace default), as in OLM's release manifests.
const DefaultNamespace = "olm"

// Options configures Start.
type Options struct {
	// Namespace is OLM's namespace (created if missing). Default "olm".
	Namespace string
	// Logf receives progress lines; nil discards them.
	Logf func(format string, args ...any)
}

// OLM is a running olm operator and catalog operator.
type OLM struct {
	// Namespace is OLM's namespace, which holds the CatalogSources.
	Namespace string
	// Client has client-go's, OLM's (operators.coreos.com v1, v1alpha1),
	// apiextensions' and hookwright's kinds registered.
	Client client.Client
	// Cluster is the harness cluster OLM runs against.
	Cluster *cluster.Cluster
	// Dir holds logs (Dir/logs), OLM's CRDs and rendered catalogs.
	Dir string

	logf    func(format string, args ...any)
	mu      sync.Mutex
	procs   []*cluster.Process
	stopped bool
}

// Binaries are the tools Start and the catalog helpers run, relative to the
// harness's bin directory.
var Binaries = []string{"olm", "catalog", "olm-crds", "opm"}

// Start installs OLM's CRDs into c and starts the olm and catalog operators.
// It returns once both have started and the CRDs are established. Call Stop
// (or let the process die: children get SIGKILL with the test binary).
func Start(ctx context.Context, c *cluster.Cluster, opts Options) (o *OLM, err error) {
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	for _, b := range Binaries {
		if _, err := os.Stat(filepath.Join(c.Bin, b)); err != nil {
			return nil, fmt.Errorf("%s not built in %s: run hack/tools.sh %s: %w", b, c.Bin, b, err)
		}
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme,
		operatorsv1alpha1.AddToScheme, operatorsv1.AddToScheme, hookwrightv1alpha1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	cl, err := client.New(c.Config, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	o = &OLM{Namespace: opts.Namespace, Client: cl, Cluster: c, Dir: filepath.Join(c.Dir, "olm"), logf: opts.Logf}
	defer func() {
		if err != nil {
			o.Stop()
		}
	}()
	if err := os.MkdirAll(filepath.Join(o.Dir, "logs"), 0o755); err != nil {
		return nil, err
	}

	start := time.Now()
	crdDir := filepath.Join(o.Dir, "crds")
	if out, err := exec.CommandContext(ctx, filepath.Join(c.Bin, "olm-crds"), crdDir).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("olm-crds: %v: %s", err, out)
	}
	if _, err := envtest.InstallCRDs(c.Config, envtest.CRDInstallOptions{
		Paths: []string{crdDir}, ErrorIfPathMissing: true, MaxTime: 2 * time.Minute,
	}); err != nil {
		return nil, fmt.Errorf("install OLM CRDs: %w", err)
	}
	o.logf("olm: CRDs established in %s", time.Since(start).Round(time.Millisecond))

	if _, err := c.CreateNamespace(ctx, o.Namespace, nil); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	env := []string{"KUBECONFIG=" + c.Kubeconfig}
	// Both operators serve /metrics and /healthz on :8080 (no flag to move
	// it; pkg/lib/server). Whichever binds second only logs the error, which
	// is harmless here: nothing scrapes them.
	if err := o.start(ctx, "olm", []string{
		"--namespace=" + o.Namespace,
		"--writeStatusName=",
	}, env); err != nil {
		return nil, err
	}
	if err := o.start(ctx, "catalog", []string{
		"--namespace=" + o.Namespace,
		"--kubeconfig=" + c.Kubeconfig,
		"--writeStatusName=",
	}, env); err != nil {
		return nil, err
	}
	o.logf("olm: olm and catalog operators started (logs in %s)", filepath.Join(o.Dir, "logs"))
	return o, nil
}

func (o *OLM) start(ctx context.Context, name string, args, env []string) error {
	p, err := cluster.StartProcess(name, filepath.Join(o.Dir, "logs"), filepath.Join(o.Cluster.Bin, name), args, env)
	if err != nil {
		return err
	}
	o.mu.Lock()
	o.procs = append(o.procs, p)
	o.mu.Unlock()
	// Bad flags or a missing kubeconfig end the process at once.
	return p.Settle(ctx, time.Second)
}

// Stop ends the operators and every opm serve this OLM started. Safe to call
// twice.
func (o *OLM) Stop() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.stopped {
		return
	}
	o.stopped = true
	for i := len(o.procs) - 1; i >= 0; i-- {
		_ = o.procs[i].Stop(10 * time.Second)
	}
}

// Alive returns an error naming the first OLM process that has exited, with
// its log tail; nil while all run. Waits call it so a crash fails fast.
func (o *OLM) Alive() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, p := range o.procs {
		if done, err := p.Exited(); done && !o.stopped {
			return fmt.Errorf("%s exited (%v); log tail:\n%s", p.Name, err, p.Tail(3000))
		}
	}
	return nil
}

// Logs returns the tails of the OLM processes' logs, for failure messages.
func (o *OLM) Logs(n int64) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var s string
	for _, p := range o.procs {
		s += fmt.Sprintf("\n===== %s (%s) =====\n%s", p.Name, p.Log, p.Tail(n))
	}
	return s
}

func (o *OLM) track(p *cluster.Process) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.procs = append(o.procs, p)
}

func (o *OLM) untrack(p *cluster.Process) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i, q := range o.procs {
		if q == p {
			o.procs = append(o.procs[:i], o.procs[i+1:]...)
			return
		}
	}
}

// ensureNamespace creates namespace ns if it does not exist.
func (o *OLM) ensureNamespace(ctx context.Context, ns string) error {
	err := o.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	return nil
}
