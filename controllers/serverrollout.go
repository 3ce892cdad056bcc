package controllers

import (
	"context"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/apply"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/health"
)

// serverRolloutRecheck is how soon a held server Deployment looks again:
// the other Deployment's status changes enqueue only its own CR.
const serverRolloutRecheck = 3 * time.Second

// serverRollouts serializes the server Deployment writes of every
// reconciler of one manager. After an operator upgrade the reconcilers of
// both kinds see their templates change within milliseconds of each other,
// before the cache shows either write: the lock makes the check and the
// write one step, and written remembers each template change until the
// cache has caught up with it.
type serverRollouts struct {
	mu sync.Mutex
	// written is the generation each Deployment ("namespace/name") had
	// when its template was last changed here.
	written map[string]int64
}

// ensureServer applies the server Deployment unless health.DecideServerRollout
// holds a template change back while another hookwright server Deployment
// is rolling. It returns how soon to look again (0: applied or nothing to
// do) and keeps ConditionServerRolloutWaiting and its Event in step.
func (r *reconciler) ensureServer(ctx context.Context, op desired.CR, want *appsv1.Deployment) (time.Duration, error) {
	if r.shared == nil {
		_, err := r.ensure(ctx, op, want)
		return 0, err
	}
	sr := &r.shared.rollouts
	sr.mu.Lock()
	defer sr.mu.Unlock()
	self := want.Namespace + "/" + want.Name
	in := health.ServerRolloutInput{Self: self}
	live := &appsv1.Deployment{}
	switch err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), live); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return 0, err
	default:
		in.Exists = true
		changes, err := templateChanges(want, live)
		if err != nil {
			return 0, err
		}
		in.TemplateChanges = changes
	}
	if in.Exists && in.TemplateChanges {
		list := &appsv1.DeploymentList{}
		if err := r.Client.List(ctx, list, client.MatchingLabels{
			desired.LabelManagedBy: desired.ManagedByValue, desired.LabelComponent: "webhook-server",
		}); err != nil {
			return 0, err
		}
		in.Others = list.Items
		for _, d := range list.Items {
			k := d.Namespace + "/" + d.Name
			if g, ok := sr.written[k]; ok && d.Generation > g {
				delete(sr.written, k) // the cache has caught up
			}
		}
		in.Written = sr.written
	}
	dec := health.DecideServerRollout(in)
	if dec.Hold {
		if !apimeta.IsStatusConditionTrue(op.Conditions(), v1alpha1.ConditionServerRolloutWaiting) {
			log.FromContext(ctx).Info("server rollout held", "deployment", self, "rolling", dec.Rolling)
			r.Recorder.Eventf(op.Object, want, corev1.EventTypeNormal, v1alpha1.ServerRolloutReasonWaiting, "Wait", dec.Message)
		}
		r.setCondition(op, v1alpha1.ConditionServerRolloutWaiting, true, v1alpha1.ServerRolloutReasonWaiting, dec.Message)
		return serverRolloutRecheck, nil
	}
	wrote, err := r.ensure(ctx, op, want)
	if err != nil {
		return 0, err
	}
	if wrote && in.TemplateChanges {
		if sr.written == nil {
			sr.written = map[string]int64{}
		}
		sr.written[self] = live.Generation
	}
	apimeta.RemoveStatusCondition(op.Object.StatusConditions(), v1alpha1.ConditionServerRolloutWaiting)
	return 0, nil
}

// templateChanges reports whether applying want would change live's pod
// template (apply.Drift on spec.template), which starts a rollout.
func templateChanges(want, live *appsv1.Deployment) (bool, error) {
	w, err := apply.ToApplyObject(want, appsv1.SchemeGroupVersion.WithKind("Deployment"))
	if err != nil {
		return false, err
	}
	l, err := runtime.DefaultUnstructuredConverter.ToUnstructured(live)
	if err != nil {
		return false, err
	}
	for _, p := range apply.Drift(w.Object, l) {
		if p == "spec.template" || strings.HasPrefix(p, "spec.template.") || strings.HasPrefix(p, "spec.template[") {
			return true, nil
		}
	}
	return false, nil
}
