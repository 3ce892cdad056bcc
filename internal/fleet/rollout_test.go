package fleet

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/utils/ptr"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

func cands(spec ...string) []Candidate {
	var out []Candidate
	for _, s := range spec {
		ns, name, _ := strings.Cut(s, "/")
		out = append(out, Candidate{Namespace: ns, Name: name})
	}
	return out
}

func names(cs []Candidate) string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Namespace+"/"+c.Name)
	}
	return strings.Join(out, ",")
}

func TestPlanBatch(t *testing.T) {
	i := func(n int) *intstr.IntOrString { v := intstr.FromInt32(int32(n)); return &v }
	pct := func(s string) *intstr.IntOrString { v := intstr.FromString(s); return &v }
	pending := cands("b/2", "a/1", "b/1", "c/1")
	cases := []struct {
		name        string
		spec        v1alpha1.RolloutSpec
		matched     int
		done, unav  int
		busy        []string
		wantNext    string
		wantBudget  int
		wantPart    int
		wantNS      string
		wantTotal   int
		wantPending []Candidate
	}{
		{name: "all in order", spec: v1alpha1.RolloutSpec{}, matched: 4, wantNext: "a/1,b/1,b/2,c/1", wantBudget: 1, wantTotal: 4},
		{name: "budget minus unavailable", spec: v1alpha1.RolloutSpec{MaxUnavailable: i(3)}, matched: 4, unav: 2, wantNext: "a/1,b/1,b/2,c/1", wantBudget: 1, wantTotal: 4},
		{name: "budget spent", spec: v1alpha1.RolloutSpec{MaxUnavailable: i(1)}, matched: 4, unav: 1, wantNext: "a/1,b/1,b/2,c/1", wantBudget: 0, wantTotal: 4},
		{name: "percent rounds down, at least 1", spec: v1alpha1.RolloutSpec{MaxUnavailable: pct("10%")}, matched: 4, wantNext: "a/1,b/1,b/2,c/1", wantBudget: 1, wantTotal: 4},
		{name: "percent of matched", spec: v1alpha1.RolloutSpec{MaxUnavailable: pct("50%")}, matched: 10, wantNext: "a/1,b/1,b/2,c/1", wantBudget: 5, wantTotal: 4},
		{name: "partition keeps the last", spec: v1alpha1.RolloutSpec{Partition: i(2)}, matched: 4, wantNext: "a/1,b/1", wantBudget: 1, wantPart: 2, wantTotal: 2},
		{name: "partition counts done pods", spec: v1alpha1.RolloutSpec{Partition: i(2)}, matched: 6, done: 2, wantNext: "a/1,b/1", wantBudget: 1, wantPart: 2, wantTotal: 4},
		{name: "partition met", spec: v1alpha1.RolloutSpec{Partition: i(4)}, matched: 6, done: 2, wantNext: "", wantBudget: 1, wantPart: 4, wantTotal: 2},
		{name: "partition percent rounds up", spec: v1alpha1.RolloutSpec{Partition: pct("30%")}, matched: 4, wantNext: "a/1,b/1", wantBudget: 1, wantPart: 2, wantTotal: 2},
		{name: "partition all", spec: v1alpha1.RolloutSpec{Partition: pct("100%")}, matched: 4, wantNext: "", wantBudget: 1, wantPart: 4, wantTotal: 0},
		{name: "namespaces first", spec: v1alpha1.RolloutSpec{Namespaces: []string{"c", "b"}}, matched: 4, wantNext: "c/1,b/1,b/2,a/1", wantBudget: 1, wantTotal: 4},
		{name: "one at a time", spec: v1alpha1.RolloutSpec{NamespaceOrder: v1alpha1.NamespacesOneAtATime, Namespaces: []string{"b"}}, matched: 4,
			wantNext: "b/1,b/2", wantBudget: 1, wantNS: "b", wantTotal: 4},
		{name: "one at a time stays on the busy one", spec: v1alpha1.RolloutSpec{NamespaceOrder: v1alpha1.NamespacesOneAtATime, MaxUnavailable: i(2)}, matched: 5,
			unav: 1, busy: []string{"c"}, wantNext: "c/1", wantBudget: 1, wantNS: "c", wantTotal: 4},
		{name: "paused", spec: v1alpha1.RolloutSpec{Paused: true}, matched: 4, wantNext: "", wantBudget: 0, wantTotal: 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := PlanBatch(BatchInput{Spec: &tc.spec, Matched: tc.matched, Pending: pending, Done: tc.done, Unavailable: tc.unav, Busy: tc.busy})
			if got := names(b.Next); got != tc.wantNext || b.Budget != tc.wantBudget || b.Partitioned != tc.wantPart || b.Namespace != tc.wantNS || b.Total != tc.wantTotal {
				t.Fatalf("next %q budget %d partitioned %d ns %q total %d; want %q %d %d %q %d",
					got, b.Budget, b.Partitioned, b.Namespace, b.Total, tc.wantNext, tc.wantBudget, tc.wantPart, tc.wantNS, tc.wantTotal)
			}
		})
	}
	if names(pending) != "b/2,a/1,b/1,c/1" {
		t.Fatalf("PlanBatch reordered its input: %s", names(pending))
	}
}

// The batch never lets more pods become unavailable than maxUnavailable
// allows, whatever the input.
func TestPlanBatchBudgetProperty(t *testing.T) {
	for m := 1; m <= 20; m++ {
		for unav := 0; unav <= 25; unav++ {
			for _, mu := range []intstr.IntOrString{intstr.FromInt32(int32(m)), intstr.FromString(fmt.Sprintf("%d%%", m*5))} {
				spec := v1alpha1.RolloutSpec{MaxUnavailable: &mu}
				b := PlanBatch(BatchInput{Spec: &spec, Matched: 40, Pending: cands("a/1", "a/2"), Unavailable: unav})
				if limit := MaxUnavailable(&spec, 40); b.Budget+unav > max(limit, unav) || b.Budget < 0 {
					t.Fatalf("maxUnavailable %s, %d unavailable: budget %d exceeds %d", mu.String(), unav, b.Budget, limit)
				}
			}
		}
	}
}

func TestActions(t *testing.T) {
	inPlace := Plan{Way: InPlace, Containers: []ContainerDiff{{Name: "proxy", List: "containers", Kind: Changed,
		Changes: []FieldChange{{Field: "resources"}, {Field: "image"}}}}}
	restart := Plan{Way: Restart, Why: "sidecars to add"}
	cases := []struct {
		name     string
		spec     v1alpha1.RolloutSpec
		plan     Plan
		want     string
		wantSkip bool
	}{
		{"in place", v1alpha1.RolloutSpec{Strategy: v1alpha1.RolloutInPlace}, inPlace, "image,resize", false},
		{"in place under Restart", v1alpha1.RolloutSpec{Strategy: v1alpha1.RolloutRestart}, inPlace, "restart", false},
		{"restart under InPlace", v1alpha1.RolloutSpec{Strategy: v1alpha1.RolloutInPlace}, restart, "", true},
		{"fallback", v1alpha1.RolloutSpec{Strategy: v1alpha1.RolloutInPlace, FallbackToRestart: true}, restart, "restart", false},
		{"current", v1alpha1.RolloutSpec{Strategy: v1alpha1.RolloutInPlace}, Plan{Way: NoChange}, "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			acts, skip := Actions(&tc.spec, tc.plan)
			var got []string
			for _, a := range acts {
				got = append(got, string(a))
			}
			if strings.Join(got, ",") != tc.want || (skip != "") != tc.wantSkip {
				t.Fatalf("actions %v skip %q, want %q skip %t", got, skip, tc.want, tc.wantSkip)
			}
		})
	}
}

func TestPodOwner(t *testing.T) {
	ref := func(kind string) []metav1.OwnerReference {
		return []metav1.OwnerReference{{Kind: kind, Name: "o", Controller: ptr.To(true)}}
	}
	for kind, want := range map[string]string{"": SkipBarePod, "Job": SkipJobPod, "ReplicaSet": "", "StatefulSet": "", "DaemonSet": "", "CloneSet": SkipOwnerKind + " (CloneSet)"} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}}
		if kind != "" {
			p.OwnerReferences = ref(kind)
		}
		if _, skip := PodOwner(p); skip != want {
			t.Errorf("owner %q: skip %q, want %q", kind, skip, want)
		}
	}
	// An owner reference that is not the controller makes a bare pod.
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{OwnerReferences: []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "o"}}}}
	if _, skip := PodOwner(p); skip != SkipBarePod {
		t.Errorf("non-controller owner: %q", skip)
	}
}

// An image and resources change of a native sidecar: the pod patch names
// only the changed image (with the revision label, the status annotation's
// configHash and the record), the resize patch the new resources; both
// apply to the pod as strategic merge patches.
func TestBuildInPlaceAndProgress(t *testing.T) {
	from := tmplInjector(t, proxyV1, true)
	to := tmplInjector(t, strings.Replace(proxyRes, "proxy:1", "proxy:2", 1), true)
	p := injected(t, from, pod("apps", "web", nil))
	p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "proxy", Ready: true, RestartCount: 2}}
	plan, err := PlanPod(to, p, map[string]string{"inject": "on"})
	if err != nil || plan.Way != InPlace {
		t.Fatalf("plan %+v %v", plan, err)
	}
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	ip, err := BuildInPlace(p, plan, to.Revision, now)
	if err != nil {
		t.Fatal(err)
	}
	if ip.Pod == nil || ip.Resize == nil {
		t.Fatalf("patches %s / %s", ip.Pod, ip.Resize)
	}
	orig, _ := json.Marshal(p)
	patched, err := strategicpatch.StrategicMergePatch(orig, ip.Pod, &corev1.Pod{})
	if err != nil {
		t.Fatal(err)
	}
	if patched, err = strategicpatch.StrategicMergePatch(patched, ip.Resize, &corev1.Pod{}); err != nil {
		t.Fatal(err)
	}
	got := &corev1.Pod{}
	if err := json.Unmarshal(patched, got); err != nil {
		t.Fatal(err)
	}
	after, err := PlanPod(to, got, map[string]string{"inject": "on"})
	if err != nil || after.State != Current || after.Way != NoChange {
		t.Fatalf("after the patches: %s %s %+v %v", after.State, after.Way, after.Containers, err)
	}
	if len(got.Spec.Containers) != len(p.Spec.Containers) || len(got.Spec.InitContainers) != len(p.Spec.InitContainers) {
		t.Fatalf("the patches changed the container lists")
	}
	rec, ok := ParseRecord(got)
	if !ok || rec.Revision != to.Revision || rec.Restarts["proxy"] != 2 || len(rec.Resized) != 1 || !rec.At.Equal(now) {
		t.Fatalf("record %+v %t", rec, ok)
	}
	timeout := time.Minute
	prog := func(mut func(*corev1.Pod), at time.Time) Progress {
		q := got.DeepCopy()
		q.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "proxy", Ready: true, RestartCount: 3,
			Resources: &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("0.2")}}}}
		q.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(now.Add(-time.Minute))}}
		if mut != nil {
			mut(q)
		}
		return InPlaceProgress(q, rec, at, timeout)
	}
	if pr := prog(nil, now); !pr.Done {
		t.Fatalf("restarted, ready and resized: %+v", pr)
	}
	// The pod's Ready condition must hold for ReadySettle after a restart:
	// the kubelet reports a restarted native sidecar Ready for an instant
	// before its startup probe flips back for one period.
	settle := ReadySettle(got, rec)
	readyAt := func(at time.Time) func(*corev1.Pod) {
		return func(q *corev1.Pod) { q.Status.Conditions[0].LastTransitionTime = metav1.NewTime(at) }
	}
	if pr := prog(readyAt(now), now.Add(settle/2)); pr.Done || pr.Stop != "" || pr.Wait != settle-settle/2 {
		t.Fatalf("Ready for half of %s: %+v", settle, pr)
	}
	if pr := prog(readyAt(now), now.Add(settle)); !pr.Done {
		t.Fatalf("Ready for %s: %+v", settle, pr)
	}
	unreadySince := func(q *corev1.Pod) {
		q.Status.Conditions[0].Status = corev1.ConditionFalse
		q.Status.Conditions[0].LastTransitionTime = metav1.NewTime(rec.At)
	}
	if pr := prog(unreadySince, now); pr.Done || pr.Wait != 0 {
		t.Fatalf("pod not Ready since the change: %+v", pr)
	}
	unreadyBefore := func(q *corev1.Pod) {
		q.Status.Conditions[0].Status = corev1.ConditionFalse
		q.Status.Conditions[0].LastTransitionTime = metav1.NewTime(rec.At.Add(-time.Second))
	}
	if pr := prog(unreadyBefore, now); !pr.Done {
		t.Fatalf("pod unready since before the change, its proxy restarted and Ready: %+v", pr)
	}
	if pr := prog(func(q *corev1.Pod) { q.Status.Conditions = nil }, now); pr.Done {
		t.Fatalf("pod without a Ready condition: %+v", pr)
	}
	if pr := prog(func(q *corev1.Pod) { q.Status.InitContainerStatuses[0].RestartCount = 2 }, now); pr.Done || pr.Stop != "" {
		t.Fatalf("not restarted yet: %+v", pr)
	}
	if pr := prog(func(q *corev1.Pod) { q.Status.InitContainerStatuses[0].Ready = false }, now.Add(2*timeout)); pr.Stop != StopReadyTimeout {
		t.Fatalf("timed out: %+v", pr)
	}
	if pr := prog(func(q *corev1.Pod) { q.Status.InitContainerStatuses[0].Resources = nil }, now); pr.Done {
		t.Fatalf("resize not applied: %+v", pr)
	}
	pull := func(q *corev1.Pod) {
		q.Status.InitContainerStatuses[0].Ready = false
		q.Status.InitContainerStatuses[0].State.Waiting = &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "Back-off pulling image \"proxy:2\""}
	}
	if pr := prog(pull, now); pr.Stop != StopImagePull || !strings.Contains(pr.Message, "ImagePullBackOff: Back-off pulling image") {
		t.Fatalf("image pull: %+v", pr)
	}
	infeasible := func(q *corev1.Pod) {
		q.Status.InitContainerStatuses[0].Resources = nil
		q.Status.Conditions = append(q.Status.Conditions, corev1.PodCondition{Type: corev1.PodResizePending, Reason: "Infeasible", Message: "Node didn't have enough capacity"})
	}
	if pr := prog(infeasible, now); pr.Stop != StopResize {
		t.Fatalf("infeasible: %+v", pr)
	}
	if _, err := BuildInPlace(p, Plan{Way: Restart, Why: "x"}, "r", now); err == nil {
		t.Fatal("BuildInPlace of a Restart plan: no error")
	}
}

func TestReadySettle(t *testing.T) {
	pod := func(probe *corev1.Probe) *corev1.Pod {
		return &corev1.Pod{Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "proxy", StartupProbe: probe}},
			Containers:     []corev1.Container{{Name: "app", StartupProbe: &corev1.Probe{PeriodSeconds: 30}}},
		}}
	}
	restarted := Record{Restarts: map[string]int32{"proxy": 0}}
	cases := []struct {
		name string
		pod  *corev1.Pod
		rec  Record
		want time.Duration
	}{
		{"no startup probe", pod(nil), restarted, time.Second},
		{"period 1 s (the sample's sidecar)", pod(&corev1.Probe{PeriodSeconds: 1}), restarted, 2 * time.Second},
		{"period unset: the kubelet's 10 s", pod(&corev1.Probe{}), restarted, 11 * time.Second},
		{"only restarted containers count", pod(nil), Record{Restarts: map[string]int32{"proxy": 0, "gone": 1}}, time.Second},
		{"the longest period", pod(&corev1.Probe{PeriodSeconds: 2}), Record{Restarts: map[string]int32{"proxy": 0, "app": 0}}, 31 * time.Second},
	}
	for _, tc := range cases {
		if got := ReadySettle(tc.pod, tc.rec); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestBlockingPDB(t *testing.T) {
	pdb := func(name string, sel *metav1.LabelSelector, allowed int32, stale bool) policyv1.PodDisruptionBudget {
		p := policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Generation: 2},
			Spec: policyv1.PodDisruptionBudgetSpec{Selector: sel}, Status: policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: allowed, ObservedGeneration: 2}}
		if stale {
			p.Status.ObservedGeneration = 1
		}
		return p
	}
	web := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
	db := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}
	labels := map[string]string{"app": "web"}
	cases := []struct {
		name string
		pdbs []policyv1.PodDisruptionBudget
		want string
	}{
		{"none", nil, ""},
		{"allows one", []policyv1.PodDisruptionBudget{pdb("a", web, 1, false)}, ""},
		{"allows none", []policyv1.PodDisruptionBudget{pdb("a", web, 0, false)}, "ns/a"},
		{"other pods", []policyv1.PodDisruptionBudget{pdb("a", db, 0, false)}, ""},
		{"empty selector selects all", []policyv1.PodDisruptionBudget{pdb("a", &metav1.LabelSelector{}, 0, false)}, "ns/a"},
		{"nil selector selects none", []policyv1.PodDisruptionBudget{pdb("a", nil, 0, false)}, ""},
		{"status not observed", []policyv1.PodDisruptionBudget{pdb("a", web, 3, true)}, "ns/a"},
	}
	for _, tc := range cases {
		if got := BlockingPDB(tc.pdbs, labels); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestOwnerProgress(t *testing.T) {
	dep := func(gen, obs int64, upd, rep, avail int32) *appsv1.Deployment {
		return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Generation: gen}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](3)},
			Status: appsv1.DeploymentStatus{ObservedGeneration: obs, UpdatedReplicas: upd, Replicas: rep, AvailableReplicas: avail}}
	}
	cases := []struct {
		name string
		obj  any
		done bool
		unav int
	}{
		{"deployment done", dep(2, 2, 3, 3, 3), true, 0},
		{"not observed", dep(3, 2, 3, 3, 3), false, 1},
		{"old pods left", dep(2, 2, 3, 4, 3), false, 1},
		{"unavailable", dep(2, 2, 3, 3, 1), false, 2},
		{"sts rolling", &appsv1.StatefulSet{Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](2)},
			Status: appsv1.StatefulSetStatus{UpdatedReplicas: 1, ReadyReplicas: 2, AvailableReplicas: 2, CurrentRevision: "a", UpdateRevision: "b"}}, false, 1},
		{"sts done", &appsv1.StatefulSet{Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](2)},
			Status: appsv1.StatefulSetStatus{UpdatedReplicas: 2, ReadyReplicas: 2, AvailableReplicas: 2, CurrentRevision: "b", UpdateRevision: "b"}}, true, 0},
		{"ds rolling", &appsv1.DaemonSet{Status: appsv1.DaemonSetStatus{DesiredNumberScheduled: 3, UpdatedNumberScheduled: 1, NumberAvailable: 2}}, false, 1},
		{"ds done", &appsv1.DaemonSet{Status: appsv1.DaemonSetStatus{DesiredNumberScheduled: 3, UpdatedNumberScheduled: 3, NumberAvailable: 3}}, true, 0},
	}
	for _, tc := range cases {
		if done, u := OwnerProgress(tc.obj); done != tc.done || u != tc.unav {
			t.Errorf("%s: done %t unavailable %d, want %t %d", tc.name, done, u, tc.done, tc.unav)
		}
	}
}

func TestRestartPatchAndSkips(t *testing.T) {
	var m map[string]any
	if err := json.Unmarshal(RestartPatch("abc", time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)), &m); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(m)
	want := `{"metadata":{"annotations":{"sidecar.hookwright.io/restarted-for":"abc"}},"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":"2026-01-02T03:04:05Z"}}}}}`
	if string(b) != want {
		t.Fatalf("%s\nwant %s", b, want)
	}
	s := Skips{}
	for i := range 5 {
		s.Add("b", fmt.Sprintf("ns/p%d", i))
	}
	s.Add("a", "ns/q")
	l := s.List()
	if len(l) != 2 || l[0].Reason != "b" || l[0].Count != 5 || len(l[0].Pods) != 3 || l[1].Reason != "a" {
		t.Fatalf("%+v", l)
	}
}

// A server without pods/resize: a resources change needs a new pod (the
// owner's restart under fallbackToRestart, a skip naming why otherwise);
// an image-only change stays in place.
func TestWithoutResize(t *testing.T) {
	if ok, why := ResizeServed([]metav1.APIResource{{Name: "pods"}, {Name: "pods/status"}}); ok || why != ResizeUnavailable {
		t.Fatalf("no pods/resize: %t %q", ok, why)
	}
	if ok, why := ResizeServed([]metav1.APIResource{{Name: "pods"}, {Name: "pods/resize"}}); !ok || why != "" {
		t.Fatalf("pods/resize: %t %q", ok, why)
	}
	resize := Plan{Way: InPlace, Containers: []ContainerDiff{{Name: "proxy", List: "initContainers", Kind: Changed,
		Changes: []FieldChange{{Field: "image"}, {Field: "resources"}}}}}
	image := Plan{Way: InPlace, Containers: []ContainerDiff{{Name: "proxy", List: "containers", Kind: Changed,
		Changes: []FieldChange{{Field: "image"}}}}}
	inPlace := v1alpha1.RolloutSpec{Strategy: v1alpha1.RolloutInPlace}
	fallback := v1alpha1.RolloutSpec{Strategy: v1alpha1.RolloutInPlace, FallbackToRestart: true}

	p := WithoutResize(resize, ResizeUnavailable)
	if p.Way != Restart || p.Why != "initContainers proxy changes resources and "+ResizeUnavailable {
		t.Fatalf("resources change: %s %q", p.Way, p.Why)
	}
	if acts, skip := Actions(&inPlace, p); len(acts) != 0 || !strings.HasPrefix(skip, SkipNotInPlace) || !strings.Contains(skip, "pods/resize") {
		t.Fatalf("InPlace: %v %q", acts, skip)
	}
	if acts, skip := Actions(&fallback, p); len(acts) != 1 || acts[0] != ActRestart || skip != "" {
		t.Fatalf("fallbackToRestart: %v %q", acts, skip)
	}
	if p := WithoutResize(image, ResizeUnavailable); p.Way != InPlace {
		t.Fatalf("image only: %s %q", p.Way, p.Why)
	}
	for _, w := range []Way{Restart, NoChange} {
		if p := WithoutResize(Plan{Way: w, Why: "x"}, ResizeUnavailable); p.Way != w || p.Why != "x" {
			t.Fatalf("%s changed to %s %q", w, p.Way, p.Why)
		}
	}
}
