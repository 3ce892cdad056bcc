package sources

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// The CA controller is woken by a CR's spec, annotations (renew
// requests), labels, finalizers and deletion, never by its status writes.
func TestPlanInputsChanged(t *testing.T) {
	base := func() *v1alpha1.SidecarInjector {
		return &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: "mesh", Generation: 3, ResourceVersion: "10",
			Annotations: map[string]string{"a": "1"}, Labels: map[string]string{"l": "1"}, Finalizers: []string{"f"}}}
	}
	now := metav1.Now()
	cases := []struct {
		name string
		mut  func(*v1alpha1.SidecarInjector)
		want bool
	}{
		{"status write", func(s *v1alpha1.SidecarInjector) {
			s.ResourceVersion = "11"
			s.Status.Fleet = &v1alpha1.FleetStatus{NamespacesTotal: 4}
			s.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue}}
		}, false},
		{"spec change", func(s *v1alpha1.SidecarInjector) { s.Generation = 4 }, true},
		{"renew request", func(s *v1alpha1.SidecarInjector) { s.Annotations[v1alpha1.AnnotationRenewCertificate] = "t1" }, true},
		{"label", func(s *v1alpha1.SidecarInjector) { s.Labels["l"] = "2" }, true},
		{"finalizer removed", func(s *v1alpha1.SidecarInjector) { s.Finalizers = nil }, true},
		{"being deleted", func(s *v1alpha1.SidecarInjector) { s.DeletionTimestamp = &now }, true},
	}
	for _, tc := range cases {
		old, cur := base(), base()
		tc.mut(cur)
		if got := planInputsChanged(old, cur); got != tc.want {
			t.Errorf("%s: %t, want %t", tc.name, got, tc.want)
		}
	}
}
