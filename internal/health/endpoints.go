package health

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// endpointSliceController is the endpointslice.kubernetes.io/managed-by
// value of the slices kube-controller-manager writes for a selector Service.
const endpointSliceController = "endpointslice-controller.k8s.io"

// ForeignEndpoints lists, for the EndpointSlices of one Service, what is
// not the operator's: slices another writer manages, endpoints that are
// not pods, and pods (looked up in pods by name) whose controller is not
// one of the ReplicaSets ours (by UID). Each entry is a short description,
// e.g. "pod mesh-servers/copy (controller: none)"; nil when all are ours.
func ForeignEndpoints(eps []discoveryv1.EndpointSlice, pods map[string]*corev1.Pod, ours map[types.UID]bool) []string {
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
