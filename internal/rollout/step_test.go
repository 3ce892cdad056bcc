package rollout

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/fleet"
)

// Owner restarts never leave more than maxUnavailable owners rolling,
// across steps where the operator is restarted (nothing remembered) and
// where it dies before its status write (only the write-ahead reached
// the API server); every owner is restarted exactly once.
func TestRestartsNeverExceedMaxUnavailable(t *testing.T) {
	const maxUnavailable = 2
	names := []string{"a", "b", "c", "d", "e", "f", "g"}
	objs, pods := deployments(names...)
	e := newEnv(t, testCR("proxy:1", v1alpha1.RolloutRestart, maxUnavailable), objs...)
	e.pods = pods
	var started, done []string
	most := 0
	for i := 0; len(done) < len(names); i++ {
		if i > 60 {
			t.Fatalf("not finished after %d steps: restarted %v, rolled out %v", i, e.restarted(), done)
		}
		if i%3 == 2 {
			e.restartOperator()
		}
		if i%4 == 1 {
			// The operator dies after the step, before its status write.
			_, _ = e.r.Step(t.Context(), e.cr(), e.inj, len(e.pods), e.pods, inject)
		} else {
			e.step()
		}
		for _, id := range e.restarted() {
			if name := id[len("Deployment/apps/"):]; !slices.Contains(started, name) {
				started = append(started, name)
				e.startRolling(name)
			}
		}
		rolling := e.rolling(e.inj.Revision)
		if len(rolling) > maxUnavailable {
			t.Fatalf("step %d: %d owners rolling %v, maxUnavailable %d", i, len(rolling), rolling, maxUnavailable)
		}
		most = max(most, len(rolling))
		// Every other step the oldest rolling owner finishes.
		if i%2 == 1 && len(rolling) > 0 {
			next := started[len(done)]
			e.rolledOut(next)
			done = append(done, next)
		}
		e.now = e.now.Add(Recheck)
	}
	if most != maxUnavailable {
		t.Errorf("at most %d owners rolling at once, want the bound %d reached", most, maxUnavailable)
	}
	want := make([]string, len(names))
	for i, n := range names {
		want[i] = "Deployment/apps/" + n
	}
	if got := e.restarted(); !slices.Equal(slices.Sorted(slices.Values(got)), want) {
		t.Errorf("restarts %v, want each owner once: %v", got, want)
	}
}

// Pods changed in place are in flight from their patch until the kubelet
// has restarted the new image and they are Ready: never more than
// maxUnavailable, also while the pod index still shows a patched pod as
// outdated (the step reads its record on the pod itself).
func TestInPlaceNeverExceedsMaxUnavailable(t *testing.T) {
	const maxUnavailable = 2
	old := injectorOf(t, testCR("proxy:1", v1alpha1.RolloutInPlace, maxUnavailable))
	var objs []client.Object
	for i := range 5 {
		_, _, p := deployment(fmt.Sprintf("p%d", i))
		objs = append(objs, injectedPod(t, old, p))
	}
	e := newEnv(t, testCR("proxy:2", v1alpha1.RolloutInPlace, maxUnavailable), objs...)
	e.index()
	most := 0
	for i := 0; ; i++ {
		if i > 40 {
			t.Fatalf("not finished after %d steps: writes %v", i, e.writes)
		}
		e.step()
		inFlight := e.recorded()
		if len(inFlight) > maxUnavailable {
			t.Fatalf("step %d: %d pods in flight %v, maxUnavailable %d", i, len(inFlight), inFlight, maxUnavailable)
		}
		most = max(most, len(inFlight))
		if len(inFlight) > 0 && i%2 == 1 {
			e.kubeletRestarts(inFlight[0])
		}
		// The pod index catches up every third step.
		if i%3 == 2 {
			e.index()
		}
		if e.allCurrent() && len(inFlight) == 0 {
			break
		}
		e.now = e.now.Add(Recheck)
	}
	if most != maxUnavailable {
		t.Errorf("at most %d pods in flight, want the bound %d reached", most, maxUnavailable)
	}
	patched := map[string]int{}
	for _, w := range e.writes {
		patched[w]++
	}
	for i := range 5 {
		// The change, then the record's removal once done.
		if n := patched[fmt.Sprintf("patch pod apps/p%d-0", i)]; n != 2 {
			t.Errorf("pod p%d patched %d times, want 2 (the change, the record's removal)", i, n)
		}
	}
}

// pod is apps/name as the API server has it.
func (e *env) pod(name string) *corev1.Pod {
	e.t.Helper()
	p := &corev1.Pod{}
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: "apps", Name: name}, p); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// index is the pod index catching up: each pod's view as the API server
// has it, classified.
func (e *env) index() {
	e.t.Helper()
	var l corev1.PodList
	if err := e.c.List(context.Background(), &l); err != nil {
		e.t.Fatal(err)
	}
	e.pods = nil
	for i := range l.Items {
		p := &l.Items[i]
		c, ok := fleet.Classify(e.inj, p, inject["apps"])
		if !ok {
			e.t.Fatalf("pod %s not classified", p.Name)
		}
		e.pods = append(e.pods, Pod{Pod: p, Class: c})
	}
}

// recorded are the pods carrying a rollout record: in flight.
func (e *env) recorded() []string {
	e.t.Helper()
	var l corev1.PodList
	if err := e.c.List(context.Background(), &l); err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for i := range l.Items {
		if _, ok := fleet.ParseRecord(&l.Items[i]); ok {
			out = append(out, l.Items[i].Name)
		}
	}
	return out
}

func (e *env) allCurrent() bool {
	for _, p := range e.pods {
		if p.Class.State != fleet.Current {
			return false
		}
	}
	return true
}

// kubeletRestarts is the kubelet restarting the changed containers of
// pod name with their new image, and them and the pod becoming Ready now.
func (e *env) kubeletRestarts(name string) {
	e.t.Helper()
	e.kubeletReports(name, true, e.now)
}

// kubeletReports is the kubelet's status of pod name after restarting
// its changed containers: they and the pod Ready or not, the pod's Ready
// condition last changed at since.
func (e *env) kubeletReports(name string, ready bool, since time.Time) {
	e.t.Helper()
	p := e.pod(name)
	rec, _ := fleet.ParseRecord(p)
	p.Status.ContainerStatuses = nil
	for c, n := range rec.Restarts {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: c, RestartCount: n + 1, Ready: ready})
	}
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.NewTime(since)}}
	if err := e.c.Status().Update(context.Background(), p); err != nil {
		e.t.Fatal(err)
	}
}

// A pod changed in place whose Ready condition has only just come back is
// still in flight: the kubelet reports a restarted native sidecar Ready
// for an instant, then not started for one startup probe period, then
// Ready again (fleet.ReadySettle). Counting it done at the first instant
// took the next pod out while this one was unready again (seen on the
// real node under load: two pods in flight, maxUnavailable 1).
func TestInPlaceWaitsForReadyToSettle(t *testing.T) {
	old := injectorOf(t, testCR("proxy:1", v1alpha1.RolloutInPlace, 1))
	var objs []client.Object
	for i := range 2 {
		_, _, p := deployment(fmt.Sprintf("p%d", i))
		objs = append(objs, injectedPod(t, old, p))
	}
	e := newEnv(t, testCR("proxy:2", v1alpha1.RolloutInPlace, 1), objs...)
	e.index()
	e.step()
	first := e.recorded()
	if len(first) != 1 {
		t.Fatalf("first step changed %v, want one pod", first)
	}
	settle := fleet.ReadySettle(e.pod(first[0]), mustRecord(t, e.pod(first[0])))
	inFlight := func(when string, want ...string) {
		t.Helper()
		if got := e.recorded(); !slices.Equal(got, want) {
			t.Fatalf("%s: in flight %v, want %v", when, got, want)
		}
	}
	// Ready for an instant: still in flight, looked at again when it has
	// held for settle.
	e.now = e.now.Add(time.Second)
	e.kubeletReports(first[0], true, e.now)
	e.index()
	again, _ := e.r.Step(t.Context(), e.cr(), e.inj, len(e.pods), e.pods, inject)
	inFlight("Ready an instant ago", first...)
	if again != settle {
		t.Errorf("looked at again after %s, want %s (the settle left)", again, settle)
	}
	// The startup probe flips back: unready again.
	e.now = e.now.Add(time.Millisecond)
	e.kubeletReports(first[0], false, e.now)
	e.step()
	inFlight("unready again", first...)
	// Ready again, and held for settle: done, the next pod goes.
	e.now = e.now.Add(time.Second)
	e.kubeletReports(first[0], true, e.now)
	e.step()
	inFlight("Ready again, not yet for "+settle.String(), first...)
	e.now = e.now.Add(settle)
	e.step()
	if got := e.recorded(); len(got) != 1 || got[0] == first[0] {
		t.Fatalf("Ready for %s: in flight %v, want the other pod only", settle, got)
	}
}

func mustRecord(t *testing.T, p *corev1.Pod) fleet.Record {
	t.Helper()
	rec, ok := fleet.ParseRecord(p)
	if !ok {
		t.Fatalf("pod %s has no rollout record", p.Name)
	}
	return rec
}
