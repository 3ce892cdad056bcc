package v1alpha1

import (
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
)

// The spared set: pods every SidecarInjector webhook leaves alone, so that
// what a cluster needs to recover is admitted even while an injector with
// failurePolicy Fail is down (the Kubernetes "admission webhook good
// practices" page). One definition serves the webhook configuration
// (SpareMatchConditions, rendered into CEL matchConditions, KEP-3716, GA
// in 1.30) and every decision about running pods (Spared, read by
// sidecar.Decide), so the fleet never counts a pod the API server never
// sends to the injector.
const (
	// PriorityNodeCritical and PriorityClusterCritical are the two
	// built-in critical priority classes (pkg/apis/scheduling): CNI, CSI and
	// kube-proxy daemons, without which a node never becomes Ready and the
	// injector's own server never starts (netbird kubernetes-operator #168).
	PriorityNodeCritical    = "system-node-critical"
	PriorityClusterCritical = "system-cluster-critical"
	// MirrorPodAnnotation marks a mirror pod, the API's copy of a
	// kubelet's static pod: the API server refuses changes to it anyway.
	MirrorPodAnnotation = corev1.MirrorPodAnnotationKey

	// MatchNotCritical and MatchNotMirror name the matchConditions.
	MatchNotCritical = "not-critical-priority"
	MatchNotMirror   = "not-mirror-pod"
)

// CriticalPriorityClasses are the spared priority classes, in CEL order.
func CriticalPriorityClasses() []string {
	return []string{PriorityNodeCritical, PriorityClusterCritical}
}

// SpareMatchConditions are the matchConditions of every pod webhook of a
// SidecarInjector. A pod for which one is false is admitted unchanged and
// the webhook is not called. The namespaces spared installation-wide are
// kept out by the namespaceSelector instead (internal/desired).
func SpareMatchConditions() []admissionregistrationv1.MatchCondition {
	quoted := make([]string, 0, 2)
	for _, c := range CriticalPriorityClasses() {
		quoted = append(quoted, "'"+c+"'")
	}
	return []admissionregistrationv1.MatchCondition{
		{Name: MatchNotCritical, Expression: "!has(object.spec.priorityClassName) || !(object.spec.priorityClassName in [" + strings.Join(quoted, ", ") + "])"},
		{Name: MatchNotMirror, Expression: "!has(object.metadata.annotations) || !('" + MirrorPodAnnotation + "' in object.metadata.annotations)"},
	}
}

// Spared tells why a pod in namespace is spared, "" when it is not: its
// priority class ("system-node-critical"), its mirror annotation ("mirror
// pod"), or namespace being one of sparedNamespaces (the installation's
// --excluded-namespaces and, in mode CertManager, cert-manager's; "namespace
// excluded installation-wide"). The checks are those of
// SpareMatchConditions, in that order, then the namespace.
func Spared(pod *corev1.Pod, namespace string, sparedNamespaces []string) string {
	if slices.Contains(CriticalPriorityClasses(), pod.Spec.PriorityClassName) {
		return pod.Spec.PriorityClassName
	}
	if _, ok := pod.Annotations[MirrorPodAnnotation]; ok {
		return "mirror pod (annotation " + MirrorPodAnnotation + ")"
	}
	if namespace != "" && slices.Contains(sparedNamespaces, namespace) {
		return "namespace " + namespace + " excluded installation-wide"
	}
	return ""
}
