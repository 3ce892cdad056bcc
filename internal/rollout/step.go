package rollout

import (
	"context"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/fleet"
	"github.com/hookwright/hookwright/internal/requeue"
)

// Recheck is how often a rollout with pods in flight is looked at when
// no pod event comes.
const Recheck = 5 * time.Second

// Pod is one cached pod the fleet reconcile classified: the pod index's
// trimmed view (labels, our annotations, owner, Ready, UID,
// resourceVersion) and its state. The pods a step judges it reads in full.
type Pod struct {
	Pod   *corev1.Pod
	Class fleet.Pod
}

// Roller carries out spec.rollout, one Step per fleet reconcile. It reads
// full pods, owners and PodDisruptionBudgets uncached (only those it is
// about to judge, at most maxUnavailable per step) and acts with the
// rights of config/rollout. Safe for concurrent Steps of different CRs.
type Roller struct {
	client   client.Client
	reader   client.Reader
	recorder events.EventRecorder
	// resources lists core/v1 once, to learn whether the server serves
	// pods/resize (nil: assume it does).
	resources discovery.ServerResourcesInterface
	now       func() time.Time
	memo      *memo
}

// New is a Roller writing with c, reading uncached with reader (the
// manager's API reader), telling with recorder and asking resources
// whether pods/resize is served.
func New(c client.Client, reader client.Reader, recorder events.EventRecorder, resources discovery.ServerResourcesInterface) *Roller {
	return &Roller{client: c, reader: reader, recorder: recorder, resources: resources, now: time.Now, memo: newMemo()}
}

// Acted reports whether name's last step acted: its status is then written
// at once, being the record a new leader resumes from.
func (r *Roller) Acted(name string) bool { return r.memo.acted(name) }

// Forget drops what is kept of a deleted CR, and its metrics.
func (r *Roller) Forget(name string) {
	r.memo.forgetSteps(name)
	rolloutPods.DeletePartialMatch(prometheus.Labels{"name": name})
	rolloutBlocked.DeletePartialMatch(prometheus.Labels{"name": name})
	rolloutActions.DeletePartialMatch(prometheus.Labels{"name": name})
}

// step is one rollout step's working state.
type step struct {
	cr      *v1alpha1.SidecarInjector
	spec    *v1alpha1.RolloutSpec
	rev     string
	st      *v1alpha1.RolloutStatus
	skips   fleet.Skips
	blocked struct{ reason, msg string }
	denied  string
	// In flight, counted against maxUnavailable: unavailable pods now,
	// because of the rollout; their namespaces (busy); their pods' and
	// owners' entries (inProgress); the owners restarting (restarted).
	unavailable int
	busy        []string
	inProgress  []string
	restarted   []string
	// budget is how many more pods this step may take out.
	budget  int
	changed []string
	// restartedNow, imaged and resized are what this step did (acted in
	// all).
	restartedNow    []string
	imaged, resized []string
	acted           int
	pdbs            map[string][]policyv1.PodDisruptionBudget
	// resourceVersion is the CR's after a write-ahead, else "";
	// written is the CR as the last write-ahead left it.
	resourceVersion string
	written         *v1alpha1.SidecarInjector
	// wake is the soonest a pod in flight may be done by the clock alone
	// (its Ready condition settling), 0 when none.
	wake time.Duration
}

// podInFlight counts a pod changed in place, not yet done, against
// maxUnavailable.
func (s *step) podInFlight(key, ns string) {
	s.unavailable++
	s.busy = appendOnce(s.busy, ns)
	s.inProgress = append(s.inProgress, key)
}

// ownerInFlight counts an owner restarting for this revision, with
// unavailable of its pods, against maxUnavailable; its other pods wait
// for its own rollout.
func (s *step) ownerInFlight(id, ns string, unavailable int) {
	s.unavailable += unavailable
	s.busy = appendOnce(s.busy, ns)
	s.inProgress = append(s.inProgress, id)
	s.restarted = append(s.restarted, id)
}

// block stops the step: no further pod is taken out, and RolloutBlocked
// is True with reason and msg.
func (s *step) block(reason, msg string) { s.blocked.reason, s.blocked.msg = reason, msg }

// Step brings cr's pods towards inj's revision by one step and fills
// cr.Status.Rollout and the rollout conditions. matched is the fleet's
// matched pods (maxUnavailable's base); pods the classified ones. It
// returns when to look again (0: on the next event) and the CR's
// resourceVersion after the step's own write-ahead ("" when it wrote
// none), which the caller's status write must go on top of.
func (r *Roller) Step(ctx context.Context, cr *v1alpha1.SidecarInjector, inj fleet.Injector, matched int, pods []Pod, nsLabels map[string]map[string]string) (again time.Duration, rv string) {
	spec := &cr.Spec.Rollout
	if spec.Strategy == v1alpha1.RolloutNone || spec.Strategy == "" {
		r.memo.forgetSteps(cr.Name)
		clearStatus(cr)
		return 0, ""
	}
	r.memo.prune(pods)
	now := r.now()
	s := newStep(cr, inj.Revision, now)
	sel := s.sort(pods, inj.Revision, nsLabels)
	for _, pod := range sel.inFlight {
		if r.checkInFlight(ctx, s, pod, now) {
			sel.updated++
		}
	}
	last := r.memo.lastOwners(cr.Name)
	if prev := cr.Status.Rollout; prev != nil {
		// Whatever revision it was for: checkOwners counts only owners
		// restarted for this one.
		last = append(slices.Clone(prev.InProgress), last...)
	}
	last = append(last, r.discover(ctx, s, sel.pending)...)
	r.checkOwners(ctx, s, slices.Compact(slices.Sorted(slices.Values(last))))
	b := fleet.PlanBatch(fleet.BatchInput{Spec: spec, Matched: matched, Pending: sel.pending, Done: sel.done,
		Unavailable: s.unavailable, Busy: s.busy})
	s.budget = b.Budget
	if s.blocked.reason != "" {
		s.budget = 0
	}
	r.act(ctx, s, inj, b.Next, sel.byKey, nsLabels)

	s.finish(b, sel.updated)
	cr.Status.Rollout = s.st
	r.memo.stepped(cr.Name, ownersOf(s.inProgress), s.acted > 0)
	r.conditions(s)
	record(s, b)
	if s.unavailable > 0 || s.acted > 0 || (len(b.Next) > 0 && s.blocked.reason != "") {
		return requeue.Sooner(Recheck, s.wake), s.resourceVersion
	}
	return 0, s.resourceVersion
}

// newStep starts a step from cr's last status.rollout: its start and the
// pods changed so far are kept within one revision, and a stop on a
// failed pod holds until the CR changes.
func newStep(cr *v1alpha1.SidecarInjector, rev string, now time.Time) *step {
	spec := &cr.Spec.Rollout
	s := &step{cr: cr, spec: spec, rev: rev, skips: fleet.Skips{}, pdbs: map[string][]policyv1.PodDisruptionBudget{},
		st: &v1alpha1.RolloutStatus{Revision: rev, Strategy: spec.Strategy}}
	prev := cr.Status.Rollout
	same := prev != nil && prev.Revision == rev
	if same && prev.Started != nil {
		s.st.Started = prev.Started
		s.changed = slices.Clone(prev.Changed)
	} else {
		t := metav1.NewTime(now.Truncate(time.Second))
		s.st.Started = &t
	}
	if same && prev.BlockedGeneration != 0 && prev.BlockedGeneration == cr.Generation && prev.Blocked != "" {
		s.st.Blocked, s.st.BlockedGeneration = prev.Blocked, prev.BlockedGeneration
		s.block(blockedReason(cr), prev.Blocked)
	}
	return s
}

// selection is the step's pods sorted: pending ones to roll (byKey their
// cached views), done ones (the partition's count), updated ones (done
// and Ready, not in flight), and the ones changed in place for this
// revision to check.
type selection struct {
	pending       []fleet.Candidate
	byKey         map[string]*corev1.Pod
	done, updated int
	inFlight      []*corev1.Pod
}

// sort sorts pods; the ones the rollout never touches are counted in
// s.skips when they need the revision.
func (s *step) sort(pods []Pod, rev string, nsLabels map[string]map[string]string) selection {
	sel := selection{byKey: map[string]*corev1.Pod{}}
	for _, p := range pods {
		pod := p.Pod
		if p.Class.State == fleet.Orphaned {
			continue
		}
		key := pod.Namespace + "/" + pod.Name
		needs := p.Class.State == fleet.Outdated || p.Class.State == fleet.Missing
		if why := never(s.spec, pod, nsLabels[pod.Namespace]); why != "" {
			if needs {
				s.skips.Add(why, key)
			}
			continue
		}
		if rec, ok := fleet.ParseRecord(pod); ok && rec.Revision == rev && p.Class.State == fleet.Current {
			sel.inFlight = append(sel.inFlight, pod)
			sel.done++
			continue
		}
		if !needs {
			sel.done++
			if fleet.PodReady(pod) {
				sel.updated++
			}
			continue
		}
		if _, why := fleet.PodOwner(pod); why == fleet.SkipBarePod || why == fleet.SkipJobPod {
			s.skips.Add(why, key)
			continue
		}
		sel.pending = append(sel.pending, fleet.Candidate{Namespace: pod.Namespace, Name: pod.Name})
		sel.byKey[key] = pod
	}
	return sel
}

// never is why the rollout never touches pod: outside its selectors, or
// one of the operator's own servers; "" otherwise.
func never(spec *v1alpha1.RolloutSpec, pod *corev1.Pod, nsLabels map[string]string) string {
	if why := fleet.Scope(spec, pod, nsLabels); why != "" {
		return why
	}
	if pod.Labels[desired.LabelManagedBy] == desired.ManagedByValue {
		return fleet.SkipOwnServer
	}
	return ""
}

// act starts what next allows within the budget: in-place changes, owner
// restarts. A PodDisruptionBudget allowing nothing, or a webhook not
// Ready for a restart, stops the step.
func (r *Roller) act(ctx context.Context, s *step, inj fleet.Injector, next []fleet.Candidate, byKey map[string]*corev1.Pod, nsLabels map[string]map[string]string) {
	for _, c := range next {
		if s.budget <= 0 || s.blocked.reason != "" {
			break
		}
		r.actOn(ctx, s, inj, byKey[c.Namespace+"/"+c.Name], nsLabels)
	}
	r.batchEvent(s)
}

// actOn reads one pending pod and changes it in place, restarts its owner
// or skips it.
func (r *Roller) actOn(ctx context.Context, s *step, inj fleet.Injector, cached *corev1.Pod, nsLabels map[string]map[string]string) {
	key := cached.Namespace + "/" + cached.Name
	if why, ok := r.memo.skippedFor(cached.UID, cached.ResourceVersion, s.rev, s.spec); ok {
		s.skips.Add(why, key)
		return
	}
	// A pod of an owner already restarting: its owner's rollout replaces
	// it.
	if o, known := r.knownOwner(cached); known && slices.Contains(s.restarted, o.String()) {
		return
	}
	if missing := r.permitted(ctx, cached.Namespace, s.spec); missing != "" {
		if s.denied == "" {
			s.denied = missing
		}
		s.skips.Add(fleet.SkipNotAllowed, key)
		return
	}
	pod := &corev1.Pod{}
	if err := r.reader.Get(ctx, client.ObjectKeyFromObject(cached), pod); err != nil {
		return
	}
	plan, err := fleet.PlanPod(inj, pod, nsLabels[pod.Namespace])
	if err != nil {
		s.skips.Add("the template fails on this pod: "+err.Error(), key)
		return
	}
	if noResize := r.resizeUnavailable(); noResize != "" && plan.Way == fleet.InPlace {
		if plan = fleet.WithoutResize(plan, noResize); plan.Way != fleet.InPlace {
			r.warnNoResize(s, noResize)
		}
	}
	acts, why := fleet.Actions(s.spec, plan)
	switch {
	case why != "":
		s.skips.Add(fleet.SkipNotInPlace, key)
		r.memo.skip(cached.UID, cached.ResourceVersion, s.rev, s.spec, fleet.SkipNotInPlace)
	case len(acts) == 0:
		// Changed in place for this revision already, its record on the
		// pod read now while the cache still has it outdated (the step
		// right after the one that patched it): it is in flight and
		// counts against the budget, or the next pod would be changed
		// too, past maxUnavailable.
		if rec, ok := fleet.ParseRecord(pod); ok && rec.Revision == s.rev {
			s.podInFlight(key, pod.Namespace)
			s.budget--
		}
	case acts[0] == fleet.ActRestart:
		if r.restart(ctx, s, pod, key) {
			s.budget--
		}
	default:
		r.changeInPlace(ctx, s, pod, key, plan, acts)
	}
}

func appendOnce(l []string, v string) []string {
	if slices.Contains(l, v) {
		return l
	}
	return append(l, v)
}

// apiMessage is an API error's message (its Status), else err's text.
func apiMessage(err error) string {
	if st, ok := err.(apierrors.APIStatus); ok {
		return st.Status().Message
	}
	return err.Error()
}
