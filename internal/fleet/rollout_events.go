package fleet

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// PullFailureFromEvents finds in a pod's Events a failed pull of the new
// image of a container rec changed, seen at or after rec.At: a stop
// (StopImagePull) the pod's status may not show. The kubelet reports no
// Waiting reason for an init container whose last instance exited 0
// (v1.37 pkg/kubelet/kubelet_pods.go, convertToAPIContainerStatuses:
// "If the init container is terminated with exit code 0, it won't be
// restarted"), native sidecars included: a proxy that exits 0 on the
// SIGTERM of its image change stays Terminated (Completed) while its new
// image fails to pull, and the reason is in the kubelet's Events only
// (Warning Failed `Failed to pull image "<image>": ...`, Normal BackOff
// `Back-off pulling image "<image>"`). Events are matched by the
// container's field path and the image the pod's spec names now, so an
// older failure of another image is not taken for this one.
func PullFailureFromEvents(pod *corev1.Pod, rec Record, events []corev1.Event) Progress {
	for _, name := range slices.Sorted(mapsKeys(rec.Restarts)) {
		c := specContainer(pod, name)
		if c == nil {
			continue
		}
		paths := []string{"spec.containers{" + name + "}", "spec.initContainers{" + name + "}"}
		var failed, backoff *corev1.Event
		for i := range events {
			e := &events[i]
			if !slices.Contains(paths, e.InvolvedObject.FieldPath) || eventTime(e).Before(rec.At) {
				continue
			}
			switch {
			case e.Reason == "Failed" && strings.HasPrefix(e.Message, fmt.Sprintf("Failed to pull image %q", c.Image)):
				failed = e
			case e.Reason == "BackOff" && strings.HasPrefix(e.Message, fmt.Sprintf("Back-off pulling image %q", c.Image)):
				backoff = e
			}
		}
		if failed == nil {
			continue
		}
		reason := "ErrImagePull"
		if backoff != nil {
			reason = "ImagePullBackOff"
		}
		return Progress{Stop: StopImagePull, Message: fmt.Sprintf("pod %s/%s container %s: %s: %s (from the kubelet's Events: the container's status shows no reason)",
			pod.Namespace, pod.Name, name, reason, failed.Message)}
	}
	return Progress{}
}

// eventTime is when an Event last happened (core/v1 Events from the
// kubelet set lastTimestamp; events.k8s.io ones eventTime).
func eventTime(e *corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.FirstTimestamp.Time
}
