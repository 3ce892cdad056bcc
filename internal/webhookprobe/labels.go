package webhookprobe

import (
	"fmt"
	"maps"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// existsValue is the value given to a key a selector only requires to exist.
const existsValue = "probe"

// Satisfying returns base plus labels that make sel match: matchLabels as
// they are, the first value of each In requirement and existsValue for
// each Exists one; a key base has that sel requires otherwise is replaced,
// a NotIn or DoesNotExist requirement on a key of base removes it. It
// fails when no label set matches (e.g. key In [a] with key NotIn [a]) or
// sel is invalid. A nil sel matches everything.
func Satisfying(sel *metav1.LabelSelector, base map[string]string) (map[string]string, error) {
	out := maps.Clone(base)
	if out == nil {
		out = map[string]string{}
	}
	if sel == nil {
		return out, nil
	}
	maps.Copy(out, sel.MatchLabels)
	for _, r := range sel.MatchExpressions {
		switch r.Operator {
		case metav1.LabelSelectorOpIn:
			if _, ok := sel.MatchLabels[r.Key]; !ok && len(r.Values) > 0 {
				if v, ok := out[r.Key]; !ok || !contains(r.Values, v) {
					out[r.Key] = r.Values[0]
				}
			}
		case metav1.LabelSelectorOpExists:
			if _, ok := out[r.Key]; !ok {
				out[r.Key] = existsValue
			}
		case metav1.LabelSelectorOpDoesNotExist:
			delete(out, r.Key)
		case metav1.LabelSelectorOpNotIn:
			if v, ok := out[r.Key]; ok && contains(r.Values, v) {
				delete(out, r.Key)
			}
		}
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return nil, err
	}
	if !s.Matches(labels.Set(out)) {
		return nil, fmt.Errorf("no labels match selector %s", s)
	}
	return out, nil
}

func contains(vs []string, v string) bool {
	for _, x := range vs {
		if x == v {
			return true
		}
	}
	return false
}
