// Package operator tests the operator (controllers/) against a real API
// server with kube-controller-manager (garbage collection), kube-scheduler
// and kwok nodes (server Deployments become available): owned objects,
// garbage collection, drift repair times, zero writes when idle, and
// admission through the Service with the certificate the operator issued.
//
// It must not import webhooks/sidecar or webhooks/oversell: the servers
// are reached through their Services.
package operator

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/cmd/app"
	"github.com/hookwright/hookwright/controllers"
	"github.com/hookwright/hookwright/controllers/csrsigner"
	"github.com/hookwright/hookwright/internal/apply"
	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/certificates/sources"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/serverpolicy"
	"github.com/hookwright/hookwright/internal/webhookprobe"
	"github.com/hookwright/hookwright/test/cluster"
)

const (
	operatorNS  = "hookwright-system"
	serverImage = "ghcr.io/hookwright/hookwright:v0.0.0-test"
	// serverNS is the second allowed server namespace (TestRenewalAndNamespaceMove).
	serverNS = "mesh-servers"
	// excludedNS is the operator's --excluded-namespaces (TestRecoveryPodsAdmittedWhileDown).
	excludedNS = "cni-like-excluded"
)

// The operator's --allowed-server-namespaces and --allowed-server-images.
var (
	allowedServerNamespaces = []string{operatorNS, serverNS}
	allowedServerImages     = []string{"registry.example.com/allowed/*"}
	webhookBypass           atomic.Bool
)

// testRepairBudget is the default count with a shorter window, so the
// conflicting-writer test sees the back-off end; long enough that a loaded
// machine still fits the 5 repairs the test provokes in one window.
var testRepairBudget = apply.Budget{Max: 5, Window: 30 * time.Second}

var (
	env    *cluster.Cluster
	writes = &writeCounter{}
	atExit []func()
	// clock is the operator's certificate clock; a test moves it forward
	// to make the CA due for rotation.
	clock = &offsetClock{}
	// caDir is the operator's --ca-dir (empty until a test fills it).
	caDir string
)

// testFleetWriteInterval is the operator's fleet write interval here.
const testFleetWriteInterval = time.Second

// testProbePolicy is the operator's probe pace here: the default's, with
// the period and the longest back-off shortened from a minute.
var testProbePolicy = webhookprobe.Policy{Period: 20 * time.Second, MinGap: 5 * time.Second, BackoffBase: 5 * time.Second, BackoffMax: 20 * time.Second}

// testSignerMaxValidity is the CSR signer's --csr-max-validity;
// testSignerWait is how long mode CSR waits for a signer before saying it
// does not answer.
const (
	testSignerMaxValidity = 24 * time.Hour
	testSignerWait        = 5 * time.Second
)

// testCAPolicy makes a CA due for rotation 4 min after it is created (half
// of its 18 min life: NotBefore is backdated 5 min, NotAfter 13 min on), so
// a test can reach it by moving clock ahead by less than pki.Backdate:
// certificates generated at the shifted time must still be valid to the
// API server, which uses the real time. Nothing rotates on its own during
// the run. Promotion waits 2 s after publishing, as in production 10 s.
var testCAPolicy = pki.Policy{CAValidity: 13 * time.Minute, CARenewFraction: 0.5, CALookahead: time.Nanosecond, PromoteDelay: 2 * time.Second}

// testDrainGrace: local servers reload a re-issued certificate within
// about 100 ms (the test copies the Secret, certwatcher sees the files);
// the Secret-rotation test's kubelet copies 2 s late on purpose, and a
// loaded machine adds seconds to noticing the Secret: 10 s leaves room.
const testDrainGrace = 10 * time.Second

// offsetClock is the system clock plus an adjustable offset.
type offsetClock struct{ d atomic.Int64 }

func (c *offsetClock) Now() time.Time        { return time.Now().Add(time.Duration(c.d.Load())) }
func (c *offsetClock) Set(d time.Duration)   { c.d.Store(int64(d)) }
func (c *offsetClock) Offset() time.Duration { return time.Duration(c.d.Load()) }

// writeCounter counts the operator's write requests (every verb but GET,
// which covers list and watch) seen by its rest.Config transport; dry-run
// requests (the webhook probes) store nothing and are counted apart.
type writeCounter struct {
	n       atomic.Int64
	dryRuns atomic.Int64
	mu      sync.Mutex
	last    []string
	// byPath counts the writes by URL path (one object's writes).
	byPath map[string]int64
}

func (w *writeCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if req.URL.Query().Get("dryRun") != "" {
			// The webhook probes (dryRun=All): nothing is stored.
			w.dryRuns.Add(1)
			return rt.RoundTrip(req)
		}
		if req.Method != http.MethodGet {
			w.n.Add(1)
			w.mu.Lock()
			w.last = append(w.last, req.Method+" "+req.URL.Path)
			if w.byPath == nil {
				w.byPath = map[string]int64{}
			}
			w.byPath[req.URL.Path]++
			if len(w.last) > 50 {
				w.last = w.last[len(w.last)-50:]
			}
			w.mu.Unlock()
		}
		return rt.RoundTrip(req)
	})
}

// since returns the writes counted after start (a value of Count()) and the
// last requests seen.
func (w *writeCounter) Count() int64 { return w.n.Load() }

// Of counts the writes to one URL path, e.g.
// "/apis/apps/v1/namespaces/NS/deployments/NAME".
func (w *writeCounter) Of(path string) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.byPath[path]
}

func (w *writeCounter) Recent() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.last...)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// testParallel is go test's -parallel here unless the command line sets
// it: the parallel tests mostly wait on the operator, its probes and the
// API server, so more of them than the 2 of GOMAXPROCS on a 2-core machine
// overlap their waits.
const testParallel = 8

// waitSlack widens the bound of a wait (see bound).
const waitSlack = 3

// bound is the bound of a wait that was sized for a quiet operator: the
// parallel tests share the operator's workers and the API server, so a
// wait takes longer; the bound only guards against a hang, it is not a
// figure the test judges.
func bound(d time.Duration) time.Duration { return waitSlack * d }

func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if err := flag.Set("test.parallel", fmt.Sprint(testParallel)); err != nil {
			fmt.Fprintln(os.Stderr, "set -test.parallel:", err)
			os.Exit(1)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	start := time.Now()
	var err error
	env, err = cluster.New(ctx, cluster.Options{
		ControllerManager: true,
		Scheduler:         true,
		Nodes: []cluster.NodeSpec{
			{Name: "kwok-node-0", Labels: map[string]string{"pool": "system"}},
			{Name: "kwok-node-1", Labels: map[string]string{"pool": "system"}},
		},
		Logf: func(f string, a ...any) { fmt.Printf(f+"\n", a...) },
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start cluster:", err)
		os.Exit(1)
	}
	fmt.Printf("cluster: ready in %s\n", time.Since(start).Round(time.Millisecond))
	code := 1
	if err := startOperator(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "start operator:", err)
	} else {
		code = m.Run()
	}
	for _, f := range atExit {
		f()
	}
	stopOperator()
	cancel()
	cluster.RemoveHookwrightBinary()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop cluster:", err)
		code = 1
	}
	os.Exit(code)
}

// startOperator runs the controllers in this process, exactly as
// `hookwright manager` wires them, with a write-counting transport.
func startOperator(ctx context.Context) error {
	if _, err := env.CreateNamespace(ctx, operatorNS, nil); err != nil {
		return err
	}
	ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.WriteTo(logFile())))
	// cert-manager's and OLM's kinds, as `hookwright manager` registers them.
	if err := controllers.AddToScheme(env.Scheme); err != nil {
		return err
	}
	if err := setupOLM(ctx); err != nil {
		return err
	}
	// The manager's validating webhook: served on a local port, reached by
	// the API server through the webhook Service config/webhook defines.
	var err error
	if operator.webhookPort, err = cluster.FreePort(); err != nil {
		return err
	}
	caDir = filepath.Join(env.Dir, "ca-dir")
	if err := os.MkdirAll(caDir, 0o755); err != nil {
		return err
	}
	if _, err := env.ExposeLocal(ctx, operatorNS, desired.DefaultWebhookService, 443, fmt.Sprintf("127.0.0.1:%d", operator.webhookPort)); err != nil {
		return err
	}
	return runOperator(env.Config, allowedServerNamespaces)
}

// operator is the in-process manager: stopOperator ends it and
// runOperator starts another (a test restarting the operator, or running
// it as another identity, restarts the default one when it ends).
var operator struct {
	webhookPort int
	mu          sync.Mutex
	cancel      context.CancelFunc
	done        chan struct{}
	started     int
	// depthBase is workqueue_depth when the running operator started
	// (operatorBusy).
	depthBase map[string]float64
	// image is the operator's --server-image ("": serverImage); a test
	// sets it to stand for an operator upgrade.
	image string
	// deployment is the operator's Settings.OperatorDeployment ("": off,
	// no operator Deployment exists here); a test sets it to give the
	// injector servers --operator-deployment.
	deployment string
}

// runOperator builds the production manager (app.New, as `hookwright
// manager` builds it) acting with base (through the write counter) and
// the server namespaces, on local ports, and starts it.
func runOperator(base *rest.Config, serverNamespaces []string) error {
	operator.mu.Lock()
	defer operator.mu.Unlock()
	if operator.cancel != nil {
		return fmt.Errorf("the operator is running")
	}
	cfg := rest.CopyConfig(base)
	cfg.WrapTransport = writes.wrap
	image := serverImage
	if operator.image != "" {
		image = operator.image
	}
	servers, err := serverpolicy.New(operatorNS, image, serverNamespaces, allowedServerImages)
	if err != nil {
		return err
	}
	// webhookBypass stands for a CR admitted before the webhook existed or
	// while it was down: the reconciler must refuse it on its own.
	mgr, err := app.New(cfg, app.Options{
		Metrics: metricsserver.Options{BindAddress: "0"}, ProbeAddr: "0",
		WebhookHost: "127.0.0.1", WebhookPort: operator.webhookPort, WebhookService: desired.DefaultWebhookService,
		Servers: servers,
		Settings: controllers.Settings{
			Settings: desired.Settings{
				Namespace: operatorNS, Image: image,
				AllowedNamespaces: servers.Namespaces, AllowedImages: servers.Images,
				ExcludedNamespaces: []string{excludedNS},
				OperatorDeployment: operator.deployment,
			},
			Repairs: testRepairBudget, CADir: caDir,
			Certificates: sources.Settings{Policy: testCAPolicy, Clock: clock, DrainGrace: testDrainGrace},
			CSR:          sources.CSRSettings{SignerWait: testSignerWait},
			// Rollout steps and counts reach status sooner than the 5 s
			// default; TestFleetStatus still sees a quiet fleet write nothing.
			FleetWriteInterval: testFleetWriteInterval,
			// A break is seen at the next probe: a period of 20 s, not
			// the minute of the default, lets TestWebhookReachable see
			// four breaks in as many periods.
			Probe: testProbePolicy,
		},
		Signer: &csrsigner.Options{SignerName: v1alpha1.DefaultCSRSignerName, MaxValidity: testSignerMaxValidity},
		WrapValidation: func(h admission.Handler) admission.Handler {
			return admission.HandlerFunc(func(ctx context.Context, req admission.Request) admission.Response {
				if webhookBypass.Load() {
					return admission.Allowed("test: webhook bypassed")
				}
				return h.Handle(ctx, req)
			})
		},
		SkipNameValidation: operator.started > 0,
	})
	if err != nil {
		return err
	}
	operator.started++
	if operator.depthBase, err = queueDepths(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	operator.cancel, operator.done = cancel, done
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	return nil
}

// stopOperator stops the in-process manager and waits until it returned.
func stopOperator() {
	operator.mu.Lock()
	cancel, done := operator.cancel, operator.done
	operator.cancel, operator.done = nil, nil
	operator.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

// restartOperator stops the in-process manager and starts it again as
// base with the server namespaces; when the test ends the default one
// (the admin config, every allowed server namespace) runs again.
func restartOperator(t *testing.T, base *rest.Config, serverNamespaces []string) {
	t.Helper()
	stopOperator()
	t.Cleanup(func() {
		stopOperator()
		if err := runOperator(env.Config, allowedServerNamespaces); err != nil {
			t.Errorf("restart the default operator: %v", err)
		}
	})
	if err := runOperator(base, serverNamespaces); err != nil {
		t.Fatal(err)
	}
}

func logFile() *os.File {
	f, err := os.Create(filepath.Join(env.Dir, "logs", "operator.log"))
	if err != nil {
		return os.Stderr
	}
	fmt.Printf("operator log: %s\n", f.Name())
	return f
}

// serviceAccountKubeconfig writes a kubeconfig that impersonates the
// ServiceAccount ns/name with the groups the token authenticator gives it,
// so a local server runs with exactly the RBAC the operator granted.
func serviceAccountKubeconfig(t *testing.T, dir, ns, name string) string {
	t.Helper()
	kc, err := clientcmd.LoadFromFile(env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range kc.AuthInfos {
		ai.Impersonate = "system:serviceaccount:" + ns + ":" + name
		ai.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// localServer runs `hookwright` with the args of the operator's Deployment
// (plus local listener overrides; later flags win) and the serving
// certificate from the operator's Secret, until the test ends.
type localServer struct {
	port, probePort int
	proc            *cluster.Process
	certDir         string // the server's --cert-dir (tls.crt, tls.key)
}

func (s *localServer) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

func startLocalServer(t *testing.T, name string, deployArgs []string, certPEM, keyPEM []byte, kubeconfig string) *localServer {
	t.Helper()
	dir := t.TempDir()
	certDir := filepath.Join(dir, "certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(certDir, "tls.crt"), certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(certDir, "tls.key"), keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	s := &localServer{port: cluster.MustFreePort(t), probePort: cluster.MustFreePort(t), certDir: certDir}
	args := append(append([]string(nil), deployArgs...),
		"--webhook-host=127.0.0.1", fmt.Sprintf("--webhook-port=%d", s.port),
		"--cert-dir="+certDir,
		"--metrics-bind-address=0",
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", s.probePort),
		// Nothing routes by endpoints here: stop at once.
		"--drain-period=0s", "--drain-close-wait=0s",
	)
	p, err := cluster.StartProcess(name, dir, cluster.MustHookwrightBinary(t), args, []string{"KUBECONFIG=" + kubeconfig})
	if err != nil {
		t.Fatal(err)
	}
	s.proc = p
	t.Cleanup(func() { _ = p.Stop(5 * time.Second) })
	ctx := cluster.TestContext(t, 60*time.Second)
	err = cluster.WaitFor(ctx, bound(60*time.Second), name+" /readyz", p.ProbeOK(s.probePort, "/readyz"))
	if err != nil {
		t.Fatalf("%v\nargs: %s\nlog:\n%s", err, strings.Join(args, " "), p.Tail(3000))
	}
	return s
}
