package controllers

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/fleet"
	"github.com/hookwright/hookwright/internal/rollout"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch

// The fleet status of each SidecarInjector (status.fleet, conditions
// PodsUpToDate and PodsMissingSidecars, the hookwright_sidecar_fleet_pods
// metric) comes from the pod index (internal/podindex, fed by
// podindex.go on the leader): it keeps each pod's state for each
// injector and the counts, moved by each pod or namespace event, and
// wakes a CR only when its counts moved (or, for a CR rolling out, when
// one of its pods changed). The manager's cache holds only the servers'
// pods. It only reports; it never acts on a pod.

// DefaultFleetWriteInterval is the least time between two status writes
// of one CR's fleet status (Settings.FleetWriteInterval): a scale-up of
// thousands of pods becomes one write per interval, and a quiet fleet none.
const DefaultFleetWriteInterval = 5 * time.Second

// indexWait is how soon a reconcile that found the pod index still
// syncing looks again.
const indexWait = time.Second

var fleetPods = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "hookwright_sidecar_fleet_pods",
	Help: "Pods by state for each SidecarInjector (matched, injected, current, outdated, missing, orphaned), as in its status.fleet.",
}, []string{"name", "state"})

func init() { metrics.Registry.MustRegister(fleetPods) }

// fleetReconciler writes one SidecarInjector's fleet status.
type fleetReconciler struct {
	client   client.Client
	status   *statusWriter
	index    *podIndexer
	settings Settings
	now      func() time.Time

	roller *rollout.Roller
	// discovery asks the API server's version once; version is its answer.
	discovery discovery.ServerVersionInterface
	version   string

	mu sync.Mutex
	// lastWrite is when each CR's fleet status was last written.
	lastWrite map[string]time.Time
	// compiled is each CR's last compiled config, by UID and generation.
	compiled map[string]compiledInjector
}

type compiledInjector struct {
	uid        types.UID
	generation int64
	revision   string
	inj        fleet.Injector
}

func setupFleet(mgr ctrl.Manager, s Settings, status *statusWriter) (*podIndexer, error) {
	// The pod index reads pods in protobuf, as kube-controller-manager and
	// kube-scheduler do (component-base ClientConnectionConfiguration):
	// decoding 150,000 pods from JSON costs several times the CPU and the
	// garbage, which a takeover's stream pays all at once.
	pcfg := rest.CopyConfig(mgr.GetConfig())
	pcfg.ContentType = runtime.ContentTypeProtobuf
	pcfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	cs, err := kubernetes.NewForConfigAndClient(pcfg, mgr.GetHTTPClient())
	if err != nil {
		return nil, err
	}
	ix := newPodIndexer(cs)
	if err := mgr.Add(ix); err != nil {
		return nil, err
	}
	dc, err := discovery.NewDiscoveryClientForConfigAndClient(mgr.GetConfig(), mgr.GetHTTPClient())
	if err != nil {
		return nil, err
	}
	r := &fleetReconciler{client: mgr.GetClient(), status: status, index: ix, settings: s, now: time.Now, discovery: dc,
		lastWrite: map[string]time.Time{}, compiled: map[string]compiledInjector{},
		roller: rollout.New(mgr.GetClient(), mgr.GetAPIReader(), mgr.GetEventRecorder("hookwright-rollout"), dc)}
	return ix, ctrl.NewControllerManagedBy(mgr).Named("sidecar-fleet").For(&v1alpha1.SidecarInjector{}).
		WatchesRawSource(ix.source()).
		Complete(r)
}

// rollsOut reports whether cr asks for a rollout (spec.rollout.strategy):
// then its pods are planned (fleet.PlanPod), which renders.
func rollsOut(cr *v1alpha1.SidecarInjector) bool {
	return cr.Spec.Rollout.Strategy != v1alpha1.RolloutNone && cr.Spec.Rollout.Strategy != ""
}

// injector compiles what cr's servers serve (sidecar.Served: pinned to
// spec.revision once resolved) once per generation and revision.
func (r *fleetReconciler) injector(cr *v1alpha1.SidecarInjector) (fleet.Injector, error) {
	_, rev, _ := sidecar.Served(cr)
	r.mu.Lock()
	c, ok := r.compiled[cr.Name]
	r.mu.Unlock()
	if ok && c.uid == cr.UID && c.generation == cr.Generation && c.revision == rev && c.inj.Params.ServerVersion != "" {
		return c.inj, nil
	}
	// What the servers inject with nativeSidecars Auto depends on the
	// version: without it a rollout would judge native sidecars as
	// containers to move, a change only a restart makes.
	inj, err := fleet.NewInjector(cr, r.settings.Settings, r.serverVersion())
	if err != nil {
		return fleet.Injector{}, err
	}
	if !rollsOut(cr) {
		// Only the rollout renders (fleet.PlanPod); counting decides. The
		// parsed templates are about 200 KiB per SidecarInjector, held
		// for as long as its generation lives.
		inj = inj.ForDecisions()
	}
	r.mu.Lock()
	r.compiled[cr.Name] = compiledInjector{uid: cr.UID, generation: cr.Generation, revision: rev, inj: inj}
	r.mu.Unlock()
	return inj, nil
}

// Reconcile reads one SidecarInjector's counts from the pod index and
// writes its fleet status when a count or condition changed, at most once
// per write interval (Settings.FleetWriteInterval).
func (r *fleetReconciler) Reconcile(ctx context.Context, req reconcile.Request) (ctrl.Result, error) {
	cr := &v1alpha1.SidecarInjector{}
	if err := r.client.Get(ctx, req.NamespacedName, cr); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !cr.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	cr.Default()
	inj, err := r.injector(cr)
	if err != nil {
		// The lifecycle reconciler reports a spec that does not compile.
		return ctrl.Result{}, nil
	}
	rolling := rollsOut(cr)
	// A new compiled form (a template, selector or revision change)
	// re-classifies every pod once, here.
	id := fmt.Sprintf("%s/%d/%s/%s", cr.UID, cr.Generation, inj.Revision, inj.Params.ServerVersion)
	r.index.idx.SetInjector(cr.Name, id, inj, rolling)
	if !r.index.Synced() {
		return ctrl.Result{RequeueAfter: indexWait}, nil
	}
	sum, _ := r.index.idx.Summary(cr.Name)
	var counted []rollout.Pod
	var nsLabels map[string]map[string]string
	if rolling {
		// The rollout's selection reads the records' views (labels, our
		// annotations, owner, Ready, UID, resourceVersion); the pods it
		// judges it reads in full with a GET (internal/rollout).
		r.index.idx.Classified(cr.Name, func(view *corev1.Pod, c fleet.Pod) {
			counted = append(counted, rollout.Pod{Pod: view, Class: c})
		})
		nsLabels = r.index.idx.NamespaceLabels()
	}
	recordFleet(cr.Name, sum.Status.FleetCounts)
	orig := cr.DeepCopy()
	cr.Status.Fleet = &sum.Status
	fleet.SetConditions(&cr.Status.Conditions, sum, cr.Generation)
	// The step's write-ahead applies under the fleet's manager too: the
	// status's managers are handed over before either writes.
	if err := r.status.migrate(ctx, cr); err != nil {
		return ctrl.Result{}, err
	}
	again, rv := r.roller.Step(ctx, cr, inj, int(sum.Status.MatchedPods), counted, nsLabels)
	if rv != "" {
		// The rollout wrote status.rollout.inProgress ahead of a restart;
		// this write goes on top of it.
		orig.ResourceVersion, cr.ResourceVersion = rv, rv
	}
	res := ctrl.Result{RequeueAfter: again}
	if equality.Semantic.DeepEqual(orig.Status, cr.Status) {
		return res, nil
	}
	r.mu.Lock()
	interval := r.settings.FleetWriteInterval
	if interval <= 0 {
		interval = DefaultFleetWriteInterval
	}
	wait := interval - r.now().Sub(r.lastWrite[cr.Name])
	r.mu.Unlock()
	// Same counts, other conditions (a rollout condition, or one another
	// writer removed): written at once, no count moved.
	if equality.Semantic.DeepEqual(orig.Status.Fleet, cr.Status.Fleet) {
		wait = 0
	}
	// A rollout step that acted is written at once: status.rollout's
	// inProgress is the record of restarted owners a new leader resumes
	// from, and steps are bounded by maxUnavailable, not by pod events.
	if r.roller.Acted(cr.Name) {
		wait = 0
	}
	if wait > 0 {
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	// Only the fleet's share (rollout.Status): the lifecycle reconciler's
	// fields and conditions stay as the API server has them.
	if err := r.status.write(ctx, orig, cr, rollout.FieldManager); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	r.mu.Lock()
	r.lastWrite[cr.Name] = r.now()
	r.mu.Unlock()
	return res, nil
}

// serverVersion is the API server's version (discovery, asked until it
// answers once): the servers' nativeSidecars Auto follows it.
func (r *fleetReconciler) serverVersion() string {
	r.mu.Lock()
	v := r.version
	r.mu.Unlock()
	if v != "" || r.discovery == nil {
		return v
	}
	info, err := r.discovery.ServerVersion()
	if err != nil {
		return ""
	}
	r.mu.Lock()
	r.version = info.GitVersion
	r.mu.Unlock()
	return info.GitVersion
}

func (r *fleetReconciler) forget(name string) {
	r.mu.Lock()
	delete(r.lastWrite, name)
	delete(r.compiled, name)
	r.mu.Unlock()
	r.roller.Forget(name)
	if r.index != nil {
		r.index.idx.RemoveInjector(name)
	}
	fleetPods.DeletePartialMatch(prometheus.Labels{"name": name})
}

func recordFleet(name string, c v1alpha1.FleetCounts) {
	for state, n := range map[string]int32{
		"matched": c.MatchedPods, "injected": c.InjectedPods, "current": c.CurrentPods,
		"outdated": c.OutdatedPods, "missing": c.MissingPods, "orphaned": c.OrphanedPods,
	} {
		fleetPods.WithLabelValues(name, state).Set(float64(n))
	}
}
