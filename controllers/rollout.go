package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/fleet"
)

// The rollout of spec.rollout runs inside the fleet reconcile, on the same
// classified pods: it reads full pods, owners and PodDisruptionBudgets
// uncached (only those it is about to judge, at most maxUnavailable per
// step), and acts with the rights of config/rollout. Its state lives in
// the cluster (the pods' rollout annotation, the owners' restarted-for
// annotation, status.rollout), so a restarted or new leader resumes it
// without exceeding maxUnavailable.

// Reasons of the rollout conditions.
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

// rolloutRecheck is how often a rollout with pods in flight is looked at
// when no pod event comes.
const rolloutRecheck = 5 * time.Second

// permissionTTL is how long a namespace's SelfSubjectAccessReview answers
// are reused: a RoleBinding created for the rollout takes effect within it.
const permissionTTL = time.Minute

var (
	rolloutActions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hookwright_sidecar_rollout_actions_total",
		Help: "Rollout actions on running pods by SidecarInjector, action (image, resize, restart) and result (ok, error).",
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

// classifiedPod is one cached pod the fleet reconcile counted.
type classifiedPod struct {
	pod *corev1.Pod
	c   fleet.Pod
}

// roller acts for spec.rollout.
type roller struct {
	client   client.Client
	reader   client.Reader
	recorder events.EventRecorder
	now      func() time.Time

	mu      sync.Mutex
	allowed map[string]permission
	// skipped remembers, per pod UID, a pod judged not to be acted on
	// (its resourceVersion and the revision then): a fleet of pods the
	// strategy cannot change is not read and planned again every step.
	skipped map[types.UID]skipMemo
	// owners are the owners in flight of each CR's last step, until its
	// status is written; didAct tells whether the last step acted.
	owners map[string][]string
	didAct map[string]bool
	// rsOwners caches each ReplicaSet's Deployment ("ReplicaSet/ns/name").
	rsOwners map[string]fleet.Owner
	// discovered is when each CR's owners were last listed, by
	// "name/revision".
	discovered map[string]time.Time
	// resources lists core/v1 (discovery) once, to learn whether the
	// server serves pods/resize; resizeWhy is why not ("" when it does),
	// resizeKnown whether that was learnt, resizeWarned the CRs told.
	resources    discovery.ServerResourcesInterface
	resizeKnown  bool
	resizeWhy    string
	resizeWarned map[string]bool
}

// resizeUnavailable is why the API server cannot resize a pod in place
// (fleet.ResizeServed), "" when it can or while discovery fails (the
// resize call then reports the error). Asked until discovery answers once.
func (r *roller) resizeUnavailable() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.resizeKnown || r.resources == nil {
		return r.resizeWhy
	}
	list, err := r.resources.ServerResourcesForGroupVersion("v1")
	if err != nil {
		return ""
	}
	_, r.resizeWhy = fleet.ResizeServed(list.APIResources)
	r.resizeKnown = true
	return r.resizeWhy
}

// warnNoResize tells cr once, in a Warning Event, that its resources
// changes need a new pod on this server.
func (r *roller) warnNoResize(s *step, why string) {
	r.mu.Lock()
	warned := r.resizeWarned[s.cr.Name]
	if r.resizeWarned == nil {
		r.resizeWarned = map[string]bool{}
	}
	r.resizeWarned[s.cr.Name] = true
	r.mu.Unlock()
	if !warned {
		r.recorder.Eventf(s.cr, nil, corev1.EventTypeWarning, EventResizeUnavailable, "Rollout",
			"revision %s: resources change only in a new pod (fallbackToRestart restarts the owner, else the pod is skipped): %s", s.rev, why)
	}
}

// acted reports whether name's last step acted.
func (r *roller) acted(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.didAct[name]
}

func (r *roller) forget(name string) {
	r.mu.Lock()
	delete(r.owners, name)
	delete(r.didAct, name)
	r.mu.Unlock()
	rolloutPods.DeletePartialMatch(prometheus.Labels{"name": name})
	rolloutBlocked.DeletePartialMatch(prometheus.Labels{"name": name})
	rolloutActions.DeletePartialMatch(prometheus.Labels{"name": name})
}

type skipMemo struct {
	resourceVersion, revision, strategy, reason string
}

func memoStrategy(spec *v1alpha1.RolloutSpec) string {
	return fmt.Sprintf("%s/%t", spec.Strategy, spec.FallbackToRestart)
}

// prune forgets the skipped pods no longer cached.
func (r *roller) prune(pods []classifiedPod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.skipped) <= len(pods)+1000 {
		return
	}
	seen := make(map[types.UID]bool, len(pods))
	for _, p := range pods {
		seen[p.pod.UID] = true
	}
	for uid := range r.skipped {
		if !seen[uid] {
			delete(r.skipped, uid)
		}
	}
}

type permission struct {
	at      time.Time
	missing string
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
	// unavailable pods now, because of the rollout; busy namespaces.
	unavailable int
	busy        []string
	inProgress  []string
	changed     []string
	restarted   []string
	// restartedNow are the owners this step restarted.
	restartedNow []string
	acted        int
	pdbs         map[string][]policyv1.PodDisruptionBudget
	// resourceVersion is the CR's after a write-ahead, else "".
	resourceVersion string
}

// rolloutStep brings cr's pods towards inj's revision by one step and
// fills cr.Status.Rollout and the rollout conditions. It returns when to
// look again (0: on the next event).
// rv is the CR's resourceVersion after the step's own write-ahead ("" when
// it wrote none).
func (r *roller) rolloutStep(ctx context.Context, cr *v1alpha1.SidecarInjector, inj fleet.Injector, matched int, pods []classifiedPod, nsLabels map[string]map[string]string) (again time.Duration, rv string) {
	spec := &cr.Spec.Rollout
	if spec.Strategy == v1alpha1.RolloutNone || spec.Strategy == "" {
		cr.Status.Rollout = nil
		r.mu.Lock()
		delete(r.owners, cr.Name)
		delete(r.didAct, cr.Name)
		r.mu.Unlock()
		apimeta.RemoveStatusCondition(&cr.Status.Conditions, v1alpha1.ConditionRolloutBlocked)
		apimeta.RemoveStatusCondition(&cr.Status.Conditions, v1alpha1.ConditionRolloutNotPermitted)
		rolloutPods.DeletePartialMatch(prometheus.Labels{"name": cr.Name})
		rolloutBlocked.DeletePartialMatch(prometheus.Labels{"name": cr.Name})
		return 0, ""
	}
	r.prune(pods)
	now := r.now()
	s := &step{cr: cr, spec: spec, rev: inj.Revision, skips: fleet.Skips{}, pdbs: map[string][]policyv1.PodDisruptionBudget{},
		st: &v1alpha1.RolloutStatus{Revision: inj.Revision, Strategy: spec.Strategy}}
	prev := cr.Status.Rollout
	same := prev != nil && prev.Revision == inj.Revision
	if same && prev.Started != nil {
		s.st.Started = prev.Started
		s.changed = slices.Clone(prev.Changed)
	} else {
		t := metav1.NewTime(now.Truncate(time.Second))
		s.st.Started = &t
	}
	// A stop on a failed pod holds until the CR changes.
	held := same && prev.BlockedGeneration != 0 && prev.BlockedGeneration == cr.Generation && prev.Blocked != ""
	if held {
		s.st.Blocked, s.st.BlockedGeneration = prev.Blocked, prev.BlockedGeneration
		s.blocked.reason, s.blocked.msg = blockedReason(cr), prev.Blocked
	}

	var pending []fleet.Candidate
	byKey := map[string]*corev1.Pod{}
	// done pods are current (the partition's count); updated ones are
	// current and Ready, not in flight.
	done, updated := 0, 0
	var inFlight []*corev1.Pod
	for _, p := range pods {
		pod := p.pod
		if p.c.State == fleet.Orphaned {
			continue
		}
		key := pod.Namespace + "/" + pod.Name
		needs := p.c.State == fleet.Outdated || p.c.State == fleet.Missing
		if why := fleet.Scope(spec, pod, nsLabels[pod.Namespace]); why != "" {
			if needs {
				s.skips.Add(why, key)
			}
			continue
		}
		if pod.Labels[desired.LabelManagedBy] == desired.ManagedByValue {
			if needs {
				s.skips.Add(fleet.SkipOwnServer, key)
			}
			continue
		}
		if rec, ok := fleet.ParseRecord(pod); ok && rec.Revision == inj.Revision && p.c.State == fleet.Current {
			inFlight = append(inFlight, pod)
			done++
			continue
		}
		if !needs {
			done++
			if readyCondition(pod) {
				updated++
			}
			continue
		}
		if _, why := fleet.PodOwner(pod); why == fleet.SkipBarePod || why == fleet.SkipJobPod {
			s.skips.Add(why, key)
			continue
		}
		pending = append(pending, fleet.Candidate{Namespace: pod.Namespace, Name: pod.Name})
		byKey[key] = pod
	}
	for _, pod := range inFlight {
		if r.checkInFlight(ctx, s, pod, now) {
			updated++
		}
	}
	r.mu.Lock()
	last := r.owners[cr.Name]
	r.mu.Unlock()
	if prev != nil {
		// Whatever revision it was for: checkOwners counts only owners
		// restarted for this one.
		last = append(slices.Clone(prev.InProgress), last...)
	}
	last = append(last, r.discover(ctx, s, pending)...)
	r.checkOwners(ctx, s, slices.Compact(slices.Sorted(slices.Values(last))))
	b := fleet.PlanBatch(fleet.BatchInput{Spec: spec, Matched: matched, Pending: pending, Done: done,
		Unavailable: s.unavailable, Busy: s.busy})
	budget := b.Budget
	if s.blocked.reason != "" {
		budget = 0
	}
	r.act(ctx, s, inj, b.Next, byKey, nsLabels, &budget)

	s.st.Total, s.st.Updated = int32(b.Total), int32(min(updated, b.Total))
	s.st.Unavailable, s.st.Partitioned, s.st.Namespace = int32(s.unavailable), int32(b.Partitioned), b.Namespace
	s.st.InProgress = inProgressList(s.inProgress)
	s.st.Changed = fleet.Capped(s.changed, 20)
	s.st.Skipped = s.skips.List()
	if s.blocked.reason != "" && s.st.Blocked == "" {
		s.st.Blocked = s.blocked.msg
	}
	cr.Status.Rollout = s.st
	var owners []string
	for _, e := range s.inProgress {
		if k, _, _ := strings.Cut(e, "/"); ownerObject(k) != nil {
			owners = append(owners, e)
		}
	}
	r.mu.Lock()
	r.owners[cr.Name] = owners
	r.didAct[cr.Name] = s.acted > 0
	r.mu.Unlock()
	r.conditions(s)
	r.record(s, b)
	if s.unavailable > 0 || s.acted > 0 || (len(b.Next) > 0 && s.blocked.reason != "") {
		return rolloutRecheck, s.resourceVersion
	}
	return 0, s.resourceVersion
}

// blockedReason is the reason of cr's RolloutBlocked condition when True.
func blockedReason(cr *v1alpha1.SidecarInjector) string {
	if c := apimeta.FindStatusCondition(cr.Status.Conditions, v1alpha1.ConditionRolloutBlocked); c != nil && c.Status == metav1.ConditionTrue {
		return c.Reason
	}
	return fleet.StopReadyTimeout
}

// checkInFlight judges one pod changed in place for s.rev; it reports
// whether the pod is done (then its rollout record is removed).
func (r *roller) checkInFlight(ctx context.Context, s *step, cached *corev1.Pod, now time.Time) bool {
	key := cached.Namespace + "/" + cached.Name
	pod := &corev1.Pod{}
	if err := r.reader.Get(ctx, client.ObjectKeyFromObject(cached), pod); err != nil {
		// Gone or unreadable: count it unavailable until the cache says.
		s.unavailable++
		s.busy = appendOnce(s.busy, cached.Namespace)
		s.inProgress = append(s.inProgress, key)
		return false
	}
	rec, ok := fleet.ParseRecord(pod)
	if !ok || rec.Revision != s.rev {
		return true
	}
	pr := fleet.InPlaceProgress(pod, rec, now, time.Duration(*s.spec.ReadyTimeoutSeconds)*time.Second)
	if !pr.Done && pr.Stop != fleet.StopImagePull {
		// A native sidecar whose old process exited 0 shows no pull error
		// in its status: the kubelet's Events have it. Without the right
		// to list them the ready timeout still stops the rollout.
		var evs corev1.EventList
		if err := r.reader.List(ctx, &evs, client.InNamespace(pod.Namespace), client.MatchingFields{"involvedObject.uid": string(pod.UID)}); err == nil {
			if ep := fleet.PullFailureFromEvents(pod, rec, evs.Items); ep.Stop != "" {
				pr = ep
			}
		}
	}
	if pr.Done {
		patch := []byte(`{"metadata":{"annotations":{"` + v1alpha1.SidecarRolloutKey + `":null}}}`)
		if err := r.client.Patch(ctx, pod, client.RawPatch(types.MergePatchType, patch)); err != nil && !apierrors.IsNotFound(err) {
			log.FromContext(ctx).Error(err, "remove the rollout record", "pod", key)
		}
		return true
	}
	s.unavailable++
	s.busy = appendOnce(s.busy, pod.Namespace)
	s.inProgress = append(s.inProgress, key)
	// Its record says it was changed, whether or not the status write of
	// the step that changed it went through.
	s.changed = appendOnce(s.changed, key)
	if pr.Stop != "" && s.blocked.reason == "" {
		s.blocked.reason, s.blocked.msg = pr.Stop, pr.Message
		s.st.Blocked, s.st.BlockedGeneration = pr.Message, s.cr.Generation
	}
	return false
}

// checkOwners counts the owners restarted for s.rev that are still
// rolling (from the last status.rollout.inProgress).
func (r *roller) checkOwners(ctx context.Context, s *step, last []string) {
	for _, e := range last {
		kind, rest, ok := strings.Cut(e, "/")
		if !ok {
			continue
		}
		ns, name, ok := strings.Cut(rest, "/")
		if !ok {
			continue
		}
		obj := ownerObject(kind)
		if obj == nil {
			continue
		}
		if err := r.reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, obj); err != nil {
			continue
		}
		if obj.GetAnnotations()[v1alpha1.SidecarRestartedForKey] != s.rev {
			continue
		}
		if done, u := fleet.OwnerProgress(obj); !done {
			s.unavailable += u
			s.busy = appendOnce(s.busy, ns)
			s.inProgress = append(s.inProgress, e)
			s.restarted = append(s.restarted, e)
		}
	}
}

// readyCondition is the pod's Ready condition (kept by the pod index,
// which drops the pod IP configloaded's podReady also wants).
func readyCondition(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func ownerObject(kind string) client.Object {
	switch kind {
	case "Deployment":
		return &appsv1.Deployment{}
	case "StatefulSet":
		return &appsv1.StatefulSet{}
	case "DaemonSet":
		return &appsv1.DaemonSet{}
	}
	return nil
}

func appendOnce(l []string, v string) []string {
	if slices.Contains(l, v) {
		return l
	}
	return append(l, v)
}

// act starts what next allows within budget: in-place changes, owner
// restarts. A PodDisruptionBudget allowing nothing, or a webhook not
// Ready for a restart, stops the step.
func (r *roller) act(ctx context.Context, s *step, inj fleet.Injector, next []fleet.Candidate, byKey map[string]*corev1.Pod, nsLabels map[string]map[string]string, budget *int) {
	logger := log.FromContext(ctx)
	var imaged, resized []string
	for _, c := range next {
		if *budget <= 0 || s.blocked.reason != "" {
			break
		}
		key := c.Namespace + "/" + c.Name
		cached := byKey[key]
		r.mu.Lock()
		m, memo := r.skipped[cached.UID]
		owner, known := r.rsOwners[ownerKey(cached)]
		r.mu.Unlock()
		if o, why := fleet.PodOwner(cached); why == "" && o.Kind != "ReplicaSet" {
			owner, known = o, true
		}
		if memo && m.resourceVersion == cached.ResourceVersion && m.revision == s.rev && m.strategy == memoStrategy(s.spec) {
			s.skips.Add(m.reason, key)
			continue
		}
		// A pod of an owner already restarting: its owner's rollout
		// replaces it.
		if known && slices.Contains(s.restarted, owner.String()) {
			continue
		}
		if missing := r.permitted(ctx, c.Namespace, s.spec); missing != "" {
			if s.denied == "" {
				s.denied = missing
			}
			s.skips.Add(fleet.SkipNotAllowed, key)
			continue
		}
		pod := &corev1.Pod{}
		if err := r.reader.Get(ctx, client.ObjectKeyFromObject(cached), pod); err != nil {
			continue
		}
		plan, err := fleet.PlanPod(inj, pod, nsLabels[pod.Namespace])
		if err != nil {
			s.skips.Add("the template fails on this pod: "+err.Error(), key)
			continue
		}
		if noResize := r.resizeUnavailable(); noResize != "" && plan.Way == fleet.InPlace {
			if plan = fleet.WithoutResize(plan, noResize); plan.Way != fleet.InPlace {
				r.warnNoResize(s, noResize)
			}
		}
		acts, why := fleet.Actions(s.spec, plan)
		if why != "" {
			s.skips.Add(fleet.SkipNotInPlace, key)
			r.mu.Lock()
			r.skipped[cached.UID] = skipMemo{resourceVersion: cached.ResourceVersion, revision: s.rev, strategy: memoStrategy(s.spec), reason: fleet.SkipNotInPlace}
			r.mu.Unlock()
			continue
		}
		if len(acts) == 0 {
			// Changed in place for this revision already, its record on
			// the pod read now while the cache still has it outdated (the
			// step right after the one that patched it): it is in flight
			// and counts against the budget, or the next pod would be
			// changed too, past maxUnavailable.
			if rec, ok := fleet.ParseRecord(pod); ok && rec.Revision == s.rev {
				s.unavailable++
				s.busy = appendOnce(s.busy, pod.Namespace)
				s.inProgress = append(s.inProgress, key)
				*budget--
			}
			continue
		}
		if acts[0] == fleet.ActRestart {
			if r.restart(ctx, s, pod, key) {
				*budget--
			}
			continue
		}
		if pdb := r.blockingPDB(ctx, s, pod.Namespace, pod.Labels); pdb != "" {
			s.blocked.reason = ReasonDisruptionBudget
			s.blocked.msg = fmt.Sprintf("PodDisruptionBudget %s allows no disruption now; pod %s waits", pdb, key)
			break
		}
		p, err := fleet.BuildInPlace(pod, plan, s.rev, r.now())
		if err != nil {
			s.skips.Add(err.Error(), key)
			continue
		}
		if err := r.applyInPlace(ctx, pod, p); err != nil {
			logger.Error(err, "in-place change", "pod", key)
			rolloutActions.WithLabelValues(s.cr.Name, string(acts[0]), "error").Inc()
			if s.spec.FallbackToRestart && apierrors.IsInvalid(err) {
				if r.restart(ctx, s, pod, key) {
					*budget--
				}
				continue
			}
			s.skips.Add("the API server refused the in-place change: "+apiMessage(err), key)
			continue
		}
		for _, a := range acts {
			rolloutActions.WithLabelValues(s.cr.Name, string(a), "ok").Inc()
		}
		if slices.Contains(acts, fleet.ActImage) {
			imaged = append(imaged, key)
		} else {
			resized = append(resized, key)
		}
		s.changed = append(s.changed, key)
		s.inProgress = append(s.inProgress, key)
		s.unavailable++
		s.acted++
		*budget--
	}
	var parts []string
	if len(imaged) > 0 {
		parts = append(parts, "new images in place: "+strings.Join(imaged, ", "))
	}
	if len(resized) > 0 {
		parts = append(parts, "resized in place: "+strings.Join(resized, ", "))
	}
	if len(s.restartedNow) > 0 {
		parts = append(parts, "restarted: "+strings.Join(s.restartedNow, ", "))
	}
	if len(parts) > 0 {
		r.recorder.Eventf(s.cr, nil, corev1.EventTypeNormal, EventRolloutBatch, "Rollout",
			"revision %s: %s", s.rev, strings.Join(parts, "; "))
	}
}

func apiMessage(err error) string {
	if st, ok := err.(apierrors.APIStatus); ok {
		return st.Status().Message
	}
	return err.Error()
}

// applyInPlace records the change on the pod and makes it: one pod patch
// for images (with the record), then the resize subresource for resources
// (after a metadata patch with the record when no image changed).
func (r *roller) applyInPlace(ctx context.Context, pod *corev1.Pod, p fleet.InPlacePatch) error {
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

// ownerKey is the key of a pod's controller in rsOwners.
func ownerKey(pod *corev1.Pod) string {
	ref := metav1.GetControllerOf(pod)
	if ref == nil {
		return ""
	}
	return ref.Kind + "/" + pod.Namespace + "/" + ref.Name
}

// owner resolves the owner the rollout restarts for pod: a ReplicaSet's
// Deployment (read once per ReplicaSet), a StatefulSet or DaemonSet.
func (r *roller) owner(ctx context.Context, pod *corev1.Pod) (fleet.Owner, string) {
	o, why := fleet.PodOwner(pod)
	if why != "" {
		return o, why
	}
	if o.Kind != "ReplicaSet" {
		return o, ""
	}
	k := ownerKey(pod)
	r.mu.Lock()
	d, ok := r.rsOwners[k]
	r.mu.Unlock()
	if ok {
		return d, ""
	}
	rs := &appsv1.ReplicaSet{}
	if err := r.reader.Get(ctx, types.NamespacedName{Namespace: o.Namespace, Name: o.Name}, rs); err != nil {
		return o, "its ReplicaSet cannot be read: " + apiMessage(err)
	}
	ref := metav1.GetControllerOf(rs)
	if ref == nil || ref.Kind != "Deployment" {
		return o, "its ReplicaSet has no Deployment to restart"
	}
	d = fleet.Owner{Kind: "Deployment", Namespace: o.Namespace, Name: ref.Name}
	r.mu.Lock()
	if len(r.rsOwners) > 100000 {
		clear(r.rsOwners)
	}
	r.rsOwners[k] = d
	r.mu.Unlock()
	return d, ""
}

// restartRetry is how long after an ineffective restart (its new pods
// lack the sidecars) the owner is restarted again when the operator saw
// no outage end since.
const restartRetry = 5 * time.Minute

// maxOwnersInFlight bounds the owners restarting at once: they are the
// record (status.rollout.inProgress) a new leader resumes from.
const maxOwnersInFlight = 50

// restart restarts the owner of pod for s.rev unless it was already:
// true when it counts against the budget (a restart started now, or one
// for this revision still rolling that this step had not counted). The
// owner's pods' PodDisruptionBudgets are checked first.
func (r *roller) restart(ctx context.Context, s *step, pod *corev1.Pod, key string) bool {
	o, why := r.owner(ctx, pod)
	if why != "" {
		s.skips.Add(why, key)
		return false
	}
	id := o.String()
	if slices.Contains(s.restarted, id) {
		return false
	}
	obj := ownerObject(o.Kind)
	if err := r.reader.Get(ctx, types.NamespacedName{Namespace: o.Namespace, Name: o.Name}, obj); err != nil {
		s.skips.Add("its owner cannot be read: "+apiMessage(err), key)
		return false
	}
	if obj.GetAnnotations()[v1alpha1.SidecarRestartedForKey] == s.rev {
		if done, u := fleet.OwnerProgress(obj); !done {
			s.restarted = append(s.restarted, id)
			s.inProgress = append(s.inProgress, id)
			s.busy = appendOnce(s.busy, o.Namespace)
			s.unavailable += u
			return true
		}
		// Rolled out, and this pod still lacks the revision: its new
		// pods were created without the webhook. Once the webhook has
		// become reachable after that restart, restart it once more;
		// until then stop, as more restarts would make more such pods.
		at := restartedAt(obj)
		up := apimeta.FindStatusCondition(s.cr.Status.Conditions, v1alpha1.ConditionWebhookReachable)
		back := up != nil && up.Status == metav1.ConditionTrue && up.LastTransitionTime.After(at)
		if !back && r.now().Sub(at) < restartRetry {
			s.blocked.reason = ReasonRestartIneffective
			s.blocked.msg = fmt.Sprintf("%s was restarted for revision %s at %s and pod %s still lacks it: its pods were created without the webhook (check WebhookReachable); it is restarted again once the webhook is reachable again, or %s after the restart",
				id, s.rev, at.UTC().Format(time.RFC3339), key, restartRetry)
			return false
		}
	}
	if len(s.restarted) >= maxOwnersInFlight {
		return false
	}
	if pdb := r.blockingPDB(ctx, s, pod.Namespace, pod.Labels); pdb != "" {
		s.blocked.reason = ReasonDisruptionBudget
		s.blocked.msg = fmt.Sprintf("PodDisruptionBudget %s allows no disruption now; %s waits", pdb, id)
		return false
	}
	if why := webhookDown(s.cr); why != "" {
		s.blocked.reason = ReasonWebhookNotReady
		s.blocked.msg = why + ": a restarted pod would miss its sidecars; " + id + " waits"
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
		rolloutActions.WithLabelValues(s.cr.Name, string(fleet.ActRestart), "error").Inc()
		s.skips.Add("the owner restart failed: "+apiMessage(err), key)
		return false
	}
	rolloutActions.WithLabelValues(s.cr.Name, string(fleet.ActRestart), "ok").Inc()
	s.restarted = append(s.restarted, id)
	s.restartedNow = append(s.restartedNow, id)
	s.inProgress = append(s.inProgress, id)
	s.busy = appendOnce(s.busy, o.Namespace)
	s.unavailable++
	s.acted++
	return true
}

// discoverEvery is how often the owners of every namespace with pods to
// roll are listed, besides the first step of each revision.
const discoverEvery = 10 * time.Minute

// discover lists, at the first step of a revision after the operator
// starts and every discoverEvery, the Deployments, StatefulSets and
// DaemonSets of the namespaces with pods to roll, and returns those
// restarted for this revision: owners restarted by an operator that left
// no record of it (an older version, a status that was reset) count
// against maxUnavailable too. A namespace where listing fails is left to
// the record.
func (r *roller) discover(ctx context.Context, s *step, pending []fleet.Candidate) []string {
	key := s.cr.Name + "/" + s.rev
	r.mu.Lock()
	at, ok := r.discovered[key]
	r.mu.Unlock()
	if ok && r.now().Sub(at) < discoverEvery {
		return nil
	}
	var nss []string
	for _, c := range pending {
		nss = appendOnce(nss, c.Namespace)
	}
	var out []string
	for _, ns := range nss {
		for _, l := range []client.ObjectList{&appsv1.DeploymentList{}, &appsv1.StatefulSetList{}, &appsv1.DaemonSetList{}} {
			if err := r.reader.List(ctx, l, client.InNamespace(ns)); err != nil {
				continue
			}
			_ = apimeta.EachListItem(l, func(o runtime.Object) error {
				obj := o.(client.Object)
				if obj.GetAnnotations()[v1alpha1.SidecarRestartedForKey] == s.rev {
					out = append(out, kindOf(obj)+"/"+ns+"/"+obj.GetName())
				}
				return nil
			})
		}
	}
	r.mu.Lock()
	if len(r.discovered) > 1000 {
		clear(r.discovered)
	}
	r.discovered[key] = r.now()
	r.mu.Unlock()
	return out
}

func kindOf(obj client.Object) string {
	switch obj.(type) {
	case *appsv1.Deployment:
		return "Deployment"
	case *appsv1.StatefulSet:
		return "StatefulSet"
	case *appsv1.DaemonSet:
		return "DaemonSet"
	}
	return ""
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

// restartedAt is the kubectl.kubernetes.io/restartedAt of obj's pod
// template (zero when absent or not RFC 3339).
func restartedAt(obj client.Object) time.Time {
	var tmpl *corev1.PodTemplateSpec
	switch o := obj.(type) {
	case *appsv1.Deployment:
		tmpl = &o.Spec.Template
	case *appsv1.StatefulSet:
		tmpl = &o.Spec.Template
	case *appsv1.DaemonSet:
		tmpl = &o.Spec.Template
	default:
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339, tmpl.Annotations[v1alpha1.RestartedAtKey])
	if err != nil {
		return time.Time{}
	}
	return t
}

// writeAhead adds id to the CR's status.rollout.inProgress on the API
// server (a merge patch of that field alone; the whole rollout status when
// there is none yet). The CR's new resourceVersion is kept for the step's
// own status write.
func (r *roller) writeAhead(ctx context.Context, s *step, id string) error {
	ro := map[string]any{"inProgress": inProgressList(append(slices.Clone(s.inProgress), id))}
	if s.cr.Status.Rollout == nil {
		ro["revision"], ro["strategy"] = s.rev, s.spec.Strategy
		ro["total"], ro["updated"], ro["unavailable"] = 0, 0, 0
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"rollout": ro}})
	if err != nil {
		return err
	}
	tmp := &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: s.cr.Name}}
	if err := r.client.Status().Patch(ctx, tmp, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return err
	}
	s.resourceVersion = tmp.ResourceVersion
	return nil
}

// blockingPDB lists the namespace's PodDisruptionBudgets once per step.
func (r *roller) blockingPDB(ctx context.Context, s *step, ns string, podLabels map[string]string) string {
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

// rolloutRights are the rights a strategy needs in a namespace, in the
// order they are reported.
func rolloutRights(spec *v1alpha1.RolloutSpec) []authorizationv1.ResourceAttributes {
	ra := func(group, resource, sub, verb string) authorizationv1.ResourceAttributes {
		return authorizationv1.ResourceAttributes{Group: group, Resource: resource, Subresource: sub, Verb: verb}
	}
	out := []authorizationv1.ResourceAttributes{ra("", "pods", "", "get"), ra("policy", "poddisruptionbudgets", "", "list")}
	if spec.Strategy == v1alpha1.RolloutInPlace {
		out = append(out, ra("", "pods", "", "patch"), ra("", "pods", "resize", "patch"))
	}
	if spec.Strategy == v1alpha1.RolloutRestart || spec.FallbackToRestart {
		out = append(out, ra("apps", "replicasets", "", "get"), ra("apps", "deployments", "", "patch"),
			ra("apps", "statefulsets", "", "patch"), ra("apps", "daemonsets", "", "patch"))
	}
	return out
}

// permitted asks the API server (SelfSubjectAccessReview) whether the
// operator holds the rights spec needs in ns: "" when it does, else the
// first missing one. Answers are kept permissionTTL.
func (r *roller) permitted(ctx context.Context, ns string, spec *v1alpha1.RolloutSpec) string {
	key := ns + "|" + string(spec.Strategy) + fmt.Sprint(spec.FallbackToRestart)
	r.mu.Lock()
	p, ok := r.allowed[key]
	r.mu.Unlock()
	if ok && r.now().Sub(p.at) < permissionTTL {
		return p.missing
	}
	missing := ""
	for _, a := range rolloutRights(spec) {
		a.Namespace = ns
		rev := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &a}}
		if err := r.client.Create(ctx, rev); err != nil {
			missing = "cannot ask the API server (SelfSubjectAccessReview): " + apiMessage(err)
			break
		}
		if !rev.Status.Allowed {
			res := a.Resource
			if a.Subresource != "" {
				res += "/" + a.Subresource
			}
			if a.Group != "" {
				res += "." + a.Group
			}
			missing = fmt.Sprintf("%s %s in namespace %s (bind ClusterRole hookwright-rollout, config/rollout)", a.Verb, res, ns)
			break
		}
	}
	r.mu.Lock()
	r.allowed[key] = permission{at: r.now(), missing: missing}
	r.mu.Unlock()
	return missing
}

// conditions sets RolloutBlocked and RolloutNotPermitted, with a Warning
// Event when the rollout becomes blocked.
func (r *roller) conditions(s *step) {
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

func (r *roller) record(s *step, b fleet.Batch) {
	for state, n := range map[string]int32{"total": s.st.Total, "updated": s.st.Updated, "unavailable": s.st.Unavailable, "partitioned": int32(b.Partitioned)} {
		rolloutPods.WithLabelValues(s.cr.Name, state).Set(float64(n))
	}
	v := 0.0
	if s.blocked.reason != "" {
		v = 1
	}
	rolloutBlocked.WithLabelValues(s.cr.Name).Set(v)
}

// inProgressList is status.rollout.inProgress: every owner (the record a
// new leader resumes from), then pods, at most 100.
func inProgressList(all []string) []string {
	var owners, pods []string
	for _, e := range all {
		if k, _, _ := strings.Cut(e, "/"); ownerObject(k) != nil {
			owners = appendOnce(owners, e)
		} else {
			pods = appendOnce(pods, e)
		}
	}
	out := append(owners, pods...)
	return out[:min(len(out), 100)]
}
