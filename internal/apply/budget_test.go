package apply

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestRepairBudget(t *testing.T) {
	r := &Applier{Budget: Budget{Max: 3, Window: time.Minute}}
	now := t0
	for i := range 3 {
		if w := r.checkBudget("k", now); w != 0 {
			t.Fatalf("repair %d: wait %s", i, w)
		}
		r.recordRepair("k", now)
		now = now.Add(10 * time.Second)
	}
	// Fourth drift 30 s after the first repair: wait until the first ages out.
	if w := r.checkBudget("k", now); w != 30*time.Second {
		t.Fatalf("wait %s, want 30s", w)
	}
	if w := r.checkBudget("other", now); w != 0 {
		t.Fatal("budgets are per object")
	}
	if w := r.checkBudget("k", t0.Add(time.Minute)); w != 0 {
		t.Fatalf("after the window: wait %s", w)
	}
	if d := (&Applier{}).budget(); d != defaultBudget {
		t.Fatalf("default budget %+v", d)
	}
}

func TestOtherWriters(t *testing.T) {
	at := func(d time.Duration) *metav1.Time { return &metav1.Time{Time: t0.Add(d)} }
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{ManagedFields: []metav1.ManagedFieldsEntry{
		{Manager: FieldManager, Operation: metav1.ManagedFieldsOperationApply, Time: at(3 * time.Second)},
		{Manager: "kubectl-edit", Operation: metav1.ManagedFieldsOperationUpdate, Time: at(time.Second)},
		{Manager: "argocd", Operation: metav1.ManagedFieldsOperationApply, Time: at(2 * time.Second)},
		{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status", Time: at(4 * time.Second)},
	}}}
	got := otherWriters(sa)
	want := []string{"argocd (Apply at 2026-11-29T12:00:02Z)", "kubectl-edit (Update at 2026-11-29T12:00:01Z)"}
	if !slices.Equal(got, want) {
		t.Fatalf("otherWriters = %v, want %v", got, want)
	}
	if got := otherWriters(&corev1.ServiceAccount{}); !slices.Equal(got, []string{"an unknown writer"}) {
		t.Fatalf("no managedFields: %v", got)
	}
}
