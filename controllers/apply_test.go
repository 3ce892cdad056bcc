package controllers

import (
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

func mustMap(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(s), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestDrift(t *testing.T) {
	desired := `
apiVersion: v1
kind: Service
metadata: {name: s, labels: {a: "1"}}
spec:
  ports: [{port: 443, targetPort: 9443}]
  selector: {app: x}
`
	for _, tc := range []struct {
		name, live string
		want       []string
	}{
		{"identical", desired, nil},
		{"server defaults and foreign labels ignored", `
metadata: {name: s, uid: u, resourceVersion: "9", labels: {a: "1", other: "y"}}
spec:
  clusterIP: 10.0.0.1
  type: ClusterIP
  ports: [{port: 443, targetPort: 9443, protocol: TCP}]
  selector: {app: x}
status: {}
`, nil},
		{"label changed", `
metadata: {name: s, labels: {a: "2"}}
spec: {ports: [{port: 443, targetPort: 9443}], selector: {app: x}}
`, []string{"metadata.labels.a"}},
		{"list element changed", `
metadata: {name: s, labels: {a: "1"}}
spec: {ports: [{port: 443, targetPort: 8443}], selector: {app: x}}
`, []string{"spec.ports[0].targetPort"}},
		{"list element added by someone else", `
metadata: {name: s, labels: {a: "1"}}
spec: {ports: [{port: 443, targetPort: 9443}, {port: 80}], selector: {app: x}}
`, []string{"spec.ports"}},
		{"field removed", `
metadata: {name: s, labels: {a: "1"}}
spec: {ports: [{port: 443, targetPort: 9443}]}
`, []string{"spec.selector"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Drift(mustMap(t, desired), mustMap(t, tc.live))
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Drift = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestDriftTypedRoundTrip: a desired object and the same object as stored
// (converted the same way, with server defaults added) show no drift.
func TestDriftTypedRoundTrip(t *testing.T) {
	d := BuildSidecarInjector(testInjector(), testSettings, []byte("CA"))
	want, err := ToApplyObject(d.Deployment, appsv1.SchemeGroupVersion.WithKind("Deployment"))
	if err != nil {
		t.Fatal(err)
	}
	live := d.Deployment.DeepCopy()
	live.UID, live.ResourceVersion, live.Generation = "uid", "12", 4
	live.Spec.RevisionHistoryLimit = new(int32)
	live.Spec.Template.Spec.Containers[0].ImagePullPolicy = corev1.PullIfNotPresent
	live.Spec.Template.Spec.Containers[0].TerminationMessagePath = "/dev/termination-log"
	live.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyAlways
	live.Status.AvailableReplicas = 2
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(live)
	if err != nil {
		t.Fatal(err)
	}
	if got := Drift(want.Object, m); got != nil {
		t.Fatalf("drift against defaulted live object: %v", got)
	}
	live.Spec.Template.Spec.Containers[0].SecurityContext.ReadOnlyRootFilesystem = new(bool)
	m, _ = runtime.DefaultUnstructuredConverter.ToUnstructured(live)
	if got := Drift(want.Object, m); !slices.Equal(got, []string{"spec.template.spec.containers[0].securityContext.readOnlyRootFilesystem"}) {
		t.Fatalf("drift = %v", got)
	}
}

func TestToApplyObjectPrunes(t *testing.T) {
	u, err := ToApplyObject(BuildSidecarInjector(testInjector(), testSettings, nil).ServiceAccount, corev1.SchemeGroupVersion.WithKind("ServiceAccount"))
	if err != nil {
		t.Fatal(err)
	}
	md := u.Object["metadata"].(map[string]any)
	if _, ok := md["creationTimestamp"]; ok {
		t.Fatal("creationTimestamp kept")
	}
	if _, ok := u.Object["status"]; ok {
		t.Fatal("status kept")
	}
	if u.GetAPIVersion() != "v1" || u.GetKind() != "ServiceAccount" {
		t.Fatalf("gvk %s %s", u.GetAPIVersion(), u.GetKind())
	}
}

func TestRepairBudget(t *testing.T) {
	r := &Reconciler{Settings: Settings{Repairs: RepairBudget{Max: 3, Window: time.Minute}}}
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
	if d := (&Reconciler{}).budget(); d != DefaultRepairBudget {
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
