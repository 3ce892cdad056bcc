package sidecar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"

	"github.com/hookwright/hookwright/webhooks/jsonscan"
)

// podDoc is a pod decoded only as far as injection needs: top-level and spec
// keys stay raw JSON until something reads or changes them, metadata is
// decoded (it is small and always changes).
type podDoc struct {
	pod      *corev1.Pod
	top      map[string]json.RawMessage
	meta     map[string]any
	metaOrig []byte
	spec     map[string]json.RawMessage
	specOrig map[string]json.RawMessage
	lists    map[string]*rawList
	// read holds the spec lists as the one pass over the pod read them;
	// list takes them while spec still holds the same bytes.
	read [2]readList // spec.containers, spec.initContainers
	// changed holds spec keys rewritten by a strategic merge.
	changed map[string]bool
}

// readList is a spec array read in the parse pass: its elements and their
// names, or the error to report when the list is asked for.
type readList struct {
	key   string
	raw   json.RawMessage
	orig  []json.RawMessage
	names []string
	err   error
}

// rawList is a spec list (containers, initContainers, volumes,
// imagePullSecrets) as raw elements plus what injection inserts: ahead of
// the pod's own (front), right after the pod's element i (after[i], an
// initContainerPlacement), or at the end (back).
type rawList struct {
	key      string
	present  bool
	orig     []json.RawMessage
	names    []string
	front    []json.RawMessage
	after    map[int][]json.RawMessage
	back     []json.RawMessage
	replaced map[int]json.RawMessage
}

// insertAfter queues b right after the pod's element i, behind what was
// queued there before.
func (l *rawList) insertAfter(i int, b json.RawMessage) {
	if l.after == nil {
		l.after = map[int][]json.RawMessage{}
	}
	l.after[i] = append(l.after[i], b)
}

// inserted counts the elements queued after the pod's own elements 0..i-1.
func (l *rawList) inserted(i int) int {
	n := 0
	for j, a := range l.after {
		if j < i {
			n += len(a)
		}
	}
	return n
}

// parsePod splits raw into the parts decide and the templates read: typed
// metadata, spec.hostNetwork, and the whole typed spec only when a template
// reads .Spec. managedFields are dropped (as Istio does before diffing).
func parsePod(raw []byte, needsSpec bool) (*podDoc, error) {
	d := &podDoc{pod: &corev1.Pod{}, changed: map[string]bool{}, lists: map[string]*rawList{}}
	var err error
	if err = d.split(raw); err != nil {
		return nil, err
	}
	if mr, ok := d.top["metadata"]; ok && !isNull(mr) {
		if err := json.Unmarshal(mr, &d.pod.ObjectMeta); err != nil {
			return nil, fmt.Errorf("metadata: %w", err)
		}
		m, err := decodeMap(mr)
		if err != nil {
			return nil, fmt.Errorf("metadata: %w", err)
		}
		d.meta, d.metaOrig = m, mr
		if _, ok := m["managedFields"]; ok {
			delete(m, "managedFields")
			if d.metaOrig, err = json.Marshal(m); err != nil {
				return nil, err
			}
		}
		d.pod.ManagedFields = nil
	} else {
		d.meta = map[string]any{}
	}
	if sr, ok := d.top["spec"]; ok && !isNull(sr) {
		if sr[0] != '{' {
			return nil, fmt.Errorf("spec: not a JSON object")
		}
		if needsSpec {
			if err := json.Unmarshal(sr, &d.pod.Spec); err != nil {
				return nil, fmt.Errorf("spec: %w", err)
			}
		} else {
			// What Decide reads of the spec when the templates need none.
			if hn, ok := d.spec["hostNetwork"]; ok {
				if err := json.Unmarshal(hn, &d.pod.Spec.HostNetwork); err != nil {
					return nil, fmt.Errorf("spec.hostNetwork: %w", err)
				}
			}
			if pc, ok := d.spec["priorityClassName"]; ok {
				if err := json.Unmarshal(pc, &d.pod.Spec.PriorityClassName); err != nil {
					return nil, fmt.Errorf("spec.priorityClassName: %w", err)
				}
			}
		}
	}
	d.specOrig = make(map[string]json.RawMessage, len(d.spec))
	for k, v := range d.spec {
		d.specOrig[k] = v
	}
	return d, nil
}

// split reads the pod's top-level members and, in the same pass, the spec's
// members and the elements and names of its lists (jsonscan.NamedArrayAt):
// on a pod with thousands of env vars, each pass over the containers costs
// about as much as the rest of the injection.
func (d *podDoc) split(raw []byte) error {
	i := jsonscan.SkipWS(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		if _, err := jsonscan.Object(raw); err != nil {
			return err
		}
		return fmt.Errorf("pod is not a JSON object")
	}
	d.top = make(map[string]json.RawMessage, 8)
	d.spec = map[string]json.RawMessage{}
	end, err := jsonscan.EachMember(raw, i, "pod", func(key []byte, vs int) (int, error) {
		k, err := jsonscan.MemberName(key)
		if err != nil {
			return 0, err
		}
		var ve int
		switch {
		case k == "spec" && raw[vs] == '{':
			ve, err = d.splitSpec(raw, vs)
		case k == "spec": // a repeated spec that is not an object wins
			d.spec, d.read = map[string]json.RawMessage{}, [2]readList{}
			fallthrough
		default:
			ve, err = jsonscan.SkipValue(raw, vs)
		}
		if err != nil {
			return 0, err
		}
		d.top[k] = raw[vs:ve:ve]
		return ve, nil
	})
	if err != nil {
		return err
	}
	return jsonscan.End(raw, end)
}

// splitSpec reads the spec object at raw[i] into d.spec and d.read; a
// repeated spec replaces the earlier one, as in encoding/json.
func (d *podDoc) splitSpec(raw []byte, i int) (int, error) {
	d.spec = make(map[string]json.RawMessage, 8)
	d.read = [2]readList{}
	return jsonscan.EachMember(raw, i, "spec", func(key []byte, vs int) (int, error) {
		k, err := jsonscan.MemberName(key)
		if err != nil {
			return 0, err
		}
		var ve int
		if k == "containers" || k == "initContainers" {
			rl := readList{key: k}
			rl.orig, rl.names, ve, rl.err = jsonscan.NamedArrayAt(raw, vs, "")
			if _, ok := rl.err.(*jsonscan.TypeError); ok {
				// Not a list of objects: reported if the list is used.
				rl.orig, rl.names = nil, nil
				ve, err = jsonscan.SkipValue(raw, vs)
			} else {
				err = rl.err
			}
			if err != nil {
				return 0, err
			}
			rl.raw = raw[vs:ve:ve]
			if k == "containers" {
				d.read[0] = rl
			} else {
				d.read[1] = rl
			}
		} else if ve, err = jsonscan.SkipValue(raw, vs); err != nil {
			return 0, err
		}
		d.spec[k] = raw[vs:ve:ve]
		return ve, nil
	})
}

func isNull(r json.RawMessage) bool { return len(r) == 0 || string(r) == "null" }

// list parses spec[key] into raw elements and their names.
func (d *podDoc) list(key string) (*rawList, error) {
	if l, ok := d.lists[key]; ok {
		return l, nil
	}
	l := &rawList{key: key}
	if r, ok := d.spec[key]; ok && !isNull(r) {
		l.present = true
		var err error
		if rl, ok := d.readList(key); ok && sameBytes(rl.raw, r) {
			l.orig, l.names, err = rl.orig, rl.names, rl.err
		} else {
			l.orig, l.names, err = jsonscan.NamedArray(r)
		}
		if err != nil {
			return nil, &DecodeError{Err: fmt.Errorf("spec.%s: %w", key, err)}
		}
		if l.names == nil {
			l.names = []string{}
		}
	}
	d.lists[key] = l
	return l, nil
}

// readList returns what the parse pass read of spec[key].
func (d *podDoc) readList(key string) (readList, bool) {
	for _, rl := range d.read {
		if rl.key == key {
			return rl, true
		}
	}
	return readList{}, false
}

// sameBytes reports whether a and b are the same slice of memory.
func sameBytes(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// containerNames returns the names in spec.initContainers, then
// spec.containers, never nil.
func (d *podDoc) containerNames() ([]string, error) {
	names := []string{}
	for _, key := range []string{"initContainers", "containers"} {
		l, err := d.list(key)
		if err != nil {
			return nil, err
		}
		names = append(names, l.names...)
	}
	return names, nil
}

// initOnlyWithAlways are container fields the API server forbids on an init
// container unless its restartPolicy is Always (a native sidecar).
var initOnlyWithAlways = []string{"lifecycle", "livenessProbe", "readinessProbe", "startupProbe"}

// overlay merges the pod's element i of a container list over the
// template's e (pod wins). nativeSidecar: e is to be a native sidecar, so
// over a pod init container the result keeps restartPolicy Always unless the
// pod set its own. The result is kept valid for its list: an init container
// that ends up without restartPolicy Always loses the template's probes and
// lifecycle (dropped names are returned, for a warning), and a regular
// container never takes restartPolicy from the template.
func (l *rawList) overlay(i int, e *injected, nativeSidecar bool) (dropped []string, err error) {
	tm, err := e.mapped()
	if err != nil {
		return nil, err
	}
	pm, err := decodeMap(l.orig[i])
	if err != nil {
		return nil, &DecodeError{Err: fmt.Errorf("spec.%s[%d]: %w", l.key, i, err)}
	}
	base := make(map[string]any, len(tm)+1)
	for k, v := range tm {
		base[k] = v
	}
	_, podSetRP := pm["restartPolicy"]
	if l.key == "initContainers" {
		if nativeSidecar {
			base["restartPolicy"] = string(corev1.ContainerRestartPolicyAlways)
		}
		rp := base["restartPolicy"]
		if podSetRP {
			rp = pm["restartPolicy"]
		}
		if rp != string(corev1.ContainerRestartPolicyAlways) {
			for _, k := range initOnlyWithAlways {
				if _, fromPod := pm[k]; !fromPod && base[k] != nil {
					delete(base, k)
					dropped = append(dropped, k)
				}
			}
		}
	} else if !podSetRP {
		delete(base, "restartPolicy")
	}
	merged, err := strategicpatch.StrategicMergeMapPatchUsingLookupPatchMeta(base, pm, containerSchema)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(merged)
	if err != nil {
		return nil, err
	}
	if l.replaced == nil {
		l.replaced = map[int]json.RawMessage{}
	}
	l.replaced[i] = b
	return dropped, nil
}

func (l *rawList) changed() bool {
	return len(l.front)+len(l.after)+len(l.back)+len(l.replaced) > 0
}

// walk calls f with each element of the final list, in order.
func (l *rawList) walk(f func(json.RawMessage)) {
	for _, e := range l.front {
		f(e)
	}
	for i, e := range l.orig {
		if r, ok := l.replaced[i]; ok {
			e = r
		}
		f(e)
		for _, a := range l.after[i] {
			f(a)
		}
	}
	for _, e := range l.back {
		f(e)
	}
}

// joined is the final list as one JSON array, built in one allocation.
func (l *rawList) joined() json.RawMessage {
	n := 2
	l.walk(func(e json.RawMessage) { n += len(e) + 1 })
	b := make([]byte, 0, n)
	b = append(b, '[')
	l.walk(func(e json.RawMessage) {
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = append(b, e...)
	})
	return append(b, ']')
}

// appendAbsent appends the injected entries whose name the list lacks and
// returns their names.
func (d *podDoc) appendAbsent(key string, add []*injected) ([]string, error) {
	added := []string{}
	if len(add) == 0 {
		return added, nil
	}
	l, err := d.list(key)
	if err != nil {
		return nil, err
	}
	for _, e := range add {
		if slices.Contains(l.names, e.name) {
			continue
		}
		b, err := e.json(false)
		if err != nil {
			return nil, err
		}
		l.back = append(l.back, b)
		l.names = append(l.names, e.name)
		added = append(added, e.name)
	}
	return added, nil
}

// mergeRest strategic-merges the remaining spec patches, in order, decoding
// only the spec fields they touch.
func (d *podDoc) mergeRest(patches []map[string]any) error {
	if len(patches) == 0 {
		return nil
	}
	partial := map[string]any{}
	for _, p := range patches {
		for k := range p {
			if _, done := partial[k]; done {
				continue
			}
			if r, ok := d.spec[k]; ok {
				var v any
				dec := json.NewDecoder(bytes.NewReader(r))
				dec.UseNumber()
				if err := dec.Decode(&v); err != nil {
					return &DecodeError{Err: fmt.Errorf("spec.%s: %w", k, err)}
				}
				partial[k] = v
			}
			d.changed[k] = true
		}
	}
	for _, p := range patches {
		var err error
		if partial, err = strategicpatch.StrategicMergeMapPatchUsingLookupPatchMeta(partial, p, specSchema); err != nil {
			return fmt.Errorf("merging spec: %w", err)
		}
	}
	for k := range d.changed {
		v, ok := partial[k]
		if !ok {
			delete(d.spec, k)
			continue
		}
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		d.spec[k] = b
	}
	return nil
}

// finalSpec returns spec with the changed lists assembled.
func (d *podDoc) finalSpec() map[string]json.RawMessage {
	for _, l := range d.lists {
		if l.changed() {
			d.spec[l.key] = l.joined()
		}
	}
	return d.spec
}

// writeObject writes m as a JSON object with sorted keys and raw values.
func writeObject(buf *bytes.Buffer, m map[string]json.RawMessage) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	buf.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			buf.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		buf.Write(kb)
		buf.WriteByte(':')
		buf.Write(m[k])
	}
	buf.WriteByte('}')
}

// marshal returns the injected pod as JSON.
func (d *podDoc) marshal() ([]byte, error) {
	meta, err := json.Marshal(d.meta)
	if err != nil {
		return nil, err
	}
	top := make(map[string]json.RawMessage, len(d.top))
	for k, v := range d.top {
		top[k] = v
	}
	top["metadata"] = meta
	var sb bytes.Buffer
	writeObject(&sb, d.finalSpec())
	top["spec"] = sb.Bytes()
	n := len(sb.Bytes()) + len(meta) + 256
	for _, v := range d.top {
		n += len(v)
	}
	out := bytes.NewBuffer(make([]byte, 0, n))
	writeObject(out, top)
	return out.Bytes(), nil
}

// patch builds the JSON patch from the input to the injected pod. Parts the
// engine did not touch are skipped; changed parts are diffed with
// gomodules.xyz/jsonpatch/v2 (as controller-runtime and Istio do); inserted
// list elements become add operations at their index, so the pod's own
// elements (another webhook's init containers) are never rewritten by a
// positional diff.
func (d *podDoc) patch() ([]byte, error) {
	ops := make([]jsonpatch.Operation, 0, 8)
	newMeta, err := json.Marshal(d.meta)
	if err != nil {
		return nil, err
	}
	if d.metaOrig == nil {
		ops = append(ops, jsonpatch.NewOperation("add", "/metadata", json.RawMessage(newMeta)))
	} else {
		mops, err := jsonpatch.CreatePatch(d.metaOrig, newMeta)
		if err != nil {
			return nil, err
		}
		// Only map keys change under metadata, so path order is a valid order.
		sort.SliceStable(mops, func(i, j int) bool { return mops[i].Path < mops[j].Path })
		ops = append(ops, prefixed("/metadata", mops)...)
	}
	spec := d.finalSpec()
	if _, ok := d.top["spec"]; !ok || isNull(d.top["spec"]) {
		var sb bytes.Buffer
		writeObject(&sb, spec)
		ops = append(ops, jsonpatch.NewOperation("add", "/spec", json.RawMessage(sb.Bytes())))
		return encodePatch(ops)
	}
	keys := make([]string, 0, len(spec))
	for k := range spec {
		keys = append(keys, k)
	}
	for k := range d.specOrig {
		if _, ok := spec[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		path := "/spec/" + escapePointer(k)
		if l, ok := d.lists[k]; ok && l.changed() {
			if !l.present {
				ops = append(ops, jsonpatch.NewOperation("add", path, spec[k]))
				continue
			}
			// In final index order, so each add lands where it ends up and
			// each replaced element is diffed at its final index.
			for i, f := range l.front {
				ops = append(ops, jsonpatch.NewOperation("add", path+"/"+strconv.Itoa(i), f))
			}
			idx := make([]int, 0, len(l.replaced)+len(l.after))
			for i := range l.replaced {
				idx = append(idx, i)
			}
			for i := range l.after {
				if _, ok := l.replaced[i]; !ok {
					idx = append(idx, i)
				}
			}
			sort.Ints(idx)
			for _, i := range idx {
				at := len(l.front) + i + l.inserted(i)
				if r, ok := l.replaced[i]; ok {
					sub, err := jsonpatch.CreatePatch(l.orig[i], r)
					if err != nil {
						return nil, err
					}
					ops = append(ops, prefixed(path+"/"+strconv.Itoa(at), sub)...)
				}
				for j, b := range l.after[i] {
					ops = append(ops, jsonpatch.NewOperation("add", path+"/"+strconv.Itoa(at+1+j), b))
				}
			}
			for i, b := range l.back {
				ops = append(ops, jsonpatch.NewOperation("add", path+"/"+strconv.Itoa(len(l.front)+len(l.orig)+l.inserted(len(l.orig))+i), b))
			}
			continue
		}
		o, had := d.specOrig[k]
		n, has := spec[k]
		switch {
		case !had && has:
			ops = append(ops, jsonpatch.NewOperation("add", path, n))
		case had && !has:
			ops = append(ops, jsonpatch.NewOperation("remove", path, nil))
		case d.changed[k] && !bytes.Equal(o, n):
			sub, err := jsonpatch.CreatePatch(o, n)
			if err != nil {
				return nil, err
			}
			ops = append(ops, prefixed(path, sub)...)
		}
	}
	return encodePatch(ops)
}

func prefixed(prefix string, ops []jsonpatch.Operation) []jsonpatch.Operation {
	for i := range ops {
		ops[i].Path = prefix + ops[i].Path
	}
	return ops
}

var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

func escapePointer(s string) string { return pointerEscaper.Replace(s) }

// encodePatch marshals ops like jsonpatch.Operation.MarshalJSON does, but
// writes json.RawMessage values (the engine's own compact JSON) verbatim
// instead of re-validating and compacting them.
func encodePatch(ops []jsonpatch.Operation) ([]byte, error) {
	n := 2
	for _, op := range ops {
		n += len(op.Path) + 40
		if r, ok := op.Value.(json.RawMessage); ok {
			n += len(r)
		}
	}
	b := make([]byte, 0, n)
	b = append(b, '[')
	for i, op := range ops {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"op":`...)
		b = strconv.AppendQuote(b, op.Operation)
		b = append(b, `,"path":`...)
		pb, err := json.Marshal(op.Path)
		if err != nil {
			return nil, err
		}
		b = append(b, pb...)
		switch v := op.Value.(type) {
		case json.RawMessage:
			b = append(b, `,"value":`...)
			b = append(b, v...)
		case nil:
			if op.Operation == "add" || op.Operation == "replace" {
				b = append(b, `,"value":null`...)
			}
		default:
			vb, err := json.Marshal(v)
			if err != nil {
				return nil, err
			}
			b = append(b, `,"value":`...)
			b = append(b, vb...)
		}
		b = append(b, '}')
	}
	return append(b, ']'), nil
}
