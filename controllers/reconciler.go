package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/apply"
	"github.com/hookwright/hookwright/internal/certsource"
	"github.com/hookwright/hookwright/internal/desired"
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
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch;update
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch;update

// Event reasons.
const (
	EventCreated           = "Created"
	EventUpdated           = "Updated"
	EventDriftRepaired     = "DriftRepaired"
	EventDeleted           = "Deleted"
	EventConflictingWriter = "ConflictingWriter"
)

// Condition reasons besides the certificate ones.
const (
	ReasonConfigured    = "Configured"
	ReasonApplyFailed   = "ApplyFailed"
	ReasonNoCertificate = "NoCertificate"
	ReasonAvailable     = "MinimumReplicasAvailable"
	ReasonUnavailable   = "NoReplicasAvailable"
	ReasonNoDeployment  = "DeploymentMissing"
	ReasonReady         = "Ready"
	ReasonNotReady      = "NotReady"
	ReasonConflicting   = "ConflictingWriter"
	ReasonPaused        = "ReconcilePaused"
)

// PauseReconcileAnnotation set to "true" on a CR stops the operator from
// changing anything it owns until the annotation is removed, like the pause
// predicate of operator-framework/operator-lib.
const PauseReconcileAnnotation = "admission.hookwright.io/pause-reconcile"

// Reconciler is the lifecycle reconciler of one CR kind: it turns each CR
// into a ServiceAccount, RBAC, a Deployment, a PodDisruptionBudget, a
// Service, a serving certificate Secret and a MutatingWebhookConfiguration,
// all owned by the CR and written with server-side apply only when they
// differ from what is desired. Build it with NewSidecarReconciler or
// NewOversellReconciler.
type Reconciler struct {
	Client    client.Client
	APIReader client.Reader
	Scheme    *runtime.Scheme
	Recorder  events.EventRecorder
	Settings  Settings
	Kind      desired.Kind
	// Now is the clock for certificate decisions; nil means time.Now.
	Now func() time.Time

	newObject func() client.Object
	newList   func() client.ObjectList
	operand   func(client.Object) desired.CR
	build     func(client.Object, desired.Settings) *desired.Desired
	// finalize runs for a CR being deleted; done releases the finalizer.
	finalizer string
	finalize  func(ctx context.Context, obj client.Object) (done bool, retry time.Duration, err error)
	// afterApply runs after the owned objects are in place (NodeOversell:
	// node status and resync); it may set status fields and conditions.
	afterApply func(ctx context.Context, obj client.Object) (time.Duration, error)

	mu      sync.Mutex
	repairs map[string][]time.Time // recent repair times by CR and object
	// applied is the hash of what was last applied per CR and object: a
	// write of something else is the operator's own change (a CA rotation
	// step, a ca-dir update, a spec edit), not a repair of drift.
	applied map[string][sha256.Size]byte
	// wrote is the resourceVersion change of the last write per CR and
	// object: a cached object still at the "from" version is the cache
	// lagging behind that write, not new drift, and must neither be
	// written again nor spend the repair budget.
	wrote map[string]rvChange
	// shared is common to the reconcilers of one manager.
	shared *shared
	// sources are the certificate modes.
	sources certsource.Sources
	// cmWatch adds the watch on owned cert-manager Certificates once their
	// CRD is served.
	cmWatch *certManagerWatch
	// fetchConfigz reads a server pod's /configz (ConfigLoaded); nil
	// leaves ConfigLoaded unset.
	fetchConfigz ConfigzFetcher
	// watchNodes re-reconciles every CR when a node's labels or oversell
	// annotations (applied-by, raw-allocatable, ratios) change (NodeOversell).
	watchNodes bool
}

// rvChange is the resourceVersion before and after one write.
type rvChange struct{ from, to string }

// shared is what the reconcilers of one manager have in common.
type shared struct {
	caDir *caDir // nil without Settings.CADir
	// userSecrets caches the metadata of every Secret (see usersecrets.go);
	// nil when not set up.
	userSecrets cache.Cache
	// upgrade holds OLM upgrades during a CA rotation or a node restore
	// (nil: not set up, does nothing).
	upgrade *UpgradeGate
}

func newReconciler(mgr ctrl.Manager, s Settings, k desired.Kind) *Reconciler {
	r := &Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(),
		Recorder: mgr.GetEventRecorder("hookwright-" + k.Short), Settings: s, Kind: k,
		shared: &shared{},
	}
	r.Settings.CSR = csrSettings(mgr, s.CSR)
	r.sources = certsource.New(r.certEnv())
	if cs, err := kubernetes.NewForConfigAndClient(mgr.GetConfig(), mgr.GetHTTPClient()); err == nil {
		r.fetchConfigz = PodsProxyFetcher(cs)
	} else {
		mgr.GetLogger().Error(err, "no pods proxy client: ConfigLoaded is not reported")
	}
	return r
}

// certEnv is what the certificate sources of r use.
func (r *Reconciler) certEnv() certsource.Env {
	return certsource.Env{
		Client: r.Client, APIReader: r.APIReader, Recorder: r.Recorder,
		Settings: r.Settings.Settings, Certificates: r.Settings.Certificates,
		Extra:            func() []byte { return r.shared.caDir.Bundle() },
		WatchCertManager: func() error { return r.cmWatch.ensure() },
		CSR:              r.Settings.CSR,
	}
}

// NewSidecarReconciler reconciles SidecarInjector objects.
func NewSidecarReconciler(mgr ctrl.Manager, s Settings) *Reconciler {
	r := newReconciler(mgr, s, desired.SidecarKind)
	r.newObject = func() client.Object { return &v1alpha1.SidecarInjector{} }
	r.newList = func() client.ObjectList { return &v1alpha1.SidecarInjectorList{} }
	r.operand = func(o client.Object) desired.CR { return desired.SidecarCR(o.(*v1alpha1.SidecarInjector)) }
	r.build = func(o client.Object, s desired.Settings) *desired.Desired {
		return desired.BuildSidecarInjector(o.(*v1alpha1.SidecarInjector), s)
	}
	return r
}

// Setup registers both reconcilers with mgr. The manager's cache must be
// built with CacheOptions so that owned objects are watched by label.
func Setup(mgr ctrl.Manager, s Settings) error {
	if s.Namespace == "" || s.Image == "" {
		return errors.New("controllers: operator namespace and server image are required")
	}
	sh := &shared{}
	if s.CADir != "" {
		d, err := newCADir(s.CADir, mgr.GetLogger())
		if err != nil {
			return err
		}
		if err := mgr.Add(d); err != nil {
			return err
		}
		sh.caDir = d
	}
	us, err := newUserSecretCache(mgr, append([]string{s.Namespace}, s.ServerPolicy().Namespaces...))
	if err != nil {
		return err
	}
	if err := mgr.Add(us); err != nil {
		return err
	}
	sh.userSecrets = us
	// The OperatorCondition is one object: read it uncached.
	oc, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return err
	}
	sh.upgrade = NewUpgradeGate(oc, s.Namespace, mgr.GetLogger())
	if err := mgr.Add(sh.upgrade); err != nil {
		return err
	}
	for _, r := range []*Reconciler{NewSidecarReconciler(mgr, s), NewOversellReconciler(mgr, s)} {
		r.shared = sh
		if err := r.SetupWithManager(mgr); err != nil {
			return err
		}
	}
	ca := &certsource.CAReconciler{
		Env: certsource.Env{
			Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("hookwright-ca"),
			Settings: s.Settings, Certificates: s.Certificates,
			Extra: func() []byte { return sh.caDir.Bundle() },
		},
		// The CSR signer signs with it too, with or without SelfSigned CRs.
		Always: s.Webhook.Service != "" || s.CSR.OwnSigner != "",
		Rotating: func(ctx context.Context, rotating bool, why string) {
			if rotating {
				holdUpgrade(ctx, sh, caRotationHold, why)
			} else {
				releaseUpgrade(ctx, sh, caRotationHold)
			}
		},
	}
	if err := ca.SetupWithManager(mgr); err != nil {
		return err
	}
	if s.Webhook.Service != "" {
		if s.Webhook.Certs != nil {
			s.Webhook.Certs.SetReader(mgr.GetClient())
		}
		v := &ValidationReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(), Settings: s, shared: sh}
		if err := v.setup(mgr); err != nil {
			return err
		}
	}
	return nil
}

// ownedTypes are watched by every reconciler (Owns: events map to the
// controlling CR through its ownerReference).
func ownedTypes() []client.Object {
	return []client.Object{
		&corev1.ServiceAccount{}, &rbacv1.ClusterRole{}, &rbacv1.ClusterRoleBinding{},
		&appsv1.Deployment{}, &policyv1.PodDisruptionBudget{}, &corev1.Service{}, &corev1.Secret{},
		&admissionregistrationv1.MutatingWebhookConfiguration{},
	}
}

// CacheOptions restrict the manager's cache for the owned types (and
// Secrets) to objects labelled app.kubernetes.io/managed-by=hookwright, so
// the operator does not hold every Deployment, Service or Secret of the
// cluster in memory. Objects it does not label (a user's serving Secret) are
// read with the API reader. With namespaces (the operator's and the allowed
// server namespaces) every namespaced type, cert-manager's included, is
// listed and watched only there: the operator's RBAC for namespaced objects
// is namespaced too (a cluster-wide watch would be forbidden). None: every
// namespace.
func CacheOptions(namespaces ...string) cache.Options {
	sel := labels.SelectorFromSet(labels.Set{desired.LabelManagedBy: desired.ManagedByValue})
	by := map[client.Object]cache.ByObject{}
	for _, o := range ownedTypes() {
		by[o] = cache.ByObject{Label: sel}
	}
	by[&corev1.Node{}] = cache.ByObject{Transform: slimNode}
	by[&admissionregistrationv1.ValidatingWebhookConfiguration{}] = cache.ByObject{Label: sel}
	// The servers' EndpointSlices carry their Service's labels (the
	// EndpointSlice controller copies them): watched for foreign endpoints.
	by[&discoveryv1.EndpointSlice{}] = cache.ByObject{Label: sel}
	// cert-manager's Certificates and Issuers are not listed: a ByObject
	// entry needs their CRDs at start. Their informers start (unfiltered)
	// only when a CertManager-mode CR is reconciled with cert-manager present.
	return cache.Options{ByObject: by, DefaultNamespaces: namespaceConfigs(namespaces)}
}

// namespaceConfigs is a cache's DefaultNamespaces for namespaces (nil: all).
func namespaceConfigs(namespaces []string) map[string]cache.Config {
	if len(namespaces) == 0 {
		return nil
	}
	m := map[string]cache.Config{}
	for _, ns := range namespaces {
		m[ns] = cache.Config{}
	}
	return m
}

// slimNode keeps what the NodeOversell reconciler reads of a node (name,
// labels, annotations, capacity and allocatable) and drops the rest (image
// lists, conditions, managedFields) before it enters the cache.
func slimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil // a tombstone or another type: unchanged
	}
	return &corev1.Node{
		TypeMeta: n.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, Generation: n.Generation,
			CreationTimestamp: n.CreationTimestamp, DeletionTimestamp: n.DeletionTimestamp,
			Labels: n.Labels, Annotations: n.Annotations,
		},
		Status: corev1.NodeStatus{Capacity: n.Status.Capacity, Allocatable: n.Status.Allocatable},
	}, nil
}

// SetupWithManager registers the controller: the CR kind, every owned type,
// and the CA Secret (a change re-reconciles every CR of the kind).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	b := ctrl.NewControllerManagedBy(mgr).Named(r.Kind.Short).For(r.newObject())
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
	b = b.Watches(&discoveryv1.EndpointSlice{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		inst := o.GetLabels()[desired.LabelInstance]
		if inst == "" {
			return nil
		}
		var out []reconcile.Request
		for _, req := range r.allRequests(ctx) {
			if r.Kind.BaseName(req.Name) == inst {
				out = append(out, req)
			}
		}
		return out
	}))
	if r.shared != nil && r.shared.caDir != nil {
		b = b.WatchesRawSource(source.Channel(r.shared.caDir.subscribe(), handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
			return r.allRequests(ctx)
		})))
	}
	if r.shared != nil && r.shared.userSecrets != nil {
		b = b.WatchesRawSource(r.userSecretSource(r.shared.userSecrets))
	}
	if r.watchNodes {
		// Slim nodes (CacheOptions), and only label or oversell annotation
		// changes: a kubelet status report must not reconcile anything.
		b = b.Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
			return r.allRequests(ctx)
		}), builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(e event.UpdateEvent) bool {
				if !maps.Equal(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels()) {
					return true
				}
				for _, k := range []string{v1alpha1.OversellAppliedByKey, v1alpha1.OversellRawAllocatableKey, v1alpha1.OversellRatiosKey} {
					if e.ObjectOld.GetAnnotations()[k] != e.ObjectNew.GetAnnotations()[k] {
						return true
					}
				}
				return false
			},
		}))
	}
	c, err := b.Build(r)
	if err != nil {
		return err
	}
	r.cmWatch = &certManagerWatch{ctrl: c, cache: mgr.GetCache(), mapper: mgr.GetRESTMapper(), scheme: mgr.GetScheme(), owner: r.newObject(), started: true}
	return nil
}

// allRequests lists every CR of the reconciler's kind from the cache.
func (r *Reconciler) allRequests(ctx context.Context) []reconcile.Request {
	list := r.newList()
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

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	if c := r.Settings.Certificates.Clock; c != nil {
		return c.Now()
	}
	return time.Now()
}

// Reconcile brings one CR's owned objects and status to the desired state.
// It writes nothing when everything already matches.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (ctrl.Result, error) {
	obj := r.newObject()
	if err := r.Client.Get(ctx, req.NamespacedName, obj); err != nil {
		if apierrors.IsNotFound(err) {
			forgetMetrics(r.Kind.Name, req.Name)
			r.forget(req.Name)
			if r.finalizer != "" {
				releaseUpgrade(ctx, r.shared, restoreHold(req.Name))
			}
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if r.finalizer != "" {
		if !obj.GetDeletionTimestamp().IsZero() {
			return r.reconcileDelete(ctx, obj)
		}
		if !containsString(obj.GetFinalizers(), r.finalizer) {
			// A merge patch of the finalizer list alone; the next event
			// (our own update) continues the reconcile.
			patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
			obj.SetFinalizers(append(obj.GetFinalizers(), r.finalizer))
			if err := r.Client.Patch(ctx, obj, patch); err != nil {
				return ctrl.Result{}, err
			}
		}
	} else if !obj.GetDeletionTimestamp().IsZero() {
		return ctrl.Result{}, nil // the garbage collector removes the owned objects
	}

	orig := obj.DeepCopyObject().(client.Object)
	op := r.operand(obj)
	if obj.GetAnnotations()[PauseReconcileAnnotation] == "true" {
		// Hands off: owned objects are neither repaired nor pruned, so an
		// administrator can edit them (deletion still runs the finalizer).
		r.setCondition(op, v1alpha1.ConditionReady, false, ReasonPaused,
			"reconciliation paused by the "+PauseReconcileAnnotation+" annotation; owned objects are not repaired")
		return ctrl.Result{}, r.writeStatus(ctx, orig, obj)
	}
	if errs := r.Settings.ServerPolicy().Check(op.Server, op.Certificate); len(errs) > 0 {
		// No requeue: only a CR edit (an event) or a restart with other
		// flags changes the verdict.
		rerr := r.refuse(ctx, op, errs)
		return ctrl.Result{}, errors.Join(rerr, r.writeStatus(ctx, orig, obj))
	}
	result, rerr := r.reconcileOperand(ctx, op)
	if rerr == nil && r.afterApply != nil {
		var after time.Duration
		after, rerr = r.afterApply(ctx, obj)
		result.RequeueAfter = minPositive(result.RequeueAfter, after)
	}
	if rerr == nil {
		// Only a generation fully acted on counts as observed (NodeOversell
		// resyncs nodes when it differs).
		*op.ObservedGeneration = obj.GetGeneration()
	}
	if err := r.writeStatus(ctx, orig, obj); err != nil {
		return ctrl.Result{}, errors.Join(rerr, err)
	}
	return result, rerr
}

func (r *Reconciler) reconcileDelete(ctx context.Context, obj client.Object) (ctrl.Result, error) {
	if !containsString(obj.GetFinalizers(), r.finalizer) {
		return ctrl.Result{}, nil
	}
	// OLM must not replace the operator halfway through a restore.
	holdUpgrade(ctx, r.shared, restoreHold(obj.GetName()), fmt.Sprintf("%s %s restoring its nodes", r.Kind.Name, obj.GetName()))
	done, retry, err := r.finalize(ctx, obj)
	if err != nil || !done {
		return ctrl.Result{RequeueAfter: retry}, err
	}
	patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
	obj.SetFinalizers(removeString(obj.GetFinalizers(), r.finalizer))
	if err := r.Client.Patch(ctx, obj, patch); client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, err
	}
	releaseUpgrade(ctx, r.shared, restoreHold(obj.GetName()))
	return ctrl.Result{}, nil
}

// Upgrade holds: one for the installation CA, one per restoring CR.
const caRotationHold = "ca-rotation"

func restoreHold(name string) string { return "restore/" + name }

// holdUpgrade and releaseUpgrade log a failed OperatorCondition write; the
// gate retries it (UpgradeGate.Start) and on the next hold or release.
func holdUpgrade(ctx context.Context, sh *shared, key, why string) {
	if sh == nil {
		return
	}
	if err := sh.upgrade.Hold(ctx, key, why); err != nil {
		log.FromContext(ctx).Error(err, "hold OLM upgrades", "hold", key)
	}
}

func releaseUpgrade(ctx context.Context, sh *shared, key string) {
	if sh == nil {
		return
	}
	if err := sh.upgrade.Release(ctx, key); err != nil {
		log.FromContext(ctx).Error(err, "release OLM upgrades", "hold", key)
	}
}

// writeStatus patches the status subresource only when it changed.
func (r *Reconciler) writeStatus(ctx context.Context, orig, obj client.Object) error {
	if equality.Semantic.DeepEqual(statusOf(orig), statusOf(obj)) {
		return nil
	}
	return client.IgnoreNotFound(r.Client.Status().Patch(ctx, obj, client.MergeFrom(orig)))
}

func statusOf(o client.Object) any {
	switch t := o.(type) {
	case *v1alpha1.SidecarInjector:
		return t.Status
	case *v1alpha1.NodeOversell:
		return t.Status
	}
	return nil
}

func (r *Reconciler) setCondition(op desired.CR, typ string, ok bool, reason, msg string) {
	st := metav1.ConditionFalse
	if ok {
		st = metav1.ConditionTrue
	}
	apimeta.SetStatusCondition(op.Conditions, metav1.Condition{
		Type: typ, Status: st, Reason: reason, Message: msg, ObservedGeneration: op.Object.GetGeneration(),
	})
}

// reconcileOperand applies the owned objects and sets the conditions.
func (r *Reconciler) reconcileOperand(ctx context.Context, op desired.CR) (ctrl.Result, error) {
	var result ctrl.Result
	now := r.now()
	src := r.sources.For(op)
	if src == nil {
		return r.applyFailed(ctx, op, fmt.Errorf("certificate mode %q has no source", desired.CertificateMode(op)))
	}
	cs, err := src.Certificate(ctx, op, func(ctx context.Context, obj client.Object) error {
		_, err := r.ensure(ctx, op, obj)
		return err
	})
	if err != nil {
		if cs.Reason != "" {
			r.setCondition(op, v1alpha1.ConditionCertificateReady, false, cs.Reason, cs.Message)
		}
		return r.applyFailed(ctx, op, err)
	}
	result.RequeueAfter = cs.RequeueAfter
	r.setCondition(op, v1alpha1.ConditionCertificateReady, cs.Ready, cs.Reason, cs.Message)
	recordCertificate(op.Kind.Name, op.Object.GetName(), desired.ServerNamespace(op, r.Settings.Settings), desired.ServingSecretName(op), cs)

	d := r.build(op.Object, r.Settings.Settings)
	var live *admissionregistrationv1.MutatingWebhookConfiguration
	if m := (&admissionregistrationv1.MutatingWebhookConfiguration{}); r.Client.Get(ctx, client.ObjectKeyFromObject(d.Webhook), m) == nil {
		live = m
	}
	published, overlapEnds := certsource.Publish(d.Webhook, live, cs, now, r.Settings.Certificates.Grace())
	result.RequeueAfter = minPositive(result.RequeueAfter, overlapEnds)
	for _, o := range d.Objects() {
		if o == desired.Object(d.Webhook) {
			continue
		}
		if _, err := r.ensure(ctx, op, o); err != nil {
			return r.applyFailed(ctx, op, err)
		}
	}
	keep := cs.Keep
	for _, o := range d.Objects() {
		keep = append(keep, o)
	}
	if err := r.pruneOwned(ctx, op, keep); err != nil {
		return r.applyFailed(ctx, op, err)
	}
	if !published {
		r.setCondition(op, v1alpha1.ConditionWebhookConfigured, false, ReasonNoCertificate,
			"MutatingWebhookConfiguration "+d.Webhook.Name+" is not written until a serving certificate is ready")
	} else {
		if _, err := r.ensure(ctx, op, d.Webhook); err != nil {
			var ce *ConflictError
			if errors.As(err, &ce) {
				r.setCondition(op, v1alpha1.ConditionWebhookConfigured, false, ReasonConflicting, ce.Error())
			}
			return r.applyFailed(ctx, op, err)
		}
		svc := d.Webhook.Webhooks[0].ClientConfig.Service
		r.setCondition(op, v1alpha1.ConditionWebhookConfigured, true, ReasonConfigured, fmt.Sprintf(
			"MutatingWebhookConfiguration %s calls service %s/%s:443%s", d.Webhook.Name, svc.Namespace, svc.Name, *svc.Path))
	}

	r.serverAvailable(ctx, op, d.Deployment)
	if err := r.checkEndpoints(ctx, op, d.Service, d.Deployment); err != nil {
		return r.applyFailed(ctx, op, err)
	}
	if poll := r.configLoaded(ctx, op); poll > 0 {
		result.RequeueAfter = minPositive(result.RequeueAfter, poll)
	}
	r.setReady(op)
	return result, nil
}

// applyFailed records a failed write in Ready. A ConflictError is not an
// error of the reconcile: it becomes a Warning Event and a requeue when the
// repair budget allows the next repair.
func (r *Reconciler) applyFailed(ctx context.Context, op desired.CR, err error) (ctrl.Result, error) {
	var ce *ConflictError
	if errors.As(err, &ce) {
		log.FromContext(ctx).Info("repair budget exhausted; backing off", "object", ce.Object, "writers", ce.Writers, "retryAfter", ce.RetryAfter)
		r.setCondition(op, v1alpha1.ConditionReady, false, ReasonConflicting, ce.Error())
		r.Recorder.Eventf(op.Object, nil, corev1.EventTypeWarning, EventConflictingWriter, "Repair", ce.Error())
		return ctrl.Result{RequeueAfter: ce.RetryAfter}, nil
	}
	r.setCondition(op, v1alpha1.ConditionReady, false, ReasonApplyFailed, err.Error())
	return ctrl.Result{}, err
}

// ConflictError means an owned object drifted again after Max repairs within
// Window: another writer is changing it. Writers lists the other field
// managers from its managedFields, most recent first.
type ConflictError struct {
	Object     string
	Writers    []string
	Repairs    int
	Window     time.Duration
	RetryAfter time.Duration
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("%s was changed again after %d repairs within %s, by %s; not repairing it for %s",
		e.Object, e.Repairs, e.Window, strings.Join(e.Writers, ", "), e.RetryAfter.Round(time.Second))
}

func (r *Reconciler) budget() RepairBudget {
	b := r.Settings.Repairs
	if b.Max <= 0 {
		b.Max = DefaultRepairBudget.Max
	}
	if b.Window <= 0 {
		b.Window = DefaultRepairBudget.Window
	}
	return b
}

// checkBudget returns how long to wait before key may be repaired again
// (0: now), dropping repairs older than the window.
func (r *Reconciler) checkBudget(key string, now time.Time) time.Duration {
	b := r.budget()
	r.mu.Lock()
	defer r.mu.Unlock()
	ts := slices.DeleteFunc(r.repairs[key], func(t time.Time) bool { return now.Sub(t) >= b.Window })
	if len(ts) == 0 {
		delete(r.repairs, key)
	} else {
		r.repairs[key] = ts
	}
	if len(ts) < b.Max {
		return 0
	}
	return max(ts[0].Add(b.Window).Sub(now), time.Second)
}

func (r *Reconciler) recordRepair(key string, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.repairs == nil {
		r.repairs = map[string][]time.Time{}
	}
	r.repairs[key] = append(r.repairs[key], now)
}

// otherWriters names the field managers of obj other than the operator,
// most recent first, e.g. "argocd-controller (Update at 2026-11-29T20:50:01Z)".
func otherWriters(obj client.Object) []string {
	mf := slices.Clone(obj.GetManagedFields())
	slices.SortStableFunc(mf, func(a, b metav1.ManagedFieldsEntry) int {
		var at, bt time.Time
		if a.Time != nil {
			at = a.Time.Time
		}
		if b.Time != nil {
			bt = b.Time.Time
		}
		return bt.Compare(at)
	})
	var out []string
	for _, m := range mf {
		if m.Manager == apply.FieldManager || m.Subresource != "" {
			continue
		}
		w := fmt.Sprintf("%s (%s", m.Manager, m.Operation)
		if m.Time != nil {
			w += " at " + m.Time.UTC().Format(time.RFC3339)
		}
		out = append(out, w+")")
	}
	if len(out) == 0 {
		return []string{"an unknown writer"}
	}
	return out
}

// serverAvailable sets ServerAvailable from the Deployment's availableReplicas
// as the cache last saw it (a Deployment status change re-triggers us).
func (r *Reconciler) serverAvailable(ctx context.Context, op desired.CR, want *appsv1.Deployment) {
	dep := &appsv1.Deployment{}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), dep); err != nil {
		r.setCondition(op, v1alpha1.ConditionServerAvailable, false, ReasonNoDeployment, fmt.Sprintf("Deployment %s/%s: %v", want.Namespace, want.Name, err))
		return
	}
	msg := fmt.Sprintf("Deployment %s/%s: %d of %d replicas available", dep.Namespace, dep.Name, dep.Status.AvailableReplicas, *want.Spec.Replicas)
	if dep.Status.AvailableReplicas > 0 {
		r.setCondition(op, v1alpha1.ConditionServerAvailable, true, ReasonAvailable, msg)
	} else {
		r.setCondition(op, v1alpha1.ConditionServerAvailable, false, ReasonUnavailable, msg)
	}
}

// setReady sets Ready from CertificateReady, WebhookConfigured and
// ServerAvailable, naming the ones that are not True.
func (r *Reconciler) setReady(op desired.CR) {
	var not []string
	for _, t := range []string{v1alpha1.ConditionCertificateReady, v1alpha1.ConditionWebhookConfigured, v1alpha1.ConditionServerAvailable} {
		if !apimeta.IsStatusConditionTrue(*op.Conditions, t) {
			c := apimeta.FindStatusCondition(*op.Conditions, t)
			msg := t + " is not True"
			if c != nil {
				msg = fmt.Sprintf("%s is %s (%s)", t, c.Status, c.Reason)
			}
			not = append(not, msg)
		}
	}
	if len(not) == 0 {
		r.setCondition(op, v1alpha1.ConditionReady, true, ReasonReady, "webhook configured, certificate valid and server available")
		return
	}
	r.setCondition(op, v1alpha1.ConditionReady, false, ReasonNotReady, strings.Join(not, "; "))
}

// ensure server-side applies obj unless the live object (from the cache)
// already holds every field obj sets. It reports whether it wrote.
func (r *Reconciler) ensure(ctx context.Context, op desired.CR, obj client.Object) (bool, error) {
	gvk, err := apiutil.GVKForObject(obj, r.Scheme)
	if err != nil {
		return false, err
	}
	want, err := apply.ToApplyObject(obj, gvk)
	if err != nil {
		return false, err
	}
	liveObj, err := r.Scheme.New(gvk)
	if err != nil {
		return false, err
	}
	live := liveObj.(client.Object)
	created := false
	var drift []string
	switch err := r.Client.Get(ctx, client.ObjectKeyFromObject(obj), live); {
	case apierrors.IsNotFound(err):
		created = true
	case err != nil:
		return false, err
	default:
		if !metav1.IsControlledBy(live, op.Object) && metav1.GetControllerOf(live) != nil {
			return false, fmt.Errorf("%s %s is controlled by %s %s, not by %s %s",
				gvk.Kind, client.ObjectKeyFromObject(obj), metav1.GetControllerOf(live).Kind, metav1.GetControllerOf(live).Name,
				op.Kind.Name, op.Object.GetName())
		}
		liveMap, err := runtime.DefaultUnstructuredConverter.ToUnstructured(live)
		if err != nil {
			return false, err
		}
		if drift = apply.Drift(want.Object, liveMap); len(drift) == 0 {
			return false, nil
		}
	}
	budgetKey := ownedKey(op, gvk.Kind, obj)
	wantJSON, err := json.Marshal(want.Object)
	if err != nil {
		return false, err
	}
	wantHash := sha256.Sum256(wantJSON)
	r.mu.Lock()
	w, wroteBefore := r.wrote[budgetKey]
	last, known := r.applied[budgetKey]
	r.mu.Unlock()
	if wroteBefore {
		switch skip, err := r.behindOrUnchanged(ctx, obj, live, created, w, known && last == wantHash); {
		case err != nil:
			return false, err
		case skip != "":
			log.FromContext(ctx).V(1).Info(skip, "object", gvk.Kind+" "+client.ObjectKeyFromObject(obj).String())
			return false, nil
		}
	}
	fromRV := live.GetResourceVersion()
	now := r.now()
	// Unknown (first write since start) or different from the last apply:
	// the desired state moved, which the repair budget does not limit.
	updated := !created && (!known || last != wantHash)
	if !created && !updated {
		if wait := r.checkBudget(budgetKey, now); wait > 0 {
			repairConflicts.WithLabelValues(op.Kind.Name, gvk.Kind).Inc()
			b := r.budget()
			return false, &ConflictError{
				Object:  gvk.Kind + " " + strings.TrimPrefix(client.ObjectKeyFromObject(obj).String(), "/"),
				Writers: otherWriters(live), Repairs: b.Max, Window: b.Window, RetryAfter: wait,
			}
		}
	}
	if err := r.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(want), client.FieldOwner(apply.FieldManager), client.ForceOwnership); err != nil {
		return false, fmt.Errorf("apply %s %s: %w", gvk.Kind, client.ObjectKeyFromObject(obj), err)
	}
	r.mu.Lock()
	if r.applied == nil {
		r.applied = map[string][sha256.Size]byte{}
	}
	r.applied[budgetKey] = wantHash
	if r.wrote == nil {
		r.wrote = map[string]rvChange{}
	}
	r.wrote[budgetKey] = rvChange{from: fromRV, to: want.GetResourceVersion()}
	r.mu.Unlock()
	name := gvk.Kind + " " + strings.TrimPrefix(client.ObjectKeyFromObject(obj).String(), "/")
	switch {
	case created:
		log.FromContext(ctx).Info("created", "object", name)
		// The owned object is the related object: the events API merges
		// events that differ only in their note into one series.
		r.Recorder.Eventf(op.Object, obj, corev1.EventTypeNormal, EventCreated, "Create", "created %s", name)
	case updated:
		log.FromContext(ctx).Info("updated", "object", name, "fields", drift)
		r.Recorder.Eventf(op.Object, obj, corev1.EventTypeNormal, EventUpdated, "Update", "updated %s: %s", name, summarize(drift, 5))
	default:
		r.recordRepair(budgetKey, now)
		driftRepairs.WithLabelValues(op.Kind.Name, gvk.Kind).Inc()
		log.FromContext(ctx).Info("drift repaired", "object", name, "fields", drift)
		r.Recorder.Eventf(op.Object, obj, corev1.EventTypeNormal, EventDriftRepaired, "Repair", "repaired %s: %s", name, summarize(drift, 5))
	}
	return true, nil
}

// ownedKey identifies one owned object of one CR in the repairs, applied
// and wrote maps: "<CR kind>/<CR name>|<kind>/<namespace>/<name>".
func ownedKey(cr desired.CR, kind string, obj client.Object) string {
	return ownedPrefix(cr.Kind, cr.Object.GetName()) + kind + "/" + client.ObjectKeyFromObject(obj).String()
}

func ownedPrefix(k desired.Kind, crName string) string { return k.Name + "/" + crName + "|" }

// behindOrUnchanged decides, for an owned object that differs from the
// desired state, whether a write would be pointless because the last write
// (w) already covers it. It returns a reason to skip, or "" to write:
//   - the cached object is still at the resourceVersion our last write
//     replaced (w.from, when the write moved it): the cache lags behind
//     that write, whose watch event re-queues the CR;
//   - the object was created by our last write (w.from empty) and the cache
//     does not have it yet: confirmed with one uncached GET, since a
//     configuration deleted by someone else must be recreated;
//   - the cached object is exactly the result of our last write
//     (resourceVersion w.to) of the same desired state (sameDesired): the
//     reported drift is a field the API server normalises, and applying
//     again would be a no-op write (this covers applies that did not move
//     the resourceVersion, where from == to).
//
// None of them is drift, so none spends the repair budget.
func (r *Reconciler) behindOrUnchanged(ctx context.Context, obj, live client.Object, created bool, w rvChange, sameDesired bool) (string, error) {
	switch {
	case created && w.from == "" && w.to != "":
		if r.APIReader == nil {
			return "", nil
		}
		probe := live.DeepCopyObject().(client.Object)
		err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(obj), probe)
		if apierrors.IsNotFound(err) {
			return "", nil // deleted since: create it again
		}
		if err != nil {
			return "", err
		}
		return "cache has not seen the object created by the last write; waiting for its event", nil
	case created:
		return "", nil
	case w.from != "" && w.from != w.to && live.GetResourceVersion() == w.from:
		return "cache behind the last write; waiting for its event", nil
	case sameDesired && w.to != "" && live.GetResourceVersion() == w.to:
		return "object is the result of the last write of the same desired state; drift is server normalisation", nil
	}
	return "", nil
}

// forget drops what the reconciler remembers about the objects of one CR
// (repair times, applied hashes, written resourceVersions): the CR is gone.
func (r *Reconciler) forget(crName string) {
	prefix := ownedPrefix(r.Kind, crName)
	owned := func(k string) bool { return strings.HasPrefix(k, prefix) }
	r.mu.Lock()
	defer r.mu.Unlock()
	maps.DeleteFunc(r.repairs, func(k string, _ []time.Time) bool { return owned(k) })
	maps.DeleteFunc(r.applied, func(k string, _ [sha256.Size]byte) bool { return owned(k) })
	maps.DeleteFunc(r.wrote, func(k string, _ rvChange) bool { return owned(k) })
}

// forgetObject drops what the reconciler remembers about one owned object
// (deleted because it is no longer desired).
func (r *Reconciler) forgetObject(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.repairs, key)
	delete(r.applied, key)
	delete(r.wrote, key)
}

// remembered counts the entries of the repairs, applied and wrote maps
// (tests check that deleted CRs leave none behind).
func (r *Reconciler) remembered() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.repairs) + len(r.applied) + len(r.wrote)
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
func (r *Reconciler) pruneOwned(ctx context.Context, op desired.CR, keep []client.Object) error {
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
			if err := r.deleteOwned(ctx, op, obj); err != nil {
				return err
			}
		}
	}
	return nil
}

// deleteOwned deletes obj if it exists and op controls it.
func (r *Reconciler) deleteOwned(ctx context.Context, op desired.CR, obj client.Object) error {
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !metav1.IsControlledBy(obj, op.Object) {
		return nil
	}
	if err := r.Client.Delete(ctx, obj, client.Preconditions{UID: ptrUID(obj.GetUID())}); err != nil {
		return client.IgnoreNotFound(err)
	}
	gvk, _ := apiutil.GVKForObject(obj, r.Scheme)
	r.forgetObject(ownedKey(op, gvk.Kind, obj))
	r.Recorder.Eventf(op.Object, nil, corev1.EventTypeNormal, EventDeleted, "Delete", "deleted %s %s/%s (no longer desired)", gvk.Kind, obj.GetNamespace(), obj.GetName())
	return nil
}

func ptrUID(u types.UID) *types.UID { return &u }

func summarize(paths []string, n int) string {
	if len(paths) <= n {
		return strings.Join(paths, ", ")
	}
	return strings.Join(paths[:n], ", ") + fmt.Sprintf(" and %d more", len(paths)-n)
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func removeString(list []string, s string) []string {
	out := make([]string, 0, len(list))
	for _, x := range list {
		if x != s {
			out = append(out, x)
		}
	}
	return out
}

func minPositive(a, b time.Duration) time.Duration {
	switch {
	case a <= 0:
		return b
	case b <= 0:
		return a
	}
	return min(a, b)
}
