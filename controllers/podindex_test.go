package controllers

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// A continue token that expired mid-list (410, the API server compacted
// etcd past the list's resourceVersion) ends the list with that error,
// nothing kept: the reflector lists again from the first page, as it
// does after any failed list (client-go's pager would instead ask for
// every pod in one response, the peak the paged list exists to avoid).
func TestPagedListExpiredMidway(t *testing.T) {
	pages := 0
	obj, err := pagedList(context.Background(), metav1.ListOptions{}, func(o metav1.ListOptions) (metav1.ListMeta, []*podindex.Pod, error) {
		pages++
		if pages == 2 {
			return metav1.ListMeta{}, nil, apierrors.NewResourceExpired("the provided continue parameter is too old")
		}
		return metav1.ListMeta{ResourceVersion: "100", Continue: "c1"}, []*podindex.Pod{podindex.FromPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}})}, nil
	})
	if obj != nil || !apierrors.IsResourceExpired(err) || pages != 2 {
		t.Fatalf("got %v, %v after %d pages: want no list, the 410 and no third page", obj, err, pages)
	}
}
