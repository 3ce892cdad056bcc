package operator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// owned lists every object a CR owns, as keys for env.Client.
type owned struct {
	SA     *corev1.ServiceAccount
	Role   *rbacv1.ClusterRole
	Bind   *rbacv1.ClusterRoleBinding
	Deploy *appsv1.Deployment
	PDB    *policyv1.PodDisruptionBudget
	Svc    *corev1.Service
	Secret *corev1.Secret
	MWC    *admissionregistrationv1.MutatingWebhookConfiguration
}

func ownedKeys(base, ns string) owned {
	om := metav1.ObjectMeta{Name: base, Namespace: ns}
	cm := metav1.ObjectMeta{Name: base}
	return owned{
		SA: &corev1.ServiceAccount{ObjectMeta: om}, Role: &rbacv1.ClusterRole{ObjectMeta: cm},
		Bind: &rbacv1.ClusterRoleBinding{ObjectMeta: cm}, Deploy: &appsv1.Deployment{ObjectMeta: om},
		PDB: &policyv1.PodDisruptionBudget{ObjectMeta: om}, Svc: &corev1.Service{ObjectMeta: om},
		Secret: &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: base + "-tls", Namespace: ns}},
		MWC:    &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: cm},
	}
}

func (o owned) all() []client.Object {
	return []client.Object{o.SA, o.Role, o.Bind, o.Deploy, o.PDB, o.Svc, o.Secret, o.MWC}
}

// fetch reads every owned object from the API server (not a cache) and
// checks it is controlled by the CR with uid.
func (o owned) fetch(t *testing.T, ctx context.Context, kind string, uid types.UID) {
	t.Helper()
	for _, obj := range o.all() {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			t.Fatalf("%T %s: %v", obj, client.ObjectKeyFromObject(obj), err)
		}
		ref := metav1.GetControllerOf(obj)
		if ref == nil || ref.UID != uid || ref.Kind != kind || ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
			t.Fatalf("%T %s: controller reference %+v, want %s with uid %s and blockOwnerDeletion", obj, obj.GetName(), ref, kind, uid)
		}
		if obj.GetLabels()[desired.LabelManagedBy] != desired.ManagedByValue {
			t.Fatalf("%T %s: labels %v lack %s", obj, obj.GetName(), obj.GetLabels(), desired.LabelManagedBy)
		}
	}
}

// waitGone waits until every owned object is deleted and returns how long it took.
func (o owned) waitGone(t *testing.T, ctx context.Context) time.Duration {
	t.Helper()
	start := time.Now()
	err := cluster.WaitFor(ctx, bound(90*time.Second), "owned objects garbage-collected", func(ctx context.Context) (bool, error) {
		for _, obj := range o.all() {
			err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj.DeepCopyObject().(client.Object))
			if err == nil {
				return false, nil
			}
			if !apierrors.IsNotFound(err) {
				return false, err
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

// waitConditions waits until get's conditions have every type in want at
// the wanted status, for the object's current generation.
func waitConditions(t *testing.T, ctx context.Context, obj client.Object, conds func() []metav1.Condition, want map[string]metav1.ConditionStatus, timeout time.Duration) {
	t.Helper()
	var last []metav1.Condition
	err := cluster.WaitFor(ctx, bound(timeout), fmt.Sprintf("conditions %v", want), func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return false, err
		}
		last = conds()
		for typ, st := range want {
			c := apimeta.FindStatusCondition(last, typ)
			if c == nil || c.Status != st || c.ObservedGeneration != obj.GetGeneration() {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("%v; conditions: %s", err, fmtConds(last))
	}
}

// configured is what a CR's conditions say once the operator has issued
// its serving certificate and written its webhook configuration.
var configured = map[string]metav1.ConditionStatus{
	v1alpha1.ConditionCertificateReady: metav1.ConditionTrue, v1alpha1.ConditionWebhookConfigured: metav1.ConditionTrue,
}

// waitConfigured is waitConditions for configured.
func waitConfigured(t *testing.T, ctx context.Context, cr v1alpha1.Object, timeout time.Duration) {
	t.Helper()
	waitConditions(t, ctx, cr, func() []metav1.Condition { return *cr.StatusConditions() }, configured, timeout)
}

// scopedInjector is the sample SidecarInjector named name, for the
// namespaces labelled key=value, with failurePolicy fp.
func scopedInjector(t *testing.T, name, key, value string, fp v1alpha1.FailurePolicy) *v1alpha1.SidecarInjector {
	t.Helper()
	si := cluster.SampleInjector(t, name)
	si.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{key: value}}
	si.Spec.FailurePolicy = fp
	return si
}

// create creates obj and deletes it when the test ends: a failed test
// must not leave a webhook that intercepts later tests.
func create(t *testing.T, ctx context.Context, obj client.Object) {
	t.Helper()
	if err := env.Client.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
}

// reasonIn is whether a condition's reason is one of reasons; any reason
// is, when reasons is empty.
func reasonIn(reason string, reasons []string) bool {
	return len(reasons) == 0 || slices.Contains(reasons, reason)
}

func fmtConds(cs []metav1.Condition) string {
	var b strings.Builder
	for _, c := range cs {
		fmt.Fprintf(&b, "\n  %s=%s (%s, gen %d): %s", c.Type, c.Status, c.Reason, c.ObservedGeneration, c.Message)
	}
	return b.String()
}

// timeUntil polls cond every 5 ms and returns how long it took to hold.
func timeUntil(t *testing.T, ctx context.Context, what string, cond func(context.Context) (bool, error)) time.Duration {
	t.Helper()
	return pollTimed(t, ctx, what, bound(30*time.Second), cond)
}

// pollTimed polls cond every 5 ms for up to limit and returns how long it
// took to hold; a NotFound error counts as not yet, any other fails t.
func pollTimed(t *testing.T, ctx context.Context, what string, limit time.Duration, cond func(context.Context) (bool, error)) time.Duration {
	t.Helper()
	took, err := cluster.Poll(ctx, 5*time.Millisecond, limit, what, func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		if err != nil && !apierrors.IsNotFound(err) {
			return false, cluster.Permanent(err)
		}
		return ok, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return took
}

// awaitEvent polls until an Event about the kind/name CR has reason and
// returns the counts by reason (the operator records Events
// asynchronously: a read right after the act can miss them on a loaded
// machine).
func awaitEvent(t *testing.T, ctx context.Context, kind, name, reason string) map[string]int {
	t.Helper()
	var r map[string]int
	err := cluster.WaitFor(ctx, bound(time.Minute), fmt.Sprintf("%s %s Event %s", kind, name, reason), func(ctx context.Context) (bool, error) {
		var err error
		r, err = eventReasons(ctx, kind, name)
		return r[reason] > 0, err
	})
	if err != nil {
		t.Fatalf("%v (events %v)", err, r)
	}
	return r
}

// eventReasons counts events.k8s.io Events about the CR named name by
// reason (one per distinct related object; a series counts once).
func eventReasons(ctx context.Context, kind, name string) (map[string]int, error) {
	var list eventsv1.EventList
	if err := env.Client.List(ctx, &list); err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, e := range list.Items {
		if e.Regarding.Kind == kind && e.Regarding.Name == name {
			out[e.Reason]++
		}
	}
	return out, nil
}

// timeWithin polls cond every 5 ms until it holds and returns how long
// that took, failing the test past limit: ten times what the product
// takes on an idle machine, so a loaded one still meets it. The time is
// logged as a figure, not asserted.
func timeWithin(t *testing.T, ctx context.Context, what string, limit time.Duration, cond func(context.Context) (bool, error)) time.Duration {
	t.Helper()
	took := pollTimed(t, ctx, what, limit, cond)
	t.Logf("figure: %s in %s (limit %s)", what, took.Round(time.Millisecond), limit)
	return took
}

// admissionLoad counts the admissions a test sends through a webhook
// while it rotates what serves it, keeping the first five failures, timed.
type admissionLoad struct {
	attempted, failed, notInjected atomic.Int64
	mu                             sync.Mutex
	firstErrs                      []string
}

// fail counts a failed admission, keeping msg if it is one of the first
// five.
func (l *admissionLoad) fail(msg string) {
	l.failed.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.firstErrs) < 5 {
		l.firstErrs = append(l.firstErrs, time.Now().Format("15:04:05.000")+" "+msg)
	}
}

// record counts the outcome of a dry-run create of p through an injector:
// failed with err, or admitted but not injected.
func (l *admissionLoad) record(err error, p *corev1.Pod) {
	switch {
	case err != nil:
		l.fail(err.Error())
	case !injected(p):
		l.notInjected.Add(1)
	}
}

// errNotInjected is an admission that was allowed but not injected.
var errNotInjected = errors.New("not injected")

// at50PerSecond calls admit every 20 ms, a fixed rate, until ctx ends,
// counting each call attempted (taken back if ctx ended during it) and
// its outcome: an error is a failure, errNotInjected counted apart.
func (l *admissionLoad) at50PerSecond(ctx context.Context, admit func(context.Context) error) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		l.attempted.Add(1)
		err := admit(ctx)
		switch {
		case ctx.Err() != nil:
			l.attempted.Add(-1)
			return
		case errors.Is(err, errNotInjected):
			l.notInjected.Add(1)
		case err != nil:
			l.fail(err.Error())
		}
	}
}

// errs is the failures kept so far.
func (l *admissionLoad) errs() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.firstErrs)
}

// gather reads the metrics of the operator, which runs in this process
// (controller-runtime's registry); it fails t on error.
func gather(t *testing.T) []*dto.MetricFamily {
	t.Helper()
	fams, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// operatorBusy names the operator's controllers that run a reconcile or
// have one ready to run, from controller-runtime's metrics (the operator
// runs in this process): controller_runtime_active_workers and
// workqueue_depth (ready items only; a RequeueAfter not yet due is not
// counted) above what a stopped operator's queue left in it (see
// queueDepths). Empty: the operator is idle.
func operatorBusy() ([]string, error) {
	fams, err := crmetrics.Registry.Gather()
	if err != nil {
		return nil, err
	}
	operator.mu.Lock()
	base := operator.depthBase
	operator.mu.Unlock()
	var busy []string
	for _, f := range fams {
		if f.GetName() != "controller_runtime_active_workers" {
			continue
		}
		for _, m := range f.GetMetric() {
			if v := m.GetGauge().GetValue(); v != 0 {
				busy = append(busy, fmt.Sprintf("%s %s=%g", f.GetName(), metricKey(m), v))
			}
		}
	}
	depths, err := queueDepths()
	if err != nil {
		return nil, err
	}
	for k, v := range depths {
		if v != base[k] {
			busy = append(busy, fmt.Sprintf("workqueue_depth %s=%g (%g left by a stopped operator)", k, v, base[k]))
		}
	}
	return busy, nil
}

// queueDepths reads workqueue_depth by its labels. A queue shut down with
// ready items (stopOperator) leaves them in the gauge, and the next
// operator's queue of the same name counts on from there: runOperator
// records the values at its start for operatorBusy to subtract.
func queueDepths() (map[string]float64, error) {
	fams, err := crmetrics.Registry.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "workqueue_depth" {
			continue
		}
		for _, m := range f.GetMetric() {
			out[metricKey(m)] = m.GetGauge().GetValue()
		}
	}
	return out, nil
}

func metricKey(m *dto.Metric) string {
	var parts []string
	for _, l := range m.GetLabel() {
		parts = append(parts, l.GetName()+"="+l.GetValue())
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// waitCount waits until the counter n reaches want (a count of real
// events, e.g. admissions a load loop made) and returns the count then.
func waitCount(t *testing.T, ctx context.Context, what string, n *atomic.Int64, want int64) int64 {
	t.Helper()
	err := cluster.WaitFor(ctx, bound(2*time.Minute), fmt.Sprintf("%d %s", want, what), func(context.Context) (bool, error) {
		return n.Load() >= want, nil
	})
	if err != nil {
		t.Fatalf("%v (counted %d)", err, n.Load())
	}
	return n.Load()
}

// settledPolls is how many polls in a row settle wants the operator idle
// with no new write: counted polls, so a loaded machine, whose polls
// stretch, waits longer on the wall clock.
const settledPolls = 10

// settle waits until the reconciles that earlier steps queued (and those
// their writes queued in turn) have run: settledPolls polls in a row find
// no controller busy and the operator's write count unchanged.
func settle(t *testing.T, ctx context.Context) {
	t.Helper()
	last, calm := writes.Count(), 0
	var busy []string
	err := cluster.WaitFor(ctx, 2*time.Minute, "the operator idle, writing nothing", func(context.Context) (bool, error) {
		var err error
		if busy, err = operatorBusy(); err != nil {
			return false, err
		}
		n := writes.Count()
		if len(busy) > 0 || n != last {
			last, calm = n, 0
			return false, nil
		}
		calm++
		return calm >= settledPolls, nil
	})
	if err != nil {
		t.Fatalf("%v; busy: %v; recent writes: %v", err, busy, writes.Recent())
	}
}

// quiet asserts the operator sends no write request for d, once the
// reconciles of earlier steps have run (settle).
func quiet(t *testing.T, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	settle(t, ctx)
	// The test CA rotates on its own a few minutes after it was made
	// (testCAPolicy): on a slow run that falls inside some test's quiet
	// window. A step due within the window (and 30 s of room) is waited
	// for, seen in the CA Secret, and settled first.
	for {
		what, at, rv := nextCAStep(t, ctx)
		if at.IsZero() || time.Until(at) > d+30*time.Second {
			break
		}
		t.Logf("the test CA's %s is due at %s: waiting for it before a quiet %s", what, at.Format(time.TimeOnly), d)
		err := cluster.WaitFor(ctx, time.Until(at)+2*time.Minute, "the CA Secret changed by the "+what, func(ctx context.Context) (bool, error) {
			sec := &corev1.Secret{}
			err := env.Client.Get(ctx, client.ObjectKey{Namespace: operatorNS, Name: desired.CASecretName}, sec)
			return err == nil && sec.ResourceVersion != rv, client.IgnoreNotFound(err)
		})
		if err != nil {
			t.Fatal(err)
		}
		settle(t, ctx)
	}
	before := writes.Count()
	time.Sleep(d)
	n := writes.Count() - before
	t.Logf("quiet period of %s: %d write requests by the operator", d, n)
	if n != 0 {
		t.Fatalf("operator made %d write requests in a quiet %s; recent: %v", n, d, writes.Recent())
	}
}

// nextCAStep is the installation CA's next timed step (a staged CA's
// promotion, the active CA's rotation, a retired CA's expiry), when it is
// due in real time, and the CA Secret's resourceVersion; zero when there
// is no CA yet.
func nextCAStep(t *testing.T, ctx context.Context) (string, time.Time, string) {
	t.Helper()
	sec := &corev1.Secret{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: operatorNS, Name: desired.CASecretName}, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return "", time.Time{}, ""
		}
		t.Fatal(err)
	}
	if len(sec.Data[pki.SecretKeyNextCert]) > 0 {
		return "promotion of the staged CA", time.Now(), sec.ResourceVersion
	}
	active, err := pki.ParseCertPEM(sec.Data[pki.SecretKeyActiveCert])
	if err != nil {
		return "", time.Time{}, ""
	}
	// The operator's clock runs clock.Offset() ahead of the real one.
	what, at := "rotation", pki.CARotationTime(active, testCAPolicy)
	retired, _ := pki.ParseCertsPEM(sec.Data[pki.SecretKeyRetiredCerts])
	for _, r := range retired {
		if r.NotAfter.Before(at) {
			what, at = "retired CA's expiry", r.NotAfter
		}
	}
	return what, at.Add(-clock.Offset()), sec.ResourceVersion
}

// update reads obj, applies mutate and updates it, retrying on conflicts
// with the operator's own status writes.
func update(ctx context.Context, obj client.Object, mutate func()) error {
	// The operator writes the CR's status while a test changes its spec:
	// retry conflicts as a client does, for longer than DefaultRetry's
	// 50 ms.
	backoff := wait.Backoff{Steps: 12, Duration: 20 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Cap: time.Second}
	return retry.RetryOnConflict(backoff, func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		mutate()
		return env.Client.Update(ctx, obj)
	})
}
