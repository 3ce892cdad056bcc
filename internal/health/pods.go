package health

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

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

// Starting reports whether a pod is scheduled and still waiting for its
// containers to be created (a volume to mount, a sandbox), with nothing
// in its status to say why.
func Starting(p *corev1.Pod) bool {
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
		if !Starting(p) || seen["pod "+p.Name] {
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

// conditionReasonRE is metav1.Condition's reason pattern.
var conditionReasonRE = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)

// maxProblemMessage bounds the condition message (metav1.Condition allows
// 32768 bytes; a kubelet message can be long).
const maxProblemMessage = 2048

// ServerPodsState decides ServerPodsHealthy from the server pods, the
// Warning Events of those still Starting (startingPodProblems) and the
// Deployment's ReplicaFailure condition (the ReplicaSet controller's, e.g.
// FailedCreate when admission refuses the pods, so none exists). Reason is
// the first problem's own (the kubelet's word, such as
// CreateContainerConfigError); the message names up to three problems.
func ServerPodsState(pods []corev1.Pod, dep *appsv1.Deployment, events []corev1.Event) (ok bool, reason, message string) {
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
	msg := Summarize(s, 3)
	if len(msg) > maxProblemMessage {
		msg = msg[:maxProblemMessage-3] + "..."
	}
	reason = problems[0].Reason
	if len(reason) > 1024 || !conditionReasonRE.MatchString(reason) {
		reason = reasonPodFailing
	}
	return false, reason, msg
}

// PodKey is what ServerPodsHealthy reads of one pod: a status update that
// leaves it alone (a probe timestamp) need reconcile nothing.
func PodKey(p *corev1.Pod) string {
	var b strings.Builder
	b.WriteString(string(p.Status.Phase))
	for _, pr := range podProblems([]corev1.Pod{*p}) {
		b.WriteString("|" + pr.String())
	}
	return b.String()
}
