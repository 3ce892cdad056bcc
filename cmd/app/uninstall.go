package app

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/failopen"
)

// failOpenIfGone runs as the manager exits: when OperatorGone, every
// webhook configuration the operator manages is switched to Ignore
// (failOpenAll). It backs up uninstallWatch, which acts as soon as the
// Deployment is deleted or scaled to zero: by the time the kubelet stops
// this pod, an OLM uninstall has usually removed the operator's RBAC (the
// CSV's Role goes with the Deployment, its ClusterRoleBinding with the
// CSV). A Forbidden answer on its own Deployment therefore counts as gone.
// deployment "" turns this off (out of cluster, tests). Where the
// uninstall deletes the operator's ServiceAccount and bindings with its
// Deployment (Helm, OLM's garbage collection, kubectl delete -k) both may
// be refused: the injector servers, which outlive the operator, switch
// their own configurations (cmd/failopen.go, docs/failsafe.md).
func failOpenIfGone(cfg *rest.Config, namespace, deployment string) {
	if deployment == "" {
		return
	}
	log := ctrl.Log.WithName("uninstall")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		log.Error(err, "client")
		return
	}
	dep, err := cs.AppsV1().Deployments(namespace).Get(ctx, deployment, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		dep = nil
	case apierrors.IsForbidden(err):
		log.Info("may no longer read its own Deployment: its RBAC was removed, an uninstall", "deployment", deployment)
		dep = nil
	case err != nil:
		log.Error(err, "cannot tell whether the operator is uninstalled; webhook configurations left as they are")
		return
	}
	if !failopen.OperatorGone(dep, dep != nil) {
		return
	}
	_ = failOpenAll(ctx, cs) // each failure is logged; nothing is left to try
}

// failOpenAll switches every webhook configuration the operator manages
// (the CRs' mutating ones and its own validating one) to failurePolicy
// Ignore, so CRs left behind (OLM keeps CRDs and CRs on uninstall) never
// block pod creates or CR writes with nobody renewing their certificates.
// Ignore rather than delete: while the servers still run, pods keep
// getting their sidecars, and an operator installed again re-arms Fail
// after its probe (health.DecideFailurePolicy). Configurations already
// Ignore are not written. The patches are internal/failopen's, each switch
// guarded by a test of the webhook's name: a configuration rewritten
// meanwhile refuses the patch (422) and the caller tries again, rather
// than another webhook being switched. It returns nil when every switch
// succeeded, else the errors (each also logged), joined.
func failOpenAll(ctx context.Context, cs kubernetes.Interface) error {
	log := ctrl.Log.WithName("uninstall")
	var errs []error
	fail := func(err error, msg string, kv ...any) {
		log.Error(err, msg, kv...)
		errs = append(errs, err)
	}
	sel := metav1.ListOptions{LabelSelector: desired.LabelManagedBy + "=" + desired.ManagedByValue}
	mwcs, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, sel)
	if err != nil {
		fail(err, "list mutating webhook configurations")
	} else {
		for i := range mwcs.Items {
			m := &mwcs.Items[i]
			patch, names := failopen.MutatingPatch(m)
			if patch == nil {
				continue
			}
			if _, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Patch(ctx, m.Name, types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
				fail(err, "switch to Ignore", "configuration", m.Name)
			} else {
				log.Info("operator uninstalled: switched to failurePolicy Ignore", "configuration", m.Name, "webhooks", names)
			}
		}
	}
	v, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, desired.ValidatingConfigName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		fail(err, "get the validating webhook configuration")
	default:
		if patch, names := failopen.ValidatingPatch(v); patch != nil {
			if _, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Patch(ctx, v.Name, types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
				fail(err, "switch to Ignore", "configuration", v.Name)
			} else {
				log.Info("operator uninstalled: switched to failurePolicy Ignore", "configuration", v.Name, "webhooks", names)
			}
		}
	}
	return errors.Join(errs...)
}

// allForbidden reports whether err holds only Forbidden answers: the
// operator's RBAC is gone, as Helm, OLM and `kubectl delete -k` remove it
// with the Deployment, and trying again cannot help.
func allForbidden(err error) bool {
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		for _, e := range joined.Unwrap() {
			if !apierrors.IsForbidden(e) {
				return false
			}
		}
		return len(joined.Unwrap()) > 0
	}
	return apierrors.IsForbidden(err)
}

// uninstallWatch watches the operator's own Deployment while the manager
// runs, on every replica (not only the leader: leader election stops
// working once an uninstall removes the Lease's RBAC), and runs
// failOpenAll the moment OperatorGone turns true: a delete event, a
// deletionTimestamp, or replicas 0. That is before the kubelet stops this
// pod, and before most of the operator's RBAC is gone (measured by
// test/olm: at exit the Role was already deleted). A Deployment that is
// absent when the watch starts is no uninstall: only a change seen counts.
type uninstallWatch struct {
	cs         kubernetes.Interface
	namespace  string
	deployment string
	// done: every configuration was switched; later events do nothing.
	done atomic.Bool
	// synced: the watch has listed the Deployment (Ready).
	synced atomic.Bool
}

// Ready is the manager's readyz check "uninstall-watch": a replica is not
// ready until its watch has listed the Deployment, because a delete that
// comes before the first list is never seen (an absent Deployment at start
// is no uninstall).
func (w *uninstallWatch) Ready(*http.Request) error {
	if !w.synced.Load() {
		return errors.New("the operator Deployment's watch has not synced")
	}
	return nil
}

// switchRetry is the wait between failed attempts to switch, and
// switchFor how long attempts go on after the operator went: a write
// refused under load or a slow API server gets more than one chance.
const (
	switchRetry = 2 * time.Second
	switchFor   = 2 * time.Minute
)

// NeedLeaderElection is false: every replica watches.
func (w *uninstallWatch) NeedLeaderElection() bool { return false }

// Start runs the watch until ctx ends.
func (w *uninstallWatch) Start(ctx context.Context) error {
	f := informers.NewSharedInformerFactoryWithOptions(w.cs, 0, informers.WithNamespace(w.namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", w.deployment).String()
		}))
	inf := f.Apps().V1().Deployments().Informer()
	check := func(dep *appsv1.Deployment, found bool) {
		if w.done.Load() || !failopen.OperatorGone(dep, found) {
			return
		}
		ctrl.Log.WithName("uninstall").Info("operator Deployment deleted or scaled to zero: switching webhook configurations to Ignore", "deployment", w.deployment)
		// Not ctx: a SIGTERM arriving meanwhile must not cut the switch
		// short. Each attempt has 10 s; failed ones are tried again.
		end := time.Now().Add(switchFor)
		for {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := failOpenAll(sctx, w.cs)
			cancel()
			if err == nil {
				w.done.Store(true)
				return
			}
			// Retrying held the manager's exit for its whole grace period
			// (test/olm, 2026-12-05): the servers' own step acts instead.
			if allForbidden(err) {
				ctrl.Log.WithName("uninstall").Info("refused: the operator's RBAC went with it; each injector server switches its own configurations (--operator-deployment)")
				return
			}
			if time.Now().Add(switchRetry).After(end) {
				ctrl.Log.WithName("uninstall").Info("gave up switching to Ignore; the exit step tries again", "after", switchFor)
				return
			}
			time.Sleep(switchRetry)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if d, ok := o.(*appsv1.Deployment); ok && d.DeletionTimestamp != nil {
				check(d, true)
			}
		},
		UpdateFunc: func(_, o any) {
			if d, ok := o.(*appsv1.Deployment); ok {
				check(d, true)
			}
		},
		DeleteFunc: func(any) { check(nil, false) },
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		w.synced.Store(true)
	}
	<-ctx.Done()
	f.Shutdown()
	return nil
}
