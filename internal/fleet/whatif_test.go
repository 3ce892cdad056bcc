package fleet

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestPlanWhatIf(t *testing.T) {
	v1 := tmplInjector(t, proxyV1, false)
	on := map[string]string{"inject": "on"}
	labels := map[string]map[string]string{"a": on, "b": on, "off": {}}
	pods := []*corev1.Pod{
		injected(t, v1, pod("b", "web-1", nil)),
		injected(t, v1, pod("a", "web-1", nil)),
		injected(t, v1, pod("a", "web-2", nil)),
		pod("a", "bare", nil),
		pod("off", "other", nil),
	}
	cases := []struct {
		name                       string
		now                        *Injector
		next                       Injector
		change, fresh, inPl, restr int
		spaces                     []string
		trans                      map[string]int
		example                    string
	}{
		{name: "same spec", now: &v1, next: v1, change: 1, fresh: 0, restr: 1, spaces: []string{"a"}, example: "a/bare"},
		{name: "image", now: &v1, next: tmplInjector(t, proxyV2, false), change: 4, fresh: 3, inPl: 3, restr: 1, spaces: []string{"a", "b"},
			trans: map[string]int{"Current -> Outdated": 3}, example: "a/web-1"},
		{name: "env", now: &v1, next: tmplInjector(t, proxyEnv, false), change: 4, fresh: 3, restr: 4, spaces: []string{"a", "b"},
			trans: map[string]int{"Current -> Outdated": 3}, example: "a/web-1"},
		{name: "new CR", now: nil, next: v1, change: 1, fresh: 1, restr: 1, spaces: []string{"a"},
			trans: map[string]int{"- -> Current": 3, "- -> Missing": 1}, example: "a/bare"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := PlanWhatIf(tc.now, tc.next, pods, labels)
			var spaces []string
			for _, n := range w.Namespaces {
				spaces = append(spaces, n.Name)
			}
			if w.Counted != 4 || w.Change != tc.change || w.New != tc.fresh || w.InPlace != tc.inPl || w.Restart != tc.restr || !slices.Equal(spaces, tc.spaces) {
				t.Errorf("got %+v", w)
			}
			if len(w.Transitions) != len(tc.trans) {
				t.Errorf("transitions %v, want %v", w.Transitions, tc.trans)
			}
			for k, v := range tc.trans {
				if w.Transitions[k] != v {
					t.Errorf("transitions %v, want %v", w.Transitions, tc.trans)
				}
			}
			if w.Example == nil || w.Example.Namespace+"/"+w.Example.Name != tc.example || len(w.Example.Containers) == 0 {
				t.Errorf("example %+v, want %s", w.Example, tc.example)
			}
		})
	}
	// The order of pods does not matter.
	a := PlanWhatIf(&v1, tmplInjector(t, proxyV2, false), pods, labels)
	b := PlanWhatIf(&v1, tmplInjector(t, proxyV2, false), reversed(pods), labels)
	if a.Example.Name != b.Example.Name || a.Change != b.Change {
		t.Errorf("order matters: %+v vs %+v", a, b)
	}
}

func TestPlanWhatIfRenderError(t *testing.T) {
	v1 := tmplInjector(t, proxyV1, false)
	bad := tmplInjector(t, "spec:\n  containers:\n  - name: proxy\n    image: x\n{{ if .ObjectMeta.Labels.boom }}{{ fail \"boom\" }}{{ end }}\n", false)
	w := PlanWhatIf(&v1, bad, []*corev1.Pod{injected(t, v1, pod("a", "web", map[string]string{"boom": "yes"}))}, map[string]map[string]string{"a": {"inject": "on"}})
	if w.ErrorCount != 1 || len(w.Errors) != 1 || w.Change != 0 {
		t.Errorf("got %+v", w)
	}
}

func reversed(pods []*corev1.Pod) []*corev1.Pod {
	out := slices.Clone(pods)
	slices.Reverse(out)
	return out
}
