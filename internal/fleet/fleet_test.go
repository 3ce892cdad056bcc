package fleet

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

func testCR(image string) *v1alpha1.SidecarInjector {
	return &v1alpha1.SidecarInjector{
		ObjectMeta: metav1.ObjectMeta{Name: "mesh"},
		Spec: v1alpha1.SidecarInjectorSpec{
			NamespaceSelector:   &metav1.LabelSelector{MatchLabels: map[string]string{"inject": "on"}},
			NeverInjectSelector: []metav1.LabelSelector{{MatchLabels: map[string]string{"role": "migration"}}},
			DefaultTemplates:    []string{"proxy"},
			Values:              &apiextensionsv1.JSON{Raw: []byte(fmt.Sprintf(`{"image":%q}`, image))},
			Templates:           []v1alpha1.NamedTemplate{{Name: "proxy", Template: "spec:\n  containers:\n  - name: proxy\n    image: {{ .Values.image | quote }}\n"}},
		},
	}
}

func testInjector(t *testing.T, image string) Injector {
	t.Helper()
	cr := testCR(image)
	cfg, err := sidecar.Compile(cr)
	if err != nil {
		t.Fatal(err)
	}
	rev, _ := sidecar.Revision(cr)
	return Injector{Config: cfg, Params: sidecar.Params{OperatorNamespace: "hookwright-system", ExcludedNamespaces: []string{"hookwright-system"}}, Revision: rev}
}

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

func pod(ns, name string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, CreationTimestamp: metav1.NewTime(t0)},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:1"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

// injected runs the real engine on p, as the webhook would have.
func injected(t *testing.T, inj Injector, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	raw, _ := json.Marshal(p)
	res, err := sidecar.Inject(inj.Config, inj.Params, sidecar.Input{Raw: raw, Namespace: p.Namespace, WantJSON: true})
	if err != nil || !res.Injected {
		t.Fatalf("inject %s: %v %+v", p.Name, err, res)
	}
	out := &corev1.Pod{}
	if err := json.Unmarshal(res.JSON, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestClassify(t *testing.T) {
	cur := testInjector(t, "proxy:2")
	old := testInjector(t, "proxy:1")
	other := testInjector(t, "proxy:2")
	other.Config, _ = sidecar.Compile(func() *v1alpha1.SidecarInjector { c := testCR("x"); c.Name = "other"; return c }())
	on := map[string]string{"inject": "on"}
	done := pod("apps", "done", nil)
	done.Status.Phase = corev1.PodSucceeded
	deleting := pod("apps", "deleting", nil)
	deleting.DeletionTimestamp = &metav1.Time{Time: t0}
	optedOut := injected(t, cur, pod("apps", "opted-out", nil))
	optedOut.Labels[v1alpha1.SidecarInjectKey] = "false"
	never := injected(t, cur, pod("apps", "e", nil))
	never.Labels["role"] = "migration"
	hostNet := pod("apps", "hostnet", nil)
	hostNet.Spec.HostNetwork = true
	// A copied spec: the annotation names a container the pod lacks.
	stale := injected(t, cur, pod("apps", "stale", nil))
	stale.Spec.Containers = stale.Spec.Containers[:1]
	// Injected before revision labels existed: the annotation still tells.
	noLabel := injected(t, old, pod("apps", "no-label", nil))
	delete(noLabel.Labels, v1alpha1.SidecarRevisionKey)
	// What the webhook configuration spares (v1alpha1.Spared) is never
	// sent to the injector, so it is not counted as missing.
	cur.Params.ExcludedNamespaces = append(cur.Params.ExcludedNamespaces, "calico-system")
	cur.Params.SparedNamespaces = []string{"calico-system"}
	critical := pod("apps", "critical", nil)
	critical.Spec.PriorityClassName = v1alpha1.PriorityNodeCritical
	mirror := pod("apps", "mirror", nil)
	mirror.Annotations = map[string]string{v1alpha1.MirrorPodAnnotation: "0a1b"}
	// Injected before the configuration spared it.
	criticalInjected := injected(t, cur, pod("apps", "critical-injected", nil))
	criticalInjected.Spec.PriorityClassName = v1alpha1.PriorityClusterCritical
	cases := []struct {
		name   string
		pod    *corev1.Pod
		ns     map[string]string
		want   State
		ok     bool
		reason string
	}{
		{"current", injected(t, cur, pod("apps", "a", nil)), on, Current, true, "injected at revision " + cur.Revision},
		{"outdated", injected(t, old, pod("apps", "b", nil)), on, Outdated, true, "current revision " + cur.Revision + " (containers proxy)"},
		{"outdated without label", noLabel, on, Outdated, true, "injected at revision " + old.Revision},
		{"missing", pod("apps", "c", nil), on, Missing, true, "policy is Enabled"},
		{"missing stale annotation", stale, on, Missing, true, "should carry"},
		{"orphaned by namespace", injected(t, cur, pod("apps", "d", nil)), map[string]string{}, Orphaned, true, "namespaceSelector"},
		{"orphaned by never selector", never, on, Orphaned, true, "neverInjectSelector"},
		{"orphaned by opt-out label", optedOut, on, Orphaned, true, "label sidecar.hookwright.io/inject"},
		{"not matched namespace", pod("apps", "f", nil), map[string]string{}, "", false, ""},
		{"not matched never", pod("apps", "g", map[string]string{"role": "migration"}), on, "", false, ""},
		{"hostNetwork", hostNet, on, "", false, ""},
		{"operator namespace", pod("hookwright-system", "h", nil), on, "", false, ""},
		{"system namespace", pod("kube-system", "i", nil), on, "", false, ""},
		{"injected by another injector", injected(t, other, pod("apps", "j", nil)), on, "", false, ""},
		{"finished", done, on, "", false, ""},
		{"being deleted", deleting, on, "", false, ""},
		{"namespace labels unknown", pod("apps", "k", nil), nil, Missing, true, ""},
		{"spared node critical", critical, on, "", false, ""},
		{"spared mirror pod", mirror, on, "", false, ""},
		{"spared namespace", pod("calico-system", "l", nil), on, "", false, ""},
		{"orphaned: injected, then spared", criticalInjected, on, Orphaned, true, "no longer matches: spared: system-cluster-critical"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Classify(cur, tc.pod, tc.ns)
			if ok != tc.ok || got.State != tc.want {
				t.Fatalf("got %v %q (%s), want %v %q", ok, got.State, got.Reason, tc.ok, tc.want)
			}
			// The fleet's decisions-only injector judges the same.
			if d, dok := Classify(cur.ForDecisions(), tc.pod, tc.ns); dok != ok || d != got {
				t.Errorf("ForDecisions: %v %+v, the full injector %v %+v", dok, d, ok, got)
			}
			if !strings.Contains(got.Reason, tc.reason) {
				t.Errorf("reason %q lacks %q", got.Reason, tc.reason)
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	var pods []Pod
	// ns-00..ns-24: ns-i has i missing pods and one current; ns-x one outdated.
	for i := range 25 {
		ns := fmt.Sprintf("ns-%02d", i)
		pods = append(pods, Pod{Namespace: ns, Name: "cur", State: Current})
		for j := range i {
			pods = append(pods, Pod{Namespace: ns, Name: fmt.Sprintf("m-%d", j), State: Missing, Reason: "r"})
		}
	}
	pods = append(pods, Pod{Namespace: "ns-x", Name: "old", State: Outdated, Reason: "rev"},
		Pod{Namespace: "ns-x", Name: "orph", State: Orphaned})
	s := Summarize(pods)
	want := v1alpha1.FleetCounts{MatchedPods: 25 + 300 + 1, InjectedPods: 25 + 1 + 1, CurrentPods: 25, OutdatedPods: 1, MissingPods: 300, OrphanedPods: 1}
	if s.Status.FleetCounts != want {
		t.Errorf("counts %+v, want %+v", s.Status.FleetCounts, want)
	}
	if s.Status.NamespacesTotal != 26 || len(s.Namespaces) != 26 || len(s.Status.Namespaces) != TopNamespaces {
		t.Fatalf("namespaces total %d, all %d, top %d", s.Status.NamespacesTotal, len(s.Namespaces), len(s.Status.Namespaces))
	}
	if top := s.Status.Namespaces[0]; top.Name != "ns-24" || top.MissingPods != 24 || top.MatchedPods != 25 {
		t.Errorf("top namespace %+v", top)
	}
	if last := s.Status.Namespaces[TopNamespaces-1]; last.Name != "ns-05" {
		t.Errorf("20th namespace %s, want ns-05", last.Name)
	}
	if len(s.Missing) != MaxNamedPods || len(s.Outdated) != 1 {
		t.Errorf("named missing %d outdated %d", len(s.Missing), len(s.Outdated))
	}
	// Order does not matter.
	rev := make([]Pod, len(pods))
	for i, p := range pods {
		rev[len(pods)-1-i] = p
	}
	if r := Summarize(rev); fmt.Sprint(r) != fmt.Sprint(s) {
		t.Errorf("summary depends on pod order")
	}
	var conds []metav1.Condition
	SetConditions(&conds, s, 3)
	up := apimeta.FindStatusCondition(conds, v1alpha1.ConditionPodsUpToDate)
	miss := apimeta.FindStatusCondition(conds, v1alpha1.ConditionPodsMissingSidecars)
	if up.Status != metav1.ConditionFalse || !strings.Contains(up.Message, "ns-x/old (rev)") {
		t.Errorf("PodsUpToDate %+v", up)
	}
	if miss.Status != metav1.ConditionTrue || !strings.Contains(miss.Message, "and 295 more") || strings.Count(miss.Message, "(r)") != MaxNamedPods {
		t.Errorf("PodsMissingSidecars %+v", miss)
	}
	SetConditions(&conds, Summarize(nil), 3)
	if apimeta.IsStatusConditionFalse(conds, v1alpha1.ConditionPodsUpToDate) || apimeta.IsStatusConditionTrue(conds, v1alpha1.ConditionPodsMissingSidecars) {
		t.Errorf("empty fleet conditions %+v", conds)
	}
}

func TestPlanHistory(t *testing.T) {
	k := func(h string, n int64) Kept { return Kept{Name: "mesh-" + h, Hash: h, Number: n} }
	var many []Kept
	for i := range 10 {
		many = append(many, k(fmt.Sprintf("h%d", i), int64(i+1)))
	}
	cases := []struct {
		name     string
		kept     []Kept
		hash     string
		create   int64
		renumber string
		delete   []string
		protect  string
	}{
		{"first", nil, "a", 1, "", nil, ""},
		{"unchanged", []Kept{k("a", 1)}, "a", 0, "", nil, ""},
		{"new", []Kept{k("a", 1)}, "b", 2, "", nil, ""},
		{"back to an older one", []Kept{k("a", 1), k("b", 2)}, "a", 0, "mesh-a", nil, ""},
		{"new beyond the limit", many, "new", 11, "", []string{"mesh-h0"}, ""},
		{"current at the limit", many, "h9", 0, "", nil, ""},
		{"repeat of a hash", []Kept{k("a", 1), {Name: "dup", Hash: "a", Number: 2}}, "a", 0, "", []string{"mesh-a"}, ""},
		{"pinned one protected, kept beyond the limit", many, "new", 11, "", nil, "h0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := PlanHistory(tc.kept, tc.hash, tc.protect, HistoryLimit)
			var del []string
			for _, d := range p.Delete {
				del = append(del, d.Name)
			}
			ren := ""
			if p.Renumber != nil {
				ren = p.Renumber.Name
			}
			if p.Create != tc.create || ren != tc.renumber || fmt.Sprint(del) != fmt.Sprint(tc.delete) {
				t.Errorf("plan create %d renumber %q delete %v; want %d %q %v", p.Create, ren, del, tc.create, tc.renumber, tc.delete)
			}
		})
	}
}

func TestOutageNote(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	cond := func(typ string, st metav1.ConditionStatus, at time.Time) []metav1.Condition {
		return []metav1.Condition{{Type: typ, Status: st, Reason: "R", LastTransitionTime: metav1.NewTime(at)}}
	}
	cases := []struct {
		name    string
		created time.Time
		conds   []metav1.Condition
		want    string
	}{
		{"no conditions", t0, nil, ""},
		{"during a current outage", t0, cond(v1alpha1.ConditionWebhookReachable, metav1.ConditionFalse, t0.Add(-time.Minute)), "during an outage"},
		{"before it came back", t0, cond(v1alpha1.ConditionWebhookReachable, metav1.ConditionTrue, t0.Add(30*time.Second)), "30s before WebhookReachable last became True"},
		{"after it came back", t0, cond(v1alpha1.ConditionWebhookReachable, metav1.ConditionTrue, t0.Add(-time.Hour)), "not during a recorded outage"},
		{"server availability when unknown", t0, append(cond(v1alpha1.ConditionWebhookReachable, metav1.ConditionUnknown, t0),
			cond(v1alpha1.ConditionServerAvailable, metav1.ConditionFalse, t0.Add(-time.Second))...), "ServerAvailable is False"},
	}
	for _, tc := range cases {
		if got := OutageNote(tc.created, tc.conds); (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
