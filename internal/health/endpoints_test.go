package health

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

func TestForeignEndpoints(t *testing.T) {
	pod := func(name string, uid types.UID, owner *metav1.OwnerReference) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "srv", UID: uid}}
		if owner != nil {
			p.OwnerReferences = []metav1.OwnerReference{*owner}
		}
		return p
	}
	rs := func(uid types.UID) *metav1.OwnerReference {
		return &metav1.OwnerReference{Kind: "ReplicaSet", Name: "rs-" + string(uid), UID: uid, Controller: ptr.To(true)}
	}
	pods := map[string]*corev1.Pod{
		"ours-a": pod("ours-a", "pa", rs("rs1")),
		"ours-b": pod("ours-b", "pb", rs("rs2")),
		"copy":   pod("copy", "pc", nil),
		"other":  pod("other", "pd", rs("rs9")),
		"job":    pod("job", "pe", &metav1.OwnerReference{Kind: "Job", Name: "j", UID: "j1", Controller: ptr.To(true)}),
	}
	ours := map[types.UID]bool{"rs1": true, "rs2": true}
	ep := func(name string, uid types.UID) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: name, UID: uid}}
	}
	slice := func(managedBy string, eps ...discoveryv1.Endpoint) discoveryv1.EndpointSlice {
		return discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "svc-x", Namespace: "srv",
			Labels: map[string]string{discoveryv1.LabelManagedBy: managedBy}}, Endpoints: eps}
	}
	for _, tc := range []struct {
		name  string
		eps   []discoveryv1.EndpointSlice
		wants []string // substrings, one per foreign entry
	}{
		{"only ours", []discoveryv1.EndpointSlice{slice(endpointSliceController, ep("ours-a", "pa"), ep("ours-b", "pb"))}, nil},
		{"pod gone since", []discoveryv1.EndpointSlice{slice(endpointSliceController, ep("ours-a", "pa"), ep("vanished", "px"))}, nil},
		{"copied labels, no controller", []discoveryv1.EndpointSlice{slice(endpointSliceController, ep("ours-a", "pa"), ep("copy", "pc"))}, []string{"pod srv/copy (controller: none)"}},
		{"another ReplicaSet", []discoveryv1.EndpointSlice{slice(endpointSliceController, ep("other", "pd"))}, []string{"ReplicaSet rs-rs9"}},
		{"a Job's pod", []discoveryv1.EndpointSlice{slice(endpointSliceController, ep("job", "pe"))}, []string{"Job j"}},
		{"recreated under the same name", []discoveryv1.EndpointSlice{slice(endpointSliceController, ep("ours-a", "old"))}, []string{"uid old"}},
		{"forged slice", []discoveryv1.EndpointSlice{slice("someone", ep("ours-a", "pa"))}, []string{`managed by "someone"`}},
		{"not a pod", []discoveryv1.EndpointSlice{slice(endpointSliceController, discoveryv1.Endpoint{Addresses: []string{"192.0.2.7"}})}, []string{"endpoint 192.0.2.7 in EndpointSlice srv/svc-x (not a pod)"}},
	} {
		got := ForeignEndpoints(tc.eps, pods, ours)
		if len(got) != len(tc.wants) {
			t.Errorf("%s: %v, want %d entries", tc.name, got, len(tc.wants))
			continue
		}
		for _, w := range tc.wants {
			if !strings.Contains(strings.Join(got, "; "), w) {
				t.Errorf("%s: %v lacks %q", tc.name, got, w)
			}
		}
	}
}
