package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/test/cluster"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

// The fleet status of a SidecarInjector at scale (issue 18, "Scale on kwok
// nodes"): pods bound to a few Node objects (no kubelet: the fleet counts
// every pod that is not finished, Pending ones too), nine in ten created
// already injected by the engine (sidecar.Inject, as the webhook would
// have, revision label and status annotation included), one in ten plain
// in a matched namespace (missing). The injector's server never runs: its
// Service has no route, so under failurePolicy Ignore every pod is admitted
// as created. The operator runs as its own process (operator_test.go).
const (
	fleetOperatorNS = "hookwright-fleetscale"
	fleetNSLabel    = "scale.hookwright.io/fleet-pods"
	fleetInjector   = "fleet-scale"
	fleetNodes      = 10
)

// fleetFigures is what TestFleetScale measures.
type fleetFigures struct {
	pods, namespaces int
	create           time.Duration // creating every pod (32 at a time)
	converge         time.Duration // last pod created → status.fleet counts right
	scaleUpWrites    int           // CR versions from the first pod created to convergence
	outdated         time.Duration // template change → every injected pod outdated
	quiet            time.Duration
	quietWrites      int
	rssBefore        float64 // operator VmRSS with the injector and no pods
	rssAfter         float64 // VmRSS after convergence
	rssPeak          float64 // highest VmRSS sampled during creation and convergence
	hwm              float64 // VmHWM at the end
	reconciles       float64 // sidecar-fleet reconciles over the run
	reconcileSecs    float64
}

// fleetNodeNames creates fleetNodes bare Nodes, prefix-node-00 on, for
// the fleet's pods to be bound to, deleted when the test ends.
func fleetNodeNames(t *testing.T, ctx context.Context, prefix string) []string {
	t.Helper()
	nodes := make([]string, fleetNodes)
	for i := range nodes {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-node-%02d", prefix, i)}}
		if err := env.Client.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), n) })
		nodes[i] = n.Name
	}
	return nodes
}

func TestFleetScale(t *testing.T) {
	full := os.Getenv("HOOKWRIGHT_SCALE") == "full"
	f := fleetFigures{pods: 1000, namespaces: 10, quiet: 2*5*time.Second + time.Second}
	if full {
		f = fleetFigures{pods: 10000, namespaces: 100, quiet: 60 * time.Second}
	}
	ctx := cluster.TestContext(t, 30*time.Minute)
	c := env.Client
	if _, err := env.CreateNamespace(ctx, fleetOperatorNS, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fleetOperatorNS}})
	})
	op := startOperatorIn(t, ctx, fleetOperatorNS)

	si := cluster.SampleInjector(t, fleetInjector)
	si.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{fleetNSLabel: "on"}}
	si.Spec.FailurePolicy = v1alpha1.FailurePolicyIgnore
	if err := c.Create(ctx, si); err != nil {
		t.Fatal(err)
	}
	// Registered after the operator, so it runs before the operator stops:
	// the operator removes its finalizer.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_ = c.Delete(ctx, si)
		if err := cluster.WaitFor(ctx, 2*time.Minute, "SidecarInjector deleted", func(ctx context.Context) (bool, error) {
			err := c.Get(ctx, client.ObjectKeyFromObject(si), &v1alpha1.SidecarInjector{})
			return err != nil, client.IgnoreNotFound(err)
		}); err != nil {
			t.Error(err)
		}
	})
	var rev string
	waitFor(t, ctx, time.Minute, "status.revision and an empty fleet", func(ctx context.Context) (bool, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(si), si)
		rev = si.Status.Revision
		return rev != "" && si.Status.Fleet != nil, err
	})
	inject := engine(t, si)

	nodes := fleetNodeNames(t, ctx, "fleet")
	nss := make([]string, f.namespaces)
	for i := range nss {
		nss[i] = fmt.Sprintf("fleet-%03d", i)
		if _, err := env.CreateNamespace(ctx, nss[i], map[string]string{fleetNSLabel: "on"}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { deleteFleetPods(t, nss) })

	// Every pod, built before the clock starts: nine in ten injected.
	pods := make([]*corev1.Pod, 0, f.pods)
	want := v1alpha1.FleetCounts{}
	for i := range f.pods {
		p := fleetPod(nss[i%len(nss)], fmt.Sprintf("app-%05d", i), nodes[i%len(nodes)])
		if i%10 != 0 {
			p = inject(p)
			if got := p.Labels[v1alpha1.SidecarRevisionKey]; got != rev {
				t.Fatalf("engine stamped revision %q, status.revision %q", got, rev)
			}
			want.CurrentPods++
		} else {
			want.MissingPods++
		}
		pods = append(pods, p)
	}
	want.MatchedPods, want.InjectedPods = want.CurrentPods+want.MissingPods, want.CurrentPods

	o0, err := op.read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f.rssBefore = o0.rss
	writes, caughtUp := watchWrites(t, ctx, si)
	w0 := writes()
	peak := op.rssPeak(ctx)
	start := time.Now()
	fast := fastClient(t)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for _, p := range pods {
		g.Go(func() error {
			_, err := fast.CoreV1().Pods(p.Namespace).Create(gctx, p, metav1.CreateOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	f.create = time.Since(start)
	f.converge = fleetConverges(t, ctx, si, want, 10*time.Minute)
	if err := caughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	f.scaleUpWrites = writes() - w0
	f.rssPeak = peak()
	o1, err := op.read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f.rssAfter = o1.rss
	t.Logf("%d pods in %d namespaces created in %s; counts right %s after the last (%d CR writes since the first): %+v",
		f.pods, f.namespaces, f.create.Round(time.Millisecond), f.converge.Round(time.Millisecond), f.scaleUpWrites, want)

	// Quiet: nothing changes, nothing is written. Counted from the version
	// the counts converged in, once the watch delivered it.
	if err := caughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	w1 := writes()
	if err := cluster.During(ctx, f.quiet, time.Second, op.running); err != nil {
		t.Fatal(err)
	}
	f.quietWrites = writes() - w1
	t.Logf("quiet %s: %d CR writes", f.quiet, f.quietWrites)
	if f.quietWrites != 0 {
		t.Errorf("a quiet fleet of %d pods wrote the SidecarInjector %d times in %s", f.pods, f.quietWrites, f.quiet)
	}

	// A template change: every injected pod outdated.
	start = time.Now()
	if err := retryUpdate(ctx, si, func() { cluster.SetProxyImage(si, "ghcr.io/hookwright/proxy:1.5.0") }); err != nil {
		t.Fatal(err)
	}
	outdated := want
	outdated.CurrentPods, outdated.OutdatedPods = 0, want.CurrentPods
	fleetConverges(t, ctx, si, outdated, 5*time.Minute)
	f.outdated = time.Since(start)
	o2, err := op.read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f.hwm = o2.hwm
	d := o2.minus(o0)
	f.reconciles, f.reconcileSecs = d.fleetReconciles, d.fleetReconcileSecs
	t.Logf("template change → %d outdated in %s; operator VmRSS %.1f MiB before the pods, %.1f after (peak %.1f, VmHWM %.1f); %v fleet reconciles, %.0f ms each",
		outdated.OutdatedPods, f.outdated.Round(time.Millisecond), f.rssBefore/(1<<20), f.rssAfter/(1<<20), f.rssPeak/(1<<20), f.hwm/(1<<20),
		f.reconciles, 1e3*f.reconcileSecs/max(f.reconciles, 1))
	if full {
		if err := writeReportPart("fleet", fleetReport(f)); err != nil {
			t.Error(err)
		}
	}
}

// engine returns the webhook's mutation of a pod for si as the operator
// compiles it (defaults, then sidecar.Served).
func engine(t *testing.T, si *v1alpha1.SidecarInjector) func(*corev1.Pod) *corev1.Pod {
	t.Helper()
	inject := injectFunc(t, si)
	return func(p *corev1.Pod) *corev1.Pod {
		out, err := inject(p)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
}

// injectFunc is engine for other goroutines than the test's: it returns
// its error (the compiled configuration is only read, so calls may run
// at once).
func injectFunc(t *testing.T, si *v1alpha1.SidecarInjector) func(*corev1.Pod) (*corev1.Pod, error) {
	t.Helper()
	cr := si.DeepCopy()
	cr.Default()
	eff, _, _ := sidecar.Served(cr)
	cfg, err := sidecar.Compile(eff)
	if err != nil {
		t.Fatal(err)
	}
	params := sidecar.Params{OperatorNamespace: fleetOperatorNS}
	return func(p *corev1.Pod) (*corev1.Pod, error) {
		raw, err := json.Marshal(p)
		if err != nil {
			return nil, err
		}
		res, err := sidecar.Inject(cfg, params, sidecar.Input{Raw: raw, Namespace: p.Namespace, WantJSON: true})
		if err != nil || !res.Injected {
			return nil, fmt.Errorf("inject %s/%s: %v %+v", p.Namespace, p.Name, err, res)
		}
		out := &corev1.Pod{}
		if err := json.Unmarshal(res.JSON, out); err != nil {
			return nil, err
		}
		return out, nil
	}
}

// fleetPod is a Deployment-like pod bound to node.
func fleetPod(ns, name, node string) *corev1.Pod {
	app := corev1.Container{Name: "app", Image: "registry.example.com/team/web:1.27.3",
		Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")}}}
	for j := range 4 {
		app.Env = append(app.Env, corev1.EnvVar{Name: fmt.Sprintf("SETTING_%d", j), Value: strings.Repeat("v", 24)})
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels: map[string]string{"app": "web", "pod-template-hash": "7d9f8c6b5"}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{app}},
	}
}

// fastClient is an admin clientset without client-go's rate limit, to
// create pods as fast as the API server takes them.
func fastClient(t *testing.T) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = -1, 0
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// fleetConverges polls si's status.fleet every 250 ms until it is want
// and returns how long that took.
func fleetConverges(t *testing.T, ctx context.Context, si *v1alpha1.SidecarInjector, want v1alpha1.FleetCounts, timeout time.Duration) time.Duration {
	t.Helper()
	var got v1alpha1.FleetCounts
	d, err := cluster.Poll(ctx, 250*time.Millisecond, timeout, fmt.Sprintf("status.fleet %+v", want), func(ctx context.Context) (bool, error) {
		cur := &v1alpha1.SidecarInjector{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(si), cur); err != nil {
			return false, err
		}
		if cur.Status.Fleet != nil {
			got = cur.Status.Fleet.FleetCounts
		}
		return got == want, nil
	})
	if err != nil {
		t.Fatalf("%v: status.fleet %+v", err, got)
	}
	return d
}

// watchWrites counts the modifications of si (every new resourceVersion:
// spec, status or metadata) from now until the test ends, from a watch
// (which, unlike polling, sees every version). caughtUp waits until the
// watch has delivered the version a GET returns now, so a count read
// after it includes every write made before it (on a loaded machine a
// watch event can arrive seconds after the write).
func watchWrites(t *testing.T, ctx context.Context, si *v1alpha1.SidecarInjector) (writes func() int, caughtUp func(context.Context) error) {
	t.Helper()
	dc, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	res := dc.Resource(schema.GroupVersionResource{Group: v1alpha1.GroupVersion.Group, Version: v1alpha1.GroupVersion.Version, Resource: "sidecarinjectors"})
	cur, err := res.Get(ctx, si.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	var n atomic.Int64
	done := make(chan struct{})
	rv := cur.GetResourceVersion()
	var seen atomic.Pointer[string] // a copy of rv for caughtUp
	initial := rv
	seen.Store(&initial)
	go func() {
		defer close(done)
		// A watch the API server ends is resumed from the last version seen.
		for ctx.Err() == nil {
			w, err := res.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + si.Name, ResourceVersion: rv})
			if err != nil {
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
				continue
			}
			for ev := range w.ResultChan() {
				if ev.Type != watch.Modified {
					continue
				}
				if o, ok := ev.Object.(metav1.Object); ok {
					rv = o.GetResourceVersion()
				}
				n.Add(1)
				v := rv
				seen.Store(&v)
			}
			w.Stop()
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	writes = func() int { return int(n.Load()) }
	caughtUp = func(ctx context.Context) error {
		now, err := res.Get(ctx, si.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		want := now.GetResourceVersion()
		return cluster.WaitFor(ctx, 2*time.Minute, "the watch of "+si.Name+" at resourceVersion "+want, func(context.Context) (bool, error) {
			return *seen.Load() == want, nil
		})
	}
	return writes, caughtUp
}

// retryUpdate applies mutate to the latest si until no conflict.
func retryUpdate(ctx context.Context, si *v1alpha1.SidecarInjector, mutate func()) error {
	return cluster.WaitFor(ctx, 30*time.Second, "update SidecarInjector "+si.Name, func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(si), si); err != nil {
			return false, err
		}
		mutate()
		err := env.Client.Update(ctx, si)
		if apierrors.IsConflict(err) {
			return false, nil
		}
		return err == nil, err
	})
}

// deleteFleetPods removes every pod of nss at once (grace period 0: no
// kubelet confirms), then the namespaces (no namespace controller here:
// they stay Terminating, empty, until the cluster stops).
func deleteFleetPods(t *testing.T, nss []string) {
	// 162,500 pods of the largest sweep take minutes; a bound, not a wait.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for _, ns := range nss {
		g.Go(func() error {
			if err := env.Client.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(ns), client.GracePeriodSeconds(0)); err != nil {
				return err
			}
			return env.Client.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
		})
	}
	if err := g.Wait(); err != nil {
		t.Errorf("delete fleet pods: %v", err)
	}
}

func fleetReport(f fleetFigures) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# SidecarInjector fleet status at scale (HOOKWRIGHT_SCALE=full, TestFleetScale)\n\n")
	fmt.Fprintf(&b, "%s. %d pods in %d namespaces on %d Node objects (no kubelet; Pending pods count), nine in ten created injected by the engine at the current revision, one in ten plain (missing); the operator (`hookwright manager`) its own process; its injector server not running (failurePolicy Ignore).\n\n",
		time.Now().UTC().Format(time.RFC3339), f.pods, f.namespaces, fleetNodes)
	b.WriteString("| pods | create all (32 at a time) | last create → counts right | CR writes during scale-up | template change → all outdated | CR writes in quiet window | operator VmRSS MiB: before pods / after / peak / VmHWM | fleet reconciles | ms/reconcile |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	fmt.Fprintf(&b, "| %d | %s | %s | %d | %s | %d in %s (%.1f/min) | %.1f / %.1f / %.1f / %.1f | %.0f | %.0f |\n", f.pods,
		f.create.Round(100*time.Millisecond), f.converge.Round(100*time.Millisecond), f.scaleUpWrites, f.outdated.Round(100*time.Millisecond),
		f.quietWrites, f.quiet, float64(f.quietWrites)/f.quiet.Minutes(),
		f.rssBefore/(1<<20), f.rssAfter/(1<<20), f.rssPeak/(1<<20), f.hwm/(1<<20), f.reconciles, 1e3*f.reconcileSecs/max(f.reconciles, 1))
	return b.String()
}
