package scale

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/test/cluster"
)

// TestPodSweep is issue 24's pod sweep: the operator (two replicas, each
// its own process, with the shipped Go soft memory limit from
// HOOKWRIGHT_MEMORY_LIMIT) keeps exact fleet counts for many
// SidecarInjectors over running and finished pods in many namespaces.
// Pods are bound to Node objects (no kubelet and no kwok here: they stay
// Pending, which the fleet counts like Running ones); the finished ones
// are set Succeeded through pods/status and must not be counted (the
// index's field selector).
//
// By default (`make test`) it is small (600 running pods, 60 finished, 30
// namespaces, 5 injectors) and asserts facts only: exact counts after the
// creation, after a template change on every injector and after a
// takeover (the leader stopped, injector 0's plain pods deleted while no
// replica leads, the standby builds its index from a stream or a paged
// list), no CR write in a quiet window, and none after the takeover for
// the injectors whose pods did not change; then a namespace of 300 pods
// (the sweep: 3,000) relabelled from one injector to another (bigNamespace: one status
// write each, none for the others); then faults during the next
// initial sync (midSyncFaults: a leader killed mid-list, the next one's
// list cut mid-stream), after which the counts are still exact and
// nothing was written. With HOOKWRIGHT_SWEEP_PODS=N
// (`make scale-pods SWEEP_PODS=N`) it runs N running pods, N/12
// finished, N/15 namespaces (at most 10,000) and 50 injectors, kills the
// leader with SIGKILL instead of stopping it, restarts kube-apiserver
// while the mid-sync fault holds a list, then forces a re-sync by
// restarting kube-apiserver (with a new standby started first), samples
// the replicas' VmRSS every second and writes
// _scale/report-podsweep-N.md.
func TestPodSweep(t *testing.T) {
	type size struct {
		running, finished, namespaces, injectors int
		quiet                                    time.Duration
	}
	sz := size{running: 600, finished: 60, namespaces: 30, injectors: 5, quiet: 11 * time.Second}
	measure := false
	if v := os.Getenv(sweepPodsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 100 {
			t.Fatalf("%s=%q: want a number of pods, at least 100", sweepPodsEnv, v)
		}
		sz = size{running: n, finished: n / 12, namespaces: min(max(n/15, 50), 10000), injectors: 50, quiet: time.Minute}
		measure = true
	}
	const opNS = "hookwright-podsweep"
	timeout := 20 * time.Minute
	if measure {
		// 150,000 pods take about 25 minutes to create here.
		timeout = 170 * time.Minute
	}
	ctx := cluster.TestContext(t, timeout)
	c := env.Client
	if _, err := env.CreateNamespace(ctx, opNS, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: opNS}})
	})
	// The shipped limit (config/manager), or make scale-pods'
	// SWEEP_MEMORY_LIMIT: the manager sets its Go soft limit from it.
	memLimit := sweepMemoryLimit(t)
	memEnv := []string{"HOOKWRIGHT_MEMORY_LIMIT=" + strconv.FormatInt(memLimit, 10)}
	// make scale-pods SWEEP_GOGC: the replicas' garbage collector target
	// (Go's GOGC; the shipped manager leaves it at 100), to measure
	// memory against CPU.
	if v := os.Getenv(sweepGOGCEnv); v != "" {
		memEnv = append(memEnv, "GOGC="+v)
	}
	// Two replicas as shipped: the first leads, the second stands by
	// (it holds no pod index until it takes over).
	replicas.reset()
	t.Cleanup(replicas.reset)
	op := replicas.add(startReplica(t, ctx, opNS, memEnv))
	waitFor(t, ctx, 2*time.Minute, "the first replica leads", func(ctx context.Context) (bool, error) {
		return op.leads(ctx), nil
	})
	sb := replicas.add(startReplica(t, ctx, opNS, memEnv))
	rss, sbRSS := newRSSSeries(op), newRSSSeries(sb)
	stopRSS, stopSbRSS := rss.run(ctx), sbRSS.run(ctx)
	defer stopRSS()
	defer stopSbRSS()
	mark := func(phase string) { rss.mark(phase); sbRSS.mark(phase) }

	// Injector i selects the namespaces labelled team=i.
	const teamLabel = "sweep.hookwright.io/team"
	crs := make([]*v1alpha1.SidecarInjector, sz.injectors)
	for i := range crs {
		si := cluster.SampleInjector(t, fmt.Sprintf("sweep-%02d", i))
		si.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{teamLabel: strconv.Itoa(i)}}
		si.Spec.FailurePolicy = v1alpha1.FailurePolicyIgnore
		if err := c.Create(ctx, si); err != nil {
			t.Fatal(err)
		}
		crs[i] = si
	}
	// Deleted while an operator runs, so that it removes the finalizers.
	deleteCRs := func() {
		dctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		for _, si := range crs {
			_ = c.Delete(dctx, si)
		}
		if err := cluster.WaitFor(dctx, 3*time.Minute, "sweep SidecarInjectors deleted", func(ctx context.Context) (bool, error) {
			var l v1alpha1.SidecarInjectorList
			err := c.List(ctx, &l)
			return err == nil && len(l.Items) == 0, err
		}); err != nil {
			t.Error(err)
		}
	}
	// A failure before the takeover: deleted while the first operator runs.
	t.Cleanup(deleteCRs)
	engines := make([]func(*corev1.Pod) (*corev1.Pod, error), len(crs))
	for i, si := range crs {
		waitFor(t, ctx, 2*time.Minute, si.Name+" status.revision and an empty fleet", func(ctx context.Context) (bool, error) {
			err := c.Get(ctx, client.ObjectKeyFromObject(si), si)
			return si.Status.Revision != "" && si.Status.Fleet != nil, err
		})
		engines[i] = injectFunc(t, si)
	}
	nodes := fleetNodeNames(t, ctx, "sweep")
	nss := make([]string, sz.namespaces)
	fast := fastClient(t)
	{
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(16)
		for i := range nss {
			nss[i] = fmt.Sprintf("sweep-%05d", i)
			g.Go(func() error {
				_, err := fast.CoreV1().Namespaces().Create(gctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nss[i],
					Labels: map[string]string{teamLabel: strconv.Itoa(i % sz.injectors)}}}, metav1.CreateOptions{})
				return err
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { deleteFleetPods(t, nss) })

	// Pods in namespace j belong to injector j%injectors: nine in ten
	// injected by it, one in ten plain (missing). Each is built as it is
	// created: 150,000 injected pods held at once would cost this
	// process 3 GiB.
	want := make([]v1alpha1.FleetCounts, len(crs))
	pod := func(i int) (*corev1.Pod, error) {
		j := i % len(nss)
		p := fleetPod(nss[j], fmt.Sprintf("app-%06d", i), nodes[i%len(nodes)])
		if i%10 != 0 {
			return engines[j%len(crs)](p)
		}
		return p, nil
	}
	for i := range sz.running {
		if k := (i % len(nss)) % len(crs); i%10 != 0 {
			want[k].CurrentPods++
		} else {
			want[k].MissingPods++
		}
	}
	for k := range want {
		want[k].MatchedPods, want[k].InjectedPods = want[k].CurrentPods+want[k].MissingPods, want[k].CurrentPods
	}

	mark("create")
	start := time.Now()
	create := func(p *corev1.Pod, finished bool) error {
		got, err := fast.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if err != nil || !finished {
			return err
		}
		got.Status.Phase = corev1.PodSucceeded
		_, err = fast.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, got, metav1.UpdateOptions{})
		return err
	}
	g, _ := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for i := range sz.finished {
		p := fleetPod(nss[i%len(nss)], fmt.Sprintf("job-%06d", i), nodes[i%len(nodes)])
		g.Go(func() error { return create(p, true) })
	}
	for i := range sz.running {
		g.Go(func() error {
			p, err := pod(i)
			if err != nil {
				return err
			}
			return create(p, false)
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	created := time.Since(start)
	mark("converge")
	converge := sweepConverges(t, ctx, crs, want, 20*time.Minute)
	o1, err := op.read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d running + %d finished pods in %d namespaces created in %s; every injector's counts exact %s after the last",
		sz.running, sz.finished, sz.namespaces, created.Round(time.Millisecond), converge.Round(time.Millisecond))

	// Quiet: nothing changes, nothing is written.
	mark("quiet")
	writes := watchAllWrites(t, ctx)
	w0, err := writes.settle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.During(ctx, sz.quiet, time.Second, op.running); err != nil {
		t.Fatal(err)
	}
	w1, err := writes.settle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	quietWrites := w1 - w0
	t.Logf("quiet %s: %d CR writes", sz.quiet, quietWrites)
	// The leader's heap by function (--pprof-bind-address), for the
	// report; make test's small sweep checks that the profile is served.
	heapQuiet, heapTakeover := op.heapTop(ctx, 25), ""
	t.Logf("leader's heap after the quiet minute:\n%s", heapQuiet)
	if !strings.Contains(heapQuiet, "flat%") {
		t.Errorf("no heap profile from the leader's --pprof-bind-address: %s", heapQuiet)
	}
	if quietWrites != 0 {
		t.Errorf("a quiet fleet of %d pods wrote the SidecarInjectors %d times in %s", sz.running, quietWrites, sz.quiet)
	}

	// A template change on every injector: every injected pod outdated.
	mark("template")
	start = time.Now()
	for _, si := range crs {
		if err := retryUpdate(ctx, si, func() { cluster.SetProxyImage(si, "ghcr.io/hookwright/proxy:1.5.0") }); err != nil {
			t.Fatal(err)
		}
	}
	outdated := slices.Clone(want)
	for k := range outdated {
		outdated[k].CurrentPods, outdated[k].OutdatedPods = 0, want[k].CurrentPods
	}
	sweepConverges(t, ctx, crs, outdated, 20*time.Minute)
	templ := time.Since(start)
	o2, err := op.read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	idx := indexFigures(ctx, op)
	// Interim figures, in case a later phase fails on a long sweep.
	t.Logf("template change: all outdated %s after; index %.0f pods, %.0f bytes; leader VmRSS (MiB) so far: %s; standby: %s",
		templ.Round(time.Millisecond), idx.pods, idx.bytes, rss.summary(), sbRSS.summary())
	// The lifecycle reconciler's own writes for the change (revision,
	// observedGeneration) done before the takeover, so that what follows
	// it is the new operator's doing only.
	waitFor(t, ctx, 5*time.Minute, "every SidecarInjector observed its generation", func(ctx context.Context) (bool, error) {
		var l v1alpha1.SidecarInjectorList
		if err := c.List(ctx, &l); err != nil {
			return false, err
		}
		for _, si := range l.Items {
			if si.Status.ObservedGeneration != si.Generation {
				return false, nil
			}
		}
		return true, nil
	})
	before := statuses(t, ctx)

	// A takeover: the leader dies and the standby builds its index from
	// the stream (or the paged list). While no replica leads, injector
	// 0's plain pods are deleted, so its counts must move under the new
	// leader and every other injector's must not be written. The sweep
	// kills the leader (SIGKILL: the Lease runs out, 15 s); make test
	// stops it (it releases the Lease and the standby takes it at once),
	// which asserts the same facts in less time.
	if _, err := writes.settle(ctx); err != nil {
		t.Fatal(err)
	}
	w2by := writes.by()
	stopSbRSS()
	mark("takeover")
	start = time.Now()
	if measure {
		op.proc.Kill()
	} else {
		_ = op.proc.Stop(30 * time.Second)
	}
	rss.switchTo(sb)
	var gone []*corev1.Pod
	for i := range sz.running {
		if i%10 == 0 && (i%len(nss))%len(crs) == 0 {
			p, _ := pod(i) // a plain pod: no injection, no error
			gone = append(gone, p)
		}
	}
	{
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(32)
		for _, p := range gone {
			g.Go(func() error {
				return fast.CoreV1().Pods(p.Namespace).Delete(gctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	deleted := time.Since(start)
	after := slices.Clone(outdated)
	after[0].MissingPods -= int32(len(gone))
	after[0].MatchedPods -= int32(len(gone))
	running := sz.running - len(gone)
	var led, synced time.Duration
	waitFor(t, ctx, 5*time.Minute, "the standby leads", func(ctx context.Context) (bool, error) {
		led = time.Since(start)
		return sb.leads(ctx), nil
	})
	waitFor(t, ctx, 20*time.Minute, "the new leader's index holds every running pod", func(ctx context.Context) (bool, error) {
		n := indexFigures(ctx, sb)
		synced = time.Since(start)
		return n.pods == float64(running), nil
	})
	sweepConverges(t, ctx, crs, after, 5*time.Minute)
	exact := time.Since(start)
	// The stream where the server offers it (WatchList, on by default
	// from kube-apiserver 1.34), else the paged list.
	wantPath := "streamed"
	if os.Getenv(sweepWatchListEnv) == "false" {
		wantPath = "paged"
	}
	listed := sb.listPath()
	if listed != wantPath {
		t.Errorf("the new leader's pod index was %q, want %s", listed, wantPath)
	}
	// Nothing else moved: the new leader's counts equal the written ones
	// for every other injector, so it writes none of them.
	if err := cluster.During(ctx, sz.quiet, time.Second, func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := writes.settle(ctx); err != nil {
		t.Fatal(err)
	}
	w3by := writes.by()
	if measure {
		heapTakeover = sb.heapTop(ctx, 25)
		t.Logf("new leader's heap after the takeover:\n%s", heapTakeover)
	}
	var others int
	for _, si := range crs[1:] {
		others += w3by[si.Name] - w2by[si.Name]
	}
	t.Logf("takeover: %d pods deleted %s after the kill; new leader %s, index of %d pods (%s) %s, counts exact %s after it; %d writes of injector 0, %d of the others",
		len(gone), deleted.Round(time.Millisecond), led.Round(time.Millisecond), running, listed, synced.Round(time.Millisecond), exact.Round(time.Millisecond),
		w3by[crs[0].Name]-w2by[crs[0].Name], others)
	if others != 0 {
		t.Errorf("a takeover wrote the %d SidecarInjectors whose pods did not change %d times: %s", len(crs)-1, others, cmp.Diff(before, statuses(t, ctx)))
	}

	// The published limit of pods in one namespace, moved from injector
	// 0 to injector 1 by a relabel.
	bigPods := smallNamespacePods
	if measure {
		bigPods = bigNamespacePods
	}
	rss.mark("namespace")
	after, big := bigNamespace(t, ctx, fast, writes, crs, after, bigPods, 0, 1, teamLabel, nodes[0], sz.quiet)
	running += bigPods

	// Faults during the next takeover's initial sync: its leader killed
	// mid-list, the next one's list broken mid-stream.
	leader, mid := midSyncFaults(t, ctx, sb, measure, opNS, memEnv, rss, crs, after, running, wantPath == "paged")

	// A forced re-sync (the sweep only: it restarts the API server every
	// test of the package shares): every watch ends, the new server's
	// watch cache starts past the index's resourceVersion, so the
	// reflector gets 410 Gone and lists again. A new standby first, as the
	// Deployment would start one in place of the killed replica: should
	// the leader lose its Lease while the server is away, it takes over.
	var resync resyncFigures
	if measure {
		resync = forcedResync(t, ctx, leader, opNS, memEnv, rss, crs, after, running, sz.quiet)
	}
	defer deleteCRs()
	rss.mark("end")
	stopRSS()
	t.Logf("leader VmRSS (MiB): %s", rss.summary())
	t.Logf("standby VmRSS before the takeover (MiB): %s", sbRSS.summary())
	if measure {
		d := o2.minus(o1)
		perPod := (rss.last("quiet") - rss.first("create")) * (1 << 20) / float64(sz.running)
		body := fmt.Sprintf("# Pod sweep (TestPodSweep, %s=%d)\n\n%s. %d running pods (Pending, bound to %d Node objects) + %d finished, %d namespaces, %d SidecarInjectors; two replicas, each its own process, Go soft limit 90%% of %d MiB.\n\n"+
			"| figure | value |\n|---|---:|\n| create all pods (32 at a time) | %s |\n| last pod created → every injector's counts exact | %s |\n| CR writes in a quiet %s | %d |\n"+
			"| template change on every injector → all outdated | %s |\n| fleet reconciles during the template change | %.0f, %.1f ms each |\n"+
			"| index: pods / estimated bytes / bytes per pod | %.0f / %.0f / %.0f |\n| leader VmRSS per pod (quiet last − create first) | %.0f B |\n"+
			"| standby VmRSS before the takeover: max | %.1f MiB |\n"+
			"| takeover (kill -9): %d pods deleted while no leader | %s after the kill |\n| … standby leads | %s after the kill |\n"+
			"| … its index holds every pod (%s) | %s after the kill |\n| … every injector's counts exact | %s after the kill |\n| … writes of the injectors whose pods did not change | %d |\n"+
			"%s%s%s\n"+
			"Leader VmRSS by phase (MiB, sampled every second: first / max / last; from `takeover` on, the former standby):\n\n%s\n"+
			"Standby VmRSS by phase until the takeover (MiB):\n\n%s\n"+
			"The leader's heap after the quiet minute (go tool pprof -top, in-use bytes):\n\n```\n%s\n```\n\n"+
			"The new leader's heap after the takeover:\n\n```\n%s\n```\n",
			sweepPodsEnv, sz.running, time.Now().UTC().Format(time.RFC3339), sz.running, fleetNodes, sz.finished, sz.namespaces, sz.injectors, memLimit>>20,
			created.Round(time.Second), converge.Round(time.Millisecond), sz.quiet, quietWrites, templ.Round(time.Millisecond),
			d.fleetReconciles, 1e3*d.fleetReconcileSecs/max(d.fleetReconciles, 1),
			idx.pods, idx.bytes, idx.bytes/max(idx.pods, 1), perPod, sbRSS.max(),
			len(gone), deleted.Round(time.Millisecond), led.Round(time.Millisecond), listed, synced.Round(time.Millisecond), exact.Round(time.Millisecond), others,
			big.rows(crs[0].Name, crs[1].Name), mid.rows(), resync.rows(), rss.table(), sbRSS.table(), heapQuiet, heapTakeover)
		if err := writeReportPart(fmt.Sprintf("podsweep-%d", sz.running), body); err != nil {
			t.Error(err)
		}
	}
}

// sweepPodsEnv is the pod sweep's size (make scale-pods SWEEP_PODS=N).
const sweepPodsEnv = "HOOKWRIGHT_SWEEP_PODS"

// sweepWatchListEnv "false" starts the sweep's API server without
// WatchList (make scale-pods SWEEP_WATCHLIST=false).
const sweepWatchListEnv = "HOOKWRIGHT_SWEEP_WATCHLIST"

// sweepAPIServerMemoryEnv is the sweep's kube-apiserver GOMEMLIMIT (make
// scale-pods SWEEP_APISERVER_MEMORY; when empty 10GiB, 16GiB from
// 100,000 pods).
const sweepAPIServerMemoryEnv = "HOOKWRIGHT_SWEEP_APISERVER_MEMORY"

// sweepGOGCEnv is the replicas' GOGC (make scale-pods SWEEP_GOGC; Go's
// default 100 when empty).
const sweepGOGCEnv = "HOOKWRIGHT_SWEEP_GOGC"

// resyncFigures are the forced re-sync's measurements.
type resyncFigures struct {
	away, listed, exact time.Duration
	leader              string // "same" or "new standby"
	writes              int
	standbyMax          float64
}

func (r resyncFigures) rows() string {
	return fmt.Sprintf("| standby started after the takeover: VmRSS max | %.1f MiB |\n"+
		"| forced re-sync (kube-apiserver restarted): server away | %s |\n| … index listed again and holds every pod | %s after the restart began |\n"+
		"| … every injector's counts exact | %s after the restart began |\n| … leader afterwards | %s |\n| … SidecarInjectors written in the quiet window after | %d |\n",
		r.standbyMax, r.away.Round(time.Millisecond), r.listed.Round(time.Millisecond), r.exact.Round(time.Millisecond), r.leader, r.writes)
}

// forcedResync starts a new standby, restarts kube-apiserver and waits
// until the leader's index has listed every pod again (its
// hookwright_pod_index_lists_total stepped) and every injector's counts
// are want; then, after a quiet window, counts the SidecarInjectors whose
// resourceVersion moved (the write watch does not outlive the restart).
func forcedResync(t *testing.T, ctx context.Context, leader *operator, ns string, memEnv []string, rss *rssSeries,
	crs []*v1alpha1.SidecarInjector, want []v1alpha1.FleetCounts, running int, quiet time.Duration) resyncFigures {
	t.Helper()
	var r resyncFigures
	sb := replicas.add(startReplica(t, ctx, ns, memEnv))
	sbRSS := newRSSSeries(sb)
	stopSb := sbRSS.run(ctx)
	lists0 := indexFigures(ctx, leader).lists
	rvs := resourceVersions(t, ctx)
	rss.mark("resync")
	start := time.Now()
	away, err := env.RestartAPIServer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r.away = away
	r.leader = "same"
	waitFor(t, ctx, 20*time.Minute, "the leader's index listed again and holds every pod", func(ctx context.Context) (bool, error) {
		r.listed = time.Since(start)
		if done, _ := leader.proc.Exited(); done && r.leader == "same" {
			// It lost its Lease while the server was away: the new
			// standby builds its index from nothing.
			r.leader, leader, lists0 = "new standby (the leader lost its Lease)", sb, 0
			rss.switchTo(sb)
		}
		n := indexFigures(ctx, leader)
		return n.lists > lists0 && n.pods == float64(running), nil
	})
	sweepConverges(t, ctx, crs, want, 5*time.Minute)
	r.exact = time.Since(start)
	rss.mark("after-resync")
	if err := cluster.During(ctx, quiet, time.Second, func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	for name, rv := range resourceVersions(t, ctx) {
		if rv != rvs[name] {
			r.writes++
		}
	}
	stopSb()
	r.standbyMax = sbRSS.max()
	t.Logf("re-sync: server away %s, index listed again %s, counts exact %s after the restart began; leader: %s; %d SidecarInjectors written after",
		r.away.Round(time.Millisecond), r.listed.Round(time.Millisecond), r.exact.Round(time.Millisecond), r.leader, r.writes)
	if r.writes != 0 {
		t.Errorf("a re-sync with no pod changed wrote %d SidecarInjectors", r.writes)
	}
	return r
}

// resourceVersions are every SidecarInjector's resourceVersion, by name.
func resourceVersions(t *testing.T, ctx context.Context) map[string]string {
	t.Helper()
	var l v1alpha1.SidecarInjectorList
	if err := env.Client.List(ctx, &l); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, si := range l.Items {
		out[si.Name] = si.ResourceVersion
	}
	return out
}

// shippedMemoryLimit is config/manager's memory limit, in bytes.
const shippedMemoryLimit = 256 << 20

// sweepMemoryLimitEnv sets the sweep's memory limit instead of the
// shipped one (make scale-pods SWEEP_MEMORY_LIMIT=512Mi): a row of
// docs/scale.md's sizing table is measured with the limit it proposes.
const sweepMemoryLimitEnv = "HOOKWRIGHT_SWEEP_MEMORY_LIMIT"

// sweepMemoryLimit is the memory limit the sweep's replicas take their Go
// soft limit from, in bytes: sweepMemoryLimitEnv as a quantity, or
// shippedMemoryLimit when it is unset.
func sweepMemoryLimit(t *testing.T) int64 {
	v := os.Getenv(sweepMemoryLimitEnv)
	if v == "" {
		return shippedMemoryLimit
	}
	q, err := resource.ParseQuantity(v)
	if err != nil || q.Value() < 64<<20 {
		t.Fatalf("%s=%q: want a memory quantity of at least 64Mi (%v)", sweepMemoryLimitEnv, v, err)
	}
	return q.Value()
}

// sweepConverges polls every injector's status.fleet (one list every
// 250 ms) until each is want[i] and returns how long that took.
func sweepConverges(t *testing.T, ctx context.Context, crs []*v1alpha1.SidecarInjector, want []v1alpha1.FleetCounts, timeout time.Duration) time.Duration {
	t.Helper()
	var bad string
	d, err := cluster.Poll(ctx, 250*time.Millisecond, timeout, "every injector's status.fleet exact", func(ctx context.Context) (bool, error) {
		if err := replicas.allExited(); err != nil {
			return false, cluster.Permanent(err)
		}
		var l v1alpha1.SidecarInjectorList
		if err := env.Client.List(ctx, &l); err != nil {
			return false, err
		}
		got := map[string]v1alpha1.FleetCounts{}
		for _, si := range l.Items {
			if si.Status.Fleet != nil {
				got[si.Name] = si.Status.Fleet.FleetCounts
			}
		}
		for i, si := range crs {
			if got[si.Name] != want[i] {
				bad = fmt.Sprintf("%s: %+v, want %+v", si.Name, got[si.Name], want[i])
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("%v: %s", err, bad)
	}
	return d
}

// sweepReplicas are the sweep's operator processes: when every one has
// exited (each exits when it loses its Lease, as it would on a loaded
// cluster whose Deployment then restarts it), no count can move any more.
type sweepReplicas struct {
	mu  sync.Mutex
	ops []*operator
}

var replicas sweepReplicas

func (r *sweepReplicas) add(o *operator) *operator {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, o)
	return o
}

func (r *sweepReplicas) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = nil
}

// allExited is an error naming how the last replica ended once every
// replica has exited, nil while one runs (or none was added).
func (r *sweepReplicas) allExited() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.ops) == 0 {
		return nil
	}
	for _, o := range r.ops {
		if done, _ := o.proc.Exited(); !done {
			return nil
		}
	}
	o := r.ops[len(r.ops)-1]
	_, err := o.proc.Exited()
	return fmt.Errorf("every operator replica exited (the last: %v); log tail:\n%s", err, o.proc.Tail(1500))
}

// statuses are every SidecarInjector's status, by name.
func statuses(t *testing.T, ctx context.Context) map[string]v1alpha1.SidecarInjectorStatus {
	t.Helper()
	var l v1alpha1.SidecarInjectorList
	if err := env.Client.List(ctx, &l); err != nil {
		t.Fatal(err)
	}
	out := map[string]v1alpha1.SidecarInjectorStatus{}
	for _, si := range l.Items {
		out[si.Name] = si.Status
	}
	return out
}

type idxFigures struct{ pods, bytes, lists float64 }

// indexFigures reads the operator's pod index metrics (zeros when it
// cannot be read yet).
func indexFigures(ctx context.Context, o *operator) idxFigures {
	body, err := o.metricsBody(ctx)
	if err != nil {
		return idxFigures{}
	}
	fams, err := families(body)
	if err != nil {
		return idxFigures{}
	}
	return idxFigures{pods: sum(fams, "hookwright_pod_index_pods", nil), bytes: sum(fams, "hookwright_pod_index_bytes", nil),
		lists: sum(fams, "hookwright_pod_index_lists_total", nil)}
}

// allWrites counts the modifications of every SidecarInjector from a
// watch of them all.
type allWrites struct {
	n      atomic.Int64
	seen   atomic.Pointer[string]
	res    dynamic.NamespaceableResourceInterface
	mu     sync.Mutex
	byName map[string]int
}

// by is the count of modifications per SidecarInjector name.
func (a *allWrites) by() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.byName)
}

func watchAllWrites(t *testing.T, ctx context.Context) *allWrites {
	t.Helper()
	dc, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	a := &allWrites{byName: map[string]int{}, res: dc.Resource(schema.GroupVersionResource{Group: v1alpha1.GroupVersion.Group, Version: v1alpha1.GroupVersion.Version, Resource: "sidecarinjectors"})}
	l, err := a.res.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rv := l.GetResourceVersion()
	a.seen.Store(&rv)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			w, err := a.res.Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
			if err != nil {
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
				continue
			}
			expired := false
			for ev := range w.ResultChan() {
				if ev.Type == watch.Error {
					// 410 Gone (the API server restarted): resumed
					// below from a new list; writes in between are
					// not seen (forcedResync compares versions).
					expired = true
					break
				}
				o, ok := ev.Object.(metav1.Object)
				if !ok {
					continue
				}
				rv = o.GetResourceVersion()
				if ev.Type == watch.Modified {
					a.n.Add(1)
					a.mu.Lock()
					a.byName[o.GetName()]++
					a.mu.Unlock()
				}
				v := rv
				a.seen.Store(&v)
			}
			w.Stop()
			if expired {
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
				if l, err := a.res.List(ctx, metav1.ListOptions{}); err == nil {
					rv = l.GetResourceVersion()
					v := rv
					a.seen.Store(&v)
				}
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return a
}

// settle waits until the watch has delivered every write made before the
// call (a list's resourceVersion, by the bookmarks and events after it)
// and returns the count.
func (a *allWrites) settle(ctx context.Context) (int, error) {
	l, err := a.res.List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	want, _ := strconv.ParseUint(l.GetResourceVersion(), 10, 64)
	err = cluster.WaitFor(ctx, 2*time.Minute, "the SidecarInjector watch at "+l.GetResourceVersion(), func(context.Context) (bool, error) {
		got, _ := strconv.ParseUint(*a.seen.Load(), 10, 64)
		if got >= want {
			return true, nil
		}
		// Nothing written since: the list's version may be past every
		// SidecarInjector event; a new list tells whether any came.
		l2, err := a.res.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, it := range l2.Items {
			v, _ := strconv.ParseUint(it.GetResourceVersion(), 10, 64)
			if v > got {
				return false, nil
			}
		}
		return true, nil
	})
	return int(a.n.Load()), err
}

// rssSeries samples an operator's VmRSS every second, by phase.
type rssSeries struct {
	mu     sync.Mutex
	op     *operator
	phase  string
	phases []string
	by     map[string][]float64
}

func newRSSSeries(op *operator) *rssSeries {
	return &rssSeries{op: op, phase: "start", phases: []string{"start"}, by: map[string][]float64{}}
}

func (r *rssSeries) mark(phase string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.phase = phase
	r.phases = append(r.phases, phase)
}

func (r *rssSeries) switchTo(op *operator) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.op = op
}

func (r *rssSeries) run(ctx context.Context) (stop func()) {
	stopSampling := sampleEverySecond(ctx, func() {
		r.mu.Lock()
		if v := procStatus(r.op.proc.Pid(), "VmRSS"); v > 0 {
			r.by[r.phase] = append(r.by[r.phase], v/(1<<20))
		}
		r.mu.Unlock()
	})
	var once sync.Once
	return func() { once.Do(stopSampling) }
}

// first and last are a phase's first and last samples (MiB; 0 if none).
func (r *rssSeries) first(phase string) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.by[phase]; len(s) > 0 {
		return s[0]
	}
	return 0
}

func (r *rssSeries) last(phase string) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.by[phase]; len(s) > 0 {
		return s[len(s)-1]
	}
	return 0
}

// maxOf is the highest sample of a phase (MiB; 0 if none).
func (r *rssSeries) maxOf(phase string) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.by[phase]; len(s) > 0 {
		return slices.Max(s)
	}
	return 0
}

// max is the highest sample of every phase (MiB).
func (r *rssSeries) max() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := 0.0
	for _, s := range r.by {
		m = max(m, slices.Max(s))
	}
	return m
}

func (r *rssSeries) summary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var parts []string
	for _, p := range r.phases {
		if s := r.by[p]; len(s) > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f/%.0f/%.0f", p, s[0], slices.Max(s), s[len(s)-1]))
		}
	}
	return strings.Join(parts, "; ")
}

func (r *rssSeries) table() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	b.WriteString("| phase | samples | first | max | max at sample | last |\n|---|---:|---:|---:|---:|---:|\n")
	for _, p := range r.phases {
		if s := r.by[p]; len(s) > 0 {
			// Where in the phase the peak fell (the first sample is 1):
			// a list's end, or the work after it.
			at := slices.Index(s, slices.Max(s)) + 1
			fmt.Fprintf(&b, "| %s | %d | %.1f | %.1f | %d | %.1f |\n", p, len(s), s[0], slices.Max(s), at, s[len(s)-1])
		}
	}
	return b.String()
}
