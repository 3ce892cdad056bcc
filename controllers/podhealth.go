package controllers

import (
	"context"
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
	"github.com/hookwright/hookwright/internal/health"
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

// startingPoll is how often the Events of starting server pods are read
// again (nothing watches them).
const startingPoll = 5 * time.Second

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
		if !health.Starting(p) {
			continue
		}
		poll = startingPoll
		var el corev1.EventList
		if err := r.APIReader.List(ctx, &el, client.InNamespace(p.Namespace),
			client.MatchingFields{"involvedObject.uid": string(p.UID), "type": corev1.EventTypeWarning}); err != nil {
			log.FromContext(ctx).V(1).Info("list Events of a health.Starting server pod", "pod", p.Name, "error", err.Error())
			continue
		}
		events = append(events, el.Items...)
	}
	dep := &appsv1.Deployment{}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), dep); err != nil {
		dep = nil
	}
	ok, reason, msg := health.ServerPodsState(pods.Items, dep, events)
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

// podHealthKey is health.PodKey of a watched object ("" for a non-pod).
func podHealthKey(o client.Object) string {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return ""
	}
	return health.PodKey(p)
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
