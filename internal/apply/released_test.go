package apply

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// driftDesired is a server Deployment as ToApplyObject renders it.
const driftDesired = `
apiVersion: apps/v1
kind: Deployment
metadata: {name: d, namespace: ns, labels: {app: x}}
spec:
  selector: {matchLabels: {app: x}}
  template:
    metadata: {labels: {app: x}}
    spec:
      containers:
      - name: server
        image: img
        ports: [{containerPort: 9443, name: https}]
        resources: {limits: {memory: 128Mi}}
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway}
      - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}
`

// driftLiveSpec is what the API server holds after the operator applied
// driftDesired with priorityClassName and a CPU limit, plus
// server defaults, an HPA's replicas and kubectl's label.
const driftLiveSpec = `
apiVersion: apps/v1
kind: Deployment
metadata: {name: d, namespace: ns, labels: {app: x, team: y}, generation: 3}
spec:
  replicas: 4
  revisionHistoryLimit: 10
  selector: {matchLabels: {app: x}}
  template:
    metadata: {labels: {app: x}}
    spec:
      dnsPolicy: ClusterFirst
      priorityClassName: servers
      containers:
      - name: server
        image: img
        imagePullPolicy: IfNotPresent
        ports: [{containerPort: 9443, name: https, protocol: TCP}]
        resources: {limits: {memory: 128Mi, cpu: "1"}}
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway}
      - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}
`

// oursFields is the hookwright Apply entry's fieldsV1 of that apply.
const oursFields = `{"f:metadata":{"f:labels":{"f:app":{}}},"f:spec":{"f:selector":{},"f:template":{"f:metadata":{"f:labels":{"f:app":{}}},` +
	`"f:spec":{"f:priorityClassName":{},"f:containers":{"k:{\"name\":\"server\"}":{".":{},"f:name":{},"f:image":{},` +
	`"f:ports":{"k:{\"containerPort\":9443,\"protocol\":\"TCP\"}":{".":{},"f:containerPort":{},"f:name":{}}},` +
	`"f:resources":{"f:limits":{"f:memory":{},"f:cpu":{}}}}},` +
	`"f:topologySpreadConstraints":{"k:{\"topologyKey\":\"kubernetes.io/hostname\",\"whenUnsatisfiable\":\"ScheduleAnyway\"}":{".":{},"f:maxSkew":{},"f:topologyKey":{},"f:whenUnsatisfiable":{}},` +
	`"k:{\"topologyKey\":\"topology.kubernetes.io/zone\",\"whenUnsatisfiable\":\"ScheduleAnyway\"}":{".":{},"f:maxSkew":{},"f:topologyKey":{},"f:whenUnsatisfiable":{}}}}}}}`

// driftLiveNow is the object after an apply of driftDesired itself.
var driftLiveNow = strings.NewReplacer("      priorityClassName: servers\n", "", `, cpu: "1"`, "").Replace(driftLiveSpec)

// oursNow is the entry after an apply of driftDesired itself.
const oursNow = `{"f:metadata":{"f:labels":{"f:app":{}}},"f:spec":{"f:selector":{},"f:template":{"f:metadata":{"f:labels":{"f:app":{}}},` +
	`"f:spec":{"f:containers":{"k:{\"name\":\"server\"}":{".":{},"f:name":{},"f:image":{},` +
	`"f:ports":{"k:{\"containerPort\":9443,\"protocol\":\"TCP\"}":{".":{},"f:containerPort":{},"f:name":{}}},` +
	`"f:resources":{"f:limits":{"f:memory":{}}}}},` +
	`"f:topologySpreadConstraints":{"k:{\"topologyKey\":\"kubernetes.io/hostname\",\"whenUnsatisfiable\":\"ScheduleAnyway\"}":{".":{},"f:maxSkew":{},"f:topologyKey":{},"f:whenUnsatisfiable":{}},` +
	`"k:{\"topologyKey\":\"topology.kubernetes.io/zone\",\"whenUnsatisfiable\":\"ScheduleAnyway\"}":{".":{},"f:maxSkew":{},"f:topologyKey":{},"f:whenUnsatisfiable":{}}}}}}}`

type entry struct{ manager, operation, apiVersion, subresource, fields string }

func withManaged(t *testing.T, live string, es ...entry) map[string]any {
	t.Helper()
	m := mustMap(t, live)
	var mf []any
	for _, e := range es {
		f := mustMap(t, e.fields)
		em := map[string]any{"manager": e.manager, "operation": e.operation, "apiVersion": e.apiVersion, "fieldsType": "FieldsV1", "fieldsV1": f}
		if e.subresource != "" {
			em["subresource"] = e.subresource
		}
		mf = append(mf, em)
	}
	m["metadata"].(map[string]any)["managedFields"] = mf
	return m
}

func TestDriftReleased(t *testing.T) {
	hpa := entry{"kube-controller-manager", "Update", "apps/v1", "", `{"f:spec":{"f:replicas":{}}}`}
	kubectl := entry{"kubectl-label", "Update", "apps/v1", "", `{"f:metadata":{"f:labels":{"f:team":{}}}}`}
	status := entry{"kube-controller-manager", "Update", "apps/v1", "status", `{"f:status":{"f:replicas":{}}}`}
	for _, tc := range []struct {
		name    string
		live    map[string]any
		desired string
		want    []string
	}{
		{"fields removed from desired are drift", withManaged(t, driftLiveSpec,
			entry{FieldManager, "Apply", "apps/v1", "", oursFields}, hpa, kubectl, status), driftDesired,
			[]string{"spec.template.spec.containers[name=server].resources.limits.cpu", "spec.template.spec.priorityClassName"}},
		{"a removed spread constraint is drift", withManaged(t, driftLiveSpec,
			entry{FieldManager, "Apply", "apps/v1", "", oursFields}),
			strings.Replace(driftDesired, "      - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}\n", "", 1) +
				"      priorityClassName: servers\n",
			[]string{
				"spec.template.spec.containers[name=server].resources.limits.cpu",
				"spec.template.spec.topologySpreadConstraints", // the subset comparison: lengths differ
				"spec.template.spec.topologySpreadConstraints[topologyKey=topology.kubernetes.io/zone,whenUnsatisfiable=ScheduleAnyway]",
			}},
		{"a removed field another manager also owns is not drift", withManaged(t, driftLiveSpec,
			entry{FieldManager, "Apply", "apps/v1", "", oursFields},
			entry{"kubectl-edit", "Update", "apps/v1", "", `{"f:spec":{"f:template":{"f:spec":{"f:priorityClassName":{},` +
				`"f:containers":{"k:{\"name\":\"server\"}":{"f:resources":{"f:limits":{"f:cpu":{}}}}}}}}}`}),
			driftDesired, nil},
		{"our own Update entry keeps a field", withManaged(t, driftLiveSpec,
			entry{FieldManager, "Apply", "apps/v1", "", oursFields},
			entry{FieldManager, "Update", "apps/v1", "", `{"f:spec":{"f:template":{"f:spec":{"f:priorityClassName":{}}}}}`}),
			driftDesired, []string{"spec.template.spec.containers[name=server].resources.limits.cpu"}},
		{"unchanged after the removal, with other managers and defaults", withManaged(t, driftLiveNow,
			entry{FieldManager, "Apply", "apps/v1", "", oursNow}, hpa, kubectl, status), driftDesired, nil},
		{"unchanged: desired still sets every owned field", withManaged(t, driftLiveSpec,
			entry{FieldManager, "Apply", "apps/v1", "", oursFields}, hpa, kubectl, status),
			strings.Replace(driftDesired, "memory: 128Mi}", `memory: 128Mi, cpu: "1"}`, 1) + "      priorityClassName: servers\n", nil},
		{"a whole container removed is reported once", withManaged(t, driftLiveSpec,
			entry{FieldManager, "Apply", "apps/v1", "", oursFields}), `
apiVersion: apps/v1
kind: Deployment
metadata: {name: d, namespace: ns, labels: {app: x}}
spec:
  selector: {matchLabels: {app: x}}
  template:
    metadata: {labels: {app: x}}
    spec:
      priorityClassName: servers
      containers: [{name: other, image: img}]
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway}
      - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}
`, []string{"spec.template.spec.containers[0].name", "spec.template.spec.containers[name=server]"}},
		{"status in the operator's entry is not drift", withManaged(t, driftLiveNow,
			entry{FieldManager, "Apply", "apps/v1", "", strings.TrimSuffix(oursNow, "}") + `,"f:status":{"f:replicas":{}}}`}), driftDesired, nil},
		{"an entry of another apiVersion is ignored", withManaged(t, driftLiveSpec,
			entry{FieldManager, "Apply", "apps/v1beta2", "", oursFields}), driftDesired, nil},
		{"no managedFields: subset only", mustMap(t, driftLiveSpec), driftDesired, nil},
		{"unparseable fieldsV1 is ignored", withManaged(t, driftLiveSpec,
			entry{FieldManager, "Apply", "apps/v1", "", `{"x:bad":{}}`}), driftDesired, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Drift(mustMap(t, tc.desired), tc.live)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Drift = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestReleasedSetList(t *testing.T) {
	// A set (list-type set) element by value, and an atomic list by index.
	live := withManaged(t, `
apiVersion: v1
kind: ConfigMap
metadata: {name: c, finalizers: [a, b]}
`, entry{FieldManager, "Apply", "v1", "", `{"f:metadata":{"f:finalizers":{"v:\"a\"":{},"v:\"b\"":{}}}}`})
	desired := mustMap(t, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, finalizers: [a]}\n")
	if got := Released(desired, live); !slices.Equal(got, []string{"metadata.finalizers[b]"}) {
		t.Fatalf("Released = %q", got)
	}
}

// TestEnsureReleasedField: with the managedFields a server-side apply
// records (the fake client runs the API server's field manager), a field
// dropped from the desired object is written away once, also by an
// Applier that never saw the earlier apply (an operator restart); the
// next reconcile writes nothing, and a label another manager adds is not
// drift.
func TestEnsureReleasedField(t *testing.T) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	api := fake.NewClientBuilder().WithScheme(s).WithReturnManagedFields().
		WithObjects(testOwner().Object.DeepCopyObject().(client.Object)).Build()
	lc := &laggingClient{Client: api}
	newApplier := func() *Applier {
		return &Applier{Client: lc, APIReader: api, Scheme: s, Recorder: events.NewFakeRecorder(100),
			Budget: Budget{Max: 5, Window: time.Hour}, Now: func() time.Time { return t0 }}
	}
	op := testOwner()
	with := testService()
	with.Labels["tier"] = "critical"
	with.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	without := testService()
	live := func() *corev1.Service {
		t.Helper()
		svc := &corev1.Service{}
		if err := api.Get(context.Background(), client.ObjectKeyFromObject(without), svc); err != nil {
			t.Fatal(err)
		}
		return svc
	}

	first := newApplier()
	if !mustEnsure(t, first, op, with.DeepCopy()) {
		t.Fatal("not created")
	}
	if mustEnsure(t, first, op, with.DeepCopy()) {
		t.Fatal("unchanged object written again")
	}
	// Another manager's label is not drift.
	svc := live()
	svc.Labels["team"] = "x"
	if err := api.Update(context.Background(), svc, client.FieldOwner("kubectl-label")); err != nil {
		t.Fatal(err)
	}
	// A restarted operator (no memory of the apply) with the fields
	// cleared from the desired object.
	restarted := newApplier()
	before := lc.Writes()
	if !mustEnsure(t, restarted, op, without.DeepCopy()) {
		t.Fatal("cleared fields not written")
	}
	got := live()
	if _, ok := got.Labels["tier"]; ok || got.Spec.SessionAffinity != "" {
		t.Fatalf("cleared fields still set: labels %v, sessionAffinity %q", got.Labels, got.Spec.SessionAffinity)
	}
	if got.Labels["team"] != "x" {
		t.Fatalf("the other manager's label went: %v", got.Labels)
	}
	for i := range 3 {
		if mustEnsure(t, restarted, op, without.DeepCopy()) || mustEnsure(t, newApplier(), op, without.DeepCopy()) {
			t.Fatalf("reconcile %d after the removal wrote again", i+2)
		}
	}
	if n := lc.Writes() - before; n != 1 {
		t.Fatalf("%d writes for one removal, want 1", n)
	}
	if len(restarted.repairs) != 0 {
		t.Fatalf("a change of the desired state spent the repair budget: %v", restarted.repairs)
	}
}
