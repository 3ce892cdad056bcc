package rollout

import (
	"context"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/fleet"
)

// workload is one kind of owner the rollout restarts, as kubectl rollout
// restart does (k8s.io/kubectl/pkg/polymorphichelpers/objectrestarter.go):
// its objects, their list, and the pod template the restart stamps.
type workload struct {
	kind     string
	resource string // in group apps
	new      func() client.Object
	newList  func() client.ObjectList
	template func(client.Object) *corev1.PodTemplateSpec
}

// workloads are the owners the rollout restarts. A ReplicaSet's pods are
// restarted through its Deployment (owner).
var workloads = []workload{
	{kind: "Deployment", resource: "deployments",
		new:      func() client.Object { return &appsv1.Deployment{} },
		newList:  func() client.ObjectList { return &appsv1.DeploymentList{} },
		template: func(o client.Object) *corev1.PodTemplateSpec { return &o.(*appsv1.Deployment).Spec.Template }},
	{kind: "StatefulSet", resource: "statefulsets",
		new:      func() client.Object { return &appsv1.StatefulSet{} },
		newList:  func() client.ObjectList { return &appsv1.StatefulSetList{} },
		template: func(o client.Object) *corev1.PodTemplateSpec { return &o.(*appsv1.StatefulSet).Spec.Template }},
	{kind: "DaemonSet", resource: "daemonsets",
		new:      func() client.Object { return &appsv1.DaemonSet{} },
		newList:  func() client.ObjectList { return &appsv1.DaemonSetList{} },
		template: func(o client.Object) *corev1.PodTemplateSpec { return &o.(*appsv1.DaemonSet).Spec.Template }},
}

func workloadOf(kind string) (workload, bool) {
	for _, w := range workloads {
		if w.kind == kind {
			return w, true
		}
	}
	return workload{}, false
}

// ownerEntry parses an owner's entry of status.rollout.inProgress,
// "Kind/namespace/name"; ok is false for a pod's, "namespace/name".
func ownerEntry(e string) (w workload, key types.NamespacedName, ok bool) {
	kind, rest, ok := strings.Cut(e, "/")
	if !ok {
		return workload{}, key, false
	}
	if w, ok = workloadOf(kind); !ok {
		return workload{}, key, false
	}
	ns, name, ok := strings.Cut(rest, "/")
	return w, types.NamespacedName{Namespace: ns, Name: name}, ok
}

// isOwnerEntry tells an owner's entry of status.rollout.inProgress from a
// pod's (a namespace is never a kind: kinds are capitalised).
func isOwnerEntry(e string) bool {
	kind, _, _ := strings.Cut(e, "/")
	_, ok := workloadOf(kind)
	return ok
}

// restartedAt is the kubectl.kubernetes.io/restartedAt of obj's pod
// template (zero when absent or not RFC 3339).
func (w workload) restartedAt(obj client.Object) time.Time {
	t, err := time.Parse(time.RFC3339, w.template(obj).Annotations[v1alpha1.RestartedAtKey])
	if err != nil {
		return time.Time{}
	}
	return t
}

// ownerKey is the key of a pod's controller in the memo's rsOwners.
func ownerKey(pod *corev1.Pod) string {
	ref := metav1.GetControllerOf(pod)
	if ref == nil {
		return ""
	}
	return ref.Kind + "/" + pod.Namespace + "/" + ref.Name
}

// knownOwner is the owner the rollout restarts for pod when known without
// a read: its controller, or a ReplicaSet's Deployment already resolved.
func (r *Roller) knownOwner(pod *corev1.Pod) (fleet.Owner, bool) {
	if o, why := fleet.PodOwner(pod); why == "" && o.Kind != "ReplicaSet" {
		return o, true
	}
	return r.memo.rsOwner(ownerKey(pod))
}

// owner resolves the owner the rollout restarts for pod: a ReplicaSet's
// Deployment (read once per ReplicaSet), a StatefulSet or DaemonSet; else
// why it has none.
func (r *Roller) owner(ctx context.Context, pod *corev1.Pod) (fleet.Owner, string) {
	o, why := fleet.PodOwner(pod)
	if why != "" || o.Kind != "ReplicaSet" {
		return o, why
	}
	k := ownerKey(pod)
	if d, ok := r.memo.rsOwner(k); ok {
		return d, ""
	}
	rs := &appsv1.ReplicaSet{}
	if err := r.reader.Get(ctx, types.NamespacedName{Namespace: o.Namespace, Name: o.Name}, rs); err != nil {
		return o, "its ReplicaSet cannot be read: " + apiMessage(err)
	}
	ref := metav1.GetControllerOf(rs)
	if ref == nil || ref.Kind != "Deployment" {
		return o, "its ReplicaSet has no Deployment to restart"
	}
	d := fleet.Owner{Kind: "Deployment", Namespace: o.Namespace, Name: ref.Name}
	r.memo.setRSOwner(k, d)
	return d, ""
}
