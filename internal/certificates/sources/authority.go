package sources

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/apply"
	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/requeue"
)

// CAReconciler is the installation CA controller: the only writer of the
// CA Secret. It reconciles one key, the CA Secret, and runs the steps of
// the certificate plan that change it (CreateCA, CreateNextCA,
// PromoteNextCA, DropRetiredCA, refreshing its ca.crt) over the state of
// every SelfSigned CR; each CR's reconcile does its own share (publishing
// its configuration, issuing its serving certificate). The two coordinate
// through the API only: a CA Secret change re-reconciles every CR, a
// change of a CR (not of its status: planInputsChanged), a serving Secret
// or a configuration re-reconciles the CA.
type CAReconciler struct {
	Env Env
	// Always creates a missing CA even without SelfSigned CRs (the
	// manager's validating webhook is signed by it).
	Always bool
	// Rotating, when set, is told after each reconcile whether a rotation
	// is in progress, and why (OLM's Upgradeable).
	Rotating func(ctx context.Context, rotating bool, why string)
}

func (c *CAReconciler) key() client.ObjectKey {
	return client.ObjectKey{Namespace: c.Env.Settings.Namespace, Name: desired.CASecretName}
}

// SetupWithManager registers the controller "ca".
func (c *CAReconciler) SetupWithManager(mgr ctrl.Manager) error {
	one := func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: c.key()}}
	}
	b := ctrl.NewControllerManagedBy(mgr).Named("ca")
	// The cache holds only the operator's Secrets and configurations.
	for _, o := range []client.Object{&corev1.Secret{}, &admissionregistrationv1.MutatingWebhookConfiguration{}} {
		b = b.Watches(o, handler.EnqueueRequestsFromMapFunc(one))
	}
	// A CR's status writes (the fleet's, up to one per FleetWriteInterval
	// each) change nothing the plan reads, and each reconcile costs three
	// uncached reads (the CA Secret, the two CRDs).
	for _, o := range []client.Object{&v1alpha1.SidecarInjector{}, &v1alpha1.NodeOversell{}} {
		b = b.Watches(o, handler.EnqueueRequestsFromMapFunc(one), builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(e event.UpdateEvent) bool { return planInputsChanged(e.ObjectOld, e.ObjectNew) },
		}))
	}
	// Once at start: on a fresh installation no event would come.
	b = b.WatchesRawSource(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		q.Add(reconcile.Request{NamespacedName: c.key()})
		return nil
	}))
	return b.Complete(c)
}

// planInputsChanged reports whether an update of a CR changed what the
// CA plan reads of it (gather: its spec, its renew request annotation,
// whether it is being deleted): its generation (spec changes only, with
// the status subresource), annotations, labels, finalizers or deletion.
func planInputsChanged(old, cur client.Object) bool {
	return old.GetGeneration() != cur.GetGeneration() ||
		!maps.Equal(old.GetAnnotations(), cur.GetAnnotations()) ||
		!maps.Equal(old.GetLabels(), cur.GetLabels()) ||
		!slices.Equal(old.GetFinalizers(), cur.GetFinalizers()) ||
		!old.GetDeletionTimestamp().Equal(cur.GetDeletionTimestamp())
}

// Reconcile advances the installation CA and writes the CA Secret when the
// plan changed it.
func (c *CAReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (ctrl.Result, error) {
	out, err := c.advance(ctx)
	return ctrl.Result{RequeueAfter: out.RequeueAfter}, err
}

// advance is Reconcile, returning the planner's outcome.
func (c *CAReconciler) advance(ctx context.Context) (outcome, error) {
	now := c.Env.Certificates.Now()
	g, err := gather(ctx, c.Env, nil, now)
	if err != nil {
		return outcome{}, err
	}
	if len(g.CRs) == 0 && (g.CASecret != nil || !c.Always) {
		c.rotating(ctx, outcome{})
		return outcome{}, nil
	}
	out, err := advance(inputs{Role: installation, State: g.State, Now: now, Settings: c.Env.Certificates})
	if err != nil {
		return out, err
	}
	if !g.DrainingUntil.IsZero() {
		// A retired CA a draining certificate chains to may be dropped then.
		out.RequeueAfter = requeue.Sooner(out.RequeueAfter, max(g.DrainingUntil.Sub(now), time.Second))
	}
	var owners []metav1.OwnerReference
	if c.Env.APIReader != nil {
		if owners, err = InstallationOwners(ctx, c.Env.APIReader); err != nil {
			return out, err
		}
		if len(owners) == 0 && len(g.CRs) == 0 && g.CASecret == nil {
			// The CRDs are absent or being deleted (an uninstall): the CA,
			// deleted with them, must not come back for the manager alone.
			log.FromContext(ctx).Info("CRDs absent or being deleted; the installation CA is not created", "crds", InstallationCRDs)
			c.rotating(ctx, outcome{})
			return outcome{RequeueAfter: 10 * time.Second}, nil
		}
	}
	// A rotate-now request is handled once a next CA is staged (by it, or
	// by a rotation already under way).
	var ann map[string]string
	if tok := rotateToken(g.CASecret); tok != "" {
		data := out.CA
		if data == nil {
			data = g.CASecret.Data
		}
		if pki.ParseCASecret(data, now).Next != nil {
			ann = map[string]string{AnnotationRotateCAHandled: tok}
			if out.CA == nil {
				out.CA = g.CASecret.Data
			}
		}
	}
	if out.CA != nil && (g.CASecret == nil || ann != nil || !maps.EqualFunc(out.CA, g.CASecret.Data, bytes.Equal) || len(MissingOwners(g.CASecret.OwnerReferences, owners)) > 0) {
		sec, err := writeCASecret(ctx, c.Env.Client, c.Env.Settings.Namespace, g.CASecret, out.CA, owners, ann)
		if err != nil {
			return out, err
		}
		for _, st := range out.Steps {
			log.FromContext(ctx).Info("certificate step", "step", st.Kind, "reason", st.Reason, "message", st.Message)
			c.Env.Recorder.Eventf(sec, nil, corev1.EventTypeNormal, EventCARotation, string(st.Kind), "%s (%s): %s", st.Kind, st.Reason, st.Message)
		}
	}
	c.rotating(ctx, out)
	return out, nil
}

func (c *CAReconciler) rotating(ctx context.Context, out outcome) {
	if c.Rotating != nil {
		c.Rotating(ctx, out.Last.Rotating, "CA rotation ("+describeSteps(nil, out.Last)+")")
	}
}

// AnnotationRotateCAHandled on the CA Secret is the last
// v1alpha1.AnnotationRotateCA token the CA controller acted on.
const AnnotationRotateCAHandled = "admission.hookwright.io/rotate-ca-handled"

// writeCASecret creates the CA Secret (cur nil) or patches it to data with
// an optimistic lock, so a concurrent writer (another replica that still
// thinks it leads) makes this reconcile retry instead of one CA
// overwriting another. The Secret is owned by the installation's CRDs
// (owners; see owners.go) and gains the annotations ann. It returns the
// Secret as written.
func writeCASecret(ctx context.Context, c client.Client, namespace string, cur *corev1.Secret, data map[string][]byte, owners []metav1.OwnerReference, ann map[string]string) (*corev1.Secret, error) {
	if cur == nil {
		sec := desired.CASecret(namespace, data)
		sec.OwnerReferences = owners
		if err := c.Create(ctx, sec, client.FieldOwner(apply.FieldManager)); err != nil {
			return nil, fmt.Errorf("create CA Secret %s/%s: %w", namespace, sec.Name, err)
		}
		return sec, nil
	}
	next := cur.DeepCopy()
	next.Data = data
	if len(ann) > 0 && next.Annotations == nil {
		next.Annotations = map[string]string{}
	}
	maps.Copy(next.Annotations, ann)
	if next.Labels == nil {
		next.Labels = map[string]string{}
	}
	next.Labels[desired.LabelManagedBy] = desired.ManagedByValue
	next.OwnerReferences = append(next.OwnerReferences, MissingOwners(next.OwnerReferences, owners)...)
	patch := client.MergeFromWithOptions(cur, client.MergeFromWithOptimisticLock{})
	if err := c.Patch(ctx, next, patch, client.FieldOwner(apply.FieldManager)); err != nil {
		return nil, fmt.Errorf("update CA Secret %s/%s: %w", namespace, cur.Name, err)
	}
	return next, nil
}
