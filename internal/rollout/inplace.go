package rollout

import (
	"context"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/fleet"
	"github.com/hookwright/hookwright/internal/requeue"
)

// Pods changed in place carry their record (the rollout annotation,
// fleet.ParseRecord) until they are done: it is what counts them in
// flight, whichever operator changed them.

// changeInPlace changes pod as plan says (acts: new images, a resize),
// once its PodDisruptionBudgets allow. An API server refusing a change
// it cannot make (Invalid) falls back to a restart when allowed.
func (r *Roller) changeInPlace(ctx context.Context, s *step, pod *corev1.Pod, key string, plan fleet.Plan, acts []fleet.Action) {
	if !r.budgetAllows(ctx, s, pod, "pod "+key) {
		return
	}
	p, err := fleet.BuildInPlace(pod, plan, s.rev, r.now())
	if err != nil {
		s.skips.Add(err.Error(), key)
		return
	}
	if err := r.applyInPlace(ctx, pod, p); err != nil {
		log.FromContext(ctx).Error(err, "in-place change", "pod", key)
		rolloutActions.WithLabelValues(s.cr.Name, string(acts[0]), failedResult(ctx)).Inc()
		if s.spec.FallbackToRestart && apierrors.IsInvalid(err) {
			if r.restart(ctx, s, pod, key) {
				s.budget--
			}
			return
		}
		s.skips.Add("the API server refused the in-place change: "+apiMessage(err), key)
		return
	}
	for _, a := range acts {
		rolloutActions.WithLabelValues(s.cr.Name, string(a), "ok").Inc()
	}
	if slices.Contains(acts, fleet.ActImage) {
		s.imaged = append(s.imaged, key)
	} else {
		s.resized = append(s.resized, key)
	}
	s.changed = append(s.changed, key)
	s.podInFlight(key, pod.Namespace)
	s.acted++
	s.budget--
}

// applyInPlace records the change on the pod and makes it: one pod patch
// for images (with the record), then the resize subresource for resources
// (after a metadata patch with the record when no image changed).
func (r *Roller) applyInPlace(ctx context.Context, pod *corev1.Pod, p fleet.InPlacePatch) error {
	first := p.Pod
	if first == nil {
		first = p.RecordPatch
	}
	if err := r.client.Patch(ctx, pod, client.RawPatch(types.StrategicMergePatchType, first)); err != nil {
		return err
	}
	if p.Resize != nil {
		if err := r.client.SubResource("resize").Patch(ctx, pod, client.RawPatch(types.StrategicMergePatchType, p.Resize)); err != nil {
			return err
		}
	}
	return nil
}

// checkInFlight judges one pod changed in place for s.rev; it reports
// whether the pod is done (then its rollout record is removed).
func (r *Roller) checkInFlight(ctx context.Context, s *step, cached *corev1.Pod, now time.Time) bool {
	key := cached.Namespace + "/" + cached.Name
	pod := &corev1.Pod{}
	if err := r.reader.Get(ctx, client.ObjectKeyFromObject(cached), pod); err != nil {
		// Gone or unreadable: count it unavailable until the cache says.
		s.podInFlight(key, cached.Namespace)
		return false
	}
	rec, ok := fleet.ParseRecord(pod)
	if !ok || rec.Revision != s.rev {
		return true
	}
	pr := r.progress(ctx, s, pod, rec, now)
	if pr.Done {
		patch := []byte(`{"metadata":{"annotations":{"` + v1alpha1.SidecarRolloutKey + `":null}}}`)
		if err := r.client.Patch(ctx, pod, client.RawPatch(types.MergePatchType, patch)); err != nil && !apierrors.IsNotFound(err) {
			log.FromContext(ctx).Error(err, "remove the rollout record", "pod", key)
		}
		return true
	}
	s.podInFlight(key, pod.Namespace)
	s.wake = requeue.Sooner(s.wake, pr.Wait)
	// Its record says it was changed, whether or not the status write of
	// the step that changed it went through.
	s.changed = appendOnce(s.changed, key)
	if pr.Stop != "" && s.blocked.reason == "" {
		s.block(pr.Stop, pr.Message)
		s.st.Blocked, s.st.BlockedGeneration = pr.Message, s.cr.Generation
	}
	return false
}

// progress is how far pod's in-place change has come (fleet.InPlaceProgress).
func (r *Roller) progress(ctx context.Context, s *step, pod *corev1.Pod, rec fleet.Record, now time.Time) fleet.Progress {
	pr := fleet.InPlaceProgress(pod, rec, now, time.Duration(*s.spec.ReadyTimeoutSeconds)*time.Second)
	if pr.Done || pr.Stop == fleet.StopImagePull {
		return pr
	}
	// A native sidecar whose old process exited 0 shows no pull error in
	// its status: the kubelet's Events have it. Without the right to list
	// them the ready timeout still stops the rollout.
	var evs corev1.EventList
	if err := r.reader.List(ctx, &evs, client.InNamespace(pod.Namespace), client.MatchingFields{"involvedObject.uid": string(pod.UID)}); err == nil {
		if ep := fleet.PullFailureFromEvents(pod, rec, evs.Items); ep.Stop != "" {
			return ep
		}
	}
	return pr
}

// resizeUnavailable is why the API server cannot resize a pod in place
// (fleet.ResizeServed), "" when it can or while discovery fails (the
// resize call then reports the error). Asked until discovery answers once.
func (r *Roller) resizeUnavailable() string {
	if r.resources == nil {
		return ""
	}
	return r.memo.resize(func() (string, bool) {
		list, err := r.resources.ServerResourcesForGroupVersion("v1")
		if err != nil {
			return "", false
		}
		_, why := fleet.ResizeServed(list.APIResources)
		return why, true
	})
}

// warnNoResize tells the CR once, in a Warning Event, that its resources
// changes need a new pod on this server.
func (r *Roller) warnNoResize(s *step, why string) {
	if r.memo.firstResizeWarning(s.cr.Name) {
		r.recorder.Eventf(s.cr, nil, corev1.EventTypeWarning, EventResizeUnavailable, "Rollout",
			"revision %s: resources change only in a new pod (fallbackToRestart restarts the owner, else the pod is skipped): %s", s.rev, why)
	}
}
