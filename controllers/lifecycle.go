package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/apply"
	"github.com/hookwright/hookwright/internal/certificates/sources"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/health"
	"github.com/hookwright/hookwright/internal/requeue"
)

// The operator writes the objects each CR owns, reads Secrets and nodes, and
// records events. No wildcards: every resource and verb is listed. Writes
// are server-side apply (patch; create when the object is new) and delete.
// The leader election Lease is granted by config/rbac/leader_election_role.yaml.
//
// Namespaced objects only in server namespaces: the markers with
// namespace=system make the Role manager-role of the operator's namespace
// (kustomize renames "system"); config/server-namespace/role.yaml is the
// same rules as a ClusterRole to bind with a RoleBinding in each other
// --allowed-server-namespaces entry (TestServerNamespaceRoleMatches keeps
// them equal). Cluster-scoped owned objects (the servers' ClusterRoles and
// bindings, webhook configurations) are created and patched but never
// deleted: their names never change while the CR lives, and the garbage
// collector deletes them with the CR through their ownerReferences.
// +kubebuilder:rbac:groups="",namespace=system,resources=serviceaccounts;services,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",namespace=system,resources=secrets,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=apps,namespace=system,resources=deployments,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=policy,namespace=system,resources=poddisruptionbudgets,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles;clusterrolebindings,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations,verbs=get;list;watch;create;patch
// The injector servers' fail-open rules (desired.failOpenRules), held
// cluster-wide as RBAC's escalation check requires: the operator's own
// Deployment by the name every install gives it.
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get,resourceNames=hookwright-controller-manager
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch;update
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch;update

// Event reasons.
const (
	EventConflictingWriter = "ConflictingWriter"
)

// Condition reasons besides the certificate ones.
const (
	reasonConfigured    = "Configured"
	reasonApplyFailed   = "ApplyFailed"
	reasonNoCertificate = "NoCertificate"
	reasonAvailable     = "MinimumReplicasAvailable"
	reasonUnavailable   = "NoReplicasAvailable"
	reasonNoDeployment  = "DeploymentMissing"
	reasonReady         = "Ready"
	reasonNotReady      = "NotReady"
	ReasonConflicting   = "ConflictingWriter"
	ReasonPaused        = "ReconcilePaused"
)

// PauseReconcileAnnotation set to "true" on a CR stops the operator from
// changing anything it owns until the annotation is removed, like the pause
// predicate of operator-framework/operator-lib.
const PauseReconcileAnnotation = "admission.hookwright.io/pause-reconcile"

// reconciler is the lifecycle reconciler of one CR kind: it turns each CR
// into a ServiceAccount, RBAC, a Deployment, a PodDisruptionBudget, a
// Service, a serving certificate Secret and a MutatingWebhookConfiguration,
// all owned by the CR and written with server-side apply only when they
// differ from what is desired. Per-kind behaviour comes from its kind
// adapter (sidecarKind, oversellKind); Setup builds one per kind.
type reconciler struct {
	Client    client.Client
	APIReader client.Reader
	Scheme    *runtime.Scheme
	Recorder  events.EventRecorder
	Settings  Settings
	// Now is the clock for certificate decisions; nil means time.Now.
	Now func() time.Time

	// kind adapts the CR kind (sidecarKind, oversellKind).
	kind kind

	// applier writes the owned objects (repair budget, Events).
	applier *apply.Applier
	// shared is common to the reconcilers of one manager.
	shared *shared
	// sources are the certificate modes.
	sources sources.Sources
	// cmWatch adds the watch on owned cert-manager Certificates once their
	// CRD is served.
	cmWatch *certManagerWatch
	// fetchConfigz reads a server pod's /configz (ConfigLoaded); nil
	// leaves ConfigLoaded unset.
	fetchConfigz configzFetcher
}

func newReconciler(mgr ctrl.Manager, s Settings, k kind) *reconciler {
	r := &reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(),
		Recorder: mgr.GetEventRecorder("hookwright-" + k.Kind().Short), Settings: s, kind: k,
		shared: &shared{status: newStatusWriter(mgr.GetClient(), mgr.GetAPIReader())},
	}
	r.applier = newApplier(r)
	r.Settings.CSR = csrSettings(mgr, s.CSR)
	r.sources = sources.New(r.certEnv())
	if cs, err := kubernetes.NewForConfigAndClient(mgr.GetConfig(), mgr.GetHTTPClient()); err == nil {
		r.fetchConfigz = podsProxyFetcher(cs)
	} else {
		mgr.GetLogger().Error(err, "no pods proxy client: ConfigLoaded is not reported")
	}
	return r
}

// newApplier is r's writer of owned objects, counting repairs in the
// operator's metrics.
func newApplier(r *reconciler) *apply.Applier {
	return &apply.Applier{
		Client: r.Client, APIReader: r.APIReader, Scheme: r.Scheme, Recorder: r.Recorder,
		Budget: r.Settings.Repairs, Now: r.now,
		OnRepair:   func(k, o string) { driftRepairs.WithLabelValues(k, o).Inc() },
		OnConflict: func(k, o string) { repairConflicts.WithLabelValues(k, o).Inc() },
	}
}

// ensure applies obj as an object op owns (apply.Applier.Ensure).
func (r *reconciler) ensure(ctx context.Context, op desired.CR, obj client.Object) (bool, error) {
	return r.applier.Ensure(ctx, owner(op), obj)
}

func owner(op desired.CR) apply.Owner { return apply.Owner{Object: op.Object, Kind: op.Kind.Name} }

// certEnv is what the certificate sources of r use.
func (r *reconciler) certEnv() sources.Env {
	return sources.Env{
		Client: r.Client, APIReader: r.APIReader, Recorder: r.Recorder,
		Settings: r.Settings.Settings, Certificates: r.Settings.Certificates,
		Extra:            func() []byte { return r.shared.caDir.Bundle() },
		WatchCertManager: func() error { return r.cmWatch.ensure() },
		CSR:              r.Settings.CSR,
	}
}

// SetupWithManager registers the controller: the CR kind, every owned type,
// and the CA Secret (a change re-reconciles every CR of the kind).
func (r *reconciler) SetupWithManager(mgr ctrl.Manager) error {
	b := ctrl.NewControllerManagedBy(mgr).Named(r.kind.Kind().Short).For(r.kind.New())
	for _, o := range ownedTypes() {
		b = b.Owns(o)
	}
	b = r.csrWatches(b)
	b = b.Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		if o.GetName() != desired.CASecretName || o.GetNamespace() != r.Settings.Namespace {
			return nil
		}
		return r.allRequests(ctx)
	}))
	// A pod joining or leaving a server's Service (endpoints.go).
	b = b.Watches(&discoveryv1.EndpointSlice{}, handler.EnqueueRequestsFromMapFunc(r.instanceRequests))
	b = r.watchServerPods(b) // podhealth.go
	if r.shared != nil && r.shared.caDir != nil {
		b = b.WatchesRawSource(source.Channel(r.shared.caDir.subscribe(), handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
			return r.allRequests(ctx)
		})))
	}
	if r.shared != nil && r.shared.prober != nil {
		// A probe outcome that changes WebhookReachable.
		b = b.WatchesRawSource(source.Channel(r.shared.prober.channel(r.kind), &handler.EnqueueRequestForObject{}))
	}
	if r.shared != nil && r.shared.userSecrets != nil {
		b = b.WatchesRawSource(r.userSecretSource(r.shared.userSecrets))
	}
	if w, ok := r.kind.(watching); ok {
		b = w.Watch(b, func(ctx context.Context, _ client.Object) []reconcile.Request { return r.allRequests(ctx) })
	}
	c, err := b.Build(r)
	if err != nil {
		return err
	}
	r.cmWatch = &certManagerWatch{ctrl: c, cache: mgr.GetCache(), mapper: mgr.GetRESTMapper(), scheme: mgr.GetScheme(), owner: r.kind.New(), started: true}
	return nil
}

// allRequests lists every CR of the reconciler's kind from the cache.
func (r *reconciler) allRequests(ctx context.Context) []reconcile.Request {
	list := r.kind.NewList()
	if err := r.Client.List(ctx, list); err != nil {
		log.FromContext(ctx).Error(err, "list CRs to re-reconcile")
		return nil
	}
	var reqs []reconcile.Request
	_ = apimeta.EachListItem(list, func(obj runtime.Object) error {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: obj.(client.Object).GetName()}})
		return nil
	})
	return reqs
}

func (r *reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	if c := r.Settings.Certificates.Clock; c != nil {
		return c.Now()
	}
	return time.Now()
}

// Reconcile brings one CR's owned objects and status to the desired state,
// one named phase after another (phases). It writes nothing when
// everything already matches.
func (r *reconciler) Reconcile(ctx context.Context, req reconcile.Request) (ctrl.Result, error) {
	obj := r.kind.New()
	if err := r.Client.Get(ctx, req.NamespacedName, obj); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(ctx, req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	// The API server's defaults (api/v1alpha1 Default), for objects no API
	// server defaulted; on served objects this changes nothing.
	if d, ok := obj.(interface{ Default() }); ok {
		d.Default()
	}
	if !obj.GetDeletionTimestamp().IsZero() {
		return r.reconcileDelete(ctx, obj)
	}
	if err := r.addFinalizer(ctx, obj); err != nil {
		return ctrl.Result{}, err
	}
	orig := obj.DeepCopyObject().(v1alpha1.Object)
	result, err := r.run(ctx, &pass{op: desired.NewCR(r.kind.Kind(), obj), now: r.now()})
	if serr := r.writeStatus(ctx, orig, obj); serr != nil {
		return ctrl.Result{}, errors.Join(err, serr)
	}
	return result, err
}

// pass is what the phases of one reconcile share.
type pass struct {
	op  desired.CR
	now time.Time
	// cert is the certificate phase's outcome, d the objects built.
	cert sources.State
	d    *desired.Desired
	// requeue is the soonest any phase wants to look again (0: on events).
	requeue time.Duration
	// armed: the live configuration had Fail when this pass began;
	// published: phaseWebhook wrote the configuration with its certificate.
	armed, published bool
}

// phase is one named step of a reconcile. run returns when to look again
// (0: on events) and whether the reconcile stops here; a failure goes
// through fail, which sets Ready (and cond, for a conflicting writer) the
// same way for every phase.
type phase struct {
	name string
	cond string
	run  func(ctx context.Context, p *pass) (requeueAfter time.Duration, stop bool, err error)
}

// phases are the steps of a reconcile, in order: the pause and the server
// policy may stop it; then the certificate, the owned objects, the webhook
// configuration, the status conditions and the kind's own after-apply work.
func (r *reconciler) phases() []phase {
	ps := []phase{
		{name: "pause", run: r.phasePause},
		{name: "server-policy", run: r.phasePolicy},
		{name: "certificate", cond: v1alpha1.ConditionCertificateReady, run: r.phaseCertificate},
		{name: "objects", run: r.phaseObjects},
		{name: "webhook", cond: v1alpha1.ConditionWebhookConfigured, run: r.phaseWebhook},
		{name: "status", run: r.phaseStatus},
		{name: "probe", cond: v1alpha1.ConditionWebhookReachable, run: r.phaseProbe}, // probe.go
		{name: "failure-policy", cond: v1alpha1.ConditionWebhookConfigured, run: r.phaseFailurePolicy},
	}
	if a, ok := r.kind.(afterApplying); ok {
		ps = append(ps, phase{name: "after-apply", run: func(ctx context.Context, p *pass) (time.Duration, bool, error) {
			d, err := a.AfterApply(ctx, p.op.Object)
			return d, false, err
		}})
	}
	return ps
}

// run runs the phases. Only a generation every phase acted on counts as
// observed (NodeOversell resyncs nodes when it differs).
func (r *reconciler) run(ctx context.Context, p *pass) (ctrl.Result, error) {
	for _, ph := range r.phases() {
		after, stop, err := ph.run(ctx, p)
		if err != nil {
			return r.fail(ctx, p.op, ph, err)
		}
		p.requeue = requeue.Sooner(p.requeue, after)
		if stop {
			return ctrl.Result{RequeueAfter: p.requeue}, nil
		}
	}
	p.op.Object.SetObservedGeneration(p.op.Object.GetGeneration())
	return ctrl.Result{RequeueAfter: p.requeue}, nil
}

// fail is the one error path of a reconcile: Ready becomes False naming
// the phase's error. An owned object another writer keeps changing
// (apply.ConflictError) is no error of the reconcile: it also sets the
// phase's condition, becomes a Warning Event and a requeue when the repair
// budget allows the next repair.
func (r *reconciler) fail(ctx context.Context, op desired.CR, ph phase, err error) (ctrl.Result, error) {
	var ce *apply.ConflictError
	if errors.As(err, &ce) {
		log.FromContext(ctx).Info("repair budget exhausted; backing off", "phase", ph.name, "object", ce.Object, "writers", ce.Writers, "retryAfter", ce.RetryAfter)
		if ph.cond != "" {
			r.setCondition(op, ph.cond, false, ReasonConflicting, ce.Error())
		}
		r.setCondition(op, v1alpha1.ConditionReady, false, ReasonConflicting, ce.Error())
		r.Recorder.Eventf(op.Object, nil, corev1.EventTypeWarning, EventConflictingWriter, "Repair", ce.Error())
		return ctrl.Result{RequeueAfter: ce.RetryAfter}, nil
	}
	var gone *apply.OwnerGoneError
	if errors.As(err, &gone) {
		// The CR's delete (or replacement) event queues what comes next.
		log.FromContext(ctx).Info("CR gone during reconcile; stopping", "phase", ph.name, "reason", gone.Reason)
		return ctrl.Result{}, nil
	}
	log.FromContext(ctx).V(1).Info("reconcile failed", "phase", ph.name, "error", err.Error())
	r.setCondition(op, v1alpha1.ConditionReady, false, reasonApplyFailed, err.Error())
	return ctrl.Result{}, err
}

// phasePause: with the pause annotation, owned objects are neither
// repaired nor pruned, so an administrator can edit them (deletion still
// runs the finalizer).
func (r *reconciler) phasePause(_ context.Context, p *pass) (time.Duration, bool, error) {
	if p.op.Object.GetAnnotations()[PauseReconcileAnnotation] != "true" {
		return 0, false, nil
	}
	r.setCondition(p.op, v1alpha1.ConditionReady, false, ReasonPaused,
		"reconciliation paused by the "+PauseReconcileAnnotation+" annotation; owned objects are not repaired")
	return 0, true, nil
}

// phasePolicy refuses a CR whose server the policy does not allow. No
// requeue: only a CR edit (an event) or a restart with other flags changes
// the verdict.
func (r *reconciler) phasePolicy(ctx context.Context, p *pass) (time.Duration, bool, error) {
	errs := r.Settings.ServerPolicy().Check(p.op.Server, p.op.Certificate)
	if len(errs) == 0 {
		return 0, false, nil
	}
	return 0, true, r.refuse(ctx, p.op, errs)
}

// phaseCertificate runs the source of the CR's certificate mode and sets
// CertificateReady.
func (r *reconciler) phaseCertificate(ctx context.Context, p *pass) (time.Duration, bool, error) {
	op := p.op
	src := r.sources.For(op)
	if src == nil {
		return 0, false, fmt.Errorf("certificate mode %q has no source", desired.CertificateMode(op))
	}
	cs, err := src.Certificate(ctx, op, func(ctx context.Context, obj client.Object) error {
		_, err := r.ensure(ctx, op, obj)
		return err
	})
	if cs.Reason != "" {
		r.setCondition(op, v1alpha1.ConditionCertificateReady, err == nil && cs.Ready, cs.Reason, cs.Message)
	}
	if err != nil {
		return 0, false, err
	}
	p.cert = cs
	recordCertificate(op.Kind.Name, op.Object.GetName(), desired.ServerNamespace(op, r.Settings.Settings), desired.ServingSecretName(op), cs)
	return cs.RequeueAfter, false, nil
}

// phaseObjects applies every owned object but the webhook configuration
// (identity and RBAC first, the Service last) and prunes those no longer
// desired.
func (r *reconciler) phaseObjects(ctx context.Context, p *pass) (time.Duration, bool, error) {
	p.d = r.kind.Build(p.op.Object, r.Settings.Settings)
	keep := slices.Clone(p.cert.Keep)
	var held time.Duration
	for _, o := range p.d.Objects() {
		keep = append(keep, o)
		switch o {
		case desired.Object(p.d.Webhook):
			continue
		case desired.Object(p.d.Deployment):
			// Server Deployments of different CRs roll one at a time.
			var err error
			if held, err = r.ensureServer(ctx, p.op, p.d.Deployment); err != nil {
				return 0, false, err
			}
			continue
		}
		if _, err := r.ensure(ctx, p.op, o); err != nil {
			return 0, false, err
		}
	}
	return held, false, r.pruneOwned(ctx, p.op, keep)
}

// phaseWebhook writes the webhook configuration with the caBundle the
// certificate calls for (sources.Publish), or leaves it as it is while
// there is no usable certificate.
func (r *reconciler) phaseWebhook(ctx context.Context, p *pass) (time.Duration, bool, error) {
	wh := p.d.Webhook
	var live *admissionregistrationv1.MutatingWebhookConfiguration
	if m := (&admissionregistrationv1.MutatingWebhookConfiguration{}); r.Client.Get(ctx, client.ObjectKeyFromObject(wh), m) == nil {
		live = m
	}
	// Fail only once reachable: decided from the conditions as they stand;
	// phaseFailurePolicy decides again from this pass's fresh ones.
	// Armed: Fail was in effect, or fell back to Ignore from it (so the
	// fallback stays a fallback, not a fresh start).
	p.armed = live != nil && publishedPolicy(live) == admissionregistrationv1.Fail
	if c := apimeta.FindStatusCondition(p.op.Conditions(), v1alpha1.ConditionFailurePolicyEnforced); c != nil && c.Reason == v1alpha1.FailurePolicyReasonFellBack {
		p.armed = live != nil
	}
	r.applyFailurePolicy(p, wh)
	published, overlapEnds := sources.Publish(wh, live, p.cert, p.now, r.Settings.Certificates.Grace())
	p.published = published && !p.cert.BundleOnly
	if !published {
		r.setCondition(p.op, v1alpha1.ConditionWebhookConfigured, false, reasonNoCertificate,
			"MutatingWebhookConfiguration "+wh.Name+" is not written until a serving certificate is ready")
		return 0, false, nil
	}
	if _, err := r.ensure(ctx, p.op, wh); err != nil {
		return 0, false, err
	}
	if p.cert.BundleOnly {
		r.setCondition(p.op, v1alpha1.ConditionWebhookConfigured, false, reasonNoCertificate,
			"MutatingWebhookConfiguration "+wh.Name+" has the new caBundle; its serving certificate is issued next")
		return overlapEnds, false, nil
	}
	svc := wh.Webhooks[0].ClientConfig.Service
	r.setCondition(p.op, v1alpha1.ConditionWebhookConfigured, true, reasonConfigured, fmt.Sprintf(
		"MutatingWebhookConfiguration %s calls service %s/%s:443%s", wh.Name, svc.Namespace, svc.Name, *svc.Path))
	return overlapEnds, false, nil
}

// phaseStatus sets ServerAvailable, ServerPodsHealthy, EndpointsOwned,
// ConfigLoaded and Ready.
func (r *reconciler) phaseStatus(ctx context.Context, p *pass) (time.Duration, bool, error) {
	r.serverAvailable(ctx, p.op, p.d.Deployment)
	podPoll := r.serverPodHealth(ctx, p.op, p.d.Deployment) // podhealth.go
	if err := r.checkEndpoints(ctx, p.op, p.d.Service, p.d.Deployment); err != nil {
		return 0, false, err
	}
	poll := requeue.Sooner(r.configLoaded(ctx, p.op), podPoll)
	r.setReady(p.op)
	return poll, false, nil
}

// forget drops what is remembered of a CR that is gone: its metrics, the
// applier's memory of its objects, its upgrade hold.
func (r *reconciler) forget(ctx context.Context, name string) {
	forgetMetrics(r.kind.Kind().Name, name)
	if r.shared != nil && r.shared.prober != nil {
		r.shared.prober.Forget(r.kind.Kind().Name, name)
	}
	r.applier.Forget(r.kind.Kind().Name, name)
	if _, ok := r.kind.(finalizing); ok {
		releaseUpgrade(ctx, r.shared, restoreHold(name))
	}
}

// addFinalizer adds the kind's finalizer (if it has one) with a merge patch
// of the finalizer list alone; the reconcile goes on.
func (r *reconciler) addFinalizer(ctx context.Context, obj v1alpha1.Object) error {
	f, ok := r.kind.(finalizing)
	if !ok || slices.Contains(obj.GetFinalizers(), f.Finalizer()) {
		return nil
	}
	patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
	obj.SetFinalizers(append(obj.GetFinalizers(), f.Finalizer()))
	return r.Client.Patch(ctx, obj, patch)
}

// reconcileDelete runs the kind's finalizer for a CR being deleted: a
// holding kind first keeps it while workloads need it; then its
// configuration loses its webhooks, so its server is called no more; the
// garbage collector removes the owned objects.
func (r *reconciler) reconcileDelete(ctx context.Context, obj v1alpha1.Object) (ctrl.Result, error) {
	f, ok := r.kind.(finalizing)
	if !ok || !slices.Contains(obj.GetFinalizers(), f.Finalizer()) {
		return ctrl.Result{}, nil
	}
	// OLM must not replace the operator halfway through a restore.
	holdUpgrade(ctx, r.shared, restoreHold(obj.GetName()), fmt.Sprintf("%s %s restoring its nodes", r.kind.Kind().Name, obj.GetName()))
	op := desired.NewCR(r.kind.Kind(), obj)
	if h, ok := r.kind.(holding); ok {
		orig := obj.DeepCopyObject().(v1alpha1.Object)
		held, retry, err := h.Hold(ctx, obj)
		if serr := r.writeStatus(ctx, orig, obj); serr != nil {
			return ctrl.Result{}, errors.Join(err, serr)
		}
		if err != nil || held {
			return ctrl.Result{RequeueAfter: retry}, err
		}
	}
	if _, _, err := r.disarm(ctx, op, op.Base()); err != nil {
		return ctrl.Result{}, err
	}
	done, retry, err := f.Finalize(ctx, obj)
	if err != nil || !done {
		return ctrl.Result{RequeueAfter: retry}, err
	}
	patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
	obj.SetFinalizers(slices.DeleteFunc(slices.Clone(obj.GetFinalizers()), func(s string) bool { return s == f.Finalizer() }))
	if err := r.Client.Patch(ctx, obj, patch); client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, err
	}
	releaseUpgrade(ctx, r.shared, restoreHold(obj.GetName()))
	r.shared.status.forget(obj.GetUID())
	return ctrl.Result{}, nil
}

// writeStatus applies the lifecycle's share of the status (everything but
// the fleet's: rollout.Status) only when the status changed; the fleet's
// fields and conditions are the fleet reconciler's own, which the API
// server keeps (statusWriter).
func (r *reconciler) writeStatus(ctx context.Context, orig, obj v1alpha1.Object) error {
	if equality.Semantic.DeepEqual(orig.StatusValue(), obj.StatusValue()) {
		return nil
	}
	return client.IgnoreNotFound(r.shared.status.write(ctx, orig, obj, apply.StatusManager))
}

func (r *reconciler) setCondition(op desired.CR, typ string, ok bool, reason, msg string) {
	st := metav1.ConditionFalse
	if ok {
		st = metav1.ConditionTrue
	}
	apimeta.SetStatusCondition(op.Object.StatusConditions(), metav1.Condition{
		Type: typ, Status: st, Reason: reason, Message: msg, ObservedGeneration: op.Object.GetGeneration(),
	})
}

// serverAvailable sets ServerAvailable from the Deployment's availableReplicas
// as the cache last saw it (a Deployment status change re-triggers us).
func (r *reconciler) serverAvailable(ctx context.Context, op desired.CR, want *appsv1.Deployment) {
	dep := &appsv1.Deployment{}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), dep); err != nil {
		r.setCondition(op, v1alpha1.ConditionServerAvailable, false, reasonNoDeployment, fmt.Sprintf("Deployment %s/%s: %v", want.Namespace, want.Name, err))
		return
	}
	msg := fmt.Sprintf("Deployment %s/%s: %d of %d replicas available", dep.Namespace, dep.Name, dep.Status.AvailableReplicas, *want.Spec.Replicas)
	if dep.Status.AvailableReplicas > 0 {
		r.setCondition(op, v1alpha1.ConditionServerAvailable, true, reasonAvailable, msg)
	} else {
		r.setCondition(op, v1alpha1.ConditionServerAvailable, false, reasonUnavailable, msg)
	}
}

// setReady sets Ready from CertificateReady, WebhookConfigured and
// ServerAvailable, naming the ones that are not True.
func (r *reconciler) setReady(op desired.CR) {
	var not []string
	for _, t := range []string{v1alpha1.ConditionCertificateReady, v1alpha1.ConditionWebhookConfigured, v1alpha1.ConditionServerAvailable} {
		if !apimeta.IsStatusConditionTrue(op.Conditions(), t) {
			c := apimeta.FindStatusCondition(op.Conditions(), t)
			msg := t + " is not True"
			if c != nil {
				msg = fmt.Sprintf("%s is %s (%s)", t, c.Status, c.Reason)
			}
			not = append(not, msg)
		}
	}
	if len(not) == 0 {
		r.setCondition(op, v1alpha1.ConditionReady, true, reasonReady, "webhook configured, certificate valid and server available")
		return
	}
	r.setCondition(op, v1alpha1.ConditionReady, false, reasonNotReady, strings.Join(not, "; "))
}

// prunable are the owned types whose objects may stop being desired: a PDB
// when replicas drop to 1, namespaced objects when spec.server.namespace
// changes, the operator's serving Secret when the mode leaves SelfSigned.
// The ClusterRole and ClusterRoleBinding are named after the CR alone, so
// they stay desired until the CR is deleted (the garbage collector's job).
// The webhook configuration is never pruned here: without a certificate it
// is left as it was rather than removed.
func prunable() []client.ObjectList {
	return []client.ObjectList{
		&corev1.ServiceAccountList{}, &appsv1.DeploymentList{}, &policyv1.PodDisruptionBudgetList{},
		&corev1.ServiceList{}, &corev1.SecretList{},
	}
}

// pruneOwned deletes objects op controls (found in the cache by the
// instance label) that are not in keep.
func (r *reconciler) pruneOwned(ctx context.Context, op desired.CR, keep []client.Object) error {
	key := func(o client.Object) string {
		gvk, _ := apiutil.GVKForObject(o, r.Scheme)
		return gvk.Kind + "/" + o.GetNamespace() + "/" + o.GetName()
	}
	want := map[string]bool{}
	for _, o := range keep {
		want[key(o)] = true
	}
	sel := client.MatchingLabels{desired.LabelInstance: op.Base(), desired.LabelManagedBy: desired.ManagedByValue}
	lists := prunable()
	if r.cmWatch != nil && r.cmWatch.running() {
		// Only once cert-manager was seen: listing an unserved kind fails.
		lists = append(lists, &cmapi.CertificateList{}, &cmapi.IssuerList{})
	}
	for _, list := range lists {
		if err := r.Client.List(ctx, list, sel); err != nil {
			return err
		}
		var stale []client.Object
		_ = apimeta.EachListItem(list, func(o runtime.Object) error {
			if obj := o.(client.Object); metav1.IsControlledBy(obj, op.Object) && !want[key(obj)] {
				stale = append(stale, obj)
			}
			return nil
		})
		for _, obj := range stale {
			if err := r.applier.Delete(ctx, owner(op), obj); err != nil {
				return err
			}
		}
	}
	return nil
}

// publishedPolicy is the failurePolicy of a configuration's first webhook
// (every webhook of one configuration gets the same).
func publishedPolicy(wh *admissionregistrationv1.MutatingWebhookConfiguration) admissionregistrationv1.FailurePolicyType {
	if len(wh.Webhooks) == 0 || wh.Webhooks[0].FailurePolicy == nil {
		return ""
	}
	return *wh.Webhooks[0].FailurePolicy
}

// requestedPolicy is the spec's failurePolicy and whenUnreachable.
func requestedPolicy(op desired.CR) (requested, whenUnreachable v1alpha1.FailurePolicy) {
	if si, ok := op.Object.(*v1alpha1.SidecarInjector); ok {
		return si.Spec.FailurePolicy, si.Spec.WhenUnreachable
	}
	return v1alpha1.FailurePolicyIgnore, v1alpha1.FailurePolicyIgnore
}

// applyFailurePolicy sets wh's failurePolicy to the one in effect
// (health.DecideFailurePolicy) and, for a SidecarInjector, the
// FailurePolicyEnforced condition; it reports whether the policy changed.
func (r *reconciler) applyFailurePolicy(p *pass, wh *admissionregistrationv1.MutatingWebhookConfiguration) bool {
	requested, whenUnreachable := requestedPolicy(p.op)
	reach := ""
	if c := apimeta.FindStatusCondition(p.op.Conditions(), v1alpha1.ConditionWebhookReachable); c != nil {
		reach = string(c.Status)
	}
	d := health.DecideFailurePolicy(health.FailurePolicyInput{
		Requested: requested, WhenUnreachable: whenUnreachable, Reachable: reach, Armed: p.armed,
		ServerAvailable: apimeta.IsStatusConditionTrue(p.op.Conditions(), v1alpha1.ConditionServerAvailable),
	})
	fp := admissionregistrationv1.FailurePolicyType(d.Effective)
	changed := publishedPolicy(wh) != fp
	for i := range wh.Webhooks {
		wh.Webhooks[i].FailurePolicy = &fp
	}
	if _, ok := p.op.Object.(*v1alpha1.SidecarInjector); ok {
		r.setCondition(p.op, v1alpha1.ConditionFailurePolicyEnforced, d.Enforced, d.Reason, d.Message)
	}
	return changed
}

// phaseFailurePolicy decides the failurePolicy again from this pass's
// ServerAvailable and WebhookReachable and rewrites the configuration when
// it changes: Ignore becomes Fail one reconcile after the probe first sees
// the webhook answer (the probe's outcome queues that reconcile).
func (r *reconciler) phaseFailurePolicy(ctx context.Context, p *pass) (time.Duration, bool, error) {
	if p.d == nil || p.d.Webhook == nil || !p.published {
		return 0, false, nil
	}
	wh := p.d.Webhook
	// p.armed is as phaseWebhook found it: a fallback it just published
	// stays a fallback.
	if !r.applyFailurePolicy(p, wh) {
		return 0, false, nil
	}
	if _, err := r.ensure(ctx, p.op, wh); err != nil {
		return 0, false, err
	}
	log.FromContext(ctx).Info("failurePolicy changed", "configuration", wh.Name, "failurePolicy", publishedPolicy(wh))
	return 0, false, nil
}
