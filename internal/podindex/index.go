package podindex

import (
	"cmp"
	"slices"
	"sync"
	"unique"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/fleet"
)

// recordSize is a Pod's struct size; slotOverhead what the index adds per
// pod besides, but for byKey (a slot and a node list entry, with the
// slices' spare room).
var recordSize = int(unsafe.Sizeof(Pod{}))

const slotOverhead = 16

// state is a pod's fleet.State for one injector, one byte; stateTable packs two a byte.
type state uint8

const (
	none state = iota
	current
	outdated
	missing
	orphaned
)

var states = [...]fleet.State{none: "", current: fleet.Current, outdated: fleet.Outdated, missing: fleet.Missing, orphaned: fleet.Orphaned}

func stateOf(s fleet.State) state {
	switch s {
	case fleet.Current:
		return current
	case fleet.Outdated:
		return outdated
	case fleet.Missing:
		return missing
	case fleet.Orphaned:
		return orphaned
	}
	return none
}

// stateTable holds one injector's state of each pod slot, two slots a
// byte (a state needs three bits): 75 KB per injector at 150,000 pods.
// Its zero value holds no slot.
type stateTable struct {
	b []byte
	n int
}

func newStateTable(n int) stateTable { return stateTable{b: make([]byte, (n+1)/2), n: n} }

// len is the number of slots.
func (t *stateTable) len() int { return t.n }

func (t *stateTable) get(i int32) state {
	return state(t.b[i/2] >> (4 * (i % 2)) & 0xf)
}

func (t *stateTable) set(i int32, s state) {
	sh := 4 * (i % 2)
	t.b[i/2] = t.b[i/2]&^(0xf<<sh) | byte(s)<<sh
}

// grow adds one slot, none.
func (t *stateTable) grow() {
	if t.n%2 == 0 {
		t.b = append(t.b, 0)
	}
	t.n++
}

type podKey struct {
	ns   str
	name string
}

// injector is one SidecarInjector's compiled form and its counts.
type injector struct {
	name    string
	id      string // what it was compiled from: a change re-classifies
	inj     fleet.Injector
	rolling bool
	// states holds each slot's state.
	states stateTable
	total  v1alpha1.FleetCounts
	byNS   map[str]*v1alpha1.FleetCounts
}

type namespace struct {
	labels map[string]string // nil: not known (yet)
	pods   int
}

type node struct {
	cpu, mem, exclusive int64
	memFormat           resource.Format
	slots               []int32
}

// Index holds the records of every pod the operator watches, each pod's
// state for each registered injector and the sums per injector,
// namespace and node. It is safe for concurrent use; writers are the
// shell's reflector stores, readers the reconcilers.
type Index struct {
	mu         sync.RWMutex
	slots      []*Pod // a free slot is nil; records are shared, never modified
	free       []int32
	byKey      keyTable
	namespaces map[string]*namespace
	nodes      map[str]*node
	injectors  map[string]*injector
	bytes      int
	// list is the listing under way (BeginList), if any.
	list *List
}

// New returns an empty index.
func New() *Index {
	return &Index{byKey: newKeyTable(), namespaces: map[string]*namespace{}, nodes: map[str]*node{},
		injectors: map[string]*injector{}}
}

// Stats is the index's size.
type Stats struct {
	// Pods indexed; Bytes an estimate of the memory they hold (records,
	// slots, states; interned strings shared between pods not counted).
	Pods, Bytes, Namespaces, Nodes, Injectors int
}

// Stats tells the index's size.
func (x *Index) Stats() Stats {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return Stats{Pods: x.byKey.n, Bytes: x.bytes + x.byKey.bytes() + (len(x.slots)+1)/2*len(x.injectors), Namespaces: len(x.namespaces),
		Nodes: len(x.nodes), Injectors: len(x.injectors)}
}

// Changes names the injectors whose counts (or, for a rolling one, whose
// pods) an update moved, sorted.
type Changes []string

func (c *Changes) add(name string) {
	if !slices.Contains(*c, name) {
		*c = append(*c, name)
	}
}

// SetInjector registers or updates one injector. id identifies what inj
// was compiled from (UID, generation, revision, server version): the same
// id keeps the states; another one re-classifies every pod once. rolling
// tells whether the injector's rollout wants every change of its pods.
// It reports whether the counts moved.
func (x *Index) SetInjector(name, id string, inj fleet.Injector, rolling bool) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	in := x.injectors[name]
	if in != nil && in.id == id {
		in.rolling = rolling
		return false
	}
	before := v1alpha1.FleetCounts{}
	if in != nil {
		before = in.total
	}
	in = &injector{name: name, id: id, inj: inj, rolling: rolling, states: newStateTable(len(x.slots)), byNS: map[str]*v1alpha1.FleetCounts{}}
	x.injectors[name] = in
	memo := newMemo()
	for i, p := range x.slots {
		if p == nil {
			continue
		}
		s := memo.classify(x, in, p)
		in.states.set(int32(i), s)
		in.count(p.Namespace, s, 1)
	}
	return before != in.total
}

// RemoveInjector forgets one injector.
func (x *Index) RemoveInjector(name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.injectors, name)
}

// memoKey is what a classification reads of a pod for any injector:
// pods that share it (the replicas of one template in one namespace)
// share their states, which Replace and upsert rely on. The shape also holds
// the owner and the requests, which classification does not read: a key
// finer than needed is still correct and the replicas of one template
// share all of it, so the memo keys on the whole shape (one handle).
type memoKey struct {
	ns       str
	shape    unique.Handle[shape]
	deleting bool
	phase    phase
}

// memo holds one injector's states during one pass over the pods (an
// injector change, a namespace's labels changed), by passKey: one entry
// per distinct key (about 50 bytes each) and one per namespace for its
// fleet.NamespaceKey, dropped after the pass. Keyed by the namespace's
// kind rather than its name, an injector change classifies each template
// once per kind of namespace (those its selector takes, those it leaves,
// and the few it treats by name), not once per namespace. A bounded memo
// cost more than it saved: slots are in arrival order, so the replicas of
// one template are not adjacent, and 20,000 keys in a 4,096-entry memo
// made a template change on 50 injectors at 150,000 pods take 156 s
// instead of 11 s.
type memo struct {
	states map[passKey]state
	nsKeys map[str]fleet.NamespaceKey
}

// passKey is what one injector's classification reads of a pod: its
// namespace's fleet.NamespaceKey for that injector, and the rest of
// memoKey.
type passKey struct {
	ns       fleet.NamespaceKey
	shape    unique.Handle[shape]
	deleting bool
	phase    phase
}

func newMemo() memo {
	return memo{states: map[passKey]state{}, nsKeys: map[str]fleet.NamespaceKey{}}
}

func keyOf(p *Pod) memoKey {
	return memoKey{p.Namespace, p.shape, p.Deleting, p.phase}
}

// classify is in's state for p, from the memo or classified.
func (m memo) classify(x *Index, in *injector, p *Pod) state {
	nk, ok := m.nsKeys[p.Namespace]
	if !ok {
		ns := p.Namespace.String()
		nk = fleet.KeyOfNamespace(in.inj, ns, x.nsLabels(ns))
		m.nsKeys[p.Namespace] = nk
	}
	k := passKey{nk, p.shape, p.Deleting, p.phase}
	if s, ok := m.states[k]; ok {
		return s
	}
	s := x.classify(in, p.View())
	m.states[k] = s
	return s
}

// classify is fleet.Classify (and through it sidecar.Decide, the
// webhook's own decision) on the record's view.
func (x *Index) classify(in *injector, view *corev1.Pod) state {
	c, ok := fleet.Classify(in.inj, view, x.nsLabels(view.Namespace))
	if !ok {
		return none
	}
	return stateOf(c.State)
}

func (x *Index) nsLabels(ns string) map[string]string {
	if n := x.namespaces[ns]; n != nil {
		return n.labels
	}
	return nil
}

func (in *injector) count(ns str, s state, d int32) {
	if s == none {
		return
	}
	c := in.byNS[ns]
	if c == nil {
		c = &v1alpha1.FleetCounts{}
		in.byNS[ns] = c
	}
	for _, fc := range []*v1alpha1.FleetCounts{&in.total, c} {
		switch s {
		case current:
			fc.CurrentPods += d
		case outdated:
			fc.OutdatedPods += d
		case missing:
			fc.MissingPods += d
		case orphaned:
			fc.OrphanedPods += d
		}
		fc.MatchedPods = fc.CurrentPods + fc.OutdatedPods + fc.MissingPods
		fc.InjectedPods = fc.CurrentPods + fc.OutdatedPods + fc.OrphanedPods
	}
	if *c == (v1alpha1.FleetCounts{}) {
		delete(in.byNS, ns)
	}
}

// Compact turns a pod into its record (Record). Anything else (a
// tombstone, another type) is returned unchanged, so Compact is a
// client-go TransformFunc: whatever of a stream reaches a reflector's
// temporary store (kubernetes PR #131799) is held compacted, never as a
// full corev1.Pod.
func (x *Index) Compact(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return x.Record(pod), nil
}

// Record is pod's record: the one the index holds when the pod has not
// changed since (the same UID and resourceVersion), so a re-sync of
// unchanged pods holds no second record and classifies none of them
// again; else FromPod(pod).
func (x *Index) Record(pod *corev1.Pod) *Pod {
	x.mu.RLock()
	i, ok := x.byKey.get(podKey{intern(pod.Namespace), pod.Name}, x.slots)
	var held *Pod
	if ok {
		held = x.slots[i]
	}
	x.mu.RUnlock()
	if held != nil && pod.ResourceVersion != "" && held.hasIDs(pod.UID, pod.ResourceVersion) {
		return held
	}
	return FromPod(pod)
}

// Upsert adds or replaces one pod's record. A finished pod is removed:
// it holds no resources and is not counted.
func (x *Index) Upsert(p *Pod) Changes {
	if p.Finished() {
		return x.Delete(p.Namespace.String(), p.Name)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	var ch Changes
	x.upsert(p, &ch, -1)
	slices.Sort(ch)
	return ch
}

// upsert indexes p and returns its slot. like, when not -1, is the slot
// of a pod with p's memoKey, classified already: p takes its states.
func (x *Index) upsert(p *Pod, ch *Changes, like int32) int32 {
	k := podKey{p.Namespace, p.Name}
	i, ok := x.byKey.get(k, x.slots)
	if !ok {
		i = x.alloc()
		x.byKey.put(k, i, x.slots)
		x.ns(p.Namespace.String()).pods++
	} else {
		old := x.slots[i]
		if old == p {
			// The record held (Record): states, counts and node sums
			// stand.
			return i
		}
		if like < 0 && keyOf(old) == keyOf(p) {
			// What classification reads did not change (a status or
			// readiness update, most pod events): the states stand.
			like = i
		}
		x.unnode(i)
		x.bytes -= old.size()
	}
	x.slots[i] = p
	x.bytes += p.size()
	x.addNode(i)
	var view *corev1.Pod
	for _, in := range x.injectors {
		old := in.states.get(i)
		if !ok {
			old = none
		}
		var s state
		if like >= 0 {
			s = in.states.get(like)
		} else {
			if view == nil {
				view = p.View()
			}
			s = x.classify(in, view)
		}
		in.states.set(i, s)
		if old != s {
			in.count(p.Namespace, old, -1)
			in.count(p.Namespace, s, 1)
			ch.add(in.name)
		} else if in.rolling && s != none {
			ch.add(in.name)
		}
	}
	return i
}

func (x *Index) ns(name string) *namespace {
	n := x.namespaces[name]
	if n == nil {
		n = &namespace{}
		x.namespaces[name] = n
	}
	return n
}

func (x *Index) alloc() int32 {
	if n := len(x.free); n > 0 {
		i := x.free[n-1]
		x.free = x.free[:n-1]
		return i
	}
	x.slots = append(x.slots, nil)
	for _, in := range x.injectors {
		in.states.grow()
	}
	x.bytes += slotOverhead
	return int32(len(x.slots) - 1)
}

func (x *Index) addNode(i int32) {
	p := x.slots[i]
	if !p.Running() {
		return
	}
	n := x.nodes[p.Node]
	if n == nil {
		n = &node{}
		x.nodes[p.Node] = n
	}
	n.cpu += p.CPUMilli()
	n.mem += p.MemoryMilli()
	n.exclusive += p.ExclusiveCPUMilli()
	if n.memFormat == "" && p.MemoryMilli() != 0 {
		n.memFormat = p.memoryFormat()
	}
	n.slots = append(n.slots, i)
}

func (x *Index) unnode(i int32) {
	p := x.slots[i]
	n := x.nodes[p.Node]
	if n == nil {
		return
	}
	j := slices.Index(n.slots, i)
	if j < 0 {
		return
	}
	n.slots[j] = n.slots[len(n.slots)-1]
	n.slots = n.slots[:len(n.slots)-1]
	n.cpu -= p.CPUMilli()
	n.mem -= p.MemoryMilli()
	n.exclusive -= p.ExclusiveCPUMilli()
	if len(n.slots) == 0 {
		delete(x.nodes, p.Node)
	}
}

// Delete removes one pod by namespace and name.
func (x *Index) Delete(namespace, name string) Changes {
	x.mu.Lock()
	defer x.mu.Unlock()
	var ch Changes
	x.delete(podKey{intern(namespace), name}, &ch)
	return ch
}

func (x *Index) delete(k podKey, ch *Changes) {
	i, ok := x.byKey.get(k, x.slots)
	if !ok {
		return
	}
	x.unnode(i)
	for _, in := range x.injectors {
		if s := in.states.get(i); s != none {
			in.count(k.ns, s, -1)
			ch.add(in.name)
			in.states.set(i, none)
		}
	}
	if n := x.namespaces[k.ns.String()]; n != nil {
		n.pods--
		if n.pods == 0 && n.labels == nil {
			delete(x.namespaces, k.ns.String())
		}
	}
	x.bytes -= x.slots[i].size()
	// Out of the table while the slot still holds the record it reads.
	x.byKey.remove(k, i)
	x.slots[i] = nil
	x.free = append(x.free, i)
	if l := x.list; l != nil && int(i) < len(l.listed) {
		// A pod that takes the slot is not listed by being there.
		l.listed[i] = false
	}
	slices.Sort(*ch)
}

// Replace sets the whole set of pods (a reflector's list) and reports
// every injector: BeginList, Add of each pod, End.
func (x *Index) Replace(pods []*Pod) Changes {
	l := x.BeginList()
	for _, p := range pods {
		l.Add(p)
	}
	return l.End()
}

// A List re-fills the index from a complete listing of the pods (a
// WatchList stream's initial events, KEP-3157, or a paged list) one pod
// at a time as the listing arrives, so nothing holds the listing whole:
// End removes the records it did not name. Until End the index holds the
// pods listed so far beside the ones held before. Only the List begun
// last files pods: one begun before it (a stream that failed and was
// retried) is ignored, its End included.
type List struct {
	x *Index
	// listed marks the slots filled by this list.
	listed []bool
	// reps holds one slot per memoKey listed: a pod with the memoKey of
	// one listed before takes that pod's states, unclassified, so the
	// replicas of one template are classified once (a stream comes in no
	// particular order).
	reps map[memoKey]int32
	ch   Changes
}

// BeginList starts a listing of every pod; the one begun before, if
// any, files nothing more.
func (x *Index) BeginList() *List {
	x.mu.Lock()
	defer x.mu.Unlock()
	l := &List{x: x, listed: make([]bool, len(x.slots)), reps: map[memoKey]int32{}}
	x.list = l
	return l
}

// Add files one listed pod: indexed as Upsert does, and marked as named
// by the list. A finished pod is removed.
func (l *List) Add(p *Pod) {
	x := l.x
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.list != l {
		return
	}
	if p.Finished() {
		x.delete(podKey{p.Namespace, p.Name}, &l.ch)
		return
	}
	k := keyOf(p)
	like, ok := l.reps[k]
	if !ok || x.slots[like] == nil || keyOf(x.slots[like]) != k {
		like, ok = -1, false
	}
	i := x.upsert(p, &l.ch, like)
	if !ok {
		l.reps[k] = i
	}
	for int(i) >= len(l.listed) {
		l.listed = append(l.listed, false)
	}
	l.listed[i] = true
}

// End removes every record the list did not name and reports every
// injector. It reports nothing for a List that is not the last begun.
func (l *List) End() Changes {
	x := l.x
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.list != l {
		return nil
	}
	x.list = nil
	for i, p := range x.slots {
		if p != nil && (i >= len(l.listed) || !l.listed[i]) {
			x.delete(podKey{p.Namespace, p.Name}, &l.ch)
		}
	}
	for name := range x.injectors {
		l.ch.add(name)
	}
	slices.Sort(l.ch)
	return l.ch
}

// SetNamespace records a namespace's labels (nil: deleted) and
// re-classifies its pods when they changed.
func (x *Index) SetNamespace(name string, labels map[string]string) Changes {
	x.mu.Lock()
	defer x.mu.Unlock()
	var ch Changes
	x.setNamespace(name, labels, &ch)
	return ch
}

func (x *Index) setNamespace(name string, labels map[string]string, ch *Changes) {
	if labels == nil && x.namespaces[name] == nil {
		return
	}
	n := x.ns(name)
	if (n.labels == nil) == (labels == nil) && sameMap(n.labels, labels) {
		return
	}
	n.labels = labels
	if n.pods > 0 {
		x.reclassify(func(p *Pod) bool { return p.Namespace.String() == name }, ch)
	}
	if n.pods == 0 && n.labels == nil {
		delete(x.namespaces, name)
	}
}

// ReplaceNamespaces sets every namespace's labels (a reflector's list).
func (x *Index) ReplaceNamespaces(all map[string]map[string]string) Changes {
	x.mu.Lock()
	defer x.mu.Unlock()
	for name, n := range x.namespaces {
		if _, ok := all[name]; !ok {
			n.labels = nil
			if n.pods == 0 {
				delete(x.namespaces, name)
			}
		}
	}
	for name, l := range all {
		if l == nil {
			l = map[string]string{}
		}
		x.ns(name).labels = l
	}
	var ch Changes
	x.reclassify(func(*Pod) bool { return true }, &ch)
	for name := range x.injectors {
		ch.add(name)
	}
	slices.Sort(ch)
	return ch
}

func (x *Index) reclassify(match func(*Pod) bool, ch *Changes) {
	for _, in := range x.injectors {
		memo := newMemo()
		for i, p := range x.slots {
			if p == nil || !match(p) {
				continue
			}
			s := memo.classify(x, in, p)
			if old := in.states.get(int32(i)); old != s {
				in.count(p.Namespace, old, -1)
				in.count(p.Namespace, s, 1)
				in.states.set(int32(i), s)
				ch.add(in.name)
			}
		}
	}
	slices.Sort(*ch)
}

// Counts are one injector's counts; ok is false for an injector not
// registered.
func (x *Index) Counts(name string) (v1alpha1.FleetCounts, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	in := x.injectors[name]
	if in == nil {
		return v1alpha1.FleetCounts{}, false
	}
	return in.total, true
}

// Summary is fleet.Summarize of one injector's classified pods, from the
// counts kept: the named pods (the first fleet.MaxNamedPods outdated and
// missing by namespace and name) are found by one pass over the
// injector's states and classified again for their
// reasons.
func (x *Index) Summary(name string) (fleet.Summary, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	in := x.injectors[name]
	if in == nil {
		return fleet.Summary{}, false
	}
	nss := make([]v1alpha1.NamespaceFleet, 0, len(in.byNS))
	for ns, c := range in.byNS {
		nss = append(nss, v1alpha1.NamespaceFleet{Name: ns.String(), FleetCounts: *c})
	}
	named := func(want state, n int32) []fleet.Pod {
		if n == 0 {
			return nil
		}
		var best []*Pod
		for i := range int32(in.states.len()) {
			if in.states.get(i) != want {
				continue
			}
			p := x.slots[i]
			if len(best) == fleet.MaxNamedPods && !less(p, best[len(best)-1]) {
				continue
			}
			j, _ := slices.BinarySearchFunc(best, p, func(a, b *Pod) int {
				return cmp.Or(cmp.Compare(a.Namespace.String(), b.Namespace.String()), cmp.Compare(a.Name, b.Name))
			})
			best = slices.Insert(best, j, p)
			if len(best) > fleet.MaxNamedPods {
				best = best[:fleet.MaxNamedPods]
			}
		}
		out := make([]fleet.Pod, 0, len(best))
		for _, p := range best {
			view := p.View()
			if c, ok := fleet.Classify(in.inj, view, x.nsLabels(view.Namespace)); ok {
				out = append(out, c)
			}
		}
		return out
	}
	return fleet.SummarizeCounts(in.total, nss, named(outdated, in.total.OutdatedPods), named(missing, in.total.MissingPods)), true
}

func less(a, b *Pod) bool {
	return cmp.Or(cmp.Compare(a.Namespace.String(), b.Namespace.String()), cmp.Compare(a.Name, b.Name)) < 0
}

// Classified calls fn with the view and classification of every pod
// counted for the injector name (the rollout's input). fn must not call
// the index.
func (x *Index) Classified(name string, fn func(view *corev1.Pod, c fleet.Pod)) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	in := x.injectors[name]
	if in == nil {
		return
	}
	for i := range int32(in.states.len()) {
		s := in.states.get(i)
		if s == none {
			continue
		}
		view := x.slots[i].View()
		fn(view, fleet.Pod{Namespace: view.Namespace, Name: view.Name, State: states[s], Created: view.CreationTimestamp.Time})
	}
}

// NamespaceLabels are the labels of every namespace known, by name.
func (x *Index) NamespaceLabels() map[string]map[string]string {
	x.mu.RLock()
	defer x.mu.RUnlock()
	out := make(map[string]map[string]string, len(x.namespaces))
	for name, n := range x.namespaces {
		if n.labels != nil {
			out[name] = n.labels
		}
	}
	return out
}

// NodePods is what one node's running pods add up to.
type NodePods struct {
	// CPU and Memory are the sums of usageratio.PodRequests; Exclusive
	// the cpu of Guaranteed pods' whole-cpu containers.
	CPU, Memory, Exclusive resource.Quantity
	// Pods are namespace/name with each pod's requests.
	Pods map[string]corev1.ResourceList
}

// Node tells what the running pods on one node request; ok is false for
// a node with none.
func (x *Index) Node(name string) (NodePods, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	n := x.nodes[intern(name)]
	if n == nil {
		return NodePods{}, false
	}
	out := NodePods{
		CPU: *resource.NewMilliQuantity(n.cpu, resource.DecimalSI), Memory: memoryQuantity(n.mem, n.memFormat),
		Exclusive: *resource.NewMilliQuantity(n.exclusive, resource.DecimalSI),
		Pods:      make(map[string]corev1.ResourceList, len(n.slots)),
	}
	for _, i := range n.slots {
		p := x.slots[i]
		out.Pods[p.Key()] = p.Requests()
	}
	return out, true
}
