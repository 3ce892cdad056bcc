package controllers

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/internal/podindex"
)

// The paged list asks page after page at the latest resourceVersion with
// the continue token, and the reflector reads the result as a list of
// records (meta.ExtractListWithAlloc, meta.ListAccessor).
func TestPagedListOfRecords(t *testing.T) {
	var asked []metav1.ListOptions
	obj, err := pagedList(context.Background(), metav1.ListOptions{ResourceVersion: "0"}, func(o metav1.ListOptions) (metav1.ListMeta, []*podindex.Pod, error) {
		asked = append(asked, o)
		page := len(asked)
		var out []*podindex.Pod
		for i := range 2 {
			out = append(out, podindex.FromPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("p%d-%d", page, i)}}))
		}
		m := metav1.ListMeta{ResourceVersion: fmt.Sprint(100 + page)}
		if page < 3 {
			m.Continue = fmt.Sprint("c", page)
		}
		return m, out, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(asked) != 3 || asked[0].ResourceVersion != "" || asked[0].Limit != listPageSize || asked[1].Continue != "c1" || asked[2].Continue != "c2" {
		t.Fatalf("pages asked: %+v", asked)
	}
	items, err := meta.ExtractListWithAlloc(obj)
	if err != nil || len(items) != 6 {
		t.Fatalf("items %d, %v", len(items), err)
	}
	lm, err := meta.ListAccessor(obj)
	if err != nil || lm.GetResourceVersion() != "101" {
		t.Fatalf("list resourceVersion %v, %v: want the first page's", lm, err)
	}
	if r, err := record(items[5]); err != nil || r.Name != "p3-1" {
		t.Fatalf("record %+v, %v", r, err)
	}
}
