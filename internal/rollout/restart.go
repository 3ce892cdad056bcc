package rollout

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/fleet"
)

// restartRetry is how long after an ineffective restart (its new pods
// lack the sidecars) the owner is restarted again when the operator saw
// no outage end since.
const restartRetry = 5 * time.Minute

// maxOwnersInFlight bounds the owners restarting at once: they are the
// record (status.rollout.inProgress) a new leader resumes from.
const maxOwnersInFlight = 50

// discoverEvery is how often the owners of every namespace with pods to
// roll are listed, besides the first step of each revision.
const discoverEvery = 10 * time.Minute

// restart restarts the owner of pod for s.rev unless it was already:
// true when it counts against the budget (a restart started now, or one
// for this revision still rolling that this step had not counted). The
// owner's pods' PodDisruptionBudgets are checked first.
func (r *Roller) restart(ctx context.Context, s *step, pod *corev1.Pod, key string) bool {
	o, why := r.owner(ctx, pod)
	if why != "" {
		s.skips.Add(why, key)
		return false
	}
	id := o.String()
	if slices.Contains(s.restarted, id) {
		return false
	}
	w, ok := workloadOf(o.Kind)
	if !ok {
		s.skips.Add(fleet.SkipOwnerKind+" ("+o.Kind+")", key)
		return false
	}
	obj := w.new()
	if err := r.reader.Get(ctx, types.NamespacedName{Namespace: o.Namespace, Name: o.Name}, obj); err != nil {
		s.skips.Add("its owner cannot be read: "+apiMessage(err), key)
		return false
	}
	if obj.GetAnnotations()[v1alpha1.SidecarRestartedForKey] == s.rev {
		if done, u := fleet.OwnerProgress(obj); !done {
			s.ownerInFlight(id, o.Namespace, u)
			return true
		}
		if r.ineffective(s, w.restartedAt(obj), id, key) {
			return false
		}
	}
	if len(s.restarted) >= maxOwnersInFlight || !r.budgetAllows(ctx, s, pod, id) {
		return false
	}
	if why := webhookDown(s.cr); why != "" {
		s.block(ReasonWebhookNotReady, why+": a restarted pod would miss its sidecars; "+id+" waits")
		return false
	}
	// Write ahead: the owner is in status.rollout.inProgress before it
	// restarts, so an operator that dies right after the restart leaves
	// the record its successor counts against maxUnavailable.
	if err := r.writeAhead(ctx, s, id); err != nil {
		s.skips.Add("status.rollout could not record the restart first: "+apiMessage(err), key)
		return false
	}
	if err := r.client.Patch(ctx, obj, client.RawPatch(types.MergePatchType, fleet.RestartPatch(s.rev, r.now()))); err != nil {
		rolloutActions.WithLabelValues(s.cr.Name, string(fleet.ActRestart), failedResult(ctx)).Inc()
		s.skips.Add("the owner restart failed: "+apiMessage(err), key)
		return false
	}
	rolloutActions.WithLabelValues(s.cr.Name, string(fleet.ActRestart), "ok").Inc()
	s.ownerInFlight(id, o.Namespace, 1)
	s.restartedNow = append(s.restartedNow, id)
	s.acted++
	return true
}

// ineffective tells whether an owner restarted for s.rev at at, rolled
// out, still has pod key without the revision: its new pods were created
// without the webhook. Once the webhook has become reachable after that
// restart it is restarted once more; until then (or restartRetry) the
// rollout stops, as more restarts would make more such pods.
func (r *Roller) ineffective(s *step, at time.Time, id, key string) bool {
	up := apimeta.FindStatusCondition(s.cr.Status.Conditions, v1alpha1.ConditionWebhookReachable)
	back := up != nil && up.Status == metav1.ConditionTrue && up.LastTransitionTime.After(at)
	if back || r.now().Sub(at) >= restartRetry {
		return false
	}
	s.block(ReasonRestartIneffective, fmt.Sprintf("%s was restarted for revision %s at %s and pod %s still lacks it: its pods were created without the webhook (check WebhookReachable); it is restarted again once the webhook is reachable again, or %s after the restart",
		id, s.rev, at.UTC().Format(time.RFC3339), key, restartRetry))
	return true
}

// writeAhead adds id to the CR's status.rollout.inProgress on the API
// server: an apply of the fleet's share of the status (Status) as the
// step read it, or as the step's last write-ahead left it, with id added
// (and a rollout status for the revision when there is none yet). The
// CR's new resourceVersion is kept for the step's own status write.
func (r *Roller) writeAhead(ctx context.Context, s *step, id string) error {
	base := s.cr
	if s.written != nil {
		base = s.written
	}
	want := base.DeepCopy()
	ro := &v1alpha1.RolloutStatus{Revision: s.rev, Strategy: s.spec.Strategy}
	if base.Status.Rollout != nil {
		ro = base.Status.Rollout.DeepCopy()
	}
	ro.InProgress = inProgressList(append(slices.Clone(s.inProgress), id))
	want.Status.Rollout = ro
	if err := Status.ApplyStatus(ctx, r.client, r.reader, base, want, FieldManager); err != nil {
		return err
	}
	s.written = want
	s.resourceVersion = want.ResourceVersion
	return nil
}

// checkOwners counts the owners restarted for s.rev that are still
// rolling, from last: the previous status.rollout.inProgress, the last
// step's owners and the discovered ones.
func (r *Roller) checkOwners(ctx context.Context, s *step, last []string) {
	for _, e := range last {
		w, key, ok := ownerEntry(e)
		if !ok {
			continue
		}
		obj := w.new()
		if err := r.reader.Get(ctx, key, obj); err != nil {
			continue
		}
		if obj.GetAnnotations()[v1alpha1.SidecarRestartedForKey] != s.rev {
			continue
		}
		if done, u := fleet.OwnerProgress(obj); !done {
			s.ownerInFlight(e, key.Namespace, u)
		}
	}
}

// discover lists, at the first step of a revision after the operator
// starts and every discoverEvery, the owners (workloads) of the namespaces
// with pods to roll, and returns those restarted for this revision:
// owners restarted by an operator that left no record of it (an older
// version, a status that was reset) count against maxUnavailable too. A
// namespace where listing fails is left to the record.
func (r *Roller) discover(ctx context.Context, s *step, pending []fleet.Candidate) []string {
	key := s.cr.Name + "/" + s.rev
	if r.memo.discoveredSince(key, r.now(), discoverEvery) {
		return nil
	}
	var nss []string
	for _, c := range pending {
		nss = appendOnce(nss, c.Namespace)
	}
	var out []string
	for _, ns := range nss {
		for _, w := range workloads {
			l := w.newList()
			if err := r.reader.List(ctx, l, client.InNamespace(ns)); err != nil {
				continue
			}
			_ = apimeta.EachListItem(l, func(o runtime.Object) error {
				if obj := o.(client.Object); obj.GetAnnotations()[v1alpha1.SidecarRestartedForKey] == s.rev {
					out = append(out, w.kind+"/"+ns+"/"+obj.GetName())
				}
				return nil
			})
		}
	}
	r.memo.setDiscovered(key, r.now())
	return out
}
