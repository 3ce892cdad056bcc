package rollout

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/fleet"
)

func pdb(name string, allowed int32, app string) *policyv1.PodDisruptionBudget {
	one := intstr.FromInt32(1)
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: name},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}},
		Status:     policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: allowed},
	}
}

// A PodDisruptionBudget allowing no disruption holds the owner restart
// back, before anything is written (no write-ahead either), and blocks
// the rollout with reason DisruptionBudget; once it allows one, the owner
// restarts. Budgets that cannot be listed block as well.
func TestRestartWaitsForThePDB(t *testing.T) {
	objs, pods := deployments("a")
	budget := pdb("a-pdb", 0, "a")
	e := newEnv(t, testCR("proxy:1", v1alpha1.RolloutRestart, 1), append(objs, budget)...)
	e.pods = pods

	cr := e.step()
	if got := e.restarted(); len(got) != 0 {
		t.Fatalf("restarted %v through a PDB allowing no disruption", got)
	}
	if slices.Contains(e.writes, "status mesh") {
		t.Errorf("write-ahead %v while the PDB blocks", e.writes)
	}
	c := condition(cr, v1alpha1.ConditionRolloutBlocked)
	if c.Status != metav1.ConditionTrue || c.Reason != ReasonDisruptionBudget || !strings.Contains(c.Message, "PodDisruptionBudget apps/a-pdb allows no disruption now; Deployment/apps/a waits") {
		t.Fatalf("RolloutBlocked %+v", c)
	}
	if len(e.rec.Events) != 1 || !strings.Contains(<-e.rec.Events, EventRolloutBlocked) {
		t.Errorf("want one %s Warning Event", EventRolloutBlocked)
	}

	budget.Status.DisruptionsAllowed = 1
	if err := e.c.Status().Update(t.Context(), budget); err != nil {
		t.Fatal(err)
	}
	cr = e.step()
	if got := e.restarted(); !slices.Equal(got, []string{"Deployment/apps/a"}) {
		t.Fatalf("restarted %v once the PDB allows one, want Deployment/apps/a; %+v %+v", got, condition(cr, v1alpha1.ConditionRolloutBlocked), cr.Status.Rollout)
	}
	if c := condition(cr, v1alpha1.ConditionRolloutBlocked); c.Status != metav1.ConditionFalse || c.Reason != ReasonRolloutProgressing {
		t.Errorf("RolloutBlocked %+v after the restart", c)
	}
}

func TestPDBListFailureBlocks(t *testing.T) {
	objs, pods := deployments("a")
	e := newEnv(t, testCR("proxy:1", v1alpha1.RolloutRestart, 1), objs...)
	e.pods, e.failPDBList = pods, true
	cr := e.step()
	if got := e.restarted(); len(got) != 0 {
		t.Fatalf("restarted %v with unknown budgets", got)
	}
	c := condition(cr, v1alpha1.ConditionRolloutBlocked)
	if c.Reason != ReasonDisruptionBudget || !strings.Contains(c.Message, "apps/* (cannot list PodDisruptionBudgets: poddisruptionbudgets is forbidden)") {
		t.Fatalf("RolloutBlocked %+v", c)
	}
}

// An in-place change waits for the pod's budget as a restart does; a
// budget of another app does not hold it.
func TestInPlaceWaitsForThePDB(t *testing.T) {
	old := testCR("proxy:1", v1alpha1.RolloutInPlace, 1)
	cr := testCR("proxy:2", v1alpha1.RolloutInPlace, 1)
	_, _, base := deployment("a")
	pod := injectedPod(t, injectorOf(t, old), base)
	budget := pdb("a-pdb", 0, "a")
	e := newEnv(t, cr, pod, pdb("other", 0, "other"), budget)
	e.pods = []Pod{{Pod: pod.DeepCopy(), Class: fleet.Pod{Namespace: "apps", Name: pod.Name, State: fleet.Outdated}}}

	got := e.step()
	if slices.Contains(e.writes, "patch pod apps/a-0") {
		t.Fatalf("pod changed in place through its PDB: %v", e.writes)
	}
	c := condition(got, v1alpha1.ConditionRolloutBlocked)
	if c.Reason != ReasonDisruptionBudget || !strings.Contains(c.Message, "PodDisruptionBudget apps/a-pdb allows no disruption now; pod apps/a-0 waits") {
		t.Fatalf("RolloutBlocked %+v", c)
	}

	if err := e.c.Delete(t.Context(), budget); err != nil {
		t.Fatal(err)
	}
	e.step()
	if !slices.Contains(e.writes, "patch pod apps/a-0") {
		t.Fatalf("pod not changed in place once its PDB is gone: %v", e.writes)
	}
	live := &corev1.Pod{}
	if err := e.c.Get(t.Context(), client.ObjectKeyFromObject(pod), live); err != nil {
		t.Fatal(err)
	}
	if rec, ok := fleet.ParseRecord(live); !ok || rec.Revision != e.inj.Revision {
		t.Errorf("pod's rollout record %+v (%t), want revision %s", rec, ok, e.inj.Revision)
	}
}
