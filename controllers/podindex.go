package controllers

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/hookwright/hookwright/internal/podindex"
)

// The pod index (internal/podindex) is fed here by two client-go
// reflectors, on the leader only: pods with the field selector
// podFieldSelector (finished pods are filtered on the server) and
// namespaces (for spec.namespaceSelector). The initial sync and every
// re-sync (a watch that expired, 410 Gone) stream the objects (WatchList,
// KEP-3157, on by default from client-go 1.35 and kube-apiserver 1.34).
// Each pod of the stream is compacted and filed into the index as it
// arrives (fileInitialEvents), not held in the reflector's temporary
// store; the reflector keeps what it is good at: retries, backoff,
// resourceVersions, the bookmark, the watch that follows. Where the
// server refuses to stream, the list is paged (listPageSize) and each
// page filed before the next is asked for. Either way a full
// corev1.PodList is never held, nor a second set of the pods, and the
// fleet writes nothing while a listing is under way (Synced).

// podFieldSelector leaves out finished pods: they hold no resources and
// are not counted (the pod garbage collector keeps up to 12,500).
const podFieldSelector = "status.phase!=Succeeded,status.phase!=Failed"

// listPageSize is the page of the paged list (Gatekeeper's audit pages
// by 500 too).
const listPageSize = 500

var (
	// indexLists counts the complete pod lists the index took: the
	// initial sync of each leader and every re-sync (a watch that expired
	// with 410 Gone, an API server restart). A re-sync the operator did
	// not need shows as a step here, not as a change in the counts.
	indexLists = prometheus.NewCounter(prometheus.CounterOpts{Name: "hookwright_pod_index_lists_total",
		Help: "Complete pod lists (streamed or paged) the pod index was rebuilt from: the initial sync and every re-sync."})
	// liveIndex is the index of the running leader, for the metrics.
	liveIndex   atomic.Pointer[podindex.Index]
	indexMetric = func(f func(podindex.Stats) int) func() float64 {
		return func() float64 {
			x := liveIndex.Load()
			if x == nil {
				return 0
			}
			return float64(f(x.Stats()))
		}
	}
)

func init() {
	metrics.Registry.MustRegister(indexLists,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "hookwright_pod_index_pods",
			Help: "Pods held by the operator's pod index (running and pending; finished pods are not watched)."},
			indexMetric(func(s podindex.Stats) int { return s.Pods })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "hookwright_pod_index_bytes",
			Help: "Estimated bytes the pod index holds: records, slots and per-injector states (interned label, annotation and container sets shared between pods not counted)."},
			indexMetric(func(s podindex.Stats) int { return s.Bytes })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "hookwright_pod_index_namespaces",
			Help: "Namespaces known to the pod index."},
			indexMetric(func(s podindex.Stats) int { return s.Namespaces })),
	)
}

// podIndexer runs the reflectors that feed one podindex.Index. It is a
// manager Runnable that needs leader election: a standby holds nothing.
type podIndexer struct {
	idx *podindex.Index
	cs  kubernetes.Interface

	mu sync.Mutex
	// queue is the fleet controller's (set by its source); changes seen
	// before it is set are picked up by the controller's initial list of
	// every SidecarInjector.
	queue workqueue.TypedRateLimitingInterface[reconcile.Request]
	// synced is set once both reflectors delivered their first list.
	podsSynced, nsSynced atomic.Bool
	// lastEvent is when the index last changed (a pod or namespace event).
	lastEvent atomic.Int64
	// done is a listing whose pods were all filed (a stream's
	// initial-events-end bookmark, a paged list's last page), for the
	// reflector's Replace that follows to end.
	done atomic.Pointer[listing]
	log  logr.Logger

	// gcMu guards listing and gcPercent: the collector's pace is
	// tightened from a list's beginning to the end of a list (one that
	// failed and was retried stays one span).
	gcMu      sync.Mutex
	listing   bool
	gcPercent int
}

// listing is a podindex.List the pods of a stream or a paged list were
// filed into, and which of the two it was.
type listing struct {
	list *podindex.List
	how  string
}

// beginList begins a listing of every pod. Until the listing ends the
// index is not Synced: the fleet writes no counts of a half-filed list.
func (p *podIndexer) beginList() *podindex.List {
	p.podsSynced.Store(false)
	p.gcMu.Lock()
	if !p.listing {
		p.listing = true
		// SetGCPercent has no getter: the first call reads the pace.
		p.gcPercent = debug.SetGCPercent(-1)
		debug.SetGCPercent(listGCPercent(p.gcPercent))
	}
	p.gcMu.Unlock()
	return p.idx.BeginList()
}

// listGCPercent is the collector's pace while a list fills the index:
// half the process's own (GOGC, 100 by default). The index grows by every
// pod while each pod's decoding leaves about 4 KB of garbage, so the heap
// the list ends with is the process's high-water mark; a heap goal of
// 1.5 rather than twice what is live lowers it, for more collections in
// the list's seconds (docs/scale.md, run Z). Off (negative) stays off.
func listGCPercent(own int) int {
	if own < 0 {
		return own
	}
	return max(own/2, 10)
}

// endList restores the collector's pace once a list ended and returns
// the list's garbage to the OS at once: the runtime's background
// scavenger would take minutes, the process at its high-water mark
// meanwhile. Lists are rare (a takeover, a watch that expired), so the
// forced collection and scavenge are cheap.
func (p *podIndexer) endList() {
	p.gcMu.Lock()
	if p.listing {
		p.listing = false
		debug.SetGCPercent(p.gcPercent)
	}
	p.gcMu.Unlock()
	debug.FreeOSMemory()
}

// listed hands a listing whose pods were all filed to the reflector's
// Replace that follows.
func (p *podIndexer) listed(how string, l *podindex.List) {
	p.done.Store(&listing{list: l, how: how})
}

func newPodIndexer(cs kubernetes.Interface) *podIndexer {
	return &podIndexer{idx: podindex.New(), cs: cs, log: logr.Discard()}
}

// NeedLeaderElection: only the leader builds and holds the index.
func (p *podIndexer) NeedLeaderElection() bool { return true }

// Synced reports whether the index holds every pod and namespace: a
// list of every pod ended and none is under way.
func (p *podIndexer) Synced() bool { return p.podsSynced.Load() && p.nsSynced.Load() }

// source is the fleet controller's source of the index's changes.
func (p *podIndexer) source() source.Source {
	return source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		p.mu.Lock()
		p.queue = q
		p.mu.Unlock()
		return nil
	})
}

func (p *podIndexer) notify(ch podindex.Changes) {
	p.lastEvent.Store(time.Now().UnixNano())
	if len(ch) == 0 {
		return
	}
	p.mu.Lock()
	q := p.queue
	p.mu.Unlock()
	if q == nil {
		return
	}
	for _, name := range ch {
		q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: name}})
	}
}

// Start runs both reflectors until ctx ends.
func (p *podIndexer) Start(ctx context.Context) error {
	liveIndex.Store(p.idx)
	defer liveIndex.CompareAndSwap(p.idx, nil)
	p.log = log.FromContext(ctx).WithName("pod-index")
	pods := p.cs.CoreV1().Pods(metav1.NamespaceAll)
	podLW := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			// Each page is filed into the index before the next is asked
			// for; the reflector gets an empty list and its Replace ends
			// the listing.
			l := p.beginList()
			list, err := pagedList(ctx, o, func(o metav1.ListOptions) (metav1.ListMeta, []*podindex.Pod, error) {
				o.FieldSelector = podFieldSelector
				page, err := pods.List(ctx, o)
				if err != nil {
					return metav1.ListMeta{}, nil, err
				}
				for i := range page.Items {
					l.Add(p.idx.Record(&page.Items[i]))
				}
				return page.ListMeta, nil, nil
			})
			if err == nil {
				p.listed("paged", l)
			}
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = podFieldSelector
			w, err := pods.Watch(ctx, o)
			if err != nil || o.SendInitialEvents == nil || !*o.SendInitialEvents {
				return w, err
			}
			return p.fileInitialEvents(w), nil
		},
	}
	nss := p.cs.CoreV1().Namespaces()
	nsLW := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return pagedList(ctx, o, func(o metav1.ListOptions) (metav1.ListMeta, []*nsRecord, error) {
				l, err := nss.List(ctx, o)
				if err != nil {
					return metav1.ListMeta{}, nil, err
				}
				out := make([]*nsRecord, len(l.Items))
				for i := range l.Items {
					out[i] = compactNamespace(&l.Items[i])
				}
				return l.ListMeta, out, nil
			})
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return nss.Watch(ctx, o)
		},
	}
	pr := cache.NewReflectorWithOptions(podLW, &corev1.Pod{}, &podStore{p: p}, cache.ReflectorOptions{Name: "hookwright-pod-index"})
	nr := cache.NewReflectorWithOptions(nsLW, &corev1.Namespace{}, &nsStore{p: p}, cache.ReflectorOptions{Name: "hookwright-pod-index-namespaces"})
	var wg sync.WaitGroup
	wg.Go(func() { nr.RunWithContext(ctx) })
	wg.Go(func() { pr.RunWithContext(ctx) })
	log.FromContext(ctx).Info("pod index started")
	wg.Wait()
	return nil
}

// fileInitialEvents files a WatchList stream's initial events into a new
// listing of the index as they arrive and passes the reflector only what
// follows them: the initial-events-end bookmark (after which the
// reflector calls Replace, which ends the listing) and every later event.
// The reflector's own watchList would hold every pod in a temporary store
// keyed by "namespace/name" until the bookmark (client-go
// tools/cache/reflector.go watchList), beside the index it then fills:
// at 150,000 pods that store is most of what a new leader held above its
// steady state (docs/scale.md). A stream that fails before its bookmark
// leaves its listing unended; the reflector's retry begins another.
func (p *podIndexer) fileInitialEvents(w watch.Interface) watch.Interface {
	l := p.beginList()
	initial, first := true, true
	return filterWatch(w, func(e watch.Event) bool {
		if !initial {
			return true
		}
		switch e.Type {
		case watch.Added, watch.Modified:
			if first {
				// The reflector takes a stream that closed within a second
				// having passed it nothing for an error and lists instead;
				// its first pod, passed on, keeps that check true. The
				// reflector's Replace files it.
				first = false
				return true
			}
			if pod, ok := e.Object.(*corev1.Pod); ok {
				l.Add(p.idx.Record(pod))
				return false
			}
		case watch.Deleted:
			if pod, ok := e.Object.(*corev1.Pod); ok {
				p.idx.Delete(pod.Namespace, pod.Name)
				return false
			}
		case watch.Bookmark:
			if m, err := meta.Accessor(e.Object); err == nil && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
				initial = false
				p.listed("streamed", l)
			}
		}
		return true
	})
}

// filteredWatch passes on the events keep accepts. Unlike
// watch.Filter's, its goroutine ends on Stop even while the reader has
// stopped reading (the reflector stops a watch and reads no more) or
// the watch below has not closed yet.
type filteredWatch struct {
	in   watch.Interface
	out  chan watch.Event
	stop chan struct{}
	once sync.Once
}

func filterWatch(in watch.Interface, keep func(watch.Event) bool) watch.Interface {
	w := &filteredWatch{in: in, out: make(chan watch.Event), stop: make(chan struct{})}
	go func() {
		defer close(w.out)
		for {
			select {
			case <-w.stop:
				return
			case e, ok := <-in.ResultChan():
				if !ok {
					return
				}
				if !keep(e) {
					continue
				}
				select {
				case w.out <- e:
				case <-w.stop:
					return
				}
			}
		}
	}()
	return w
}

func (w *filteredWatch) ResultChan() <-chan watch.Event { return w.out }
func (w *filteredWatch) Stop() {
	w.once.Do(func() { close(w.stop) })
	w.in.Stop()
}

// recordList is a page-by-page list of compact records: a runtime.Object
// list the reflector's list path takes as it takes a PodList.
type recordList[T runtime.Object] struct {
	metav1.ListMeta
	Items []T
}

func (l *recordList[T]) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }
func (l *recordList[T]) DeepCopyObject() runtime.Object {
	c := *l
	return &c
}

// pagedList lists in pages of listPageSize at the latest resourceVersion
// (a consistent paged list: the watch cache would otherwise answer
// resourceVersion=0 in one response, whatever the limit), compacting each
// page before asking for the next.
func pagedList[T runtime.Object](ctx context.Context, o metav1.ListOptions, page func(metav1.ListOptions) (metav1.ListMeta, []T, error)) (runtime.Object, error) {
	o.ResourceVersion, o.ResourceVersionMatch, o.Limit, o.Continue = "", "", listPageSize, ""
	out := &recordList[T]{}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		meta, items, err := page(o)
		if err != nil {
			return nil, err
		}
		if out.ResourceVersion == "" {
			out.ResourceVersion = meta.ResourceVersion
		}
		out.Items = append(out.Items, items...)
		if meta.Continue == "" {
			return out, nil
		}
		o.Continue = meta.Continue
	}
}

// podStore is the pod reflector's store: it compacts and indexes.
type podStore struct{ p *podIndexer }

var _ cache.TransformingStore = &podStore{}

// Transformer compacts what of a WatchList stream reaches the reflector's
// temporary store: the first pod of each stream (fileInitialEvents files
// the others into the index).
func (s *podStore) Transformer() cache.TransformFunc { return s.p.idx.Compact }

func record(obj any) (*podindex.Pod, error) {
	switch o := obj.(type) {
	case *podindex.Pod:
		return o, nil
	case *corev1.Pod:
		return podindex.FromPod(o), nil
	case cache.DeletedFinalStateUnknown:
		return record(o.Obj)
	}
	return nil, fmt.Errorf("pod index: unexpected %T", obj)
}

func (s *podStore) Add(obj any) error { return s.Update(obj) }
func (s *podStore) Update(obj any) error {
	r, err := record(obj)
	if err != nil {
		return err
	}
	s.p.notify(s.p.idx.Upsert(r))
	return nil
}
func (s *podStore) Delete(obj any) error {
	r, err := record(obj)
	if err != nil {
		return err
	}
	s.p.notify(s.p.idx.Delete(r.Namespace.String(), r.Name))
	return nil
}

// Replace ends the listing the pods were filed into as they came (the
// stream's initial events or the pages), with items (none from our list
// functions) filed last. Without one under way, items are the list.
func (s *podStore) Replace(items []any, _ string) error {
	var l *podindex.List
	how := "listed"
	if d := s.p.done.Swap(nil); d != nil {
		l, how = d.list, d.how
	} else {
		l = s.p.idx.BeginList()
	}
	for _, it := range items {
		r, err := record(it)
		if err != nil {
			return err
		}
		l.Add(r)
	}
	ch := l.End()
	// Once per list: which path a takeover or a re-sync took shows in the
	// log (a server that refuses WatchList costs it more).
	s.p.log.Info("pod index listed", "pods", s.p.idx.Stats().Pods, "list", how, "changed", len(ch))
	s.p.podsSynced.Store(true)
	indexLists.Inc()
	s.p.notify(ch)
	s.p.endList()
	return nil
}
func (s *podStore) Resync() error { return nil }

// nsRecord is what the index keeps of a namespace: its labels.
type nsRecord struct {
	Name   string
	Labels map[string]string
}

func (n *nsRecord) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }
func (n *nsRecord) DeepCopyObject() runtime.Object   { return n }

func compactNamespace(ns *corev1.Namespace) *nsRecord {
	l := ns.Labels
	if l == nil {
		l = map[string]string{}
	}
	return &nsRecord{Name: ns.Name, Labels: l}
}

// nsStore is the namespace reflector's store.
type nsStore struct{ p *podIndexer }

var _ cache.TransformingStore = &nsStore{}

func (s *nsStore) Transformer() cache.TransformFunc {
	return func(obj any) (any, error) {
		if ns, ok := obj.(*corev1.Namespace); ok {
			return compactNamespace(ns), nil
		}
		return obj, nil
	}
}

func nsOf(obj any) (*nsRecord, error) {
	switch o := obj.(type) {
	case *nsRecord:
		return o, nil
	case *corev1.Namespace:
		return compactNamespace(o), nil
	case cache.DeletedFinalStateUnknown:
		return nsOf(o.Obj)
	}
	return nil, fmt.Errorf("pod index: unexpected %T", obj)
}

func (s *nsStore) Add(obj any) error { return s.Update(obj) }
func (s *nsStore) Update(obj any) error {
	n, err := nsOf(obj)
	if err != nil {
		return err
	}
	s.p.notify(s.p.idx.SetNamespace(n.Name, n.Labels))
	return nil
}
func (s *nsStore) Delete(obj any) error {
	n, err := nsOf(obj)
	if err != nil {
		return err
	}
	s.p.notify(s.p.idx.SetNamespace(n.Name, nil))
	return nil
}
func (s *nsStore) Replace(items []any, _ string) error {
	all := make(map[string]map[string]string, len(items))
	for _, it := range items {
		n, err := nsOf(it)
		if err != nil {
			return err
		}
		all[n.Name] = n.Labels
	}
	ch := s.p.idx.ReplaceNamespaces(all)
	s.p.nsSynced.Store(true)
	s.p.notify(ch)
	return nil
}
func (s *nsStore) Resync() error { return nil }

// NodePods tells what the running pods on one node request (for the
// NodeOversell pass: oversellnodes.PodSource).
func (p *podIndexer) NodePods(node string) (podindex.NodePods, bool) { return p.idx.Node(node) }
