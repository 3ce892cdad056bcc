package usageratio

import (
	corev1 "k8s.io/api/core/v1"
)

// PodRequests is the cpu and memory a pod reserves on its node, as the
// scheduler counts it (k8s.io/component-helpers/resource.podRequests, KEP-753
// for sidecars): the larger of (regular containers + restartable init
// containers) and, for each regular init container, itself plus the
// restartable init containers started before it; plus spec.overhead.
func PodRequests(p *corev1.Pod) corev1.ResourceList {
	sum := corev1.ResourceList{}
	add := func(into corev1.ResourceList, l corev1.ResourceList) {
		for _, k := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if q, ok := l[k]; ok {
				v := into[k]
				v.Add(q)
				into[k] = v
			}
		}
	}
	maxInto := func(into corev1.ResourceList, l corev1.ResourceList) {
		for _, k := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if q, ok := l[k]; ok {
				if v := into[k]; q.Cmp(v) > 0 {
					into[k] = q.DeepCopy()
				}
			}
		}
	}
	for _, c := range p.Spec.Containers {
		add(sum, c.Resources.Requests)
	}
	sidecars := corev1.ResourceList{}
	initMax := corev1.ResourceList{}
	for _, c := range p.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			add(sidecars, c.Resources.Requests)
			continue
		}
		step := corev1.ResourceList{}
		add(step, sidecars)
		add(step, c.Resources.Requests)
		maxInto(initMax, step)
	}
	add(sum, sidecars)
	maxInto(sum, initMax)
	add(sum, p.Spec.Overhead)
	return sum
}
