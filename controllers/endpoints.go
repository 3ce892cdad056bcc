package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
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

// endpointSliceController is the endpointslice.kubernetes.io/managed-by
// value of the slices kube-controller-manager writes for a selector Service.
const endpointSliceController = "endpointslice-controller.k8s.io"

// foreignEndpoints lists, for the EndpointSlices of one Service, what is
// not the operator's: slices another writer manages, endpoints that are
// not pods, and pods (looked up in pods by name) whose controller is not
// one of the ReplicaSets ours (by UID). Each entry is a short description,
// e.g. "pod mesh-servers/copy (controller: none)"; nil when all are ours.
func foreignEndpoints(eps []discoveryv1.EndpointSlice, pods map[string]*corev1.Pod, ours map[types.UID]bool) []string {
	var out []string
	for i := range eps {
		s := &eps[i]
		if m := s.Labels[discoveryv1.LabelManagedBy]; m != endpointSliceController {
			out = append(out, fmt.Sprintf("EndpointSlice %s/%s (managed by %q)", s.Namespace, s.Name, m))
			continue
		}
		for _, e := range s.Endpoints {
			ref := e.TargetRef
			if ref == nil || ref.Kind != "Pod" {
				out = append(out, fmt.Sprintf("endpoint %s in EndpointSlice %s/%s (not a pod)", strings.Join(e.Addresses, ","), s.Namespace, s.Name))
				continue
			}
			p := pods[ref.Name]
			switch c := controllerOf(p); {
			case p == nil:
				// Gone since the slice was written, or not yet listed: the
				// next reconcile sees it again.
			case p.UID != ref.UID:
				out = append(out, fmt.Sprintf("pod %s/%s (uid %s in the EndpointSlice, %s live)", p.Namespace, p.Name, ref.UID, p.UID))
			case c == nil:
				out = append(out, fmt.Sprintf("pod %s/%s (controller: none)", p.Namespace, p.Name))
			case c.Kind != "ReplicaSet" || !ours[c.UID]:
				out = append(out, fmt.Sprintf("pod %s/%s (controller: %s %s)", p.Namespace, p.Name, c.Kind, c.Name))
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func controllerOf(p *corev1.Pod) *metav1.OwnerReference {
	if p == nil {
		return nil
	}
	return metav1.GetControllerOf(p)
}

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
	foreign := foreignEndpoints(eps.Items, pods, ours)
	if len(foreign) == 0 {
		r.setCondition(op, v1alpha1.ConditionEndpointsOwned, true, reasonOwnEndpoints,
			fmt.Sprintf("Service %s/%s reaches only pods of Deployment %s", ns, svc.Name, dep.Name))
		return nil
	}
	msg := fmt.Sprintf("Service %s/%s also reaches %s: they receive admission reviews; remove them, and check who may create pods in %s",
		ns, svc.Name, summarize(foreign, 5), ns)
	if c := apimeta.FindStatusCondition(op.Conditions(), v1alpha1.ConditionEndpointsOwned); c == nil || c.Message != msg {
		r.Recorder.Eventf(op.Object, svc, corev1.EventTypeWarning, ReasonForeignEndpoints, "Check", msg)
	}
	r.setCondition(op, v1alpha1.ConditionEndpointsOwned, false, ReasonForeignEndpoints, msg)
	return nil
}
