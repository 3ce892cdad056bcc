package controllers

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

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

// A stream's initial events are filed into the index as they arrive:
// the reflector is passed the first pod, the initial-events-end bookmark
// (after which its Replace ends the listing) and every later event, and
// the pod the index held but the stream did not name goes at the end.
func TestFileInitialEvents(t *testing.T) {
	p := newPodIndexer(nil)
	mk := func(name string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: "5"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	}
	p.idx.Upsert(podindex.FromPod(mk("gone")))
	up := watch.NewFake()
	w := p.fileInitialEvents(up)
	passed := make(chan watch.Event, 10)
	go func() {
		for e := range w.ResultChan() {
			passed <- e
		}
		close(passed)
	}()
	up.Add(mk("a"))
	up.Add(mk("b"))
	up.Add(mk("c"))
	bookmark := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "9", Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
	up.Action(watch.Bookmark, bookmark)
	up.Modify(mk("b"))
	if e := <-passed; e.Type != watch.Added || e.Object.(*corev1.Pod).Name != "a" {
		t.Fatalf("first passed %v %v, want the first pod", e.Type, e.Object)
	}
	if e := <-passed; e.Type != watch.Bookmark {
		t.Fatalf("second passed %v, want the bookmark (b and c filed)", e.Type)
	}
	if e := <-passed; e.Type != watch.Modified {
		t.Fatalf("third passed %v, want the event after the bookmark", e.Type)
	}
	if got := p.idx.Stats().Pods; got != 3 {
		t.Fatalf("%d pods held before the reflector's Replace, want 3 (gone, b, c)", got)
	}
	// What the reflector does after the bookmark: Replace with its
	// temporary store, which holds the first pod.
	s := &podStore{p: p}
	first, _ := p.idx.Compact(mk("a"))
	if err := s.Replace([]any{first}, "9"); err != nil {
		t.Fatal(err)
	}
	if got := p.idx.Stats().Pods; got != 3 || !p.podsSynced.Load() {
		t.Fatalf("after Replace: %d pods (want a, b, c), synced %v", got, p.podsSynced.Load())
	}
	w.Stop()
	for range passed {
	}
}

// A watch stopped while nobody reads it (the reflector stops a watch and
// reads no more), over a watch that has not closed, ends its goroutine:
// its channel closes.
func TestFilterWatchStops(t *testing.T) {
	up := &openWatch{ch: make(chan watch.Event, 1)}
	w := filterWatch(up, func(watch.Event) bool { return true })
	up.ch <- watch.Event{Type: watch.Added, Object: &corev1.Pod{}}
	for len(up.ch) > 0 {
		runtime.Gosched()
	}
	w.Stop()
	// The event in flight may still pass; then the channel closes.
	n := 0
	for range w.ResultChan() {
		n++
	}
	if n > 1 {
		t.Fatalf("%d events passed after Stop, at most the one in flight", n)
	}
}

// openWatch is a watch whose channel never closes, Stop or not.
type openWatch struct{ ch chan watch.Event }

func (w *openWatch) ResultChan() <-chan watch.Event { return w.ch }
func (w *openWatch) Stop()                          {}

// A list tightens the collector's pace to half the process's own until a
// list ends, however many lists began (a failed stream and its retry).
func TestListGCPace(t *testing.T) {
	own := debug.SetGCPercent(100)
	defer debug.SetGCPercent(own)
	p := newPodIndexer(nil)
	p.beginList()
	p.beginList()
	if got := debug.SetGCPercent(50); got != 50 {
		t.Fatalf("pace while listing %d, want 50", got)
	}
	p.endList()
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("pace after the list %d, want 100 again", got)
	}
	for _, c := range [][2]int{{100, 50}, {200, 100}, {15, 10}, {-1, -1}} {
		if got := listGCPercent(c[0]); got != c[1] {
			t.Errorf("listGCPercent(%d) = %d, want %d", c[0], got, c[1])
		}
	}
}
