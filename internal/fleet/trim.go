package fleet

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// annotationPrefix keeps the injector's own annotations (inject, status,
// templates, native-sidecar): the only ones Decide and Classify read.
const annotationPrefix = "sidecar.hookwright.io/"

// TrimPod is the operator's pod informer transform (a controller-runtime
// cache TransformFunc): it keeps the metadata (name, namespace, UID,
// resourceVersion, labels, the sidecar.hookwright.io/ annotations and the
// mirror pod annotation, owner references, creation and deletion time),
// spec.hostNetwork, spec.priorityClassName (v1alpha1.Spared), the names,
// images and resources of containers and init containers (and an init
// container's restartPolicy), status.phase and the Ready condition, and
// drops the rest (managedFields, env, probes, volumes, container
// statuses) before the pod enters the cache. Another type (a tombstone)
// is returned unchanged.
func TrimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	var ann map[string]string
	for k, v := range pod.Annotations {
		if strings.HasPrefix(k, annotationPrefix) || k == v1alpha1.MirrorPodAnnotation {
			if ann == nil {
				ann = map[string]string{}
			}
			ann[k] = v
		}
	}
	out := &corev1.Pod{
		TypeMeta: pod.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
			Labels: pod.Labels, Annotations: ann, OwnerReferences: pod.OwnerReferences,
			CreationTimestamp: pod.CreationTimestamp, DeletionTimestamp: pod.DeletionTimestamp,
		},
		Spec: corev1.PodSpec{
			HostNetwork:       pod.Spec.HostNetwork,
			PriorityClassName: pod.Spec.PriorityClassName,
			InitContainers:    trimContainers(pod.Spec.InitContainers),
			Containers:        trimContainers(pod.Spec.Containers),
		},
		Status: corev1.PodStatus{Phase: pod.Status.Phase},
	}
	if c := ReadyCondition(pod); c != nil {
		out.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
	}
	return out, nil
}

func trimContainers(cs []corev1.Container) []corev1.Container {
	if len(cs) == 0 {
		return nil
	}
	out := make([]corev1.Container, len(cs))
	for i, c := range cs {
		out[i] = corev1.Container{Name: c.Name, Image: c.Image, Resources: c.Resources, RestartPolicy: c.RestartPolicy}
	}
	return out
}

// TrimNamespace keeps a namespace's name, resourceVersion and labels (what
// spec.namespaceSelector reads).
func TrimNamespace(obj any) (any, error) {
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return obj, nil
	}
	return &corev1.Namespace{TypeMeta: ns.TypeMeta, ObjectMeta: metav1.ObjectMeta{
		Name: ns.Name, UID: ns.UID, ResourceVersion: ns.ResourceVersion, Labels: ns.Labels,
	}}, nil
}
