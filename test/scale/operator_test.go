package scale

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/test/cluster"
)

// operator is one `hookwright manager` process (HOOKWRIGHT_SCALE=full
// only), so its memory is its own. Its NodeOversell webhook has no pod
// here (no kube-controller-manager): the Service it creates is not routed,
// so the API server's call to it fails at once and is ignored
// (failurePolicy Ignore); the fleet is amplified by the measured servers.
type operator struct {
	proc        *cluster.Process
	metricsPort int
	pprofPort   int
}

// startOperator runs the manager with the admin kubeconfig in the scale
// namespace and waits until ready (its caches synced).
func startOperator(t *testing.T, ctx context.Context) *operator {
	t.Helper()
	return startOperatorIn(t, ctx, namespace)
}

// startOperatorIn runs the manager in namespace ns. The test's end waits
// for every NodeOversell and SidecarInjector to be gone (the operator
// removes their finalizers) before stopping it.
func startOperatorIn(t *testing.T, ctx context.Context, ns string) *operator {
	t.Helper()
	return startOperatorWith(t, ctx, ns, true, nil)
}

// startOperatorWith is startOperatorIn with extra environment variables;
// without waitCRs the test's end only stops it (a test that stops it
// itself, or deletes its CRs before ending).
func startOperatorWith(t *testing.T, ctx context.Context, ns string, waitCRs bool, extraEnv []string) *operator {
	t.Helper()
	return startManager(t, ctx, ns, waitCRs, false, extraEnv)
}

// startReplica runs a manager that elects a leader on the Lease in ns, as
// each replica of the shipped Deployment does; it returns once ready (a
// standby is ready too: it serves and has its caches, but holds no pod
// index). The test's end only stops it.
func startReplica(t *testing.T, ctx context.Context, ns string, extraEnv []string) *operator {
	t.Helper()
	return startManager(t, ctx, ns, false, true, extraEnv)
}

func startManager(t *testing.T, ctx context.Context, ns string, waitCRs, leaderElect bool, extraEnv []string) *operator {
	t.Helper()
	metrics, probe, pprof := cluster.MustFreePort(t), cluster.MustFreePort(t), cluster.MustFreePort(t)
	args := []string{"manager", "--namespace=" + ns, fmt.Sprintf("--leader-elect=%t", leaderElect), "--server-image=ghcr.io/hookwright/hookwright:v0.0.0-scale",
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metrics), "--metrics-secure=false",
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probe),
		fmt.Sprintf("--pprof-bind-address=127.0.0.1:%d", pprof),
		fmt.Sprintf("--webhook-port=%d", cluster.MustFreePort(t)), "--webhook-service="}
	p, err := cluster.StartProcess("manager", t.TempDir(), cluster.MustHookwrightBinary(t), args, append([]string{"KUBECONFIG=" + env.Kubeconfig}, extraEnv...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if !waitCRs {
			if t.Failed() {
				t.Logf("manager log tail:\n%s", p.Tail(4000))
			}
			_ = p.Stop(10 * time.Second)
			return
		}
		err := cluster.WaitFor(ctx, 3*time.Minute, "every NodeOversell and SidecarInjector deleted", func(ctx context.Context) (bool, error) {
			var l v1alpha1.NodeOversellList
			if err := env.Client.List(ctx, &l); err != nil || len(l.Items) > 0 {
				return false, err
			}
			var s v1alpha1.SidecarInjectorList
			err := env.Client.List(ctx, &s)
			return err == nil && len(s.Items) == 0, err
		})
		if err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("manager log tail:\n%s", p.Tail(4000))
		}
		_ = p.Stop(10 * time.Second)
	})
	waitFor(t, ctx, 2*time.Minute, "manager ready", p.ProbeOK(probe, "/readyz"))
	return &operator{proc: p, metricsPort: metrics, pprofPort: pprof}
}

// metricsBody is the manager's /metrics page.
func (o *operator) metricsBody(ctx context.Context) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/metrics", o.metricsPort), nil)
	if err != nil {
		return nil, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, err
	}
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("manager /metrics: %s", res.Status)
	}
	return body, nil
}

// operatorCounters are the manager's figures from its /metrics and /proc.
type operatorCounters struct {
	reconciles    float64 // controller_runtime_reconcile_total{controller="oversell"}
	reconcileSecs float64 // controller_runtime_reconcile_time_seconds sum, same controller
	// The same two for controller "sidecar-fleet" (SidecarInjector fleet status).
	fleetReconciles, fleetReconcileSecs float64
	requests                            float64 // rest_client_requests_total: every request it sent the API server
	cpu                                 float64 // process_cpu_seconds_total
	rss, hwm                            float64 // VmRSS and VmHWM, bytes
}

func (a operatorCounters) minus(b operatorCounters) operatorCounters {
	return operatorCounters{reconciles: a.reconciles - b.reconciles, reconcileSecs: a.reconcileSecs - b.reconcileSecs,
		fleetReconciles: a.fleetReconciles - b.fleetReconciles, fleetReconcileSecs: a.fleetReconcileSecs - b.fleetReconcileSecs,
		requests: a.requests - b.requests, cpu: a.cpu - b.cpu, rss: a.rss, hwm: a.hwm}
}

func (o *operator) read(ctx context.Context) (operatorCounters, error) {
	body, err := o.metricsBody(ctx)
	if err != nil {
		return operatorCounters{}, err
	}
	fams, err := families(body)
	if err != nil {
		return operatorCounters{}, err
	}
	c := operatorCounters{
		reconciles:      sum(fams, "controller_runtime_reconcile_total", map[string]string{"controller": desiredOversell}),
		fleetReconciles: sum(fams, "controller_runtime_reconcile_total", map[string]string{"controller": fleetController}),
		requests:        sum(fams, "rest_client_requests_total", nil),
		cpu:             sum(fams, "process_cpu_seconds_total", nil),
	}
	if f := fams["controller_runtime_reconcile_time_seconds"]; f != nil {
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if l.GetName() != "controller" || m.Histogram == nil {
					continue
				}
				switch l.GetValue() {
				case desiredOversell:
					c.reconcileSecs += m.Histogram.GetSampleSum()
				case fleetController:
					c.fleetReconcileSecs += m.Histogram.GetSampleSum()
				}
			}
		}
	}
	c.rss, c.hwm = procStatus(o.proc.Pid(), "VmRSS"), procStatus(o.proc.Pid(), "VmHWM")
	return c, nil
}

// leads reports whether o holds the leader election Lease
// (controller-runtime's leader_election_master_status gauge).
func (o *operator) leads(ctx context.Context) bool {
	body, err := o.metricsBody(ctx)
	if err != nil {
		return false
	}
	fams, err := families(body)
	return err == nil && sum(fams, "leader_election_master_status", nil) > 0
}

// desiredOversell is the NodeOversell controller's name (desired.OversellKind.Short).
const desiredOversell = "oversell"

// fleetController is the SidecarInjector fleet status controller's name
// (controllers/fleet.go).
const fleetController = "sidecar-fleet"

// heapTop is what the operator's live heap holds, by function: go tool
// pprof's -top of its /debug/pprof/heap (in-use bytes after the last GC),
// its first lines, with the process's RssAnon and RssFile.
func (o *operator) heapTop(ctx context.Context, lines int) string {
	url := fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap?gc=1", o.pprofPort)
	// pprof keeps a copy of each profile it fetched in PPROF_TMPDIR.
	dir, err := os.MkdirTemp("", "hw-pprof-")
	if err != nil {
		return err.Error()
	}
	defer os.RemoveAll(dir)
	cmd := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-sample_index=inuse_space", url)
	cmd.Env = append(os.Environ(), "PPROF_TMPDIR="+dir)
	out, err := cmd.CombinedOutput()
	l := strings.Split(string(out), "\n")
	if err != nil {
		return fmt.Sprintf("heap profile: %v: %s", err, strings.Join(l[:min(len(l), 5)], "\n"))
	}
	// Skip pprof's "Fetching profile" and "Saved profile" lines.
	for len(l) > 0 && !strings.HasPrefix(l[0], "File:") && !strings.HasPrefix(l[0], "Type:") {
		l = l[1:]
	}
	return fmt.Sprintf("RssAnon %.1f MiB, RssFile %.1f MiB\n%s", procStatus(o.proc.Pid(), "RssAnon")/(1<<20), procStatus(o.proc.Pid(), "RssFile")/(1<<20),
		strings.Join(l[:min(len(l), lines)], "\n"))
}

// procStatus reads a kB field of /proc/PID/status in bytes (0 if absent).
func procStatus(pid int, key string) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, key+":"); ok {
			n, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return n * 1024
		}
	}
	return 0
}

// running fails once the manager has exited: cluster.During's check for
// a window in which it must keep running.
func (o *operator) running(context.Context) error {
	if done, perr := o.proc.Exited(); done {
		return fmt.Errorf("manager exited: %v", perr)
	}
	return nil
}

// rssPeak samples the operator's VmRSS every second until stopped and
// returns the highest (VmHWM covers the process's whole life, so it
// cannot tell one fleet's peak from an earlier one's).
func (o *operator) rssPeak(ctx context.Context) (stop func() float64) {
	var mu sync.Mutex
	peak := 0.0
	stopSampling := sampleEverySecond(ctx, func() {
		if v := procStatus(o.proc.Pid(), "VmRSS"); v > 0 {
			mu.Lock()
			peak = max(peak, v)
			mu.Unlock()
		}
	})
	return func() float64 {
		stopSampling()
		mu.Lock()
		defer mu.Unlock()
		return peak
	}
}

// sampleEverySecond calls sample at once and then every second, in a
// goroutine of its own, until ctx ends or stop is called; stop returns
// once the last call has.
func sampleEverySecond(ctx context.Context, sample func()) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			sample()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}

// listPath is how the operator's pod index took its last complete list,
// from its log line "pod index listed" (controllers/podindex.go):
// "streamed" (WatchList), "paged", or "" before any.
func (o *operator) listPath() string {
	b, err := os.ReadFile(o.proc.Log)
	if err != nil {
		return ""
	}
	lines := strings.Split(string(b), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if !strings.Contains(lines[i], "pod index listed") {
			continue
		}
		for _, how := range []string{"streamed", "paged"} {
			if strings.Contains(lines[i], `"`+how+`"`) || strings.Contains(lines[i], "="+how) {
				return how
			}
		}
	}
	return ""
}
