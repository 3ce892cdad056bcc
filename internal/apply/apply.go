// Package apply writes the objects the operator owns with server-side
// apply: ToApplyObject turns a desired object into exactly the fields the
// operator claims and Drift compares them with the live object (apply.go,
// released.go: pure functions); Applier (applier.go, the I/O shell) writes
// only on drift, within a repair budget, and reports each write as an Event.
//
// Drift has two halves. A field desired sets that live lacks or holds
// with another value is drift (a subset comparison: server defaults and
// other managers' fields are not). A field desired no longer sets is drift
// when the operator's own field manager still owns it in live's
// metadata.managedFields and no other manager does (Released): an apply
// removes exactly those (server-side apply, KEP-555), so clearing
// spec.server.priorityClassName or a resource limit reaches the
// Deployment. The record of what the operator last applied is the one the
// API server keeps on the object, read with structured-merge-diff's
// fieldpath; it survives operator restarts and leader changes, costs no
// annotation of our own, and, unlike a hash of the desired object kept in
// an annotation, tells which field went and leaves a field another
// manager also owns alone (applying would not remove it, so a hash would
// write in vain on every change of rendering). An object that already
// matches has nothing missing and nothing released: no write.
//
// A CR's status has more than one writer: StatusSplit (status.go, pure)
// says which fields and conditions each owns, and ApplyStatus
// (statuswrite.go) applies one writer's share under its own field
// manager; MigrateStatusManagers hands what earlier versions' merge
// patches own to those managers.
//
// It must not import the operator's other packages (desired objects come
// in as client.Object): the reconcilers call it, never the reverse.
package apply

import (
	"fmt"
	"reflect"
	"slices"
	"sort"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// FieldManager is the server-side apply field manager of every write.
const FieldManager = "hookwright"

// ToApplyObject converts a typed desired object into the unstructured
// content sent with server-side apply: apiVersion and kind set from gvk,
// status and server-populated metadata removed, and nil values and empty
// maps pruned, so the operator claims only the fields it sets.
func ToApplyObject(obj runtime.Object, gvk schema.GroupVersionKind) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	delete(m, "status")
	if md, ok := m["metadata"].(map[string]any); ok {
		for _, k := range []string{"creationTimestamp", "resourceVersion", "uid", "generation", "managedFields"} {
			delete(md, k)
		}
	}
	var keep [][]string
	for _, path := range emptyStatements[gvk.GroupKind()] {
		if v, ok, _ := unstructured.NestedFieldNoCopy(m, path...); ok && v != nil {
			keep = append(keep, path)
		}
	}
	pruned, _ := prune(m).(map[string]any)
	for _, path := range keep {
		_ = unstructured.SetNestedField(pruned, map[string]any{}, path...)
	}
	u := &unstructured.Unstructured{Object: pruned}
	u.SetGroupVersionKind(gvk)
	return u, nil
}

// emptyStatements are empty objects that say something and survive
// pruning: a cert-manager Issuer's `selfSigned: {}` selects its type.
var emptyStatements = map[schema.GroupKind][][]string{
	{Group: "cert-manager.io", Kind: "Issuer"}: {{"spec", "selfSigned"}},
}

// prune drops nil values and maps that become empty. Lists are kept as
// they are (an empty list is a statement).
func prune(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			p := prune(e)
			if p == nil {
				delete(t, k)
				continue
			}
			if pm, ok := p.(map[string]any); ok && len(pm) == 0 {
				delete(t, k)
				continue
			}
			t[k] = p
		}
		return t
	case []any:
		for i, e := range t {
			t[i] = prune(e)
		}
		return t
	}
	return v
}

// Drift compares desired (as returned by ToApplyObject) with live (the
// object as read from the API, converted to unstructured, with its
// metadata.managedFields) and returns the paths where an apply of desired
// would change live, sorted; nil means it would change nothing. Maps
// compare as subsets (fields the operator does not set, such as server
// defaults or other managers' labels, are ignored); lists must have the
// same length and match element by element; and every field Released
// finds (the operator applied it before, desired no longer has it) is
// drift too. apiVersion and kind are not compared. A live object without
// managedFields (a fake client's) gets the subset comparison only.
func Drift(desired, live map[string]any) []string {
	var out []string
	for k, dv := range desired {
		if k == "apiVersion" || k == "kind" {
			continue
		}
		diff(k, dv, live[k], &out)
	}
	out = append(out, Released(desired, live)...)
	sort.Strings(out)
	return slices.Compact(out)
}

func diff(path string, d, l any, out *[]string) {
	switch dt := d.(type) {
	case map[string]any:
		lt, ok := l.(map[string]any)
		if !ok {
			*out = append(*out, path)
			return
		}
		for k, dv := range dt {
			diff(path+"."+k, dv, lt[k], out)
		}
	case []any:
		lt, ok := l.([]any)
		if !ok || len(lt) != len(dt) {
			// An empty desired list matches an absent one (omitempty).
			if len(dt) == 0 && (l == nil || ok && len(lt) == 0) {
				return
			}
			*out = append(*out, path)
			return
		}
		for i := range dt {
			diff(fmt.Sprintf("%s[%d]", path, i), dt[i], lt[i], out)
		}
	default:
		if !scalarEqual(d, l) {
			*out = append(*out, path)
		}
	}
}

// scalarEqual treats integers of any width as equal by value: the converter
// yields int64 for typed objects, JSON decoding may yield float64.
func scalarEqual(a, b any) bool {
	if ai, ok := asInt(a); ok {
		if bi, ok := asInt(b); ok {
			return ai == bi
		}
	}
	return reflect.DeepEqual(a, b)
}

func asInt(v any) (int64, bool) {
	switch t := v.(type) {
	case int64:
		return t, true
	case int:
		return int64(t), true
	case int32:
		return int64(t), true
	case float64:
		if t == float64(int64(t)) {
			return int64(t), true
		}
	}
	return 0, false
}
