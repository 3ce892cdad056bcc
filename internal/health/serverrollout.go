package health

import (
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// ServerRolloutInput is what decides whether a CR's server Deployment may
// take a new pod template now.
type ServerRolloutInput struct {
	// Self is the CR's server Deployment as "namespace/name".
	Self string
	// Exists: the Deployment is in the cache. A CR's first server is
	// never held.
	Exists bool
	// TemplateChanges: applying the desired Deployment would change its
	// pod template (spec.template), which starts a rollout.
	TemplateChanges bool
	// Others are the hookwright server Deployments in the cache (Self among
	// them is skipped).
	Others []appsv1.Deployment
	// Written maps "namespace/name" to the generation a Deployment had when
	// this operator last changed its template: a cached copy at or below it
	// lags behind that write and counts as rolling.
	Written map[string]int64
}

// ServerRolloutDecision says whether to hold the change and why.
type ServerRolloutDecision struct {
	// Hold: do not apply the Deployment now; look again later.
	Hold bool
	// Rolling names the Deployments waited for, sorted.
	Rolling []string
	Message string
}

// DecideServerRollout lets server Deployments of different CRs roll one at
// a time: a pod template change waits while any other hookwright server
// Deployment is rolling (ServerRolling). After an operator upgrade every
// server takes the new image at once otherwise, and each webhook's new pods
// are unproven at the same moment. A first creation and a change that
// leaves the template alone (replicas, strategy, labels) never wait.
func DecideServerRollout(in ServerRolloutInput) ServerRolloutDecision {
	if !in.Exists || !in.TemplateChanges {
		return ServerRolloutDecision{}
	}
	var rolling []string
	for i := range in.Others {
		d := &in.Others[i]
		key := d.Namespace + "/" + d.Name
		if key == in.Self {
			continue
		}
		if why := ServerRolling(d, in.Written[key]); why != "" {
			rolling = append(rolling, key+" ("+why+")")
		}
	}
	if len(rolling) == 0 {
		return ServerRolloutDecision{}
	}
	slices.Sort(rolling)
	return ServerRolloutDecision{Hold: true, Rolling: rolling, Message: fmt.Sprintf(
		"server Deployment %s keeps its pod template until no other hookwright server Deployment is rolling: %s",
		in.Self, strings.Join(rolling, ", "))}
}

// ServerRolling returns why d counts as rolling, or "" when it does not:
// its controller has not observed its generation, replicas of an older
// template remain, updated replicas are missing or not yet available (the
// checks of `kubectl rollout status`), or it is not Available. written is
// the generation d had when this operator last changed its template (0:
// none); a cached d at or below it has not caught up with that write.
// A Deployment being deleted, or whose rollout passed its progress deadline
// (Progressing False, ProgressDeadlineExceeded), never holds the others:
// waiting on it would hold every upgrade behind one broken server.
func ServerRolling(d *appsv1.Deployment, written int64) string {
	if d.DeletionTimestamp != nil {
		return ""
	}
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentProgressing && c.Status == corev1.ConditionFalse {
			return ""
		}
	}
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	st := d.Status
	switch {
	case written > 0 && d.Generation <= written:
		return "template change not yet seen"
	case st.ObservedGeneration < d.Generation:
		return fmt.Sprintf("generation %d not yet observed", d.Generation)
	case st.UpdatedReplicas < want:
		return fmt.Sprintf("%d of %d replicas updated", st.UpdatedReplicas, want)
	case st.Replicas > st.UpdatedReplicas:
		return fmt.Sprintf("%d old replicas pending termination", st.Replicas-st.UpdatedReplicas)
	case st.AvailableReplicas < st.UpdatedReplicas:
		return fmt.Sprintf("%d of %d updated replicas available", st.AvailableReplicas, st.UpdatedReplicas)
	}
	for _, c := range st.Conditions {
		if c.Type == appsv1.DeploymentAvailable && c.Status != corev1.ConditionTrue {
			return "not Available"
		}
	}
	return ""
}
