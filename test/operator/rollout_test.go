package operator

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// The rollout (spec.rollout, internal/rollout) against the real API
// server: kube-controller-manager rolls the Deployments the operator
// restarts, the disruption controller fills in PodDisruptionBudget
// status, kwok makes the new pods Ready, and the injector server (a local
// process behind the CR's Service) injects them.

// stepEnv is the env var of the proxy container a test changes to make a
// new revision ("a template change").
var (
	injectorEnv = regexp.MustCompile(`(?m)^( *)- name: INJECTOR\n`)
	stepEnv     = regexp.MustCompile(`(?m)^( +- name: ROLLOUT_STEP\n +value: )"[^"]*"`)
)

// rolloutFixture is one SidecarInjector (failurePolicy Ignore, namespaces
// labelled sidecar-injection=<name>) and, once served, its local server.
type rolloutFixture struct {
	si    *v1alpha1.SidecarInjector
	name  string
	o     owned
	srv   *localServer
	step  int
	probe string // a namespace to probe the server with
	nss   []string
	once  sync.Once
}

// dump logs the CR's status and the namespaces' Deployments and pods
// once, when the test failed, before the namespaces are removed.
func (f *rolloutFixture) dump(t *testing.T) {
	if !t.Failed() {
		return
	}
	f.once.Do(func() {
		ctx := context.Background()
		cur := &v1alpha1.SidecarInjector{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(f.si), cur); err == nil {
			t.Logf("SidecarInjector %s at the end: generation %d, revision %s, fleet %+v, rollout %+v; conditions:%s", f.name,
				cur.Generation, cur.Status.Revision, fleetCounts(cur), cur.Status.Rollout, fmtConds(cur.Status.Conditions))
		}
		for _, ns := range f.nss {
			var deps appsv1.DeploymentList
			_ = env.Client.List(ctx, &deps, client.InNamespace(ns))
			for _, d := range deps.Items {
				r, at := restartedFor(&d)
				t.Logf("Deployment %s/%s: generation %d, restarted-for %q, restartedAt %q, status %+v", ns, d.Name, d.Generation, r, at, d.Status)
			}
			var pods corev1.PodList
			_ = env.Client.List(ctx, &pods, client.InNamespace(ns))
			for _, p := range pods.Items {
				t.Logf("pod %s/%s: phase %s, revision %q, deleting %t, owner %v", ns, p.Name, p.Status.Phase, p.Labels[v1alpha1.SidecarRevisionKey], p.DeletionTimestamp != nil, metav1.GetControllerOf(&p))
			}
		}
		if f.srv != nil {
			done, err := f.srv.proc.Exited()
			t.Logf("local server %s: exited %t (%v); log tail:\n%s", f.srv.proc.Name, done, err, f.srv.proc.Tail(6000))
		}
		// Why the API server's calls of this webhook failed, if they did.
		if b, err := os.ReadFile(filepath.Join(env.Dir, "logs", "kube-apiserver.log")); err == nil && f.o.Svc != nil {
			var calls []string
			for _, l := range strings.Split(string(b), "\n") {
				if strings.Contains(l, "failed calling webhook") && strings.Contains(l, f.o.Svc.Name) {
					calls = append(calls, l)
				}
			}
			t.Logf("kube-apiserver: %d failed calls of %s; the last ones:\n%s", len(calls), f.o.Svc.Name, strings.Join(calls[max(0, len(calls)-5):], "\n"))
		}
		t.Logf("operator log: %s", env.Dir+"/logs/operator.log")
	})
}

func newRolloutFixture(t *testing.T, ctx context.Context, name string, rollout v1alpha1.RolloutSpec) *rolloutFixture {
	t.Helper()
	si := scopedInjector(t, name, "sidecar-injection", name, v1alpha1.FailurePolicyIgnore)
	for i := range si.Spec.Templates {
		if si.Spec.Templates[i].Name == "proxy" {
			tmpl := si.Spec.Templates[i].Template
			if !injectorEnv.MatchString(tmpl) {
				t.Fatalf("the sample's proxy template has no env var INJECTOR:\n%s", tmpl)
			}
			si.Spec.Templates[i].Template = injectorEnv.ReplaceAllString(tmpl, "${1}- name: ROLLOUT_STEP\n${1}  value: \"0\"\n${1}- name: INJECTOR\n")
		}
	}
	si.Spec.Rollout = rollout
	create(t, ctx, si)
	f := &rolloutFixture{si: si, name: name}
	t.Cleanup(func() { f.dump(t) })
	// Restart needs the CR Ready: kwok runs the server Deployment's pods.
	waitConditions(t, ctx, si, func() []metav1.Condition { return si.Status.Conditions }, map[string]metav1.ConditionStatus{
		v1alpha1.ConditionCertificateReady: metav1.ConditionTrue, v1alpha1.ConditionWebhookConfigured: metav1.ConditionTrue,
		v1alpha1.ConditionReady: metav1.ConditionTrue,
	}, 90*time.Second)
	f.o = ownedKeys(desired.SidecarKind.BaseName(name), operatorNS)
	f.o.fetch(t, ctx, "SidecarInjector", si.UID)
	return f
}

func fleetCounts(si *v1alpha1.SidecarInjector) v1alpha1.FleetCounts {
	if si.Status.Fleet == nil {
		return v1alpha1.FleetCounts{}
	}
	return si.Status.Fleet.FleetCounts
}

// namespace creates a namespace the injector matches, removed (with its
// pods, at once) when the test ends.
func (f *rolloutFixture) namespace(t *testing.T, ctx context.Context, name string, labels map[string]string) {
	t.Helper()
	l := map[string]string{"sidecar-injection": f.name}
	for k, v := range labels {
		l[k] = v
	}
	if _, err := env.CreateNamespace(ctx, name, l); err != nil {
		t.Fatal(err)
	}
	if f.probe == "" {
		f.probe = name
	}
	f.nss = append(f.nss, name)
	t.Cleanup(func() {
		f.dump(t)
		bg := context.Background()
		_ = env.Client.DeleteAllOf(bg, &appsv1.Deployment{}, client.InNamespace(name))
		_ = env.Client.DeleteAllOf(bg, &batchv1.Job{}, client.InNamespace(name), client.PropagationPolicy(metav1.DeletePropagationBackground))
		_ = env.Client.DeleteAllOf(bg, &corev1.Pod{}, client.InNamespace(name), client.GracePeriodSeconds(0))
		_ = env.Client.Delete(bg, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	})
}

// serve starts the injector's server and routes its Service to it; it
// returns once a dry-run pod is injected.
func (f *rolloutFixture) serve(t *testing.T, ctx context.Context) {
	t.Helper()
	ct := f.o.Deploy.Spec.Template.Spec.Containers[0]
	kc := serviceAccountKubeconfig(t, t.TempDir(), operatorNS, f.o.SA.Name)
	f.srv = startLocalServer(t, "injector-"+f.name, ct.Args, f.o.Secret.Data[corev1.TLSCertKey], f.o.Secret.Data[corev1.TLSPrivateKeyKey], kc)
	f.srv.follow(t, f.o.Secret)
	// Dump before the server stops and its log directory goes.
	t.Cleanup(func() { f.dump(t) })
	if err := env.RouteService(f.o.Svc, f.srv.Addr()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.UnrouteService(f.o.Svc) })
	if err := cluster.WaitFor(ctx, 30*time.Second, "the injector serving", func(ctx context.Context) (bool, error) {
		p := barePod(f.probe, "probe")
		if err := env.Client.Create(ctx, p, client.DryRunAll); err != nil {
			return false, err
		}
		return injected(p), nil
	}); err != nil {
		t.Fatalf("%v\ninjector log:\n%s", err, f.srv.proc.Tail(3000))
	}
}

// revision waits until status.revision is set and differs from not.
func (f *rolloutFixture) revision(t *testing.T, ctx context.Context, not string) string {
	t.Helper()
	var rev string
	if err := cluster.WaitFor(ctx, bound(30*time.Second), "a new status.revision", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(f.si), f.si)
		rev = f.si.Status.Revision
		return rev != "" && rev != not, err
	}); err != nil {
		t.Fatalf("%v: %q", err, rev)
	}
	// The server must inject it before a restart can bring pods to it.
	if f.srv != nil {
		if err := cluster.WaitFor(ctx, bound(30*time.Second), "the server injecting revision "+rev, func(ctx context.Context) (bool, error) {
			p := barePod(f.probe, "probe")
			if err := env.Client.Create(ctx, p, client.DryRunAll); err != nil {
				return false, err
			}
			return p.Labels[v1alpha1.SidecarRevisionKey] == rev, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	return rev
}

// change updates the CR: mutate on its spec; with newStep the proxy's
// ROLLOUT_STEP env var changes too (a new revision).
func (f *rolloutFixture) change(t *testing.T, ctx context.Context, newStep bool, mutate func(*v1alpha1.SidecarInjectorSpec)) {
	t.Helper()
	if newStep {
		f.step++
	}
	if err := update(ctx, f.si, func() {
		if newStep {
			for i := range f.si.Spec.Templates {
				if f.si.Spec.Templates[i].Name == "proxy" {
					f.si.Spec.Templates[i].Template = stepEnv.ReplaceAllString(f.si.Spec.Templates[i].Template, fmt.Sprintf(`${1}"%d"`, f.step))
				}
			}
		}
		if mutate != nil {
			mutate(&f.si.Spec)
		}
	}); err != nil {
		t.Fatal(err)
	}
}

// fleetIs waits until the CR's status.fleet counts satisfy ok, failing
// with the last counts read.
func (f *rolloutFixture) fleetIs(t *testing.T, ctx context.Context, timeout time.Duration, what string, ok func(v1alpha1.FleetCounts) bool) {
	t.Helper()
	if err := cluster.WaitFor(ctx, timeout, what, func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(f.si), f.si)
		return ok(fleetCounts(f.si)), err
	}); err != nil {
		t.Fatalf("%v: %+v", err, fleetCounts(f.si))
	}
}

// rolloutIs waits until status.rollout (for revision rev) satisfies ok.
func (f *rolloutFixture) rolloutIs(t *testing.T, ctx context.Context, what, rev string, timeout time.Duration, ok func(*v1alpha1.RolloutStatus, *v1alpha1.SidecarInjector) bool) *v1alpha1.RolloutStatus {
	t.Helper()
	var last *v1alpha1.RolloutStatus
	d, err := cluster.Poll(ctx, 100*time.Millisecond, bound(timeout), what, func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(f.si), f.si); err != nil {
			return false, err
		}
		last = f.si.Status.Rollout
		return last != nil && last.Revision == rev && ok(last, f.si), nil
	})
	if err != nil {
		t.Fatalf("%v: status.rollout %+v, fleet %+v; conditions:%s", err, last, fleetCounts(f.si), fmtConds(f.si.Status.Conditions))
	}
	t.Logf("%s after %s: total %d updated %d unavailable %d partitioned %d inProgress %v skipped %+v",
		what, d.Round(time.Millisecond), last.Total, last.Updated, last.Unavailable, last.Partitioned, last.InProgress, last.Skipped)
	return last
}

// condition waits until the CR's condition typ has status st, reason (if
// set) and a message containing msg, for its current generation.
func (f *rolloutFixture) condition(t *testing.T, ctx context.Context, typ string, st metav1.ConditionStatus, reason, msg string, timeout time.Duration) metav1.Condition {
	t.Helper()
	var got *metav1.Condition
	d, err := cluster.Poll(ctx, 100*time.Millisecond, bound(timeout), fmt.Sprintf("%s %s %s (%s)", typ, st, reason, msg), func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(f.si), f.si)
		got = apimeta.FindStatusCondition(f.si.Status.Conditions, typ)
		return got != nil && got.Status == st && got.ObservedGeneration == f.si.Generation &&
			(reason == "" || got.Reason == reason) && strings.Contains(got.Message, msg), err
	})
	if err != nil {
		t.Fatalf("%v: %+v; rollout %+v", err, got, f.si.Status.Rollout)
	}
	t.Logf("%s=%s (%s) after %s: %s", typ, got.Status, got.Reason, d.Round(time.Millisecond), got.Message)
	return *got
}

func barePod(ns, name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "nginx:1.27"}}}}
}

// deploy creates a Deployment of replicas pods labelled app=name (and
// podLabels) and waits until it is available.
func deploy(t *testing.T, ctx context.Context, ns, name string, replicas int32, podLabels map[string]string) client.ObjectKey {
	t.Helper()
	l := map[string]string{"app": name}
	for k, v := range podLabels {
		l[k] = v
	}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: l},
				Spec: corev1.PodSpec{
					Containers:                    []corev1.Container{{Name: "app", Image: "nginx:1.27"}},
					TerminationGracePeriodSeconds: ptr.To[int64](0),
				},
			},
		},
	}
	if err := env.Client.Create(ctx, d); err != nil {
		t.Fatal(err)
	}
	return client.ObjectKeyFromObject(d)
}

// rolledOut is kubectl rollout status's "successfully rolled out".
func rolledOut(d *appsv1.Deployment) bool {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	s := d.Status
	return s.ObservedGeneration >= d.Generation && s.UpdatedReplicas == want && s.Replicas == want && s.AvailableReplicas == want
}

// podsAt counts the live pods of Deployment key and those labelled with
// revision rev.
func podsAt(ctx context.Context, key client.ObjectKey, rev string) (total, atRev int, err error) {
	var pods corev1.PodList
	if err := env.Client.List(ctx, &pods, client.InNamespace(key.Namespace), client.MatchingLabels{"app": key.Name}); err != nil {
		return 0, 0, err
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		total++
		if p.Labels[v1alpha1.SidecarRevisionKey] == rev {
			atRev++
		}
	}
	return total, atRev, nil
}

// waitDeployments waits until every Deployment is rolled out with all its
// pods at revision rev.
func waitDeployments(t *testing.T, ctx context.Context, what, rev string, keys ...client.ObjectKey) {
	t.Helper()
	var last string
	d, err := cluster.Poll(ctx, 100*time.Millisecond, bound(90*time.Second), what, func(ctx context.Context) (bool, error) {
		for _, k := range keys {
			dep := &appsv1.Deployment{}
			if err := env.Client.Get(ctx, k, dep); err != nil {
				return false, err
			}
			total, at, err := podsAt(ctx, k, rev)
			if err != nil {
				return false, err
			}
			last = fmt.Sprintf("%s: status %+v, %d pods, %d at revision %s", k, dep.Status, total, at, rev)
			if !rolledOut(dep) || total != int(*dep.Spec.Replicas) || at != total {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("%v: %s", err, last)
	}
	t.Logf("%s after %s", what, d.Round(time.Millisecond))
}

// restartedFor is the Deployment's restarted-for annotation and its pod
// template's restartedAt.
func restartedFor(d *appsv1.Deployment) (rev, at string) {
	return d.Annotations[v1alpha1.SidecarRestartedForKey], d.Spec.Template.Annotations[v1alpha1.RestartedAtKey]
}

// ownerWatch polls Deployments and the CR while a rollout runs and
// records what it saw. It starts before the change that begins the
// rollout: a Deployment counts as restarted once its restarted-for or
// restartedAt differs from what it had when the watch started, and in
// flight while restarted and not rolled out. It records how many were in
// flight at once (and in how many namespaces), how many owners
// status.rollout.inProgress named at once, the order Deployments were
// restarted in, the namespaces status.rollout.namespace went through, and
// any second restart of a Deployment (restartedAt changing again).
type ownerWatch struct {
	keys []client.ObjectKey
	si   client.ObjectKey

	mu         sync.Mutex
	initial    map[string][2]string
	initialRev string // status.rollout.revision at the start
	maxFlight  int
	maxNS      int
	maxStatus  int
	evidence   string // the sample at maxFlight
	statusSeen string // the inProgress at maxStatus
	first      map[string][2]string
	order      []string
	nsSeen     []string
	twice      []string
	samples    int
	stop       context.CancelFunc
	done       chan struct{}
}

func watchOwners(t *testing.T, ctx context.Context, si *v1alpha1.SidecarInjector, keys ...client.ObjectKey) *ownerWatch {
	t.Helper()
	w := &ownerWatch{keys: keys, si: client.ObjectKeyFromObject(si), initial: map[string][2]string{}, first: map[string][2]string{}, done: make(chan struct{})}
	for _, k := range keys {
		d := &appsv1.Deployment{}
		if err := env.Client.Get(ctx, k, d); err != nil {
			t.Fatal(err)
		}
		r, at := restartedFor(d)
		w.initial[k.String()] = [2]string{r, at}
	}
	cur := &v1alpha1.SidecarInjector{}
	if err := env.Client.Get(ctx, w.si, cur); err != nil {
		t.Fatal(err)
	}
	if cur.Status.Rollout != nil {
		w.initialRev = cur.Status.Rollout.Revision
	}
	wctx, cancel := context.WithCancel(context.Background())
	w.stop = cancel
	go func() {
		defer close(w.done)
		cluster.Every(wctx, 25*time.Millisecond, w.sample)
	}()
	t.Cleanup(cancel)
	return w
}

func (w *ownerWatch) sample(ctx context.Context) {
	var flight []string
	nss := map[string]bool{}
	for _, k := range w.keys {
		d := &appsv1.Deployment{}
		if err := env.Client.Get(ctx, k, d); err != nil {
			continue
		}
		r, at := restartedFor(d)
		now := [2]string{r, at}
		w.mu.Lock()
		changed := now != w.initial[k.String()]
		if changed {
			if prev, ok := w.first[k.String()]; !ok {
				w.first[k.String()] = now
				w.order = append(w.order, k.String())
			} else if prev != now {
				w.twice = append(w.twice, fmt.Sprintf("%s restarted-for/restartedAt %v then %v", k, prev, now))
				w.first[k.String()] = now
			}
		}
		w.mu.Unlock()
		if changed && !rolledOut(d) {
			flight = append(flight, fmt.Sprintf("%s (gen %d observed %d, updated %d, replicas %d, available %d)",
				k, d.Generation, d.Status.ObservedGeneration, d.Status.UpdatedReplicas, d.Status.Replicas, d.Status.AvailableReplicas))
			nss[k.Namespace] = true
		}
	}
	si := &v1alpha1.SidecarInjector{}
	owners := 0
	var inProgress []string
	ns := ""
	if err := env.Client.Get(ctx, w.si, si); err == nil && si.Status.Rollout != nil {
		inProgress = si.Status.Rollout.InProgress
		for _, s := range inProgress {
			if strings.Count(s, "/") == 2 { // Kind/namespace/name: an owner
				owners++
			}
		}
		if si.Status.Rollout.Revision != w.initialRev {
			ns = si.Status.Rollout.Namespace
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.samples++
	if len(flight) > w.maxFlight {
		w.maxFlight, w.evidence = len(flight), strings.Join(flight, "; ")
	}
	w.maxNS = max(w.maxNS, len(nss))
	if owners > w.maxStatus {
		w.maxStatus, w.statusSeen = owners, strings.Join(inProgress, ", ")
	}
	if ns != "" && (len(w.nsSeen) == 0 || w.nsSeen[len(w.nsSeen)-1] != ns) {
		w.nsSeen = append(w.nsSeen, ns)
	}
}

// check stops the watch and fails the test if more than maxOwners owners
// (or namespaces, when maxNS > 0) were in flight at once or one was
// restarted twice.
func (w *ownerWatch) check(t *testing.T, what string, maxOwners, maxNS int) {
	t.Helper()
	w.stop()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	t.Logf("%s, %d samples: at most %d Deployments in flight at once (%s), in %d namespaces; status.rollout.inProgress named at most %d owners (%s); restart order %v; status.rollout.namespace went %v",
		what, w.samples, w.maxFlight, w.evidence, w.maxNS, w.maxStatus, w.statusSeen, w.order, w.nsSeen)
	if w.maxFlight > maxOwners {
		t.Errorf("%d Deployments restarted and not rolled out at once, maxUnavailable allows %d: %s", w.maxFlight, maxOwners, w.evidence)
	}
	if w.maxStatus > maxOwners {
		t.Errorf("status.rollout.inProgress named %d owners at once, maxUnavailable allows %d: %s", w.maxStatus, maxOwners, w.statusSeen)
	}
	if maxNS > 0 && w.maxNS > maxNS {
		t.Errorf("Deployments of %d namespaces in flight at once, want at most %d", w.maxNS, maxNS)
	}
	if len(w.twice) > 0 {
		t.Errorf("restarted twice: %v", w.twice)
	}
}

// restarted returns the Deployments restarted, ordered by the operator's
// own stamp, restartedAt (to the second), and within one second in the
// order the polls first saw them: a poll slowed by load may see two
// restarts at once, and then the order of its reads is no evidence. The
// poll order alone when a restart left no new stamp.
func (w *ownerWatch) restarted() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := slices.Clone(w.order)
	at := map[string]time.Time{}
	for _, k := range out {
		stamp := w.first[k][1]
		ts, err := time.Parse(time.RFC3339, stamp)
		if err != nil || stamp == w.initial[k][1] {
			return out
		}
		at[k] = ts
	}
	slices.SortStableFunc(out, func(a, b string) int { return at[a].Compare(at[b]) })
	return out
}

func (w *ownerWatch) namespaces() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.nsSeen)
}

// untouched fails the test if a Deployment was restarted for rev.
func untouched(t *testing.T, ctx context.Context, rev string, keys ...client.ObjectKey) {
	t.Helper()
	for _, k := range keys {
		d := &appsv1.Deployment{}
		if err := env.Client.Get(ctx, k, d); err != nil {
			t.Fatal(err)
		}
		r, at := restartedFor(d)
		if (rev == "" && (r != "" || at != "")) || (rev != "" && r == rev) {
			t.Errorf("Deployment %s was restarted (restarted-for %q, restartedAt %q)", k, r, at)
		}
	}
}

func skippedHas(rs *v1alpha1.RolloutStatus, pod, reasonPart string) bool {
	for _, s := range rs.Skipped {
		if slices.Contains(s.Pods, pod) && strings.Contains(strings.ToLower(s.Reason), strings.ToLower(reasonPart)) {
			return true
		}
	}
	return false
}

// TestRolloutRestart: two namespaces' Deployments restarted one owner at
// a time (maxUnavailable 1) for a template change, a PodDisruptionBudget
// that allows no disruption holding its Deployment back until relaxed,
// the operator stopped and started mid-rollout without restarting an
// owner twice or exceeding maxUnavailable, bare and Job pods never
// touched, RolloutBatch Events on the CR.
func TestRolloutRestart(t *testing.T) {
	ctx := cluster.TestContext(t, 5*time.Minute)
	start := time.Now()
	f := newRolloutFixture(t, ctx, "rollout-restart", v1alpha1.RolloutSpec{})
	const nsA, nsB = "rr-a", "rr-b"
	f.namespace(t, ctx, nsA, nil)
	f.namespace(t, ctx, nsB, nil)
	f.serve(t, ctx)
	rev1 := f.revision(t, ctx, "")
	webA := deploy(t, ctx, nsA, "web", 2, nil)
	webB := deploy(t, ctx, nsB, "web", 2, nil)
	// Last in rollout order (namespace, name), so the budget holding it
	// back cannot delay the others whether it stops the whole rollout or
	// only its owner.
	api := deploy(t, ctx, nsB, "zapi", 1, nil)
	all := []client.ObjectKey{webA, webB, api}
	// Never touched: a bare pod and a Job's pod (Pending on no node, so
	// kwok does not complete it).
	if err := env.Client.Create(ctx, barePod(nsA, "bare")); err != nil {
		t.Fatal(err)
	}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "job", Namespace: nsA}, Spec: batchv1.JobSpec{
		Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "job"}},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, NodeSelector: map[string]string{"hookwright.io/test": "nowhere"},
				Containers: []corev1.Container{{Name: "app", Image: "busybox"}}}}}}
	if err := env.Client.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	var jobPod string
	if err := cluster.WaitFor(ctx, 30*time.Second, "the Job's pod", func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		err := env.Client.List(ctx, &pods, client.InNamespace(nsA), client.MatchingLabels{"app": "job"})
		if len(pods.Items) == 1 {
			jobPod = nsA + "/" + pods.Items[0].Name
		}
		return jobPod != "", err
	}); err != nil {
		t.Fatal(err)
	}
	waitDeployments(t, ctx, "Deployments available at the first revision", rev1, all...)

	// A budget allowing no disruption of zapi.
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "zapi", Namespace: nsB}, Spec: policyv1.PodDisruptionBudgetSpec{
		MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "zapi"}}}}
	create(t, ctx, pdb)
	if err := cluster.WaitFor(ctx, 30*time.Second, "the disruption controller's status of the budget", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(pdb), pdb)
		return pdb.Status.ObservedGeneration == pdb.Generation && pdb.Status.ExpectedPods == 1 && pdb.Status.CurrentHealthy == 1, err
	}); err != nil {
		t.Fatalf("%v: %+v", err, pdb.Status)
	}
	t.Logf("PodDisruptionBudget %s/%s: %d disruptions allowed", nsB, pdb.Name, pdb.Status.DisruptionsAllowed)

	// The template change with the rollout.
	w := watchOwners(t, ctx, f.si, all...)
	f.change(t, ctx, true, func(s *v1alpha1.SidecarInjectorSpec) {
		s.Rollout = v1alpha1.RolloutSpec{Strategy: v1alpha1.RolloutRestart, MaxUnavailable: ptr.To(intstr.FromInt32(1))}
	})
	rev2 := f.revision(t, ctx, rev1)

	// Resume: the operator stopped while the first owner rolls, then
	// started again.
	var inFlight string
	if err := cluster.WaitFor(ctx, 60*time.Second, "a first Deployment restarted", func(ctx context.Context) (bool, error) {
		for _, k := range all {
			d := &appsv1.Deployment{}
			if err := env.Client.Get(ctx, k, d); err != nil {
				return false, err
			}
			if r, _ := restartedFor(d); r == rev2 {
				inFlight = fmt.Sprintf("%s (rolled out: %t)", k, rolledOut(d))
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatal(err)
	}
	bounce := time.Now()
	stopOperator()
	// What the next operator finds recorded (no t.Fatal while stopped).
	at := &v1alpha1.SidecarInjector{}
	var recorded any = "unreadable"
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(f.si), at); err == nil {
		recorded = []string(nil)
		if at.Status.Rollout != nil && at.Status.Rollout.Revision == rev2 {
			recorded = at.Status.Rollout.InProgress
		}
	}
	t.Logf("operator stopped (in %s) with %s restarted; status.rollout.inProgress then: %v",
		time.Since(bounce).Round(time.Millisecond), inFlight, recorded)
	if err := runOperator(env.Config, allowedServerNamespaces); err != nil {
		t.Fatal(err)
	}

	// The budget holds zapi back: blocked, naming it.
	f.condition(t, ctx, v1alpha1.ConditionRolloutBlocked, metav1.ConditionTrue, "DisruptionBudget", "PodDisruptionBudget "+nsB+"/"+pdb.Name, 90*time.Second)
	untouched(t, ctx, rev2, api)
	rs := f.rolloutIs(t, ctx, "rollout blocked by the budget", rev2, 30*time.Second, func(rs *v1alpha1.RolloutStatus, _ *v1alpha1.SidecarInjector) bool {
		return rs.Blocked != ""
	})
	if !strings.Contains(rs.Blocked, pdb.Name) {
		t.Errorf("status.rollout.blocked %q does not name the budget", rs.Blocked)
	}
	// Relaxed, it lets zapi go.
	if err := update(ctx, pdb, func() { pdb.Spec.MinAvailable = ptr.To(intstr.FromInt32(0)) }); err != nil {
		t.Fatal(err)
	}
	waitDeployments(t, ctx, "every Deployment rolled to the new revision", rev2, all...)
	f.condition(t, ctx, v1alpha1.ConditionRolloutBlocked, metav1.ConditionFalse, "", "", 30*time.Second)
	rs = f.rolloutIs(t, ctx, "rollout complete", rev2, 30*time.Second, func(rs *v1alpha1.RolloutStatus, si *v1alpha1.SidecarInjector) bool {
		return rs.Total == 5 && rs.Updated == rs.Total && rs.Unavailable == 0 && rs.Blocked == "" &&
			skippedHas(rs, nsA+"/bare", "") && skippedHas(rs, jobPod, "")
	})
	w.check(t, "rollout to "+rev2, 1, 0)
	for _, k := range all {
		d := &appsv1.Deployment{}
		if err := env.Client.Get(ctx, k, d); err != nil {
			t.Fatal(err)
		}
		if r, at := restartedFor(d); r != rev2 || at == "" {
			t.Errorf("Deployment %s: restarted-for %q, restartedAt %q; want %s and a time", k, r, at, rev2)
		}
	}
	if got := w.restarted(); len(got) != 3 || got[len(got)-1] != api.String() {
		t.Errorf("restart order %v: want all three, %s (held by its budget) last", got, api)
	}
	for _, s := range rs.Skipped {
		t.Logf("skipped: %s: %d %v", s.Reason, s.Count, s.Pods)
	}
	if !skippedHas(rs, nsA+"/bare", "bare") && !skippedHas(rs, nsA+"/bare", "controller") && !skippedHas(rs, nsA+"/bare", "owner") {
		t.Errorf("the bare pod's skip reason does not say why: %+v", rs.Skipped)
	}
	if !skippedHas(rs, jobPod, "job") {
		t.Errorf("the Job pod's skip reason does not say Job: %+v", rs.Skipped)
	}
	for _, p := range []string{"bare", strings.TrimPrefix(jobPod, nsA+"/")} {
		pod := &corev1.Pod{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: nsA, Name: p}, pod); err != nil {
			t.Fatalf("pod %s: %v", p, err)
		}
		if pod.Labels[v1alpha1.SidecarRevisionKey] != rev1 || pod.Annotations[v1alpha1.SidecarRolloutKey] != "" {
			t.Errorf("pod %s touched: labels %v annotations %v", p, pod.Labels, pod.Annotations)
		}
	}
	f.fleetIs(t, ctx, 30*time.Second, "fleet counts: all but the bare and Job pods current", func(c v1alpha1.FleetCounts) bool {
		return c.CurrentPods == 5 && c.OutdatedPods == 2 && c.MissingPods == 0
	})
	var reasons map[string]int
	if err := cluster.WaitFor(ctx, 30*time.Second, "RolloutBatch Events", func(ctx context.Context) (bool, error) {
		var err error
		reasons, err = eventReasons(ctx, "SidecarInjector", f.name)
		return reasons["RolloutBatch"] > 0, err
	}); err != nil {
		t.Fatalf("%v: %v", err, reasons)
	}
	// The rollout metrics (the operator runs in this process). The stop
	// may cut one restart short: counted interrupted, and then either it
	// had landed (the next leader finds it done: 2 ok) or it had not (the
	// next leader makes it: 3 ok). Never an error.
	if err := cluster.WaitFor(ctx, 30*time.Second, "rollout metrics", func(ctx context.Context) (bool, error) {
		m := rolloutMetrics(t, f.name)
		ok, cut := m["actions restart ok"], m["actions restart interrupted"]
		return (ok == 3 && cut <= 1 || ok == 2 && cut == 1) && m["actions restart error"] == 0 &&
			m["pods updated"] == 5 && m["pods total"] == 5 && m["pods unavailable"] == 0 && m["blocked"] == 0, nil
	}); err != nil {
		t.Fatalf("%v: %v", err, rolloutMetrics(t, f.name))
	}
	t.Logf("Events on the CR by reason: %v; metrics %v; test took %s", reasons, rolloutMetrics(t, f.name), time.Since(start).Round(time.Millisecond))
}

// rolloutMetrics reads the hookwright_sidecar_rollout_* series of CR name
// from the operator's registry: "actions <action> <result>", "pods
// <state>", "blocked".
func rolloutMetrics(t *testing.T, name string) map[string]float64 {
	t.Helper()
	fams := gather(t)
	out := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["name"] != name {
				continue
			}
			switch f.GetName() {
			case "hookwright_sidecar_rollout_actions_total":
				out["actions "+l["action"]+" "+l["result"]] += m.GetCounter().GetValue()
			case "hookwright_sidecar_rollout_pods":
				out["pods "+l["state"]] = m.GetGauge().GetValue()
			case "hookwright_sidecar_rollout_blocked":
				out["blocked"] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// TestRolloutMissingAfterOutage: pods created while the injector's server
// is unreachable (failurePolicy Ignore) are reported missing, and a
// Restart rollout brings them the sidecars once it serves again.
func TestRolloutMissingAfterOutage(t *testing.T) {
	t.Parallel()
	ctx := cluster.TestContext(t, 3*time.Minute)
	start := time.Now()
	f := newRolloutFixture(t, ctx, "rollout-missing", v1alpha1.RolloutSpec{})
	const ns = "rm-a"
	f.namespace(t, ctx, ns, nil)
	web := deploy(t, ctx, ns, "web", 2, nil)
	// Both pods created (bare: nothing serves).
	var created time.Time
	if err := cluster.WaitFor(ctx, bound(60*time.Second), "two pods created during the outage", func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if err := env.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": "web"}); err != nil {
			return false, err
		}
		if len(pods.Items) != 2 {
			return false, nil
		}
		for _, p := range pods.Items {
			if injected(&p) {
				return false, cluster.Permanent(fmt.Errorf("pod %s injected with no server", p.Name))
			}
			if p.CreationTimestamp.After(created) {
				created = p.CreationTimestamp.Time
			}
		}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	took, err := cluster.Poll(ctx, 10*time.Millisecond, bound(60*time.Second), "status.fleet.missingPods 2", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(f.si), f.si)
		return fleetCounts(f.si).MissingPods == 2, err
	})
	if err != nil {
		t.Fatalf("%v: fleet %+v", err, fleetCounts(f.si))
	}
	// creationTimestamp has a resolution of a second.
	t.Logf("missing pods in status.fleet %s after the second pod was seen (%s after its creationTimestamp, second resolution)",
		took.Round(time.Millisecond), time.Since(created).Round(time.Millisecond))

	// The server back, a Restart rollout: the pods get the sidecars.
	f.serve(t, ctx)
	rev := f.revision(t, ctx, "")
	f.change(t, ctx, false, func(s *v1alpha1.SidecarInjectorSpec) {
		s.Rollout = v1alpha1.RolloutSpec{Strategy: v1alpha1.RolloutRestart}
	})
	waitDeployments(t, ctx, "the missing pods replaced by injected ones", rev, web)
	f.fleetIs(t, ctx, bound(30*time.Second), "no pod missing", func(c v1alpha1.FleetCounts) bool { return c.MissingPods == 0 && c.CurrentPods == 2 })
	f.rolloutIs(t, ctx, "rollout complete", rev, 30*time.Second, func(rs *v1alpha1.RolloutStatus, _ *v1alpha1.SidecarInjector) bool {
		return rs.Total == 2 && rs.Updated == 2 && rs.Unavailable == 0
	})
	f.condition(t, ctx, v1alpha1.ConditionPodsMissingSidecars, metav1.ConditionFalse, "", "", 30*time.Second)
	t.Logf("test took %s", time.Since(start).Round(time.Millisecond))
}

// TestRolloutControls: paused touches nothing, a namespaceSelector and a
// selector canary roll only what they select, a partition keeps pods at
// the old revision, OneAtATime walks spec.rollout.namespaces first and
// finishes each namespace before the next, and pinning the previous
// revision rolls back.
func TestRolloutControls(t *testing.T) {
	t.Parallel()
	ctx := cluster.TestContext(t, 5*time.Minute)
	start := time.Now()
	f := newRolloutFixture(t, ctx, "rollout-ctl", v1alpha1.RolloutSpec{})
	const nsA, nsB, nsC = "rc-a", "rc-b", "rc-c"
	f.namespace(t, ctx, nsA, nil)
	f.namespace(t, ctx, nsB, map[string]string{"canary": "yes"})
	f.namespace(t, ctx, nsC, nil)
	f.serve(t, ctx)
	rev1 := f.revision(t, ctx, "")
	a1 := deploy(t, ctx, nsA, "a1", 1, nil)
	a2 := deploy(t, ctx, nsA, "a2", 1, map[string]string{"track": "canary"})
	b1 := deploy(t, ctx, nsB, "b1", 1, nil)
	c1 := deploy(t, ctx, nsC, "c1", 1, nil)
	all := []client.ObjectKey{a1, a2, b1, c1}
	waitDeployments(t, ctx, "Deployments available at the first revision", rev1, all...)

	// Paused: nothing touched.
	f.change(t, ctx, true, func(s *v1alpha1.SidecarInjectorSpec) {
		s.Rollout = v1alpha1.RolloutSpec{Strategy: v1alpha1.RolloutRestart, Paused: true, MaxUnavailable: ptr.To(intstr.FromInt32(4))}
	})
	rev2 := f.revision(t, ctx, rev1)
	f.condition(t, ctx, v1alpha1.ConditionRolloutBlocked, metav1.ConditionFalse, "Paused", "", 30*time.Second)
	f.rolloutIs(t, ctx, "paused rollout reported", rev2, 30*time.Second, func(rs *v1alpha1.RolloutStatus, _ *v1alpha1.SidecarInjector) bool {
		return rs.Total == 4 && rs.Updated == 0
	})
	untouched(t, ctx, "", all...)

	// A namespace canary: only rc-b.
	w := watchOwners(t, ctx, f.si, all...)
	f.change(t, ctx, false, func(s *v1alpha1.SidecarInjectorSpec) {
		s.Rollout.Paused = false
		s.Rollout.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"canary": "yes"}}
	})
	waitDeployments(t, ctx, "the canary namespace rolled", rev2, b1)
	f.rolloutIs(t, ctx, "namespace canary complete", rev2, 30*time.Second, func(rs *v1alpha1.RolloutStatus, _ *v1alpha1.SidecarInjector) bool {
		return rs.Total == 1 && rs.Updated == 1 && rs.Unavailable == 0
	})
	untouched(t, ctx, rev2, a1, a2, c1)

	// A pod selector canary: only a2.
	f.change(t, ctx, false, func(s *v1alpha1.SidecarInjectorSpec) {
		s.Rollout.NamespaceSelector = nil
		s.Rollout.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"track": "canary"}}
	})
	waitDeployments(t, ctx, "the canary pods rolled", rev2, a2)
	f.rolloutIs(t, ctx, "selector canary complete", rev2, 30*time.Second, func(rs *v1alpha1.RolloutStatus, _ *v1alpha1.SidecarInjector) bool {
		return rs.Total == 1 && rs.Updated == 1 && rs.Unavailable == 0
	})
	untouched(t, ctx, rev2, a1, c1)

	// A partition of 1: of a1 and c1, one stays.
	f.change(t, ctx, false, func(s *v1alpha1.SidecarInjectorSpec) {
		s.Rollout.Selector = nil
		s.Rollout.Partition = ptr.To(intstr.FromInt32(1))
	})
	rs := f.rolloutIs(t, ctx, "partitioned rollout complete", rev2, 60*time.Second, func(rs *v1alpha1.RolloutStatus, si *v1alpha1.SidecarInjector) bool {
		c := fleetCounts(si)
		return rs.Partitioned == 1 && rs.Updated == rs.Total && rs.Unavailable == 0 && c.CurrentPods == 3 && c.OutdatedPods == 1
	})
	if rs.Total+rs.Partitioned != 4 {
		t.Errorf("status.rollout total %d + partitioned %d, want the 4 matched pods", rs.Total, rs.Partitioned)
	}
	w.check(t, "canaries and partition at "+rev2, 4, 0)
	if got := w.restarted(); len(got) != 3 || got[0] != b1.String() || got[1] != a2.String() {
		t.Errorf("restarted for %s: %v; want %s, %s, then one of %s and %s", rev2, got, b1, a2, a1, c1)
	}

	// OneAtATime: rc-c, rc-a, then rc-b; one namespace at a time although
	// maxUnavailable would allow all four.
	w = watchOwners(t, ctx, f.si, all...)
	f.change(t, ctx, true, func(s *v1alpha1.SidecarInjectorSpec) {
		s.Rollout.Partition = nil
		s.Rollout.NamespaceOrder = v1alpha1.NamespacesOneAtATime
		s.Rollout.Namespaces = []string{nsC, nsA}
	})
	rev3 := f.revision(t, ctx, rev2)
	waitDeployments(t, ctx, "all rolled to the third revision", rev3, all...)
	f.rolloutIs(t, ctx, "OneAtATime rollout complete", rev3, 30*time.Second, func(rs *v1alpha1.RolloutStatus, _ *v1alpha1.SidecarInjector) bool {
		return rs.Updated == 4 && rs.Total == 4 && rs.Unavailable == 0
	})
	w.check(t, "OneAtATime to "+rev3, 4, 1)
	order := w.restarted()
	var nsOrder []string
	for _, k := range order {
		n, _, _ := strings.Cut(k, "/")
		if len(nsOrder) == 0 || nsOrder[len(nsOrder)-1] != n {
			nsOrder = append(nsOrder, n)
		}
	}
	if !slices.Equal(nsOrder, []string{nsC, nsA, nsB}) {
		t.Errorf("namespaces restarted in order %v (Deployments %v), want %v", nsOrder, order, []string{nsC, nsA, nsB})
	}
	// status.rollout.namespace is written at most every few seconds: a
	// namespace may be rolled between two writes, but never out of order.
	if seen := w.namespaces(); !slices.IsSortedFunc(seen, func(a, b string) int {
		return slices.Index([]string{nsC, nsA, nsB}, a) - slices.Index([]string{nsC, nsA, nsB}, b)
	}) {
		t.Errorf("status.rollout.namespace went %v, want in the order %v", seen, []string{nsC, nsA, nsB})
	}

	// Pinning the previous revision rolls back.
	w = watchOwners(t, ctx, f.si, all...)
	f.change(t, ctx, false, func(s *v1alpha1.SidecarInjectorSpec) {
		s.Revision = rev2
		s.Rollout.NamespaceOrder = v1alpha1.NamespacesAll
		s.Rollout.Namespaces = nil
	})
	if got := f.revision(t, ctx, rev3); got != rev2 {
		t.Fatalf("pinned status.revision %s, want %s", got, rev2)
	}
	waitDeployments(t, ctx, "rolled back to the pinned revision", rev2, all...)
	f.rolloutIs(t, ctx, "rollback complete", rev2, 30*time.Second, func(rs *v1alpha1.RolloutStatus, si *v1alpha1.SidecarInjector) bool {
		c := fleetCounts(si)
		return rs.Updated == 4 && rs.Total == 4 && rs.Unavailable == 0 && c.CurrentPods == 4 && c.OutdatedPods == 0
	})
	w.check(t, "rollback to "+rev2, 4, 0)
	t.Logf("test took %s", time.Since(start).Round(time.Millisecond))
}

// rolloutClusterRole creates config/rollout's ClusterRole as prefix+its
// name, removed when the test ends.
func rolloutClusterRole(t *testing.T, ctx context.Context, prefix string) *rbacv1.ClusterRole {
	t.Helper()
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(root, "config", "rollout", "*.yaml"))
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(string(b), "\n---") {
			var meta metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil || meta.Kind != "ClusterRole" {
				continue
			}
			r := &rbacv1.ClusterRole{}
			if err := yaml.UnmarshalStrict([]byte(doc), r); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			r.Name = prefix + r.Name
			create(t, ctx, r)
			return r
		}
	}
	t.Fatalf("no ClusterRole in config/rollout (%v)", files)
	return nil
}

// TestRolloutNotPermitted: the operator runs as config/rbac's
// ServiceAccount (impersonated), with config/rollout's ClusterRole bound in
// one namespace only: there the rollout restarts, in the other it reports
// RolloutNotPermitted naming the missing right and leaves the Deployment
// alone, and status.fleet still counts both.
func TestRolloutNotPermitted(t *testing.T) {
	ctx := cluster.TestContext(t, 4*time.Minute)
	start := time.Now()
	const prefix = "rnp-"
	user := applyConfigRBAC(t, ctx, prefix, operatorNS)
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + operatorNS}
	role := rolloutClusterRole(t, ctx, prefix)
	f := newRolloutFixture(t, ctx, "rollout-np", v1alpha1.RolloutSpec{})
	const nsA, nsB = "rn-a", "rn-b"
	f.namespace(t, ctx, nsA, nil)
	f.namespace(t, ctx, nsB, nil)
	f.serve(t, ctx)
	rev1 := f.revision(t, ctx, "")
	webA := deploy(t, ctx, nsA, "web", 1, nil)
	webB := deploy(t, ctx, nsB, "web", 1, nil)
	waitDeployments(t, ctx, "Deployments available at the first revision", rev1, webA, webB)
	bindRollout := func(ns string) {
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: prefix + "rollout", Namespace: ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: prefix + "controller-manager", Namespace: operatorNS}}}
		create(t, ctx, rb)
		// The RBAC authorizer sees a binding a moment after its create.
		if err := cluster.WaitFor(ctx, 30*time.Second, "the rollout binding in effect in "+ns, func(ctx context.Context) (bool, error) {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user, Groups: append(groups, "system:authenticated"),
				ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "patch", Group: "apps", Resource: "deployments", Namespace: ns}}}
			r, err := env.Clientset.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
			return err == nil && r.Status.Allowed, err
		}); err != nil {
			t.Fatal(err)
		}
	}
	bindRollout(nsA)

	// The operator as its ServiceAccount.
	restartOperator(t, env.Impersonate(user, groups...), []string{operatorNS})
	f.change(t, ctx, true, func(s *v1alpha1.SidecarInjectorSpec) {
		s.Rollout = v1alpha1.RolloutSpec{Strategy: v1alpha1.RolloutRestart, MaxUnavailable: ptr.To(intstr.FromInt32(2))}
	})
	rev2 := f.revision(t, ctx, rev1)
	c := f.condition(t, ctx, v1alpha1.ConditionRolloutNotPermitted, metav1.ConditionTrue, "MissingRights", nsB, 60*time.Second)
	if strings.Contains(c.Message, nsA) {
		t.Errorf("RolloutNotPermitted names %s, where the rights are bound: %s", nsA, c.Message)
	}
	waitDeployments(t, ctx, "the permitted namespace rolled", rev2, webA)
	untouched(t, ctx, rev2, webB)
	var podB string
	if err := cluster.WaitFor(ctx, 30*time.Second, "status.fleet counting both namespaces", func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if err := env.Client.List(ctx, &pods, client.InNamespace(nsB), client.MatchingLabels{"app": "web"}); err != nil || len(pods.Items) != 1 {
			return false, err
		}
		podB = nsB + "/" + pods.Items[0].Name
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(f.si), f.si)
		c := fleetCounts(f.si)
		return c.CurrentPods == 1 && c.OutdatedPods == 1 && c.MatchedPods == 2, err
	}); err != nil {
		t.Fatalf("%v: fleet %+v", err, fleetCounts(f.si))
	}
	f.rolloutIs(t, ctx, "the unpermitted pod skipped", rev2, 30*time.Second, func(rs *v1alpha1.RolloutStatus, _ *v1alpha1.SidecarInjector) bool {
		return skippedHas(rs, podB, "")
	})

	// (Bound there too, it would proceed once the operator asks again:
	// answers are kept a minute, internal/rollout/access.go permissionTTL.)
	t.Logf("test took %s", time.Since(start).Round(time.Millisecond))
}

// TestRolloutResumeFromCluster: the state of a rollout lives in the
// cluster. An owner restarted for the revision by an operator that then
// died before writing status.rollout (simulated: the test restarts it as
// the operator would, restarted-for and restartedAt, and keeps its new
// pod Pending) counts against maxUnavailable for the operator that takes
// over: no other owner restarts while it rolls, and it is not restarted
// again.
func TestRolloutResumeFromCluster(t *testing.T) {
	t.Parallel()
	ctx := cluster.TestContext(t, 3*time.Minute)
	start := time.Now()
	f := newRolloutFixture(t, ctx, "rollout-resume", v1alpha1.RolloutSpec{})
	const ns = "rs-a"
	f.namespace(t, ctx, ns, nil)
	f.serve(t, ctx)
	rev1 := f.revision(t, ctx, "")
	a := deploy(t, ctx, ns, "a", 1, nil)
	b := deploy(t, ctx, ns, "b", 1, nil)
	waitDeployments(t, ctx, "Deployments available at the first revision", rev1, a, b)
	f.change(t, ctx, true, nil)
	rev2 := f.revision(t, ctx, rev1)

	// b restarted for rev2 by "the previous operator"; its new pod stays
	// Pending (no node matches), so b keeps rolling.
	at := time.Now().UTC().Format(time.RFC3339)
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: b.Name, Namespace: b.Namespace}}
	if err := update(ctx, dep, func() {
		metav1.SetMetaDataAnnotation(&dep.ObjectMeta, v1alpha1.SidecarRestartedForKey, rev2)
		metav1.SetMetaDataAnnotation(&dep.Spec.Template.ObjectMeta, v1alpha1.RestartedAtKey, at)
		dep.Spec.Template.Spec.NodeSelector = map[string]string{"hookwright.io/test": "nowhere"}
	}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitFor(ctx, bound(30*time.Second), "b rolling, its new pod Pending", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, b, dep)
		return dep.Status.ObservedGeneration == dep.Generation && dep.Status.UpdatedReplicas == 1 && !rolledOut(dep), err
	}); err != nil {
		t.Fatalf("%v: %+v", err, dep.Status)
	}

	// The rollout starts with no record of its own.
	f.change(t, ctx, false, func(s *v1alpha1.SidecarInjectorSpec) {
		s.Rollout = v1alpha1.RolloutSpec{Strategy: v1alpha1.RolloutRestart, MaxUnavailable: ptr.To(intstr.FromInt32(1))}
	})
	f.rolloutIs(t, ctx, "b found in flight", rev2, 30*time.Second, func(rs *v1alpha1.RolloutStatus, _ *v1alpha1.SidecarInjector) bool {
		return len(rs.InProgress) > 0
	})
	ad := &appsv1.Deployment{}
	if err := env.Client.Get(ctx, a, ad); err != nil {
		t.Fatal(err)
	}
	if r, at := restartedFor(ad); r != "" || at != "" {
		t.Errorf("a restarted (restarted-for %q, restartedAt %q) while b, restarted for the same revision, was still rolling: maxUnavailable 1 exceeded", r, at)
	}

	// b unstuck (the test's own change of its template): it completes,
	// then a goes.
	if err := update(ctx, dep, func() { dep.Spec.Template.Spec.NodeSelector = nil }); err != nil {
		t.Fatal(err)
	}
	waitDeployments(t, ctx, "both rolled to the new revision", rev2, a, b)
	if err := env.Client.Get(ctx, b, dep); err != nil {
		t.Fatal(err)
	}
	if r, got := restartedFor(dep); r != rev2 || got != at {
		t.Errorf("b restarted again by the operator: restarted-for %q, restartedAt %q (the first restart's %q)", r, got, at)
	}
	f.rolloutIs(t, ctx, "rollout complete", rev2, 30*time.Second, func(rs *v1alpha1.RolloutStatus, _ *v1alpha1.SidecarInjector) bool {
		return rs.Total == 2 && rs.Updated == 2 && rs.Unavailable == 0
	})
	t.Logf("test took %s", time.Since(start).Round(time.Millisecond))
}

// TestRolloutDuringOutage: a Restart rollout while the injector's server
// is unreachable (failurePolicy Ignore, pods created bare) must not leave
// the restarted owners' pods without sidecars unreported: it either waits
// (RolloutBlocked WebhookNotReady) or says the restart did not help
// (RolloutBlocked RestartIneffective), as the API documents; once the
// server serves again the pods get their sidecars.
func TestRolloutDuringOutage(t *testing.T) {
	t.Parallel()
	ctx := cluster.TestContext(t, 3*time.Minute)
	start := time.Now()
	f := newRolloutFixture(t, ctx, "rollout-outage", v1alpha1.RolloutSpec{})
	const ns = "ro-a"
	f.namespace(t, ctx, ns, nil)
	web := deploy(t, ctx, ns, "web", 1, nil)
	f.fleetIs(t, ctx, bound(30*time.Second), "the pod missing", func(c v1alpha1.FleetCounts) bool { return c.MissingPods == 1 })
	f.change(t, ctx, false, func(s *v1alpha1.SidecarInjectorSpec) {
		s.Rollout = v1alpha1.RolloutSpec{Strategy: v1alpha1.RolloutRestart}
	})
	var got *metav1.Condition
	d, err := cluster.Poll(ctx, 100*time.Millisecond, bound(60*time.Second), "RolloutBlocked True", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(f.si), f.si)
		got = apimeta.FindStatusCondition(f.si.Status.Conditions, v1alpha1.ConditionRolloutBlocked)
		return got != nil && got.Status == metav1.ConditionTrue && got.ObservedGeneration == f.si.Generation, err
	})
	dep := &appsv1.Deployment{}
	_ = env.Client.Get(ctx, web, dep)
	r, at := restartedFor(dep)
	t.Logf("after %s: RolloutBlocked %+v; Deployment restarted-for %q restartedAt %q; rollout %+v; fleet %+v",
		d.Round(time.Millisecond), got, r, at, f.si.Status.Rollout, fleetCounts(f.si))
	if err != nil {
		t.Fatalf("the rollout during the outage never reported itself blocked: %v", err)
	}
	if got.Reason != "WebhookNotReady" && got.Reason != "RestartIneffective" {
		t.Errorf("RolloutBlocked reason %s, want WebhookNotReady or RestartIneffective", got.Reason)
	}

	// The server back: the rollout goes on once the operator's live
	// check (WebhookReachable) sees the webhook again.
	back := time.Now()
	f.serve(t, ctx)
	waitDeployments(t, ctx, "the pod replaced by an injected one after the outage", f.si.Status.Revision, web)
	t.Logf("rolled %s after the server was back", time.Since(back).Round(time.Millisecond))
	f.fleetIs(t, ctx, bound(30*time.Second), "no pod missing", func(c v1alpha1.FleetCounts) bool { return c.MissingPods == 0 && c.CurrentPods == 1 })
	f.condition(t, ctx, v1alpha1.ConditionRolloutBlocked, metav1.ConditionFalse, "Complete", "", 30*time.Second)
	t.Logf("test took %s", time.Since(start).Round(time.Millisecond))
}
