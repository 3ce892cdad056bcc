package rollout

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/fleet"
)

// The owner is in status.rollout.inProgress on the API server before it
// is restarted; a write-ahead that fails restarts nothing.
func TestWriteAheadComesFirst(t *testing.T) {
	objs, pods := deployments("a")
	e := newEnv(t, testCR("proxy:1", v1alpha1.RolloutRestart, 1), objs...)
	e.pods = pods

	e.failStatus = true
	cr := e.step()
	if got := e.restarted(); len(got) != 0 {
		t.Fatalf("restarted %v though the write-ahead failed", got)
	}
	if cr.Status.Rollout == nil || len(cr.Status.Rollout.Skipped) != 1 ||
		!strings.HasPrefix(cr.Status.Rollout.Skipped[0].Reason, "status.rollout could not record the restart first: etcdserver: request timed out") {
		t.Fatalf("status.rollout %+v, want the pod skipped for the failed write-ahead", cr.Status.Rollout)
	}

	e.failStatus, e.writes = false, nil
	// The write-ahead is checked where the restart is made: the
	// interceptor reads the CR's status when the Deployment is patched.
	var seen []string
	e.onRestart = func() { seen = slices.Clone(e.cr().Status.Rollout.InProgress) }
	e.step()
	if want := []string{"status mesh", "restart Deployment/apps/a"}; !slices.Equal(e.writes, want) {
		t.Fatalf("writes %v, want %v", e.writes, want)
	}
	if !slices.Equal(seen, []string{"Deployment/apps/a"}) {
		t.Fatalf("status.rollout.inProgress %v when the Deployment was restarted, want it recorded first", seen)
	}
}

// An operator that dies between the write-ahead and its status write
// leaves the record its successor resumes from: the owner still rolling
// counts against maxUnavailable, so no second owner restarts; so does an
// owner restarted for this revision with no record at all (found by
// listing the namespace's owners).
func TestResumeAfterRestart(t *testing.T) {
	for _, tc := range []struct {
		name string
		// lose drops the record: the status as if reset.
		lose bool
	}{{name: "from the write-ahead"}, {name: "from the owners", lose: true}} {
		t.Run(tc.name, func(t *testing.T) {
			objs, pods := deployments("a", "b")
			e := newEnv(t, testCR("proxy:1", v1alpha1.RolloutRestart, 1), objs...)
			e.pods = pods
			// The step restarts a and the operator dies before its own
			// status write: only the write-ahead reached the API server.
			_, _ = e.r.Step(t.Context(), e.cr(), e.inj, len(e.pods), e.pods, inject)
			if got := e.restarted(); !slices.Equal(got, []string{"Deployment/apps/a"}) {
				t.Fatalf("first step restarted %v", got)
			}
			e.startRolling("a")
			// a's new pod has the sidecars; the Deployment still rolls.
			e.pods[0].Class.State = fleet.Current
			if ro := e.cr().Status.Rollout; ro == nil || !slices.Equal(ro.InProgress, []string{"Deployment/apps/a"}) {
				t.Fatalf("status.rollout after the write-ahead: %+v", ro)
			}
			if tc.lose {
				cr := e.cr()
				cr.Status.Rollout = nil
				if err := e.c.Status().Update(t.Context(), cr); err != nil {
					t.Fatal(err)
				}
			}

			e.restartOperator()
			e.now = e.now.Add(Recheck)
			cr := e.step()
			if got := e.restarted(); !slices.Equal(got, []string{"Deployment/apps/a"}) {
				t.Fatalf("the new leader restarted %v while a still rolls (maxUnavailable 1)", got)
			}
			ro := cr.Status.Rollout
			if !slices.Contains(ro.InProgress, "Deployment/apps/a") || ro.Unavailable != 1 {
				t.Fatalf("status.rollout %+v, want a in progress and 1 unavailable", ro)
			}
			if c := condition(cr, v1alpha1.ConditionRolloutBlocked); c.Status != metav1.ConditionFalse || c.Reason != ReasonRolloutProgressing {
				t.Errorf("RolloutBlocked %+v", c)
			}

			// a rolled out: b is next, restarted once.
			e.rolledOut("a")
			e.now = e.now.Add(Recheck)
			e.step()
			if got := e.restarted(); !slices.Equal(got, []string{"Deployment/apps/a", "Deployment/apps/b"}) {
				t.Fatalf("restarted %v, want a then b", got)
			}
			d := e.deployment("b")
			if d.Annotations[v1alpha1.SidecarRestartedForKey] != e.inj.Revision || d.Spec.Template.Annotations[v1alpha1.RestartedAtKey] == "" {
				t.Errorf("b after its restart: annotations %v, template %v", d.Annotations, d.Spec.Template.Annotations)
			}
		})
	}
}

// An owner restart cut short by the step's own context (the operator
// stopping mid-write) is counted interrupted, not error: the write may
// have landed, and the next leader resumes from the write-ahead record.
// A restart the API server fails is an error.
func TestInterruptedRestartIsNotAnError(t *testing.T) {
	objs, pods := deployments("a")
	cr := testCR("proxy:1", v1alpha1.RolloutRestart, 1)
	e := newEnv(t, cr, objs...)
	e.pods = pods
	count := func(result string) float64 {
		return testutil.ToFloat64(rolloutActions.WithLabelValues(cr.Name, string(fleet.ActRestart), result))
	}
	errors0, interrupted0 := count("error"), count("interrupted")

	ctx, cancel := context.WithCancel(t.Context())
	e.onRestart = cancel
	_, _ = e.r.Step(ctx, e.cr(), e.inj, len(e.pods), e.pods, inject)
	if got := count("interrupted") - interrupted0; got != 1 {
		t.Errorf("interrupted restarts %v, want 1", got)
	}
	if got := count("error") - errors0; got != 0 {
		t.Errorf("restart errors %v, want 0 for a restart our own context ended", got)
	}

	e.onRestart = nil
	e.restartOperator()
	e.failRestart = true
	e.now = e.now.Add(Recheck)
	e.step()
	if got := count("error") - errors0; got != 1 {
		t.Errorf("restart errors %v, want 1 for a restart the API server failed", got)
	}
	if got := count("interrupted") - interrupted0; got != 1 {
		t.Errorf("interrupted restarts %v, want still 1", got)
	}
}
