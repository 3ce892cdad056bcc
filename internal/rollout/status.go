package rollout

import (
	"context"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/apply"
	"github.com/hookwright/hookwright/internal/fleet"
)

// FieldManager is the field manager of what the fleet reconciler and the
// rollout write of a SidecarInjector's status: status.fleet,
// status.rollout and the conditions PodsUpToDate, PodsMissingSidecars,
// RolloutBlocked and RolloutNotPermitted. One manager for both, so that a
// write-ahead's inProgress entry the next status write no longer sends is
// removed.
const FieldManager = "hookwright-fleet"

// Status shares a SidecarInjector's status between its writers:
// FieldManager's share, and the rest the lifecycle reconciler's
// (apply.StatusManager). Each applies only its share, so neither merges
// the other's conditions.
var Status = apply.StatusSplit{Parts: []apply.StatusPart{{
	Manager: FieldManager,
	Fields:  []string{"fleet", "rollout"},
	Conditions: []string{v1alpha1.ConditionPodsUpToDate, v1alpha1.ConditionPodsMissingSidecars,
		v1alpha1.ConditionRolloutBlocked, v1alpha1.ConditionRolloutNotPermitted},
}}}

// Reasons of the rollout conditions, and its Events.
const (
	ReasonRolloutProgressing = "Progressing"
	ReasonRolloutComplete    = "Complete"
	ReasonRolloutPaused      = "Paused"
	ReasonDisruptionBudget   = "DisruptionBudget"
	ReasonWebhookNotReady    = "WebhookNotReady"
	ReasonRestartIneffective = "RestartIneffective"
	ReasonMissingRights      = "MissingRights"
	ReasonPermitted          = "Permitted"
	EventRolloutBatch        = "RolloutBatch"
	EventRolloutBlocked      = "RolloutBlocked"
	// EventResizeUnavailable: the server has no pods/resize, so a
	// resources change of strategy InPlace needs a restart.
	EventResizeUnavailable = "ResizeUnavailable"
)

var (
	rolloutActions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hookwright_sidecar_rollout_actions_total",
		Help: "Rollout actions on running pods by SidecarInjector, action (image, resize, restart) and result (ok, error, interrupted: the operator stopped during the write, which may have landed).",
	}, []string{"name", "action", "result"})
	rolloutPods = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "hookwright_sidecar_rollout_pods",
		Help: "Pods of a SidecarInjector's rollout by state (total, updated, unavailable, partitioned), as in its status.rollout.",
	}, []string{"name", "state"})
	rolloutBlocked = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "hookwright_sidecar_rollout_blocked",
		Help: "1 while a SidecarInjector's rollout is blocked (condition RolloutBlocked True), else 0.",
	}, []string{"name"})
)

func init() { metrics.Registry.MustRegister(rolloutActions, rolloutPods, rolloutBlocked) }

// failedResult is the result label of an action whose write failed:
// "interrupted" when the step's own context ended first (the operator
// stopping or losing its lease), since the write may then have reached
// the API server and the next leader resumes from the write-ahead record;
// "error" when the API server refused or could not be reached.
func failedResult(ctx context.Context) string {
	if ctx.Err() != nil {
		return "interrupted"
	}
	return "error"
}

// blockedReason is the reason of cr's RolloutBlocked condition when True.
func blockedReason(cr *v1alpha1.SidecarInjector) string {
	if c := apimeta.FindStatusCondition(cr.Status.Conditions, v1alpha1.ConditionRolloutBlocked); c != nil && c.Status == metav1.ConditionTrue {
		return c.Reason
	}
	return fleet.StopReadyTimeout
}

// finish fills status.rollout from the step and its batch.
func (s *step) finish(b fleet.Batch, updated int) {
	s.st.Total, s.st.Updated = int32(b.Total), int32(min(updated, b.Total))
	s.st.Unavailable, s.st.Partitioned, s.st.Namespace = int32(s.unavailable), int32(b.Partitioned), b.Namespace
	s.st.InProgress = inProgressList(s.inProgress)
	s.st.Changed = fleet.Capped(s.changed, 20)
	s.st.Skipped = s.skips.List()
	if s.blocked.reason != "" && s.st.Blocked == "" {
		s.st.Blocked = s.blocked.msg
	}
}

// conditions sets RolloutBlocked and RolloutNotPermitted, with a Warning
// Event when the rollout becomes blocked.
func (r *Roller) conditions(s *step) {
	cr := s.cr
	c := metav1.Condition{Type: v1alpha1.ConditionRolloutBlocked, ObservedGeneration: cr.Generation}
	switch {
	case s.blocked.reason != "":
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, s.blocked.reason, s.blocked.msg
		if len(s.changed) > 0 && (s.blocked.reason == fleet.StopImagePull || s.blocked.reason == fleet.StopReadyTimeout) {
			c.Message += "; changed in place so far: " + strings.Join(fleet.Capped(s.changed, 5), ", ")
		}
	case s.spec.Paused:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, ReasonRolloutPaused, "paused: "+fleet.RolloutMessage(s.st)
	case s.st.Updated >= s.st.Total && s.st.Unavailable == 0:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, ReasonRolloutComplete, fleet.RolloutMessage(s.st)
	default:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, ReasonRolloutProgressing, fleet.RolloutMessage(s.st)
	}
	old := apimeta.FindStatusCondition(cr.Status.Conditions, v1alpha1.ConditionRolloutBlocked)
	if c.Status == metav1.ConditionTrue && (old == nil || old.Status != metav1.ConditionTrue || old.Message != c.Message) {
		r.recorder.Eventf(cr, nil, corev1.EventTypeWarning, EventRolloutBlocked, "Rollout", "%s", c.Message)
	}
	apimeta.SetStatusCondition(&cr.Status.Conditions, c)
	np := metav1.Condition{Type: v1alpha1.ConditionRolloutNotPermitted, ObservedGeneration: cr.Generation,
		Status: metav1.ConditionFalse, Reason: ReasonPermitted, Message: "the operator holds the rollout's rights where it acted"}
	if s.denied != "" {
		np.Status, np.Reason, np.Message = metav1.ConditionTrue, ReasonMissingRights, "missing "+s.denied
	}
	apimeta.SetStatusCondition(&cr.Status.Conditions, np)
}

// clearStatus removes the rollout's status, conditions and metrics of a
// CR without a rollout strategy.
func clearStatus(cr *v1alpha1.SidecarInjector) {
	cr.Status.Rollout = nil
	apimeta.RemoveStatusCondition(&cr.Status.Conditions, v1alpha1.ConditionRolloutBlocked)
	apimeta.RemoveStatusCondition(&cr.Status.Conditions, v1alpha1.ConditionRolloutNotPermitted)
	rolloutPods.DeletePartialMatch(prometheus.Labels{"name": cr.Name})
	rolloutBlocked.DeletePartialMatch(prometheus.Labels{"name": cr.Name})
}

// record sets the step's gauges.
func record(s *step, b fleet.Batch) {
	for state, n := range map[string]int32{"total": s.st.Total, "updated": s.st.Updated, "unavailable": s.st.Unavailable, "partitioned": int32(b.Partitioned)} {
		rolloutPods.WithLabelValues(s.cr.Name, state).Set(float64(n))
	}
	v := 0.0
	if s.blocked.reason != "" {
		v = 1
	}
	rolloutBlocked.WithLabelValues(s.cr.Name).Set(v)
}

// batchEvent tells in one Normal Event what the step changed.
func (r *Roller) batchEvent(s *step) {
	var parts []string
	if len(s.imaged) > 0 {
		parts = append(parts, "new images in place: "+strings.Join(s.imaged, ", "))
	}
	if len(s.resized) > 0 {
		parts = append(parts, "resized in place: "+strings.Join(s.resized, ", "))
	}
	if len(s.restartedNow) > 0 {
		parts = append(parts, "restarted: "+strings.Join(s.restartedNow, ", "))
	}
	if len(parts) > 0 {
		r.recorder.Eventf(s.cr, nil, corev1.EventTypeNormal, EventRolloutBatch, "Rollout",
			"revision %s: %s", s.rev, strings.Join(parts, "; "))
	}
}

// inProgressList is status.rollout.inProgress: every owner (the record a
// new leader resumes from), then pods, at most 100.
func inProgressList(all []string) []string {
	var owners, pods []string
	for _, e := range all {
		if isOwnerEntry(e) {
			owners = appendOnce(owners, e)
		} else {
			pods = appendOnce(pods, e)
		}
	}
	out := append(owners, pods...)
	return out[:min(len(out), 100)]
}

// ownersOf are the owners' entries of inProgress.
func ownersOf(inProgress []string) []string {
	var owners []string
	for _, e := range inProgress {
		if isOwnerEntry(e) {
			owners = append(owners, e)
		}
	}
	return owners
}
