package manager

import (
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestOperatorGone(t *testing.T) {
	now := metav1.Now()
	for _, c := range []struct {
		name  string
		dep   *appsv1.Deployment
		found bool
		want  bool
	}{
		{"deleted", nil, false, true},
		{"being deleted", &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2)}}, true, true},
		{"scaled to zero", &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](0)}}, true, true},
		{"rolling or restarting", &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2)}}, true, false},
		{"replicas unset (defaults to 1)", &appsv1.Deployment{}, true, false},
	} {
		if got := OperatorGone(c.dep, c.found); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestFailOpen(t *testing.T) {
	fail, ignore := admissionregistrationv1.Fail, admissionregistrationv1.Ignore
	ps := []*admissionregistrationv1.FailurePolicyType{&fail, &ignore, nil}
	if !failOpen(ps) {
		t.Fatal("no change reported")
	}
	for i, p := range ps {
		if p == nil || *p != ignore {
			t.Fatalf("webhook %d: %v", i, p)
		}
	}
	if failOpen(ps) {
		t.Fatal("all Ignore already: change reported")
	}
}

func TestIgnorePatch(t *testing.T) {
	if got := string(ignorePatch(2)); got != `[{"op":"add","path":"/webhooks/0/failurePolicy","value":"Ignore"},{"op":"add","path":"/webhooks/1/failurePolicy","value":"Ignore"}]` {
		t.Fatal(got)
	}
}
