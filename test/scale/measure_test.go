package scale

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"

	"github.com/hookwright/hookwright/test/cluster"
)

// phase is one measured window of a fleet.
type phase struct {
	name      string
	seconds   float64
	api       apiCounters
	srv       serverCounters // deltas, rss at the end
	beatFails int
}

// fleetResult is one fleet size's figures.
type fleetResult struct {
	nodes           int
	phases          []phase
	ratioChange     time.Duration // ratio 2 → 3 until every node publishes it (holding server)
	amplifyAll      time.Duration // NodeOversell created until every node is amplified
	holdRSS, ampRSS float64
	// The operator over the fleet's whole run (nodes registered until the
	// ratio change reached them): counter deltas, VmRSS after the held
	// window (steady) and the highest VmRSS sampled (peak).
	op               operatorCounters
	opSeconds        float64
	opSteady, opPeak float64
}

// measureFull runs the fleets of HOOKWRIGHT_SCALE_SIZES (default
// 10,100,1000) for HOOKWRIGHT_SCALE_WINDOW each phase (default 60s) and
// writes _scale/report-full.md.
func measureFull(t *testing.T) {
	sizes := []int{10, 100, 1000}
	if v := os.Getenv("HOOKWRIGHT_SCALE_SIZES"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				t.Fatalf("HOOKWRIGHT_SCALE_SIZES: %q is not a positive number", f)
			}
			sizes = append(sizes, n)
		}
	}
	window := 60 * time.Second
	if v := os.Getenv("HOOKWRIGHT_SCALE_WINDOW"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("HOOKWRIGHT_SCALE_WINDOW: %q is not a positive duration", v)
		}
		window = d
	}
	ctx := cluster.TestContext(t, 3*time.Hour)
	certDir, svc := setup(t, ctx)
	op := startOperator(t, ctx)
	var results []fleetResult
	for _, n := range sizes {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			r := measureFleet(t, ctx, op, certDir, svc, n, window)
			results = append(results, r)
			// Each fleet's figures land even if a later one fails.
			if err := writeReport(results, window); err != nil {
				t.Error(err)
			}
		})
	}
}

// measureFleet measures n nodes plain, amplified by a server that never
// holds, and amplified by one that holds (the default). Each fleet has its
// own two servers: the API server keeps its connections to a webhook
// through the egress tunnel it opened, so a route change takes effect only
// once the old server is gone.
func measureFleet(t *testing.T, ctx context.Context, op *operator, certDir string, svc *corev1.Service, n int, window time.Duration) fleetResult {
	fleet := fmt.Sprintf("f%d", n)
	r := fleetResult{nodes: n}
	o0, err := op.read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	opStart := time.Now()
	peak := op.rssPeak(ctx)
	amp := startServer(t, ctx, "amplify", certDir, "--max-heartbeat-age=0")
	hold := startServer(t, ctx, "hold", certDir)
	if err := env.RouteService(svc, amp.addr); err != nil {
		t.Fatal(err)
	}
	hb := startFleet(t, ctx, fleet, n)
	waitFor(t, ctx, 5*time.Minute, fmt.Sprintf("first report of all %d nodes", n), func(context.Context) (bool, error) {
		for _, name := range hb.Nodes() {
			if p, _, _ := hb.Stats(name); p == 0 {
				return false, nil
			}
		}
		return true, nil
	})
	r.phases = append(r.phases, measureWindow(t, ctx, "plain", amp, hb, window))

	// A plain node reports again only after the report period (2.5 to 7.5
	// min after its last change): force one report per node, as the
	// operator's re-touch or a kubelet restart does.
	no := createNodeOversell(t, ctx, fleet, "2")
	waitServed(t, ctx, 1, amp, hold)
	start := time.Now()
	forceBeats(t, ctx, hb)
	waitFleetCPU(t, ctx, fleet, n, "7600m", 5*time.Minute)
	r.amplifyAll = time.Since(start)
	r.phases = append(r.phases, measureWindow(t, ctx, "amplified", amp, hb, window))

	ac, err := amp.read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r.ampRSS = ac.rss
	if err := env.RouteService(svc, hold.addr); err != nil {
		t.Fatal(err)
	}
	_ = amp.proc.Stop(5 * time.Second)
	h0, err := hold.read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, 2*time.Minute, "holding server answering every node", func(ctx context.Context) (bool, error) {
		h, err := hold.read(ctx)
		return err == nil && h.held-h0.held >= float64(n), err
	})
	r.phases = append(r.phases, measureWindow(t, ctx, "amplified, held", hold, hb, window))
	r.opSteady = procStatus(op.proc.Pid(), "VmRSS")

	setRatio(t, ctx, no, "3")
	r.ratioChange = waitFleetCPU(t, ctx, fleet, n, "11400m", 5*time.Minute)
	hc, err := hold.read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r.holdRSS = hc.rss
	o1, err := op.read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r.op, r.opSeconds, r.opPeak = o1.minus(o0), time.Since(opStart).Seconds(), peak()
	if done, perr := op.proc.Exited(); done {
		t.Fatalf("manager exited: %v", perr)
	}
	t.Logf("%d nodes: amplified all in %s, ratio change on all in %s", n, r.amplifyAll.Round(time.Millisecond), r.ratioChange.Round(time.Millisecond))
	return r
}

// forceBeats sends one out-of-schedule report per node, 16 at a time.
func forceBeats(t *testing.T, ctx context.Context, hb *cluster.Heartbeater) {
	t.Helper()
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for _, name := range hb.Nodes() {
		g.Go(func() error { return hb.Beat(ctx, name) })
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}

// measureWindow reads the counters before and after window.
func measureWindow(t *testing.T, ctx context.Context, name string, s *server, hb *cluster.Heartbeater, window time.Duration) phase {
	t.Helper()
	fails := func() int {
		total := 0
		for _, n := range hb.Nodes() {
			_, e, _ := hb.Stats(n)
			total += e
		}
		return total
	}
	a0, err := readAPI(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s0, err := s.read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f0 := fails()
	start := time.Now()
	// Sample the server meanwhile, so a crash ends the window early.
	if err := cluster.During(ctx, window, 5*time.Second, func(ctx context.Context) error {
		if done, perr := s.proc.Exited(); done {
			return fmt.Errorf("server exited: %v", perr)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	secs := time.Since(start).Seconds()
	a1, err := readAPI(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s1, err := s.read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p := phase{name: name, seconds: secs, api: a1.minus(a0), beatFails: fails() - f0,
		srv: serverCounters{reviews: s1.reviews - s0.reviews, held: s1.held - s0.held, cpu: s1.cpu - s0.cpu, rss: s1.rss}}
	t.Logf("%s over %.0f s: %+v server %+v", name, secs, p.api, p.srv)
	return p
}

func writeReport(results []fleetResult, window time.Duration) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# NodeOversell cost at scale (HOOKWRIGHT_SCALE=full)\n\n")
	fmt.Fprintf(&b, "%s, %d-s windows, nodes played by cluster.Heartbeater (kubelet rhythm: GET every 10 s, status PATCH when changed or every 5 min, Lease every 10 s); cpu ratio 2 then 3.\n\n", time.Now().UTC().Format(time.RFC3339), int(window.Seconds()))
	b.WriteString("| nodes | phase | status PATCH/s | node GET/s | webhook calls/s | etcd node writes/s | etcd lease writes/s | held/s | server CPU µs/review | server RSS MiB | failed beats |\n")
	b.WriteString("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range results {
		for _, p := range r.phases {
			per := func(v float64) string { return fmt.Sprintf("%.2f", v/p.seconds) }
			cpu := "-"
			if p.srv.reviews > 0 {
				cpu = fmt.Sprintf("%.0f", p.srv.cpu/p.srv.reviews*1e6)
			}
			fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %s | %s | %s | %.1f | %d |\n", r.nodes, p.name,
				per(p.api.statusPatches), per(p.api.nodeGets), per(p.api.webhookCalls), per(p.api.nodeWrites), per(p.api.leaseWrites),
				per(p.srv.held), cpu, p.srv.rss/(1<<20), p.beatFails)
		}
	}
	b.WriteString("\n| nodes | NodeOversell served → every node amplified (one forced report each) | ratio 2 → 3 → every node updated | server RSS MiB (no hold / hold) |\n|---:|---:|---:|---:|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %d | %s | %s | %.1f / %.1f |\n", r.nodes, r.amplifyAll.Round(100*time.Millisecond), r.ratioChange.Round(100*time.Millisecond), r.ampRSS/(1<<20), r.holdRSS/(1<<20))
	}
	b.WriteString("\nThe operator (`hookwright manager`, its own process) from the fleet's registration to the ratio change reaching it; its NodeOversell server has no pod here, so ConfigLoaded stays False and the NodeOversell is reconciled again every 5 s besides node events. Steady RSS after the held window, peak sampled every second; API requests from its rest_client_requests_total.\n")
	b.WriteString("\n| nodes | operator RSS MiB steady / peak | NodeOversell reconciles/min | reconcile time ms/reconcile | operator API requests/min | operator CPU ms/min |\n|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range results {
		m := r.opSeconds / 60
		perRec := "-"
		if r.op.reconciles > 0 {
			perRec = fmt.Sprintf("%.1f", r.op.reconcileSecs/r.op.reconciles*1e3)
		}
		fmt.Fprintf(&b, "| %d | %.1f / %.1f | %.1f | %s | %.1f | %.0f |\n", r.nodes, r.opSteady/(1<<20), r.opPeak/(1<<20),
			r.op.reconciles/m, perRec, r.op.requests/m, r.op.cpu/m*1e3)
	}
	return writeReportPart("oversell", b.String())
}

// writeReportPart writes one test's section of the full report to
// _scale/part-NAME.md and _scale/report-full.md as every part so far, by
// name, so TestScale and TestFleetScale each keep the other's figures.
func writeReportPart(name, body string) error {
	root, err := cluster.RepoRoot()
	if err != nil {
		return err
	}
	dir := filepath.Join(root, "_scale")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "part-"+name+".md"), []byte(body), 0o644); err != nil {
		return err
	}
	parts, err := filepath.Glob(filepath.Join(dir, "part-*.md"))
	if err != nil {
		return err
	}
	var all []string
	for _, p := range parts {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		all = append(all, strings.TrimRight(string(b), "\n")+"\n")
	}
	return os.WriteFile(filepath.Join(dir, "report-full.md"), []byte(strings.Join(all, "\n")), 0o644)
}
