package cluster

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// KubeletNode registers a node that kwok does not manage and whose pods
// this runner reports, as that node's kubelet would: a Heartbeater posts
// the node's status every 10 s, and the runner sets each pod's status
// (Running, a pod IP, and Ready only once the readinessProbe of every
// container it runs succeeds; pods of other images are Ready at once, as
// kwok makes them) and deletes a terminating pod once its processes have
// stopped. Unlike kwok's pods, these are not Ready before their server
// listens, so a Deployment's availability (and whatever waits for it) is
// honest. Call before Start.
func (r *PodRunner) KubeletNode(ctx context.Context, name string, labels map[string]string, cpu, memory string) (*Heartbeater, error) {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory),
		corev1.ResourcePods: resource.MustParse("110"),
	}
	h, err := r.c.NewHeartbeater(ctx, KubeletNode{Name: name, Labels: labels, Capacity: capacity, Allocatable: capacity.DeepCopy()})
	if err != nil {
		return nil, err
	}
	// Pods do run here: drop the Heartbeater's keep-off taint.
	patch := []byte(`{"spec":{"taints":null}}`)
	if _, err := r.c.Clientset.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return nil, err
	}
	// Post status every period, so the node lifecycle controller (which
	// would otherwise read the kubelet's Lease) sees a live node.
	h.Report = h.Period
	if err := h.Start(ctx); err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.kubelet[name] = true
	r.mu.Unlock()
	return h, nil
}

func (r *PodRunner) isKubeletNode(node string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.kubelet[node]
}

// podIPFor returns the pod IP the runner assigned (10.245.x.y).
func (r *PodRunner) podIPFor(uid types.UID) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ip, ok := r.podIPs[uid]; ok {
		return ip
	}
	r.nextIP++
	ip := fmt.Sprintf("10.245.%d.%d", r.nextIP/250, r.nextIP%250+1)
	r.podIPs[uid] = ip
	return ip
}

// kubeletSync reports the status of pods bound to the runner's kubelet
// nodes and deletes terminated ones (grace 0 once nothing runs), as the
// kubelet's status manager does.
func (r *PodRunner) kubeletSync(ctx context.Context, pods []*corev1.Pod) {
	for _, p := range pods {
		if !r.isKubeletNode(p.Spec.NodeName) {
			continue
		}
		if p.DeletionTimestamp != nil {
			r.mu.Lock()
			_, running := r.running[p.UID]
			stopping := r.stopping[p.UID]
			r.mu.Unlock()
			if !running && !stopping {
				err := r.c.Clientset.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
					GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &p.UID},
				})
				if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
					r.opts.Logf("pod runner: delete %s/%s: %v", p.Namespace, p.Name, err)
				}
			}
			continue
		}
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		ready, started := true, map[string]RunningContainer{}
		r.mu.Lock()
		rp, running := r.running[p.UID]
		r.mu.Unlock()
		if r.runnable(p) {
			if !running {
				continue // not started yet (e.g. its Secret is missing): stays Pending
			}
			for _, c := range rp.ctrs {
				rc := RunningContainer{Name: c.name, Ready: c.ready.Load(), Starts: int(c.starts.Load())}
				started[c.name] = rc
				ready = ready && rc.Ready
			}
		}
		want := r.podStatus(p, ready, started)
		if statusSame(&p.Status, want) {
			continue
		}
		up := p.DeepCopy()
		up.Status = *want
		if _, err := r.c.Clientset.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, up, metav1.UpdateOptions{}); err != nil &&
			!apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			r.opts.Logf("pod runner: status of %s/%s: %v", p.Namespace, p.Name, err)
		}
	}
}

func (r *PodRunner) podStatus(p *corev1.Pod, ready bool, started map[string]RunningContainer) *corev1.PodStatus {
	now := metav1.Now()
	st := p.Status.DeepCopy()
	st.Phase = corev1.PodRunning
	st.HostIP, st.HostIPs = "10.96.0.2", []corev1.HostIP{{IP: "10.96.0.2"}}
	ip := r.podIPFor(p.UID)
	st.PodIP, st.PodIPs = ip, []corev1.PodIP{{IP: ip}}
	if st.StartTime == nil {
		st.StartTime = &now
	}
	setCond := func(t corev1.PodConditionType, ok bool) {
		s := corev1.ConditionFalse
		if ok {
			s = corev1.ConditionTrue
		}
		for i := range st.Conditions {
			if st.Conditions[i].Type == t {
				if st.Conditions[i].Status != s {
					st.Conditions[i].Status, st.Conditions[i].LastTransitionTime = s, now
				}
				return
			}
		}
		st.Conditions = append(st.Conditions, corev1.PodCondition{Type: t, Status: s, LastTransitionTime: now})
	}
	setCond(corev1.PodReadyToStartContainers, true)
	setCond(corev1.PodInitialized, true)
	setCond(corev1.ContainersReady, ready)
	setCond(corev1.PodReady, ready)
	st.ContainerStatuses = nil
	for _, c := range p.Spec.Containers {
		cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: *st.StartTime}}}
		if rc, ok := started[c.Name]; ok {
			cs.Ready = rc.Ready
			cs.RestartCount = int32(max(rc.Starts-1, 0))
		}
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
	}
	st.InitContainerStatuses = nil
	for _, c := range p.Spec.InitContainers {
		cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true}
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			cs.Started = ptr.To(true)
			cs.State.Running = &corev1.ContainerStateRunning{StartedAt: *st.StartTime}
		} else {
			cs.State.Terminated = &corev1.ContainerStateTerminated{Reason: "Completed", StartedAt: *st.StartTime, FinishedAt: *st.StartTime}
		}
		st.InitContainerStatuses = append(st.InitContainerStatuses, cs)
	}
	return st
}

// statusSame compares what the runner reports: phase, pod IP and the
// readiness of the pod and each container.
func statusSame(a, b *corev1.PodStatus) bool {
	if a.Phase != b.Phase || a.PodIP != b.PodIP || len(a.ContainerStatuses) != len(b.ContainerStatuses) ||
		len(a.InitContainerStatuses) != len(b.InitContainerStatuses) {
		return false
	}
	cond := func(s *corev1.PodStatus, t corev1.PodConditionType) corev1.ConditionStatus {
		for _, c := range s.Conditions {
			if c.Type == t {
				return c.Status
			}
		}
		return ""
	}
	for _, t := range []corev1.PodConditionType{corev1.PodReady, corev1.ContainersReady, corev1.PodInitialized} {
		if cond(a, t) != cond(b, t) {
			return false
		}
	}
	for i := range a.ContainerStatuses {
		if a.ContainerStatuses[i].Ready != b.ContainerStatuses[i].Ready || a.ContainerStatuses[i].RestartCount != b.ContainerStatuses[i].RestartCount {
			return false
		}
	}
	return true
}
