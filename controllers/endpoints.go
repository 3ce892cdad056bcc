package controllers

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/health"
)

// A pod anyone may create in a server namespace can copy the server pods'
// labels and so join the webhook Service: the API server would then send
// it admission reviews (every pod spec, every node status). Labels cannot
// prevent that (whoever can create the pod can read the labels), so the
// operator checks what is behind the Service: every endpoint of its
// EndpointSlices must be a pod of a ReplicaSet of the CR's Deployment, and
// every slice must be the EndpointSlice controller's. Anything else is
// reported in the EndpointsOwned condition and a Warning Event.
// +kubebuilder:rbac:groups=discovery.k8s.io,namespace=system,resources=endpointslices,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,namespace=system,resources=replicasets,verbs=get;list

// EndpointsOwned reasons.
const (
	reasonOwnEndpoints     = "OwnEndpointsOnly"
	ReasonForeignEndpoints = "ForeignEndpoints"
)

// checkEndpoints sets EndpointsOwned for the CR's Service (read uncached:
// a copied pod or a forged slice carries no label the cache selects).
func (r *reconciler) checkEndpoints(ctx context.Context, op desired.CR, svc *corev1.Service, dep *appsv1.Deployment) error {
	ns := svc.Namespace
	var eps discoveryv1.EndpointSliceList
	if err := r.APIReader.List(ctx, &eps, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: svc.Name}); err != nil {
		return fmt.Errorf("list EndpointSlices of Service %s/%s: %w", ns, svc.Name, err)
	}
	ours := map[types.UID]bool{}
	live := &appsv1.Deployment{}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(dep), live); err == nil {
		var rss appsv1.ReplicaSetList
		if err := r.APIReader.List(ctx, &rss, client.InNamespace(ns), client.MatchingLabels(desired.SelectorLabels(op))); err != nil {
			return fmt.Errorf("list ReplicaSets in %s: %w", ns, err)
		}
		for i := range rss.Items {
			if metav1.IsControlledBy(&rss.Items[i], live) {
				ours[rss.Items[i].UID] = true
			}
		}
	}
	pods := map[string]*corev1.Pod{}
	if len(eps.Items) > 0 {
		// A pod behind the Service matches its selector, so only those.
		var pl corev1.PodList
		if err := r.APIReader.List(ctx, &pl, client.InNamespace(ns), client.MatchingLabels(svc.Spec.Selector)); err != nil {
			return fmt.Errorf("list pods in %s: %w", ns, err)
		}
		for i := range pl.Items {
			pods[pl.Items[i].Name] = &pl.Items[i]
		}
	}
	foreign := health.ForeignEndpoints(eps.Items, pods, ours)
	if len(foreign) == 0 {
		r.setCondition(op, v1alpha1.ConditionEndpointsOwned, true, reasonOwnEndpoints,
			fmt.Sprintf("Service %s/%s reaches only pods of Deployment %s", ns, svc.Name, dep.Name))
		return nil
	}
	msg := fmt.Sprintf("Service %s/%s also reaches %s: they receive admission reviews; remove them, and check who may create pods in %s",
		ns, svc.Name, health.Summarize(foreign, 5), ns)
	if c := apimeta.FindStatusCondition(op.Conditions(), v1alpha1.ConditionEndpointsOwned); c == nil || c.Message != msg {
		r.Recorder.Eventf(op.Object, svc, corev1.EventTypeWarning, ReasonForeignEndpoints, "Check", msg)
	}
	r.setCondition(op, v1alpha1.ConditionEndpointsOwned, false, ReasonForeignEndpoints, msg)
	return nil
}
