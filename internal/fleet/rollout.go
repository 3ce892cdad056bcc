package fleet

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// The rollout's pure parts: which pods it may touch, in which order, how
// many at once, how (image patch, resize, owner restart), and when a
// changed pod is done. The operator's rollout shell reads the cluster,
// calls these and writes what they say.

// Owner is the controller of a pod the rollout can restart.
type Owner struct {
	// Kind is Deployment, StatefulSet or DaemonSet; ReplicaSet until the
	// shell resolves it to its Deployment.
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

func (o Owner) String() string { return o.Kind + "/" + o.Namespace + "/" + o.Name }

// Skip reasons: pods the rollout never touches.
const (
	SkipBarePod    = "bare pod: no owner to restart"
	SkipJobPod     = "Job pod: runs to completion, never restarted"
	SkipOwnServer  = "a pod of the operator's own servers"
	SkipSelector   = "outside spec.rollout.selector"
	SkipNamespace  = "outside spec.rollout.namespaceSelector"
	SkipNotInPlace = "needs a restart; strategy InPlace without fallbackToRestart"
	SkipOwnerKind  = "owner kind the rollout does not restart"
	SkipNotAllowed = "the operator lacks the rollout's rights in this namespace"
)

// PodOwner is pod's controller as the rollout sees it: ok is false with a
// Skip reason for a bare pod or a Job's. A ReplicaSet's pod gets Owner
// Kind ReplicaSet (the shell looks up its Deployment).
func PodOwner(pod *corev1.Pod) (o Owner, skip string) {
	ref := metav1.GetControllerOf(pod)
	if ref == nil {
		return Owner{}, SkipBarePod
	}
	switch ref.Kind {
	case "Job":
		return Owner{}, SkipJobPod
	case "ReplicaSet", "StatefulSet", "DaemonSet":
		return Owner{Kind: ref.Kind, Namespace: pod.Namespace, Name: ref.Name}, ""
	}
	return Owner{Kind: ref.Kind, Namespace: pod.Namespace, Name: ref.Name}, SkipOwnerKind + " (" + ref.Kind + ")"
}

// Scope tells whether a pod lies in spec.rollout's selector and
// namespaceSelector: "" when it does, else the Skip reason. A selector
// that does not parse selects nothing (the API rejects most of them).
func Scope(spec *v1alpha1.RolloutSpec, pod *corev1.Pod, nsLabels map[string]string) string {
	if spec.Selector != nil {
		sel, err := metav1.LabelSelectorAsSelector(spec.Selector)
		if err != nil || !sel.Matches(labels.Set(pod.Labels)) {
			return SkipSelector
		}
	}
	if spec.NamespaceSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(spec.NamespaceSelector)
		if err != nil || !sel.Matches(labels.Set(nsLabels)) {
			return SkipNamespace
		}
	}
	return ""
}

// Candidate is one pod in the rollout's scope, not current (or current
// but still in flight).
type Candidate struct {
	Namespace, Name string
}

// NamespaceRank orders namespaces: spec.rollout.namespaces first, in their
// order, then the rest by name.
func NamespaceRank(spec *v1alpha1.RolloutSpec) func(a, b string) int {
	rank := make(map[string]int, len(spec.Namespaces))
	for i, n := range spec.Namespaces {
		rank[n] = i
	}
	return func(a, b string) int {
		ra, oka := rank[a]
		rb, okb := rank[b]
		switch {
		case oka && okb:
			return cmp.Compare(ra, rb)
		case oka:
			return -1
		case okb:
			return 1
		}
		return cmp.Compare(a, b)
	}
}

// SortCandidates puts cs in rollout order: namespaces by NamespaceRank,
// then pods by name.
func SortCandidates(spec *v1alpha1.RolloutSpec, cs []Candidate) {
	nsCmp := NamespaceRank(spec)
	slices.SortFunc(cs, func(a, b Candidate) int {
		if c := nsCmp(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
}

// Scaled is v (a count, or a percent of total) as a count: percents round
// up when up, else down. A nil v is 0; a malformed percent is 0.
func Scaled(v *intstr.IntOrString, total int, up bool) int {
	if v == nil {
		return 0
	}
	if v.Type == intstr.Int {
		return max(v.IntValue(), 0)
	}
	pct, err := intstr.GetScaledValueFromIntOrPercent(v, total, up)
	if err != nil {
		return 0
	}
	return max(pct, 0)
}

// MaxUnavailable is spec.rollout.maxUnavailable for matched pods: at
// least 1, so a small fleet still moves.
func MaxUnavailable(spec *v1alpha1.RolloutSpec, matched int) int {
	if spec.MaxUnavailable == nil {
		return 1
	}
	return max(Scaled(spec.MaxUnavailable, matched, false), 1)
}

// BatchInput is one step of a rollout.
type BatchInput struct {
	Spec *v1alpha1.RolloutSpec
	// Matched is status.fleet.matchedPods (maxUnavailable's base).
	Matched int
	// Pending are the pods in scope still to roll (outdated or missing,
	// not in flight), in any order.
	Pending []Candidate
	// Done is how many pods in scope are current (in flight or not).
	Done int
	// Unavailable is how many pods are unavailable because of the rollout
	// now (pods in flight, owners restarting).
	Unavailable int
	// Busy are namespaces with pods or owners in flight.
	Busy []string
}

// Batch is what a step may start.
type Batch struct {
	// Next are the pending pods to try, in order, at most Budget of them
	// counted by the shell (several pods of one owner are one restart).
	Next []Candidate
	// Budget is how many more pods may become unavailable.
	Budget int
	// Partitioned is how many pending pods the partition holds back.
	Partitioned int
	// Namespace is the one being rolled (OneAtATime), else "".
	Namespace string
	// Total is the pods in scope without the partitioned ones.
	Total int
}

// PlanBatch chooses what a rollout step may start: pending pods in order
// minus the partition (the last ones in order stay at their revision;
// spec.rollout.partition of all pods in scope, rounded up), within one
// namespace for OneAtATime (the first busy one, else the first with
// pending pods), and a budget of maxUnavailable minus what is unavailable
// already. Paused gives an empty batch.
func PlanBatch(in BatchInput) Batch {
	spec := in.Spec
	pending := slices.Clone(in.Pending)
	SortCandidates(spec, pending)
	inScope := len(pending) + in.Done
	keep := min(Scaled(spec.Partition, inScope, true), inScope)
	// Of the pods in scope, inScope-keep may be current; Done already are.
	may := max(inScope-keep-in.Done, 0)
	b := Batch{Partitioned: max(len(pending)-may, 0), Total: inScope - keep}
	pending = pending[:min(may, len(pending))]
	b.Budget = max(MaxUnavailable(spec, in.Matched)-in.Unavailable, 0)
	if spec.NamespaceOrder == v1alpha1.NamespacesOneAtATime {
		if len(in.Busy) > 0 {
			busy := slices.Clone(in.Busy)
			slices.SortFunc(busy, NamespaceRank(spec))
			b.Namespace = busy[0]
		} else if len(pending) > 0 {
			b.Namespace = pending[0].Namespace
		}
		pending = slices.DeleteFunc(pending, func(c Candidate) bool { return c.Namespace != b.Namespace })
	}
	if spec.Paused {
		b.Budget = 0
		return b
	}
	b.Next = pending
	return b
}

// Action is how one pod is brought to the current revision.
type Action string

// Actions.
const (
	ActImage   Action = "image"
	ActResize  Action = "resize"
	ActRestart Action = "restart"
)

// ResizeUnavailable is the reason, for WithoutResize, when the API
// server does not serve the pods/resize subresource: in-place pod resize
// (KEP-1287) is beta and on by default from Kubernetes v1.33 (feature gate
// InPlacePodVerticalScaling, GA in v1.35); older servers, or a server
// with the gate off, change a pod's resources only in a new pod.
const ResizeUnavailable = "the API server does not serve pods/resize (in-place resize, KEP-1287: Kubernetes v1.33 or newer with feature gate InPlacePodVerticalScaling)"

// ResizeServed tells from the API server's core/v1 resource list
// (discovery) whether it serves the pods/resize subresource, and if not
// why (ResizeUnavailable).
func ResizeServed(coreV1 []metav1.APIResource) (bool, string) {
	for _, r := range coreV1 {
		if r.Name == "pods/resize" {
			return true, ""
		}
	}
	return false, ResizeUnavailable
}

// WithoutResize is plan for a server without the resize subresource
// (ResizeServed): an InPlace plan that changes the resources of a
// container becomes Restart, its Why naming the container and why, so
// Actions restarts the owner under fallbackToRestart and otherwise skips
// the pod with that reason. Any other plan is returned unchanged.
func WithoutResize(plan Plan, why string) Plan {
	if plan.Way != InPlace {
		return plan
	}
	for _, d := range plan.Containers {
		for _, c := range d.Changes {
			if c.Field == "resources" {
				plan.Way = Restart
				plan.Why = fmt.Sprintf("%s %s changes resources and %s", d.List, d.Name, why)
				return plan
			}
		}
	}
	return plan
}

// Actions is what strategy does with a pod of plan (PlanPod): image
// and/or resize for a pod that can change in place under InPlace, restart
// under Restart or as InPlace's fallback; skip says why nothing is done.
func Actions(spec *v1alpha1.RolloutSpec, plan Plan) (acts []Action, skip string) {
	switch plan.Way {
	case NoChange:
		return nil, ""
	case InPlace:
		if spec.Strategy == v1alpha1.RolloutInPlace {
			for _, d := range plan.Containers {
				for _, c := range d.Changes {
					a := ActImage
					if c.Field == "resources" {
						a = ActResize
					}
					if !slices.Contains(acts, a) {
						acts = append(acts, a)
					}
				}
			}
			slices.Sort(acts) // image before resize
			return acts, ""
		}
	}
	if spec.Strategy == v1alpha1.RolloutRestart || spec.FallbackToRestart {
		return []Action{ActRestart}, ""
	}
	return nil, SkipNotInPlace + ": " + plan.Why
}

// Record is the pod annotation v1alpha1.SidecarRolloutKey: what the
// rollout changed on a running pod and when.
type Record struct {
	Revision string    `json:"revision"`
	At       time.Time `json:"at"`
	// Restarts are the changed containers' restartCount before an image
	// change (the kubelet restarts such a container: +1 when done).
	Restarts map[string]int32 `json:"restarts,omitempty"`
	// Resized names the containers resized (done when their status
	// resources are the new ones).
	Resized []string `json:"resized,omitempty"`
}

// ParseRecord reads a pod's rollout record; ok is false without one or
// with one that does not parse (then the pod is not in flight).
func ParseRecord(pod *corev1.Pod) (Record, bool) {
	v, ok := pod.Annotations[v1alpha1.SidecarRolloutKey]
	if !ok {
		return Record{}, false
	}
	var r Record
	if err := json.Unmarshal([]byte(v), &r); err != nil || r.Revision == "" {
		return Record{}, false
	}
	return r, true
}

// InPlacePatch is the change of one pod in place.
type InPlacePatch struct {
	// Pod is a strategic merge patch of the pod: the new images, the
	// revision label, the status annotation's new configHash and the
	// rollout record. Nil without an image change.
	Pod []byte
	// Resize is a strategic merge patch for the pods/resize subresource
	// (the new resources), nil without a resources change.
	Resize []byte
	// Record is the rollout record the patches set.
	Record Record
	// RecordPatch sets only the labels and annotations (a resize-only
	// change, whose subresource cannot set metadata).
	RecordPatch []byte
}

type smpContainer struct {
	Name      string                       `json:"name"`
	Image     string                       `json:"image,omitempty"`
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
}

// BuildInPlace builds the patches that bring pod (a full pod, not a
// trimmed one) to plan.Want for revision at now. Only containers whose
// image or resources differ are named. The error is for a plan that is not
// InPlace.
func BuildInPlace(pod *corev1.Pod, plan Plan, revision string, now time.Time) (InPlacePatch, error) {
	if plan.Way != InPlace || plan.Want == nil {
		return InPlacePatch{}, fmt.Errorf("pod %s/%s cannot change in place: %s", pod.Namespace, pod.Name, plan.Why)
	}
	rec := Record{Revision: revision, At: now.UTC().Truncate(time.Second)}
	var imgC, imgI, resC, resI []smpContainer
	for _, d := range plan.Containers {
		want := findContainer(plan.Want.Pod, d.List, d.Name)
		if want == nil {
			return InPlacePatch{}, fmt.Errorf("pod %s/%s: %s %s not in the injector's output", pod.Namespace, pod.Name, d.List, d.Name)
		}
		for _, c := range d.Changes {
			switch c.Field {
			case "image":
				e := smpContainer{Name: d.Name, Image: want.Image}
				if d.List == "initContainers" {
					imgI = append(imgI, e)
				} else {
					imgC = append(imgC, e)
				}
				if rec.Restarts == nil {
					rec.Restarts = map[string]int32{}
				}
				rec.Restarts[d.Name] = restartCount(pod, d.Name)
			case "resources":
				r := want.Resources
				e := smpContainer{Name: d.Name, Resources: &r}
				if d.List == "initContainers" {
					resI = append(resI, e)
				} else {
					resC = append(resC, e)
				}
				rec.Resized = append(rec.Resized, d.Name)
			}
		}
	}
	recJSON, err := json.Marshal(rec)
	if err != nil {
		return InPlacePatch{}, err
	}
	st := podStatus(pod)
	st.ConfigHash = revision
	stJSON, err := json.Marshal(st)
	if err != nil {
		return InPlacePatch{}, err
	}
	meta := map[string]any{
		"labels":      map[string]string{v1alpha1.SidecarRevisionKey: revision},
		"annotations": map[string]string{v1alpha1.SidecarRolloutKey: string(recJSON), v1alpha1.SidecarStatusKey: string(stJSON)},
	}
	out := InPlacePatch{Record: rec}
	if out.RecordPatch, err = json.Marshal(map[string]any{"metadata": meta}); err != nil {
		return InPlacePatch{}, err
	}
	if len(imgC)+len(imgI) > 0 {
		spec := map[string]any{}
		if len(imgC) > 0 {
			spec["containers"] = imgC
		}
		if len(imgI) > 0 {
			spec["initContainers"] = imgI
		}
		if out.Pod, err = json.Marshal(map[string]any{"metadata": meta, "spec": spec}); err != nil {
			return InPlacePatch{}, err
		}
	}
	if len(resC)+len(resI) > 0 {
		spec := map[string]any{}
		if len(resC) > 0 {
			spec["containers"] = resC
		}
		if len(resI) > 0 {
			spec["initContainers"] = resI
		}
		if out.Resize, err = json.Marshal(map[string]any{"spec": spec}); err != nil {
			return InPlacePatch{}, err
		}
	}
	return out, nil
}

func findContainer(pod *corev1.Pod, list, name string) *corev1.Container {
	cs := pod.Spec.Containers
	if list == "initContainers" {
		cs = pod.Spec.InitContainers
	}
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}

func containerStatus(pod *corev1.Pod, name string) *corev1.ContainerStatus {
	for _, l := range [][]corev1.ContainerStatus{pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses} {
		for i := range l {
			if l[i].Name == name {
				return &l[i]
			}
		}
	}
	return nil
}

func restartCount(pod *corev1.Pod, name string) int32 {
	if s := containerStatus(pod, name); s != nil {
		return s.RestartCount
	}
	return 0
}

// Waiting reasons of the kubelet that stop a rollout at once: the new
// image will not run without a change to the CR.
var stopReasons = []string{"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
	"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}

// Stop reasons of Progress.
const (
	StopImagePull    = "ImagePull"
	StopReadyTimeout = "ReadyTimeout"
	StopResize       = "ResizeInfeasible"
)

// Progress is how a pod changed in place is doing.
type Progress struct {
	Done bool
	// Stop is set (StopImagePull, StopReadyTimeout, StopResize) when the
	// rollout must stop on this pod; Message says why, with the kubelet's
	// reason and message.
	Stop, Message string
	// Wait, when not done, is how long until the clock alone may make the
	// pod done (its Ready condition settling, ReadySettle); 0 when the pod
	// must change first.
	Wait time.Duration
}

// InPlaceProgress judges a pod (full, with its status) changed in place
// by rec: done when every container whose image changed has restarted
// since (restartCount above the recorded one) and is Ready, the pod's
// Ready condition has held for ReadySettle when any restarted (unless it
// has been unready since before the change), and every
// resized container reports the new resources in its status (KEP-1287:
// status.containerStatuses[].resources is what the runtime applied); a
// stop on an image pull or container creation error, an infeasible resize
// (condition PodResizePending reason Infeasible), or when timeout passed
// since rec.At.
func InPlaceProgress(pod *corev1.Pod, rec Record, now time.Time, timeout time.Duration) Progress {
	where := fmt.Sprintf("pod %s/%s", pod.Namespace, pod.Name)
	done := true
	var last string
	for _, name := range slices.Sorted(mapsKeys(rec.Restarts)) {
		st := containerStatus(pod, name)
		if st == nil {
			done, last = false, "container "+name+" has no status yet"
			continue
		}
		if w := st.State.Waiting; w != nil && slices.Contains(stopReasons, w.Reason) {
			return Progress{Stop: StopImagePull, Message: fmt.Sprintf("%s container %s: %s: %s", where, name, w.Reason, w.Message)}
		}
		if st.RestartCount <= rec.Restarts[name] || !st.Ready {
			done, last = false, fmt.Sprintf("container %s: restartCount %d (was %d), ready %t", name, st.RestartCount, rec.Restarts[name], st.Ready)
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodResizePending && c.Reason == "Infeasible" {
			return Progress{Stop: StopResize, Message: fmt.Sprintf("%s: resize infeasible: %s", where, c.Message)}
		}
	}
	for _, name := range rec.Resized {
		want := specContainer(pod, name)
		st := containerStatus(pod, name)
		if want == nil || st == nil || st.Resources == nil || !sameResources(want.Resources, *st.Resources) {
			done, last = false, "container "+name+" has not applied its new resources yet"
		}
	}
	var wait time.Duration
	if done && len(rec.Restarts) > 0 {
		switch since, ready := podReadySince(pod); {
		case !ready && !since.IsZero() && since.Before(rec.At):
			// Unready since before the change: not the rollout's doing,
			// judged by its containers alone (as a pod whose readiness
			// gate or other container keeps it unready would never be
			// done otherwise).
		case !ready:
			done, last = false, "the pod is not Ready"
		default:
			if settle := ReadySettle(pod, rec); now.Sub(since) < settle {
				wait = settle - now.Sub(since)
				done, last = false, fmt.Sprintf("the pod is Ready since %s, not yet for %s", since.UTC().Format(time.TimeOnly), settle)
			}
		}
	}
	if done {
		return Progress{Done: true}
	}
	if now.Sub(rec.At) > timeout {
		return Progress{Stop: StopReadyTimeout, Message: fmt.Sprintf("%s not ready %s after its in-place change: %s", where, timeout, last)}
	}
	return Progress{Message: last, Wait: wait}
}

// ReadySettle is how long the Ready condition of a pod whose containers
// (rec.Restarts) restarted in place must have held before the pod counts
// as available again: the longest startupProbe period of those containers
// (10 s when unset), plus one second because lastTransitionTime is whole
// seconds in the API. The kubelet reports a restarted native sidecar with
// a startup probe started, then not started, then started again one
// period later (Kubernetes 1.37 on the real node: "started", "unhealthy"
// within a millisecond, "started" a second later with periodSeconds 1),
// so the pod is Ready for an instant first; counting it done then let the
// next pod go while it was unready again, past maxUnavailable. The
// comparison with now is the one the Deployment controller makes for
// minReadySeconds (k8s.io/kubernetes/pkg/api/v1/pod IsPodAvailable).
func ReadySettle(pod *corev1.Pod, rec Record) time.Duration {
	var settle time.Duration
	for name := range rec.Restarts {
		if c := specContainer(pod, name); c != nil && c.StartupProbe != nil {
			period := c.StartupProbe.PeriodSeconds
			if period <= 0 {
				period = 10
			}
			settle = max(settle, time.Duration(period)*time.Second)
		}
	}
	return settle + time.Second
}

// ReadyCondition is the pod's Ready condition, or nil when it has none.
// Every reading of a pod's readiness in the operator goes through it.
func ReadyCondition(pod *corev1.Pod) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == corev1.PodReady {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

// PodReady reports whether the pod's Ready condition is True.
func PodReady(pod *corev1.Pod) bool {
	c := ReadyCondition(pod)
	return c != nil && c.Status == corev1.ConditionTrue
}

// podReadySince is when the pod's Ready condition last changed, and
// whether it is True.
func podReadySince(pod *corev1.Pod) (time.Time, bool) {
	if c := ReadyCondition(pod); c != nil {
		return c.LastTransitionTime.Time, c.Status == corev1.ConditionTrue
	}
	return time.Time{}, false
}

func mapsKeys(m map[string]int32) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func specContainer(pod *corev1.Pod, name string) *corev1.Container {
	if c := findContainer(pod, "containers", name); c != nil {
		return c
	}
	return findContainer(pod, "initContainers", name)
}

// sameResources compares the requests and limits of cpu and memory that
// the spec sets (the runtime reports only those).
func sameResources(spec, status corev1.ResourceRequirements) bool {
	for _, pair := range [][2]corev1.ResourceList{{spec.Requests, status.Requests}, {spec.Limits, status.Limits}} {
		for _, n := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			w, ok := pair[0][n]
			if !ok {
				continue
			}
			if g, ok := pair[1][n]; !ok || !equality.Semantic.DeepEqual(w, g) {
				return false
			}
		}
	}
	return true
}

// BlockingPDB names the first PodDisruptionBudget of pdbs (in the pods'
// namespace) that selects any of podLabels and allows no disruption now
// (status.disruptionsAllowed < 1), as "namespace/name"; "" when none. A
// PDB whose status the disruption controller has not written yet
// (observedGeneration behind) blocks too. policy/v1: an empty selector
// selects every pod of the namespace, a nil one none.
func BlockingPDB(pdbs []policyv1.PodDisruptionBudget, podLabels ...map[string]string) string {
	for i := range pdbs {
		p := &pdbs[i]
		if p.Spec.Selector == nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err != nil {
			continue
		}
		if !slices.ContainsFunc(podLabels, func(l map[string]string) bool { return sel.Matches(labels.Set(l)) }) {
			continue
		}
		if p.Status.DisruptionsAllowed < 1 || p.Status.ObservedGeneration < p.Generation {
			return p.Namespace + "/" + p.Name
		}
	}
	return ""
}

// OwnerProgress tells whether a restarted owner (Deployment, StatefulSet
// or DaemonSet) has finished rolling out its pods, as kubectl rollout
// status judges it (k8s.io/kubectl/pkg/polymorphichelpers/rollout_status.go),
// and how many of its pods are unavailable (at least 1 while rolling).
func OwnerProgress(obj any) (done bool, unavailable int) {
	switch o := obj.(type) {
	case *appsv1.Deployment:
		want := ptrOr(o.Spec.Replicas, 1)
		s := o.Status
		done = s.ObservedGeneration >= o.Generation && s.UpdatedReplicas >= want && s.Replicas <= s.UpdatedReplicas && s.AvailableReplicas >= s.UpdatedReplicas
		unavailable = int(max(want-s.AvailableReplicas, 0))
	case *appsv1.StatefulSet:
		want := ptrOr(o.Spec.Replicas, 1)
		s := o.Status
		done = s.ObservedGeneration >= o.Generation && s.UpdatedReplicas >= want && s.ReadyReplicas >= want && s.CurrentRevision == s.UpdateRevision
		unavailable = int(max(want-s.AvailableReplicas, 0))
	case *appsv1.DaemonSet:
		s := o.Status
		done = s.ObservedGeneration >= o.Generation && s.UpdatedNumberScheduled >= s.DesiredNumberScheduled && s.NumberAvailable >= s.DesiredNumberScheduled
		unavailable = int(max(s.DesiredNumberScheduled-s.NumberAvailable, 0))
	default:
		return true, 0
	}
	if !done {
		unavailable = max(unavailable, 1)
	}
	return done, unavailable
}

func ptrOr(p *int32, d int32) int32 {
	if p == nil {
		return d
	}
	return *p
}

// RestartPatch is the merge patch that restarts an owner for revision at
// now, as kubectl rollout restart does (the pod template annotation
// kubectl.kubernetes.io/restartedAt), recording the revision on the owner.
func RestartPatch(revision string, now time.Time) []byte {
	b, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]string{v1alpha1.SidecarRestartedForKey: revision}},
		"spec": map[string]any{"template": map[string]any{"metadata": map[string]any{
			"annotations": map[string]string{v1alpha1.RestartedAtKey: now.UTC().Format(time.RFC3339)}}}},
	})
	return b
}

// Skips counts skip reasons for status.rollout.skipped: by count, then
// reason, at most 16 reasons with up to 3 pods each.
type Skips map[string]*v1alpha1.RolloutCount

// Add counts pod (namespace/name) under reason.
func (s Skips) Add(reason, pod string) {
	c := s[reason]
	if c == nil {
		c = &v1alpha1.RolloutCount{Reason: reason}
		s[reason] = c
	}
	c.Count++
	if len(c.Pods) < 3 {
		c.Pods = append(c.Pods, pod)
	}
}

// List is the counts in status order.
func (s Skips) List() []v1alpha1.RolloutCount {
	out := make([]v1alpha1.RolloutCount, 0, len(s))
	for _, c := range s {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b v1alpha1.RolloutCount) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Reason, b.Reason)
	})
	return out[:min(len(out), 16)]
}

// Capped keeps the last n of names (the newest), for status lists.
func Capped(names []string, n int) []string {
	if len(names) <= n {
		return names
	}
	return names[len(names)-n:]
}

// percentOf is a rounded percent for messages.
func percentOf(n, total int) int {
	if total == 0 {
		return 100
	}
	return int(math.Round(100 * float64(n) / float64(total)))
}

// RolloutMessage is the one-line summary of a rollout for conditions and
// Events.
func RolloutMessage(st *v1alpha1.RolloutStatus) string {
	parts := []string{fmt.Sprintf("%d/%d pods at revision %s (%d%%)", st.Updated, st.Total, st.Revision, percentOf(int(st.Updated), int(st.Total)))}
	if st.Unavailable > 0 {
		parts = append(parts, fmt.Sprintf("%d unavailable", st.Unavailable))
	}
	if st.Partitioned > 0 {
		parts = append(parts, fmt.Sprintf("%d held by the partition", st.Partitioned))
	}
	if st.Namespace != "" {
		parts = append(parts, "namespace "+st.Namespace)
	}
	return strings.Join(parts, ", ")
}
