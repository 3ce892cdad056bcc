package apply

import (
	"fmt"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// StatusManager is the field manager of the status fields and conditions
// of a CR that no StatusPart names: the lifecycle reconciler's.
const StatusManager = "hookwright-lifecycle"

// StatusPart is one writer's share of a CR's status: the top-level status
// fields and the status.conditions types it alone writes, applied under
// its own field manager (server-side apply, KEP-555). status.conditions
// must be a list map keyed by type (+listType=map, +listMapKey=type), so
// that each condition is owned apart.
type StatusPart struct {
	Manager    string
	Fields     []string
	Conditions []string
}

// StatusSplit shares a kind's status between its writers: each of Parts
// owns what it names, StatusManager everything else. Each writer applies
// its whole share and nothing more, so the API server keeps the others'
// fields and conditions, and a field or condition a writer stops sending
// is removed. The zero value gives StatusManager all of the status.
type StatusSplit struct {
	Parts []StatusPart
}

// Managers are the split's field managers, StatusManager first.
func (s StatusSplit) Managers() []string {
	m := []string{StatusManager}
	for _, p := range s.Parts {
		m = append(m, p.Manager)
	}
	return m
}

// StatusObject is what manager applies of obj's status: apiVersion and
// kind from gvk, metadata.name, metadata.resourceVersion (the apply's
// precondition: a conflict when obj was stale) and the status fields and
// conditions of manager's share. An unknown manager is an error.
func (s StatusSplit) StatusObject(obj runtime.Object, gvk schema.GroupVersionKind, manager string) (*unstructured.Unstructured, error) {
	if !slices.Contains(s.Managers(), manager) {
		return nil, fmt.Errorf("field manager %q has no share of %s status", manager, gvk.Kind)
	}
	content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetGroupVersionKind(gvk)
	in := &unstructured.Unstructured{Object: content}
	u.SetName(in.GetName())
	if ns := in.GetNamespace(); ns != "" {
		u.SetNamespace(ns)
	}
	if rv := in.GetResourceVersion(); rv != "" {
		u.SetResourceVersion(rv)
	}
	status, _ := content["status"].(map[string]any)
	u.Object["status"] = s.share(status, manager)
	return u, nil
}

// share is manager's part of status (not copied: the result is only
// marshalled). A condition without a type goes to StatusManager.
func (s StatusSplit) share(status map[string]any, manager string) map[string]any {
	out := map[string]any{}
	for k, v := range status {
		if k != "conditions" {
			if s.fieldOwner(k) == manager {
				out[k] = v
			}
			continue
		}
		list, _ := v.([]any)
		var mine []any
		for _, c := range list {
			t, _ := c.(map[string]any)["type"].(string)
			if s.conditionOwner(t) == manager {
				mine = append(mine, c)
			}
		}
		if mine != nil {
			out[k] = mine
		}
	}
	return out
}

func (s StatusSplit) fieldOwner(field string) string {
	for _, p := range s.Parts {
		if slices.Contains(p.Fields, field) {
			return p.Manager
		}
	}
	return StatusManager
}

func (s StatusSplit) conditionOwner(typ string) string {
	for _, p := range s.Parts {
		if slices.Contains(p.Conditions, typ) {
			return p.Manager
		}
	}
	return StatusManager
}

// pathOwners are the managers a managed path of the status subresource
// goes to: status.conditions' list node to every manager with
// conditions, a condition to its type's owner, a field to its owner.
func (s StatusSplit) pathOwners(p fieldpath.Path) []string {
	if len(p) < 2 || p[0].FieldName == nil || *p[0].FieldName != "status" || p[1].FieldName == nil {
		return []string{StatusManager}
	}
	f := *p[1].FieldName
	if f != "conditions" {
		return []string{s.fieldOwner(f)}
	}
	if len(p) == 2 || p[2].Key == nil {
		m := []string{StatusManager}
		for _, part := range s.Parts {
			if len(part.Conditions) > 0 {
				m = append(m, part.Manager)
			}
		}
		return m
	}
	for _, k := range *p[2].Key {
		if k.Name == "type" && k.Value.IsString() {
			return []string{s.conditionOwner(k.Value.AsString())}
		}
	}
	return []string{StatusManager}
}

// MigrateStatus moves what Update operations of the managers old own of
// the status subresource to the split's Apply managers, each getting the
// paths of its share, merged with what it already owns. Without it, a
// field written by merge patches before the split would stay owned by
// the old manager, and an apply that stops sending it would never remove
// it. (client-go's util/csaupgrade moves an old manager's fields to one
// new manager; here they are shared out first.) apiVersion is the one
// the new entries record. It returns entries unchanged and false when no
// old entry is there.
func (s StatusSplit) MigrateStatus(entries []metav1.ManagedFieldsEntry, old []string, apiVersion string, now metav1.Time) ([]metav1.ManagedFieldsEntry, bool, error) {
	shares := map[string]*fieldpath.Set{}
	var kept []metav1.ManagedFieldsEntry
	moved := false
	for _, e := range entries {
		if e.Operation != metav1.ManagedFieldsOperationUpdate || e.Subresource != "status" || !slices.Contains(old, e.Manager) {
			kept = append(kept, e)
			continue
		}
		moved = true
		set, err := decodeFields(e.FieldsV1)
		if err != nil {
			return entries, false, fmt.Errorf("managedFields of %s: %w", e.Manager, err)
		}
		set.Iterate(func(p fieldpath.Path) {
			for _, m := range s.pathOwners(p) {
				if shares[m] == nil {
					shares[m] = &fieldpath.Set{}
				}
				shares[m].Insert(p)
			}
		})
	}
	if !moved {
		return entries, false, nil
	}
	for i, e := range kept {
		add := shares[e.Manager]
		if add == nil || e.Operation != metav1.ManagedFieldsOperationApply || e.Subresource != "status" {
			continue
		}
		set, err := decodeFields(e.FieldsV1)
		if err != nil {
			return entries, false, fmt.Errorf("managedFields of %s: %w", e.Manager, err)
		}
		raw, err := set.Union(add).ToJSON()
		if err != nil {
			return entries, false, err
		}
		kept[i].FieldsV1 = &metav1.FieldsV1{Raw: raw}
		delete(shares, e.Manager)
	}
	for _, m := range s.Managers() {
		set := shares[m]
		if set == nil || set.Empty() {
			continue
		}
		raw, err := set.ToJSON()
		if err != nil {
			return entries, false, err
		}
		kept = append(kept, metav1.ManagedFieldsEntry{Manager: m, Operation: metav1.ManagedFieldsOperationApply,
			APIVersion: apiVersion, Time: &now, FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: raw}, Subresource: "status"})
	}
	return kept, true, nil
}

// decodeFields is fieldsV1 of an entry's FieldsV1; none is an empty set.
func decodeFields(f *metav1.FieldsV1) (*fieldpath.Set, error) {
	if f == nil {
		return &fieldpath.Set{}, nil
	}
	return fieldsV1(f.Raw)
}
