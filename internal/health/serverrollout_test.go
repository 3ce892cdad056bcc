package health

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// dep is a server Deployment of 2 replicas, rolled out and Available,
// changed by mutate.
func dep(ns, name string, mutate func(*appsv1.Deployment)) appsv1.Deployment {
	d := appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Generation: 3},
		Spec:       appsv1.DeploymentSpec{Replicas: ptr.To[int32](2)},
		Status: appsv1.DeploymentStatus{
			ObservedGeneration: 3, Replicas: 2, UpdatedReplicas: 2, ReadyReplicas: 2, AvailableReplicas: 2,
			Conditions: []appsv1.DeploymentCondition{
				{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue},
				{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: "NewReplicaSetAvailable"},
			},
		},
	}
	if mutate != nil {
		mutate(&d)
	}
	return d
}

func setCond(d *appsv1.Deployment, typ appsv1.DeploymentConditionType, st corev1.ConditionStatus, reason string) {
	for i := range d.Status.Conditions {
		if d.Status.Conditions[i].Type == typ {
			d.Status.Conditions[i].Status, d.Status.Conditions[i].Reason = st, reason
		}
	}
}

func TestDecideServerRollout(t *testing.T) {
	const self = "hookwright-system/hookwright-sidecar-a"
	selfRolling := dep("hookwright-system", "hookwright-sidecar-a", func(d *appsv1.Deployment) { d.Generation = 4 })
	steady := dep("hookwright-system", "hookwright-oversell-b", nil)
	cases := []struct {
		name    string
		in      ServerRolloutInput
		hold    bool
		rolling string // substring of the message
	}{
		{name: "first creation is never held", in: ServerRolloutInput{Self: self, TemplateChanges: true,
			Others: []appsv1.Deployment{dep("hookwright-system", "hookwright-oversell-b", func(d *appsv1.Deployment) { d.Generation = 4 })}}},
		{name: "no template change is never held", in: ServerRolloutInput{Self: self, Exists: true,
			Others: []appsv1.Deployment{dep("hookwright-system", "hookwright-oversell-b", func(d *appsv1.Deployment) { d.Generation = 4 })}}},
		{name: "alone", in: ServerRolloutInput{Self: self, Exists: true, TemplateChanges: true}},
		{name: "others steady", in: ServerRolloutInput{Self: self, Exists: true, TemplateChanges: true, Others: []appsv1.Deployment{steady, selfRolling}}},
		{name: "own rollout does not hold itself", in: ServerRolloutInput{Self: self, Exists: true, TemplateChanges: true, Others: []appsv1.Deployment{selfRolling}}},
		{name: "generation not observed", hold: true, rolling: "hookwright-oversell-b (generation 4 not yet observed)",
			in: ServerRolloutInput{Self: self, Exists: true, TemplateChanges: true, Others: []appsv1.Deployment{
				dep("hookwright-system", "hookwright-oversell-b", func(d *appsv1.Deployment) { d.Generation = 4 })}}},
		{name: "updated replicas missing", hold: true, rolling: "1 of 2 replicas updated",
			in: ServerRolloutInput{Self: self, Exists: true, TemplateChanges: true, Others: []appsv1.Deployment{
				dep("hookwright-system", "hookwright-oversell-b", func(d *appsv1.Deployment) { d.Status.UpdatedReplicas = 1; d.Status.Replicas = 3 })}}},
		{name: "old replicas terminating", hold: true, rolling: "1 old replicas pending termination",
			in: ServerRolloutInput{Self: self, Exists: true, TemplateChanges: true, Others: []appsv1.Deployment{
				dep("hookwright-system", "hookwright-oversell-b", func(d *appsv1.Deployment) { d.Status.Replicas = 3 })}}},
		{name: "updated but unavailable", hold: true, rolling: "1 of 2 updated replicas available",
			in: ServerRolloutInput{Self: self, Exists: true, TemplateChanges: true, Others: []appsv1.Deployment{
				dep("mesh-servers", "hookwright-sidecar-c", func(d *appsv1.Deployment) { d.Status.AvailableReplicas = 1 })}}},
		{name: "not Available", hold: true, rolling: "not Available",
			in: ServerRolloutInput{Self: self, Exists: true, TemplateChanges: true, Others: []appsv1.Deployment{
				dep("hookwright-system", "hookwright-oversell-b", func(d *appsv1.Deployment) {
					setCond(d, appsv1.DeploymentAvailable, corev1.ConditionFalse, "MinimumReplicasUnavailable")
				})}}},
		{name: "our own write not yet in the cache", hold: true, rolling: "template change not yet seen",
			in: ServerRolloutInput{Self: self, Exists: true, TemplateChanges: true, Others: []appsv1.Deployment{steady},
				Written: map[string]int64{"hookwright-system/hookwright-oversell-b": 3}}},
		{name: "our own write seen and rolled out", in: ServerRolloutInput{Self: self, Exists: true, TemplateChanges: true,
			Others:  []appsv1.Deployment{dep("hookwright-system", "hookwright-oversell-b", func(d *appsv1.Deployment) { d.Generation, d.Status.ObservedGeneration = 4, 4 })},
			Written: map[string]int64{"hookwright-system/hookwright-oversell-b": 3}}},
		{name: "progress deadline exceeded does not hold", in: ServerRolloutInput{Self: self, Exists: true, TemplateChanges: true, Others: []appsv1.Deployment{
			dep("hookwright-system", "hookwright-oversell-b", func(d *appsv1.Deployment) {
				d.Status.AvailableReplicas = 0
				setCond(d, appsv1.DeploymentProgressing, corev1.ConditionFalse, "ProgressDeadlineExceeded")
			})}}},
		{name: "being deleted does not hold", in: ServerRolloutInput{Self: self, Exists: true, TemplateChanges: true, Others: []appsv1.Deployment{
			dep("hookwright-system", "hookwright-oversell-b", func(d *appsv1.Deployment) { d.Generation = 9; d.DeletionTimestamp = &metav1.Time{} })}}},
		{name: "names every rolling one, sorted", hold: true, rolling: "hookwright-system/hookwright-oversell-b (not Available), mesh-servers/hookwright-sidecar-c (generation 4 not yet observed)",
			in: ServerRolloutInput{Self: self, Exists: true, TemplateChanges: true, Others: []appsv1.Deployment{
				dep("mesh-servers", "hookwright-sidecar-c", func(d *appsv1.Deployment) { d.Generation = 4 }),
				steady,
				dep("hookwright-system", "hookwright-oversell-b", func(d *appsv1.Deployment) {
					setCond(d, appsv1.DeploymentAvailable, corev1.ConditionFalse, "MinimumReplicasUnavailable")
				})}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := DecideServerRollout(c.in)
			if got.Hold != c.hold {
				t.Fatalf("hold %v, want %v: %+v", got.Hold, c.hold, got)
			}
			if c.hold && !strings.Contains(got.Message, c.rolling) {
				t.Errorf("message %q lacks %q", got.Message, c.rolling)
			}
			if !c.hold && (got.Message != "" || len(got.Rolling) != 0) {
				t.Errorf("not held but %+v", got)
			}
		})
	}
}
