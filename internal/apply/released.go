package apply

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
	"sigs.k8s.io/structured-merge-diff/v6/value"
)

// Released returns the fields an apply of desired would remove from live,
// sorted: those FieldManager's Apply entry in live's metadata.managedFields
// owns, that desired (as returned by ToApplyObject) no longer sets, and
// that no other entry (another manager, or an Update by this one) also
// owns. Status is left out: an apply of the object does not change it. The API server removes exactly those on the next apply
// (server-side apply, KEP-555: a field dropped from the applied
// configuration is removed when no other manager owns it). A path is
// reported up to its first element desired lacks, in Drift's notation
// with list elements by key, e.g.
// "spec.template.spec.containers[name=server].resources.limits.cpu".
//
// The entry must be of desired's apiVersion (its field paths are of that
// version); an entry of another version, or one that does not parse, is
// ignored and only the subset comparison of Drift applies.
func Released(desired, live map[string]any) []string {
	entries, _ := nestedNoCopy(live, "metadata", "managedFields").([]any)
	var ours *fieldpath.Set
	var others []*fieldpath.Set
	for _, e := range entries {
		em, _ := e.(map[string]any)
		set, err := fieldsV1(em["fieldsV1"])
		if err != nil {
			continue
		}
		if em["manager"] == FieldManager && em["operation"] == "Apply" && (em["subresource"] == nil || em["subresource"] == "") {
			if em["apiVersion"] == desired["apiVersion"] {
				ours = set
			}
			continue
		}
		others = append(others, set)
	}
	if ours == nil {
		return nil
	}
	seen := map[string]bool{}
	var out []string
	ours.Iterate(func(p fieldpath.Path) {
		if len(p) > 0 && p[0].FieldName != nil && *p[0].FieldName == "status" {
			// An apply to the object never changes its status (the
			// registry strategies' ResetFields); ToApplyObject sends none.
			return
		}
		n := missingAt(desired, p)
		if n < 0 {
			return
		}
		for _, o := range others {
			if keeps(o, p) {
				return
			}
		}
		if s := pathString(p[:n+1]); !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	})
	return out
}

func nestedNoCopy(m map[string]any, path ...string) any {
	var cur any = m
	for _, k := range path {
		cm, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = cm[k]
	}
	return cur
}

// fieldsV1 parses a managedFields entry's fieldsV1: a map when converted
// from a typed object or decoded from JSON, a string or bytes otherwise.
func fieldsV1(v any) (*fieldpath.Set, error) {
	var raw []byte
	switch t := v.(type) {
	case nil:
		return nil, fmt.Errorf("no fieldsV1")
	case string:
		raw = []byte(t)
	case []byte:
		raw = t
	default:
		b, err := json.Marshal(t)
		if err != nil {
			return nil, err
		}
		raw = b
	}
	s := &fieldpath.Set{}
	if err := s.FromJSON(bytes.NewReader(raw)); err != nil {
		return nil, err
	}
	return s, nil
}

// missingAt returns the index of the first element of p that desired
// lacks, or -1 when desired has the whole path.
func missingAt(desired map[string]any, p fieldpath.Path) int {
	var cur any = desired
	for i, pe := range p {
		next, ok := step(cur, pe)
		if !ok {
			return i
		}
		cur = next
	}
	return -1
}

// step selects pe in cur.
func step(cur any, pe fieldpath.PathElement) (any, bool) {
	switch {
	case pe.FieldName != nil:
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		v, ok := m[*pe.FieldName]
		return v, ok && v != nil
	case pe.Key != nil:
		l, _ := cur.([]any)
		for _, e := range l {
			if em, ok := e.(map[string]any); ok && keyMatches(em, *pe.Key) {
				return e, true
			}
		}
	case pe.Value != nil:
		want := (*pe.Value).Unstructured()
		l, _ := cur.([]any)
		for _, e := range l {
			if scalarEqual(e, want) {
				return e, true
			}
		}
	case pe.Index != nil:
		l, _ := cur.([]any)
		if *pe.Index >= 0 && *pe.Index < len(l) {
			return l[*pe.Index], true
		}
	}
	return nil, false
}

// keyMatches reports whether the list element e is the one key selects.
// A key field e lacks is taken as matching: the API server fills in the
// defaults of key fields (a Service port's protocol) before it records the
// key, and ToApplyObject leaves them out when the operator does not set
// them. At least one key field must be present and equal.
func keyMatches(e map[string]any, key value.FieldList) bool {
	matched := false
	for _, f := range key {
		v, ok := e[f.Name]
		if !ok || v == nil {
			continue
		}
		if !scalarEqual(v, f.Value.Unstructured()) {
			return false
		}
		matched = true
	}
	return matched
}

// keeps reports whether s owns p or anything below it: then an apply
// without p leaves it on the object.
func keeps(s *fieldpath.Set, p fieldpath.Path) bool {
	if len(p) == 0 {
		return false
	}
	for _, pe := range p[:len(p)-1] {
		s = s.WithPrefix(pe)
	}
	last := p[len(p)-1]
	return s.Members.Has(last) || !s.WithPrefix(last).Empty()
}

// pathString writes p in Drift's notation: fields joined by dots, list
// elements as [key=value,...], [value] or [index].
func pathString(p fieldpath.Path) string {
	var b strings.Builder
	for _, pe := range p {
		switch {
		case pe.FieldName != nil:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(*pe.FieldName)
		case pe.Key != nil:
			kv := make([]string, 0, len(*pe.Key))
			for _, f := range *pe.Key {
				kv = append(kv, fmt.Sprintf("%s=%v", f.Name, f.Value.Unstructured()))
			}
			b.WriteString("[" + strings.Join(kv, ",") + "]")
		case pe.Value != nil:
			fmt.Fprintf(&b, "[%v]", (*pe.Value).Unstructured())
		case pe.Index != nil:
			b.WriteString("[" + strconv.Itoa(*pe.Index) + "]")
		}
	}
	return b.String()
}
