package health

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func waitingPod(name, reason, msg string) corev1.Pod {
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "server", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}},
		}}},
	}
}

func runningPod(name string) corev1.Pod {
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "server", Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
		}}},
	}
}

// The statuses are the kubelet v1.37's for the operator's pod spec
// (messages from pkg/kubelet/kuberuntime and pkg/kubelet/images).
func TestServerPodsState(t *testing.T) {
	nonNumeric := `container has runAsNonRoot and image has non-numeric user (nonroot), cannot verify user is non-root (pod: "hookwright-sidecar-a-5d9c_hookwright-system(0b1e)", container: server)`
	crashing := waitingPod("hookwright-sidecar-a-crash", "CrashLoopBackOff", "back-off 20s restarting failed container=server pod=hookwright-sidecar-a-crash_hookwright-system(1c2d)")
	crashing.Status.Phase = corev1.PodRunning
	crashing.Status.ContainerStatuses[0].RestartCount = 2
	crashing.Status.ContainerStatuses[0].LastTerminationState.Terminated = &corev1.ContainerStateTerminated{ExitCode: 2, Reason: "Error", Message: "unknown role \"sidecar\"\n"}
	justExited := runningPod("hookwright-sidecar-a-exited")
	justExited.Status.ContainerStatuses[0].Ready = false
	justExited.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}}
	completed := runningPod("hookwright-sidecar-a-done")
	completed.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}}
	terminating := waitingPod("hookwright-sidecar-a-old", "ImagePullBackOff", "Back-off pulling image")
	terminating.DeletionTimestamp = &metav1.Time{}
	evicted := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hookwright-oversell-b-ev"}, Status: corev1.PodStatus{
		Phase: corev1.PodFailed, Reason: "OutOfcpu", Message: "Pod was rejected: Node didn't have enough resource: cpu, requested: 100, used: 3900, capacity: 4000",
	}}
	unschedulable := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hookwright-oversell-b-pending"}, Status: corev1.PodStatus{
		Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
			Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable",
			Message: "0/1 nodes are available: 1 Insufficient cpu. no new claims to deallocate, preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod.",
		}},
	}}
	initFailing := runningPod("hookwright-sidecar-a-init")
	initFailing.Status.Phase = corev1.PodPending
	initFailing.Status.ContainerStatuses[0].State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}
	initFailing.Status.InitContainerStatuses = []corev1.ContainerStatus{{
		Name: "init", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImageNeverPull", Message: `Container image "registry.example.com/init:1" is not present with pull policy of Never`}},
	}}
	failedCreate := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "hookwright-sidecar-a"}, Status: appsv1.DeploymentStatus{Conditions: []appsv1.DeploymentCondition{{
		Type: appsv1.DeploymentReplicaFailure, Status: corev1.ConditionTrue, Reason: "FailedCreate",
		Message: `pods "hookwright-sidecar-a-5d9c-x" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=0, limited: pods=0`,
	}}}}
	oddReason := waitingPod("p", "Some reason!", "x")
	mounting := waitingPod("mounting", "ContainerCreating", "")
	mounting.UID = "uid-mounting"
	mounting.Spec.NodeName = "real-node-0"
	runningWithUID := runningPod("running")
	runningWithUID.UID = "uid-running"
	runningWithUID.Spec.NodeName = "real-node-0"

	for _, tc := range []struct {
		name   string
		pods   []corev1.Pod
		dep    *appsv1.Deployment
		events []corev1.Event
		ok     bool
		reason string
		// want are substrings of the message.
		want []string
	}{
		{name: "no pods", ok: true, reason: reasonPodsHealthy, want: []string{"0 server pods"}},
		{name: "running and creating", pods: []corev1.Pod{runningPod("a"), waitingPod("b", "ContainerCreating", "")}, ok: true, reason: reasonPodsHealthy, want: []string{"2 server pods"}},
		{name: "completed container is no failure", pods: []corev1.Pod{completed}, ok: true, reason: reasonPodsHealthy},
		{
			name: "runAsNonRoot and a non-numeric image user", pods: []corev1.Pod{runningPod("a"), waitingPod("hookwright-sidecar-a-5d9c", "CreateContainerConfigError", nonNumeric)},
			reason: "CreateContainerConfigError",
			want:   []string{"pod hookwright-sidecar-a-5d9c container server: CreateContainerConfigError: container has runAsNonRoot and image has non-numeric user (nonroot)"},
		},
		{
			name: "missing Secret in env", pods: []corev1.Pod{waitingPod("p", "CreateContainerConfigError", `secret "proxy-env" not found`)},
			reason: "CreateContainerConfigError", want: []string{`secret "proxy-env" not found`},
		},
		{
			name: "image pull back-off", pods: []corev1.Pod{waitingPod("p", "ImagePullBackOff", `Back-off pulling image "registry.hookwright.local/hookwright:absent": ErrImagePull: not found`)},
			reason: "ImagePullBackOff", want: []string{"pod p container server: ImagePullBackOff: Back-off pulling image"},
		},
		{
			name: "crash loop names the last exit", pods: []corev1.Pod{crashing},
			reason: "CrashLoopBackOff", want: []string{"back-off 20s restarting failed container", `last exit code 2 (Error): unknown role "sidecar"`},
		},
		{name: "terminated non-zero", pods: []corev1.Pod{justExited}, reason: "OOMKilled", want: []string{"exit code 137"}},
		{name: "terminating pods are skipped", pods: []corev1.Pod{terminating, runningPod("new")}, ok: true, reason: reasonPodsHealthy},
		{name: "rejected by the kubelet's admission", pods: []corev1.Pod{evicted}, reason: "OutOfcpu", want: []string{"pod hookwright-oversell-b-ev: OutOfcpu: Pod was rejected"}},
		{name: "unschedulable", pods: []corev1.Pod{unschedulable}, reason: "Unschedulable", want: []string{"1 Insufficient cpu"}},
		{name: "init container", pods: []corev1.Pod{initFailing}, reason: "ErrImageNeverPull", want: []string{"container init: ErrImageNeverPull"}},
		{
			name: "no pod created", dep: failedCreate, reason: "FailedCreate",
			want: []string{"Deployment hookwright-sidecar-a: FailedCreate: pods \"hookwright-sidecar-a-5d9c-x\" is forbidden: exceeded quota"},
		},
		{
			name:   "several, sorted and summarized",
			pods:   []corev1.Pod{waitingPod("d", "ErrImagePull", "x"), waitingPod("c", "ErrImagePull", "x"), waitingPod("b", "ErrImagePull", "x"), waitingPod("a", "ImagePullBackOff", "y")},
			reason: "ImagePullBackOff", want: []string{"pod a container server: ImagePullBackOff: y, pod b", "and 1 more"},
		},
		{
			name: "missing Secret volume: the kubelet's Event", pods: []corev1.Pod{mounting, waitingPod("other", "ContainerCreating", "")},
			events: []corev1.Event{
				podEvent(mounting.UID, corev1.EventTypeWarning, "FailedMount", `MountVolume.SetUp failed for volume "serving-cert" : secret "old" not found`, 10),
				podEvent(mounting.UID, corev1.EventTypeWarning, "FailedMount", `MountVolume.SetUp failed for volume "serving-cert" : secret "byo-serving" not found`, 20),
				podEvent(mounting.UID, corev1.EventTypeNormal, "Scheduled", "Successfully assigned", 30),
				podEvent("another-pod", corev1.EventTypeWarning, "FailedCreatePodSandBox", "x", 40),
			},
			reason: "FailedMount", want: []string{`pod mounting: FailedMount: MountVolume.SetUp failed for volume "serving-cert" : secret "byo-serving" not found`},
		},
		{
			name: "a Starting pod without Warning Events is fine", pods: []corev1.Pod{mounting},
			events: []corev1.Event{podEvent(mounting.UID, corev1.EventTypeNormal, "Pulled", "ok", 1)},
			ok:     true, reason: reasonPodsHealthy,
		},
		{
			name: "Events of a running pod are not read", pods: []corev1.Pod{runningWithUID},
			events: []corev1.Event{podEvent(runningWithUID.UID, corev1.EventTypeWarning, "Unhealthy", "Readiness probe failed", 1)},
			ok:     true, reason: reasonPodsHealthy,
		},
		{name: "reason that is no condition reason", pods: []corev1.Pod{oddReason}, reason: reasonPodFailing, want: []string{"Some reason!: x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, reason, msg := ServerPodsState(tc.pods, tc.dep, tc.events)
			if ok != tc.ok || reason != tc.reason {
				t.Errorf("ServerPodsState = %v, %q, %q; want %v, %q", ok, reason, msg, tc.ok, tc.reason)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q lacks %q", msg, w)
				}
			}
			if len(msg) > maxProblemMessage {
				t.Errorf("message of %d bytes", len(msg))
			}
		})
	}
}

func TestServerPodsStateBoundsTheMessage(t *testing.T) {
	_, _, msg := ServerPodsState([]corev1.Pod{waitingPod("p", "CreateContainerError", strings.Repeat("x", 40000))}, nil, nil)
	if len(msg) > maxProblemMessage || !strings.HasSuffix(msg, "...") {
		t.Errorf("message of %d bytes, ends %q", len(msg), msg[len(msg)-5:])
	}
}

// A status update that changes nothing podProblems reads (a probe's
// readiness flip in a running pod is read by ServerAvailable through the
// Deployment) does not reconcile.
func TestPodHealthKey(t *testing.T) {
	a, b := runningPod("a"), runningPod("a")
	b.Status.ContainerStatuses[0].Ready = false
	if PodKey(&a) != PodKey(&b) {
		t.Error("readiness alone changed the key")
	}
	c := waitingPod("a", "CrashLoopBackOff", "back-off 10s")
	d := waitingPod("a", "CrashLoopBackOff", "back-off 20s")
	if PodKey(&c) == PodKey(&d) {
		t.Error("a new back-off message did not change the key")
	}
}

func podEvent(uid types.UID, typ, reason, msg string, at int64) corev1.Event {
	return corev1.Event{
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", UID: uid},
		Type:           typ, Reason: reason, Message: msg,
		LastTimestamp: metav1.Unix(at, 0),
	}
}

// Pods still creating containers are polled (their Events are not
// watched); a pending pod with a status reason, or one not yet scheduled,
// is not "Starting".
func TestStarting(t *testing.T) {
	creating := waitingPod("a", "ContainerCreating", "")
	creating.Spec.NodeName = "n"
	noStatus := corev1.Pod{Spec: corev1.PodSpec{NodeName: "n"}, Status: corev1.PodStatus{Phase: corev1.PodPending}}
	unscheduled := corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending}}
	pulling := waitingPod("b", "ImagePullBackOff", "")
	pulling.Spec.NodeName = "n"
	for _, tc := range []struct {
		name string
		pod  corev1.Pod
		want bool
	}{
		{"creating", creating, true},
		{"no container status yet", noStatus, true},
		{"not scheduled", unscheduled, false},
		{"failing with a reason", pulling, false},
		{"running", runningPod("r"), false},
	} {
		if got := Starting(&tc.pod); got != tc.want {
			t.Errorf("%s: Starting = %v, want %v", tc.name, got, tc.want)
		}
	}
}
