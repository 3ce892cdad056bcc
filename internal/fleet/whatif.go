package fleet

import (
	corev1 "k8s.io/api/core/v1"

	"cmp"
	"maps"
	"slices"
)

// MaxWhatIfErrors is how many per-pod render errors a WhatIf keeps.
const MaxWhatIfErrors = 5

// WhatIf is what applying a SidecarInjector would change on the running
// pods: each pod planned against it (PlanPod) and classified against the
// version in the cluster.
type WhatIf struct {
	// Revision is the new revision; Before the one in the cluster (empty
	// when the CR does not exist yet).
	Revision string `json:"revision"`
	Before   string `json:"before,omitempty"`
	// Counted are the pods the new version counts (matched or injected).
	Counted int `json:"counted"`
	// Change are the counted pods that would not be current: Outdated,
	// Missing or Orphaned under the new version. New are those of them
	// that are current, or not counted, today.
	Change int `json:"change"`
	New    int `json:"new"`
	// InPlace and Restart split Change by the way each pod gets there.
	InPlace int `json:"inPlace"`
	Restart int `json:"restart"`
	// Transitions count pods by "STATE-NOW -> STATE-NEW" where the two
	// differ ("-" for a pod not counted).
	Transitions map[string]int `json:"transitions,omitempty"`
	// Namespaces are the namespaces with a pod to change, by name.
	Namespaces []WhatIfNamespace `json:"namespaces"`
	// Example is one pod to change, with its diff: the first by namespace
	// and name of those that are new and have container differences, else
	// of any to change.
	Example *Plan `json:"example,omitempty"`
	// Errors are the first MaxWhatIfErrors pods the new version fails to
	// render for; ErrorCount all of them (counted nowhere else).
	Errors     []string `json:"errors,omitempty"`
	ErrorCount int      `json:"errorCount,omitempty"`
}

// WhatIfNamespace is one namespace's pods to change.
type WhatIfNamespace struct {
	Name    string `json:"name"`
	Change  int    `json:"change"`
	New     int    `json:"new"`
	InPlace int    `json:"inPlace"`
	Restart int    `json:"restart"`
}

// PlanWhatIf plans pods (any order) against next, as if applied. now is
// the version in the cluster (nil: none). nsLabels are the labels by
// namespace name (a namespace absent from it is not checked against
// spec.namespaceSelector). The result does not depend on the order of pods.
func PlanWhatIf(now *Injector, next Injector, pods []*corev1.Pod, nsLabels map[string]map[string]string) WhatIf {
	sorted := slices.Clone(pods)
	slices.SortFunc(sorted, func(a, b *corev1.Pod) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	w := WhatIf{Revision: next.Revision, Transitions: map[string]int{}, Namespaces: []WhatIfNamespace{}}
	if now != nil {
		w.Before = now.Revision
	}
	byNS := map[string]*WhatIfNamespace{}
	var fallback *Plan
	for _, pod := range sorted {
		labels := nsLabels[pod.Namespace]
		p, err := PlanPod(next, pod, labels)
		if err != nil {
			w.ErrorCount++
			if len(w.Errors) < MaxWhatIfErrors {
				w.Errors = append(w.Errors, err.Error())
			}
			continue
		}
		before := "-"
		if now != nil {
			if c, ok := Classify(*now, pod, labels); ok {
				before = string(c.State)
			}
		}
		after := "-"
		if p.Counted {
			w.Counted++
			after = string(p.State)
		}
		if before != after {
			w.Transitions[before+" -> "+after]++
		}
		if p.Way == NoChange {
			continue
		}
		n := byNS[pod.Namespace]
		if n == nil {
			n = &WhatIfNamespace{Name: pod.Namespace}
			byNS[pod.Namespace] = n
		}
		isNew := before == "-" || before == string(Current)
		w.Change++
		n.Change++
		if isNew {
			w.New++
			n.New++
		}
		if p.Way == InPlace {
			w.InPlace++
			n.InPlace++
		} else {
			w.Restart++
			n.Restart++
		}
		if w.Example == nil && isNew && len(p.Containers) > 0 {
			w.Example = &p
		}
		if fallback == nil {
			fallback = &p
		}
	}
	if w.Example == nil {
		w.Example = fallback
	}
	for _, name := range slices.Sorted(maps.Keys(byNS)) {
		w.Namespaces = append(w.Namespaces, *byNS[name])
	}
	if len(w.Transitions) == 0 {
		w.Transitions = nil
	}
	return w
}
