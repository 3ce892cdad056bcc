package rollout

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/fleet"
)

// What holds a disruption back. An in-place change and an owner restart
// both wait for the pod's PodDisruptionBudgets (fleet.BlockingPDB: the
// eviction API's rule, disruptionsAllowed, applied to our own writes); a
// restart also waits for a webhook that can inject the pods it creates.

// blockingPDB names a PodDisruptionBudget of ns selecting podLabels that
// allows no disruption now, "" when none; ns's budgets are listed once
// per step, and budgets that cannot be listed block.
func (r *Roller) blockingPDB(ctx context.Context, s *step, ns string, podLabels map[string]string) string {
	pdbs, ok := s.pdbs[ns]
	if !ok {
		list := &policyv1.PodDisruptionBudgetList{}
		if err := r.reader.List(ctx, list, client.InNamespace(ns)); err != nil {
			// Unknown budgets: do not disrupt.
			return ns + "/* (cannot list PodDisruptionBudgets: " + apiMessage(err) + ")"
		}
		pdbs = list.Items
		s.pdbs[ns] = pdbs
	}
	return fleet.BlockingPDB(pdbs, podLabels)
}

// budgetAllows tells whether pod's budgets allow disrupting it for what
// (a pod or owner id); else the step is blocked with reason
// DisruptionBudget.
func (r *Roller) budgetAllows(ctx context.Context, s *step, pod *corev1.Pod, what string) bool {
	pdb := r.blockingPDB(ctx, s, pod.Namespace, pod.Labels)
	if pdb == "" {
		return true
	}
	s.block(ReasonDisruptionBudget, fmt.Sprintf("PodDisruptionBudget %s allows no disruption now; %s waits", pdb, what))
	return false
}

// webhookDown says why a restart now would create pods without the
// sidecars: the CR not Ready, or the operator's live check finding the
// webhook unreachable (WebhookReachable False); "" otherwise.
func webhookDown(cr *v1alpha1.SidecarInjector) string {
	if !apimeta.IsStatusConditionTrue(cr.Status.Conditions, v1alpha1.ConditionReady) {
		return "the injector is not Ready"
	}
	if c := apimeta.FindStatusCondition(cr.Status.Conditions, v1alpha1.ConditionWebhookReachable); c != nil && c.Status == metav1.ConditionFalse {
		return "the webhook is not reachable (WebhookReachable " + c.Reason + ")"
	}
	return ""
}
