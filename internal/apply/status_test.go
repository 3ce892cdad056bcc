package apply

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var testSplit = StatusSplit{Parts: []StatusPart{{Manager: "fleet", Fields: []string{"fleet", "rollout"}, Conditions: []string{"PodsUpToDate", "RolloutBlocked"}}}}

var testGVK = schema.GroupVersionKind{Group: "admission.hookwright.io", Version: "v1alpha1", Kind: "SidecarInjector"}

func cond(typ string) map[string]any { return map[string]any{"type": typ, "status": "True"} }

func TestStatusObject(t *testing.T) {
	obj := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": "mesh", "resourceVersion": "42", "labels": map[string]any{"a": "b"}},
		"spec":     map[string]any{"revision": "x"},
		"status": map[string]any{
			"revision": "r1", "fleet": map[string]any{"matchedPods": int64(3)}, "rollout": map[string]any{"total": int64(1)},
			"conditions": []any{cond("Ready"), cond("PodsUpToDate"), cond("RolloutBlocked"), cond("Other")},
		},
	}}
	for _, tc := range []struct {
		manager    string
		fields     []string
		conditions []string
	}{
		{manager: StatusManager, fields: []string{"conditions", "revision"}, conditions: []string{"Ready", "Other"}},
		{manager: "fleet", fields: []string{"conditions", "fleet", "rollout"}, conditions: []string{"PodsUpToDate", "RolloutBlocked"}},
	} {
		u, err := testSplit.StatusObject(obj, testGVK, tc.manager)
		if err != nil {
			t.Fatal(err)
		}
		if u.GetName() != "mesh" || u.GetResourceVersion() != "42" || u.GetKind() != "SidecarInjector" || u.GetLabels() != nil || u.Object["spec"] != nil {
			t.Fatalf("%s: metadata and spec %v, want the name, resourceVersion and kind alone", tc.manager, u.Object)
		}
		status := u.Object["status"].(map[string]any)
		var fields, conds []string
		for k := range status {
			fields = append(fields, k)
		}
		for _, c := range status["conditions"].([]any) {
			conds = append(conds, c.(map[string]any)["type"].(string))
		}
		slices.Sort(fields)
		if !slices.Equal(fields, tc.fields) || !slices.Equal(conds, tc.conditions) {
			t.Errorf("%s applies %v with conditions %v, want %v and %v", tc.manager, fields, conds, tc.fields, tc.conditions)
		}
	}
	if _, err := testSplit.StatusObject(obj, testGVK, "kubectl"); err == nil || !strings.Contains(err.Error(), `"kubectl" has no share`) {
		t.Fatalf("unknown manager: %v", err)
	}
	// A writer with no condition of its own sends no conditions list: an
	// empty one would claim the list.
	u, _ := StatusSplit{Parts: []StatusPart{{Manager: "counts", Fields: []string{"fleet"}}}}.StatusObject(obj, testGVK, "counts")
	if _, ok := u.Object["status"].(map[string]any)["conditions"]; ok {
		t.Fatal("a share without conditions sent status.conditions")
	}
}

// fields is a FieldsV1 of status paths: "revision", "fleet.matchedPods",
// or a condition type as "c:Ready".
func fields(paths ...string) *metav1.FieldsV1 {
	status := map[string]any{}
	for _, p := range paths {
		if typ, ok := strings.CutPrefix(p, "c:"); ok {
			cs, _ := status["f:conditions"].(map[string]any)
			if cs == nil {
				cs = map[string]any{".": map[string]any{}}
				status["f:conditions"] = cs
			}
			cs[`k:{"type":"`+typ+`"}`] = map[string]any{".": map[string]any{}, "f:status": map[string]any{}, "f:type": map[string]any{}}
			continue
		}
		top, sub, _ := strings.Cut(p, ".")
		m, _ := status["f:"+top].(map[string]any)
		if m == nil {
			m = map[string]any{}
			status["f:"+top] = m
		}
		if sub != "" {
			m["f:"+sub] = map[string]any{}
		}
	}
	raw, _ := json.Marshal(map[string]any{"f:status": status})
	return &metav1.FieldsV1{Raw: raw}
}

// owned is what entry owns, as fields() spells it.
func owned(t *testing.T, e metav1.ManagedFieldsEntry) []string {
	t.Helper()
	var f map[string]map[string]map[string]any
	if err := json.Unmarshal(e.FieldsV1.Raw, &f); err != nil {
		t.Fatal(err)
	}
	var out []string
	for k, v := range f["f:status"] {
		if k == "f:conditions" {
			for key := range v {
				if typ, ok := strings.CutPrefix(key, `k:{"type":"`); ok {
					out = append(out, "c:"+strings.TrimSuffix(typ, `"}`))
				}
			}
			continue
		}
		if len(v) == 0 {
			out = append(out, strings.TrimPrefix(k, "f:"))
		}
		for sub := range v {
			out = append(out, strings.TrimPrefix(k, "f:")+"."+strings.TrimPrefix(sub, "f:"))
		}
	}
	slices.Sort(out)
	return out
}

func TestMigrateStatus(t *testing.T) {
	now := metav1.Now()
	entry := func(m string, op metav1.ManagedFieldsOperationType, sub string, f *metav1.FieldsV1) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: m, Operation: op, Subresource: sub, APIVersion: "admission.hookwright.io/v1alpha1", FieldsType: "FieldsV1", FieldsV1: f}
	}
	in := []metav1.ManagedFieldsEntry{
		entry("hookwright", metav1.ManagedFieldsOperationApply, "", fields("revision")), // the spec's apply: not status
		entry("hookwright", metav1.ManagedFieldsOperationUpdate, "status", fields("revision", "fleet.matchedPods", "c:Ready", "c:PodsUpToDate")),
		entry("operator.test", metav1.ManagedFieldsOperationUpdate, "status", fields("rollout.total", "c:RolloutBlocked", "c:Other")),
		entry("fleet", metav1.ManagedFieldsOperationApply, "status", fields("fleet.injectedPods")),
		entry("kubectl-edit", metav1.ManagedFieldsOperationUpdate, "status", fields("c:Manual")),
	}
	out, changed, err := testSplit.MigrateStatus(in, []string{"hookwright", "operator.test"}, "admission.hookwright.io/v1alpha1", now)
	if err != nil || !changed {
		t.Fatalf("changed %v, err %v", changed, err)
	}
	got := map[string][]string{}
	for _, e := range out {
		got[e.Manager+" "+string(e.Operation)+" "+e.Subresource] = owned(t, e)
	}
	want := map[string][]string{
		"hookwright Apply ":             {"revision"},
		"fleet Apply status":            {"c:PodsUpToDate", "c:RolloutBlocked", "fleet.injectedPods", "fleet.matchedPods", "rollout.total"},
		StatusManager + " Apply status": {"c:Other", "c:Ready", "revision"},
		"kubectl-edit Update status":    {"c:Manual"},
	}
	if len(got) != len(want) {
		t.Fatalf("entries %v, want %v", got, want)
	}
	for k, w := range want {
		if !slices.Equal(got[k], w) {
			t.Errorf("%s owns %v, want %v", k, got[k], w)
		}
	}
	for _, e := range out {
		if e.Manager == StatusManager && (e.Time == nil || e.FieldsType != "FieldsV1" || e.APIVersion != "admission.hookwright.io/v1alpha1") {
			t.Errorf("new entry %+v lacks its time, type or apiVersion", e)
		}
	}
	again, changed, err := testSplit.MigrateStatus(out, []string{"hookwright", "operator.test"}, "admission.hookwright.io/v1alpha1", now)
	if err != nil || changed || len(again) != len(out) {
		t.Fatalf("a second migration changed %v (err %v)", changed, err)
	}
	if _, _, err := testSplit.MigrateStatus([]metav1.ManagedFieldsEntry{entry("hookwright", metav1.ManagedFieldsOperationUpdate, "status", &metav1.FieldsV1{Raw: []byte("{")})},
		[]string{"hookwright"}, "v1", now); err == nil {
		t.Fatal("broken managedFields migrated without an error")
	}
}
