package controllers

import (
	"cmp"
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
)

// A server pod the kubelet refuses to run (a security context the image
// cannot satisfy, an image it cannot pull, a container that keeps
// crashing) shows in its Deployment only as missing available replicas.
// The operator watches its server pods (cached by label in the server
// namespaces) and reports the kubelet's reason in ServerPodsHealthy.
// +kubebuilder:rbac:groups="",namespace=system,resources=pods,verbs=get;list;watch
// A pod waiting for a volume or a sandbox shows only "ContainerCreating":
// the kubelet reports why in Events (FailedMount: secret "x" not found),
// which are read for such pods.
// +kubebuilder:rbac:groups="",namespace=system,resources=events,verbs=list

// ServerPodsHealthy reasons besides the kubelet's own.
const (
	reasonPodsHealthy = "NoPodFailures"
	// reasonPodFailing stands for a reported reason that is not a valid
	// condition reason.
	reasonPodFailing = "PodFailing"
)

// benignWaiting are the waiting reasons of a container on its way to
// running (pkg/kubelet/kuberuntime/kuberuntime_container.go,
// pkg/kubelet/kubelet_pods.go): everything else (CreateContainerConfigError,
// ErrImagePull, ImagePullBackOff, ErrImageNeverPull, InvalidImageName,
// CrashLoopBackOff, RunContainerError, ...) is a failure.
var benignWaiting = map[string]bool{"": true, "ContainerCreating": true, "PodInitializing": true}

// podProblem is one failure reported in a server pod's status (or in the
// Deployment's, when no pod could be created).
type podProblem struct {
	// Object is "pod NAME" or "Deployment NAME"; Container is "" for a
	// pod-level problem.
	Object, Container string
	// Reason is the kubelet's (scheduler's) one-word reason, Message its
	// text, both as reported.
	Reason, Message string
}

func (p podProblem) String() string {
	where := p.Object
	if p.Container != "" {
		where += " container " + p.Container
	}
	if p.Message == "" {
		return where + ": " + p.Reason
	}
	return where + ": " + p.Reason + ": " + p.Message
}

// podProblems lists, sorted by pod and container, what keeps each pod
// from running as reported in its status: a Failed phase (OutOfcpu,
// Evicted), PodScheduled False (Unschedulable), and each init or app
// container waiting for another reason than creation (benignWaiting) or
// terminated with a non-zero exit code. A CrashLoopBackOff names the last
// exit as well. Terminating pods are skipped.
func podProblems(pods []corev1.Pod) []podProblem {
	var out []podProblem
	for i := range pods {
		p := &pods[i]
		if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded {
			continue
		}
		if p.Status.Phase == corev1.PodFailed {
			out = append(out, podProblem{Object: "pod " + p.Name, Reason: cmp.Or(p.Status.Reason, "Failed"), Message: p.Status.Message})
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason != "" {
				out = append(out, podProblem{Object: "pod " + p.Name, Reason: c.Reason, Message: c.Message})
			}
		}
		for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
			for _, cs := range list {
				if pr, ok := containerProblem(cs); ok {
					pr.Object = "pod " + p.Name
					out = append(out, pr)
				}
			}
		}
	}
	slices.SortStableFunc(out, func(a, b podProblem) int {
		return strings.Compare(a.Object+"\x00"+a.Container, b.Object+"\x00"+b.Container)
	})
	return out
}

func containerProblem(cs corev1.ContainerStatus) (podProblem, bool) {
	switch {
	case cs.State.Waiting != nil && !benignWaiting[cs.State.Waiting.Reason]:
		w := cs.State.Waiting
		msg := w.Message
		if t := cs.LastTerminationState.Terminated; t != nil {
			last := fmt.Sprintf("last exit code %d (%s)", t.ExitCode, cmp.Or(t.Reason, "Error"))
			if m := strings.TrimSpace(t.Message); m != "" {
				last += ": " + m
			}
			msg = strings.TrimPrefix(strings.Join([]string{msg, last}, "; "), "; ")
		}
		return podProblem{Container: cs.Name, Reason: w.Reason, Message: msg}, true
	case cs.State.Terminated != nil && cs.State.Terminated.ExitCode != 0:
		t := cs.State.Terminated
		msg := fmt.Sprintf("exit code %d", t.ExitCode)
		if m := strings.TrimSpace(t.Message); m != "" {
			msg += ": " + m
		}
		return podProblem{Container: cs.Name, Reason: cmp.Or(t.Reason, "Error"), Message: msg}, true
	}
	return podProblem{}, false
}

// starting reports whether a pod is scheduled and still waiting for its
// containers to be created (a volume to mount, a sandbox), with nothing
// in its status to say why.
func starting(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodPending || p.Spec.NodeName == "" && !scheduled(p) {
		return false
	}
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, cs := range list {
			if cs.State.Waiting == nil || !benignWaiting[cs.State.Waiting.Reason] {
				return false
			}
		}
	}
	return true
}

func scheduled(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// startingPodProblems names, for each starting pod (scheduled, containers
// not yet created) that podProblems found nothing wrong with, the latest
// Warning Event about it (matched by UID), such as the kubelet's
// FailedMount `MountVolume.SetUp failed for volume "serving-cert" : secret
// "x" not found` or FailedCreatePodSandBox.
func startingPodProblems(pods []corev1.Pod, found []podProblem, events []corev1.Event) []podProblem {
	seen := map[string]bool{}
	for _, p := range found {
		seen[p.Object] = true
	}
	var out []podProblem
	for i := range pods {
		p := &pods[i]
		if !starting(p) || seen["pod "+p.Name] {
			continue
		}
		var last *corev1.Event
		for j := range events {
			e := &events[j]
			if e.Type != corev1.EventTypeWarning || e.InvolvedObject.UID != p.UID {
				continue
			}
			if last == nil || eventTime(e).After(eventTime(last)) {
				last = e
			}
		}
		if last != nil {
			out = append(out, podProblem{Object: "pod " + p.Name, Reason: last.Reason, Message: last.Message})
		}
	}
	return out
}

// eventTime is when an Event last happened, whichever API wrote it.
func eventTime(e *corev1.Event) time.Time {
	switch {
	case e.Series != nil && !e.Series.LastObservedTime.IsZero():
		return e.Series.LastObservedTime.Time
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

// startingPoll is how often the Events of starting server pods are read
// again (nothing watches them).
const startingPoll = 5 * time.Second

// conditionReasonRE is metav1.Condition's reason pattern.
var conditionReasonRE = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)

// maxProblemMessage bounds the condition message (metav1.Condition allows
// 32768 bytes; a kubelet message can be long).
const maxProblemMessage = 2048

// serverPodsState decides ServerPodsHealthy from the server pods, the
// Warning Events of those still starting (startingPodProblems) and the
// Deployment's ReplicaFailure condition (the ReplicaSet controller's, e.g.
// FailedCreate when admission refuses the pods, so none exists). Reason is
// the first problem's own (the kubelet's word, such as
// CreateContainerConfigError); the message names up to three problems.
func serverPodsState(pods []corev1.Pod, dep *appsv1.Deployment, events []corev1.Event) (ok bool, reason, message string) {
	problems := podProblems(pods)
	problems = append(problems, startingPodProblems(pods, problems, events)...)
	slices.SortStableFunc(problems, func(a, b podProblem) int {
		return strings.Compare(a.Object+"\x00"+a.Container, b.Object+"\x00"+b.Container)
	})
	if dep != nil {
		for _, c := range dep.Status.Conditions {
			if c.Type == appsv1.DeploymentReplicaFailure && c.Status == corev1.ConditionTrue {
				problems = append([]podProblem{{Object: "Deployment " + dep.Name, Reason: cmp.Or(c.Reason, "ReplicaFailure"), Message: c.Message}}, problems...)
			}
		}
	}
	if len(problems) == 0 {
		return true, reasonPodsHealthy, fmt.Sprintf("%d server pods, none reports a failure", len(pods))
	}
	s := make([]string, len(problems))
	for i, p := range problems {
		s[i] = p.String()
	}
	msg := summarize(s, 3)
	if len(msg) > maxProblemMessage {
		msg = msg[:maxProblemMessage-3] + "..."
	}
	reason = problems[0].Reason
	if len(reason) > 1024 || !conditionReasonRE.MatchString(reason) {
		reason = reasonPodFailing
	}
	return false, reason, msg
}

// serverPodHealth sets ServerPodsHealthy from the cached server pods of
// op's Deployment (and, for pods still starting, their Warning Events read
// from the API server); while ServerAvailable is False it also names the
// first problem there, so Ready's message leads to it. It returns when to
// look again (0: a pod watch event will do).
func (r *reconciler) serverPodHealth(ctx context.Context, op desired.CR, want *appsv1.Deployment) time.Duration {
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(want.Namespace), client.MatchingLabels(desired.SelectorLabels(op))); err != nil {
		log.FromContext(ctx).Error(err, "list server pods for "+v1alpha1.ConditionServerPodsHealthy)
		return 0
	}
	var events []corev1.Event
	poll := time.Duration(0)
	for i := range pods.Items {
		p := &pods.Items[i]
		if !starting(p) {
			continue
		}
		poll = startingPoll
		var el corev1.EventList
		if err := r.APIReader.List(ctx, &el, client.InNamespace(p.Namespace),
			client.MatchingFields{"involvedObject.uid": string(p.UID), "type": corev1.EventTypeWarning}); err != nil {
			log.FromContext(ctx).V(1).Info("list Events of a starting server pod", "pod", p.Name, "error", err.Error())
			continue
		}
		events = append(events, el.Items...)
	}
	dep := &appsv1.Deployment{}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), dep); err != nil {
		dep = nil
	}
	ok, reason, msg := serverPodsState(pods.Items, dep, events)
	r.setCondition(op, v1alpha1.ConditionServerPodsHealthy, ok, reason, msg)
	if c := apimeta.FindStatusCondition(*op.Object.StatusConditions(), v1alpha1.ConditionServerAvailable); !ok && c != nil && c.Status == metav1.ConditionFalse && !strings.Contains(c.Message, "; "+reason) {
		r.setCondition(op, v1alpha1.ConditionServerAvailable, false, c.Reason, c.Message+"; "+reason+" (see "+v1alpha1.ConditionServerPodsHealthy+")")
	}
	return poll
}

// serverPodSelector is the label selector of the server pods in the cache.
func serverPodSelector() labels.Selector {
	return labels.SelectorFromSet(labels.Set{desired.LabelManagedBy: desired.ManagedByValue, desired.LabelComponent: "webhook-server"})
}

// serverPodCache caches server pods only, slimmed to what podProblems and
// the watch read (metadata without managedFields, spec.nodeName, status).
func serverPodCache() cache.ByObject {
	return cache.ByObject{Label: serverPodSelector(), Transform: slimPod}
}

func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	m := p.ObjectMeta
	m.ManagedFields = nil
	return &corev1.Pod{TypeMeta: p.TypeMeta, ObjectMeta: m, Spec: corev1.PodSpec{NodeName: p.Spec.NodeName}, Status: p.Status}, nil
}

// podHealthKey is what ServerPodsHealthy reads of one pod: a status
// update that leaves it alone (a probe timestamp) reconciles nothing.
func podHealthKey(o client.Object) string {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return ""
	}
	var b strings.Builder
	b.WriteString(string(p.Status.Phase))
	for _, pr := range podProblems([]corev1.Pod{*p}) {
		b.WriteString("|" + pr.String())
	}
	return b.String()
}

// watchServerPods re-reconciles a CR when one of its server pods starts
// or stops reporting a failure, or changes which.
func (r *reconciler) watchServerPods(b *builder.Builder) *builder.Builder {
	return b.Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.instanceRequests), builder.WithPredicates(predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool { return podHealthKey(e.ObjectOld) != podHealthKey(e.ObjectNew) },
	}))
}

// instanceRequests maps an object labelled with a server's instance name
// (its pods, its Service's EndpointSlices) to the CR of that server.
func (r *reconciler) instanceRequests(ctx context.Context, o client.Object) []reconcile.Request {
	inst := o.GetLabels()[desired.LabelInstance]
	if inst == "" {
		return nil
	}
	var out []reconcile.Request
	for _, req := range r.allRequests(ctx) {
		if r.kind.Kind().BaseName(req.Name) == inst {
			out = append(out, req)
		}
	}
	return out
}
