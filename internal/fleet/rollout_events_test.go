package fleet

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The kubelet's Events of a native sidecar whose new image cannot be
// pulled, as a v1.37 kubelet wrote them on a real node (test/node
// TestRolloutOnTheRealNode) while the container's status stayed
// Terminated (Completed, exit 0).
func TestPullFailureFromEvents(t *testing.T) {
	at := time.Date(2026, 12, 2, 14, 24, 2, 0, time.UTC)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "lab", Name: "web-1"},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "proxy", Image: "ghcr.io/hookwright/proxy:does-not-exist"}},
			Containers:     []corev1.Container{{Name: "nginx", Image: "nginx:1.23-alpine"}},
		},
	}
	rec := Record{Revision: "r2", At: at, Restarts: map[string]int32{"proxy": 1}}
	ev := func(reason, path, msg string, when time.Time) corev1.Event {
		return corev1.Event{Reason: reason, Message: msg, LastTimestamp: metav1.NewTime(when),
			InvolvedObject: corev1.ObjectReference{FieldPath: path}}
	}
	failed := `Failed to pull image "ghcr.io/hookwright/proxy:does-not-exist": rpc error: code = NotFound desc = failed to pull and unpack image: not found`
	for _, tc := range []struct {
		name   string
		events []corev1.Event
		want   string // reason in the message; "" for no stop
	}{
		{"none", nil, ""},
		{"pulling only", []corev1.Event{ev("Pulling", "spec.initContainers{proxy}", `Pulling image "ghcr.io/hookwright/proxy:does-not-exist"`, at)}, ""},
		{"failed", []corev1.Event{
			ev("Failed", "spec.initContainers{proxy}", failed, at.Add(time.Second)),
			ev("Failed", "spec.initContainers{proxy}", "Error: ErrImagePull", at.Add(time.Second)),
		}, "ErrImagePull"},
		{"backing off", []corev1.Event{
			ev("Failed", "spec.initContainers{proxy}", failed, at.Add(time.Second)),
			ev("BackOff", "spec.initContainers{proxy}", `Back-off pulling image "ghcr.io/hookwright/proxy:does-not-exist"`, at.Add(3*time.Second)),
		}, "ImagePullBackOff"},
		{"before the change", []corev1.Event{ev("Failed", "spec.initContainers{proxy}", failed, at.Add(-time.Second))}, ""},
		{"another image", []corev1.Event{ev("Failed", "spec.initContainers{proxy}",
			`Failed to pull image "ghcr.io/hookwright/proxy:older": not found`, at.Add(time.Second))}, ""},
		{"another container", []corev1.Event{ev("Failed", "spec.containers{nginx}", failed, at.Add(time.Second))}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := PullFailureFromEvents(pod, rec, tc.events)
			if tc.want == "" {
				if p.Stop != "" {
					t.Errorf("stop %s %q, want none", p.Stop, p.Message)
				}
				return
			}
			if p.Stop != StopImagePull || !strings.Contains(p.Message, "container proxy: "+tc.want+": "+failed) {
				t.Errorf("stop %s %q, want %s naming %s and the kubelet's message", p.Stop, p.Message, StopImagePull, tc.want)
			}
		})
	}
}
