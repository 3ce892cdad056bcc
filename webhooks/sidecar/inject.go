// Package sidecar is the SidecarInjector engine: the injection decision,
// template rendering and merging, the status annotation and the JSON patch
// (all pure functions of their inputs), plus the admission handler, its
// metrics, the hot-reloaded config store and the kube-inject file processing.
//
// Semantics follow Istio's injector (istio/istio pkg/kube/inject); see
// Decide and Inject for where they differ.
package sidecar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// CodeNoTemplates: the pod selects no template (empty annotation list and no defaultTemplates).
const CodeNoTemplates Code = "NoTemplates"

// Status is the JSON of the sidecar.hookwright.io/status annotation: what an
// injection added, so that a later pass (webhook after kube-inject, API server
// reinvocation) leaves the pod alone.
type Status struct {
	Injector         string   `json:"injector"`
	Templates        []string `json:"templates"`
	InitContainers   []string `json:"initContainers"`
	Containers       []string `json:"containers"`
	Volumes          []string `json:"volumes"`
	ImagePullSecrets []string `json:"imagePullSecrets"`
	NativeSidecars   bool     `json:"nativeSidecars"`
	ConfigHash       string   `json:"configHash"`
}

// Input is one pod to inject.
type Input struct {
	// Raw is the pod as JSON (the admission request's object).
	Raw []byte
	// Namespace of the pod; defaults to the pod's metadata.namespace.
	Namespace string
	// NamespaceLabels, when non-nil, are checked against spec.namespaceSelector.
	NamespaceLabels map[string]string
	// WantPatch asks for Result.Patch.
	WantPatch bool
}

// Result of Inject. Object, JSON and Patch are nil when the pod is not injected.
type Result struct {
	Decision Decision
	// PodName is the pod's name, or its generateName followed by "*".
	PodName   string
	Native    bool
	Templates []string
	Status    *Status
	// Object is the injected pod as a JSON-shaped map (numbers as json.Number).
	Object map[string]any
	// JSON is Object marshalled.
	JSON []byte
	// Patch is the RFC 6902 JSON patch from the input (managedFields
	// stripped) to JSON, marshalled; only with Input.WantPatch.
	Patch []byte
	// Warnings are ignored inputs, to return as admission warnings.
	Warnings []string
}

// DecodeError is a pod that does not decode.
type DecodeError struct{ Err error }

func (e *DecodeError) Error() string { return "cannot decode pod: " + e.Err.Error() }
func (e *DecodeError) Unwrap() error { return e.Err }

var (
	specSchema      = mustSchema(strategicpatch.NewPatchMetaFromStruct(corev1.PodSpec{}))
	containerSchema = mustSchema(strategicpatch.NewPatchMetaFromStruct(corev1.Container{}))
	volumeSchema    = mustSchema(strategicpatch.NewPatchMetaFromStruct(corev1.Volume{}))
)

func mustSchema(s strategicpatch.PatchMetaFromStruct, err error) strategicpatch.PatchMetaFromStruct {
	if err != nil {
		panic(err)
	}
	return s
}

// Inject decides for the pod and, when it is to be injected, renders the
// selected templates (sidecar.hookwright.io/templates, else
// spec.defaultTemplates) in order and merges each onto the pod:
//
//   - spec.containers and spec.initContainers entries are merged by name
//     across templates (strategic merge, later template wins); if the pod
//     already has a container (in either list) with that name, the pod's
//     fields win (strategic merge of the pod's container over the
//     template's) and it stays where the pod put it;
//   - with native sidecars (KEP-753), rendered spec.containers become
//     initContainers with restartPolicy Always, and injected init containers
//     go ahead of the pod's own init containers; without, injected init
//     containers are appended after the pod's (a traffic-capturing init
//     container must not break the pod's init containers) and sidecars
//     after the pod's containers;
//   - volumes and imagePullSecrets are added when the pod has none of that
//     name; labels and annotations when the pod lacks the key;
//   - any other spec field is strategic-merged with the template winning,
//     as Istio does.
//
// Nothing the pod already has is removed or reordered. The status annotation
// records what was added. Errors are *DecodeError or *RenderError.
func Inject(cfg *Config, p Params, in Input) (*Result, error) {
	var pod corev1.Pod
	if err := json.Unmarshal(in.Raw, &pod); err != nil {
		return nil, &DecodeError{Err: err}
	}
	pod.ManagedFields = nil
	ns := in.Namespace
	if ns == "" {
		ns = pod.Namespace
	}
	res := &Result{PodName: pod.Name}
	if res.PodName == "" && pod.GenerateName != "" {
		res.PodName = pod.GenerateName + "*"
	}
	res.Decision = Decide(cfg, p, DecideInput{Pod: &pod, Namespace: ns, NamespaceLabels: in.NamespaceLabels})
	res.Warnings = res.Decision.Warnings
	if !res.Decision.Inject {
		return res, nil
	}

	res.Native = NativeDefault(cfg.NativeSidecars, p.ServerVersion)
	if v, ok := pod.Annotations[v1alpha1.SidecarNativeKey]; ok {
		if b, valid := ParseBool(v); valid {
			res.Native = b
		} else {
			res.Warnings = append(res.Warnings, fmt.Sprintf("ignored annotation %s=%q: want true or false", v1alpha1.SidecarNativeKey, short(v, 63)))
		}
	}
	names := cfg.DefaultTemplates
	if v, ok := pod.Annotations[v1alpha1.SidecarTemplatesKey]; ok {
		names = nil
		for _, n := range strings.Split(v, ",") {
			if n = strings.TrimSpace(n); n != "" {
				names = append(names, n)
			}
		}
	}
	if len(names) == 0 {
		res.Decision = Decision{Code: CodeNoTemplates, Reason: "no template selected: annotation " + v1alpha1.SidecarTemplatesKey + " is empty and spec.defaultTemplates is empty", Warnings: res.Warnings}
		return res, nil
	}
	tmpls := make([]*compiledTemplate, len(names))
	for i, n := range names {
		t, ok := cfg.templates[n]
		if !ok {
			return nil, &RenderError{Template: n, Err: fmt.Errorf("no such template in SidecarInjector %s (annotation %s)", cfg.Name, v1alpha1.SidecarTemplatesKey)}
		}
		tmpls[i] = t
	}
	res.Templates = names

	obj, err := decodeMap(in.Raw)
	if err != nil {
		return nil, &DecodeError{Err: err}
	}
	orig := in.Raw
	meta := childMap(obj, "metadata")
	if _, ok := meta["managedFields"]; ok {
		delete(meta, "managedFields")
		if in.WantPatch {
			if orig, err = json.Marshal(obj); err != nil {
				return nil, &DecodeError{Err: err}
			}
		}
	}

	data := &TemplateData{
		ObjectMeta:     &pod.ObjectMeta,
		Spec:           &pod.Spec,
		Namespace:      ns,
		Values:         deepCopyValue(cfg.values).(map[string]any),
		Injector:       cfg.Name,
		NativeSidecars: res.Native,
	}
	m := merger{spec: childMap(obj, "spec"), native: res.Native}
	for _, t := range tmpls {
		j, err := cfg.renderOne(t, data)
		if err != nil {
			return nil, err
		}
		if j == nil {
			continue
		}
		part, err := decodeMap(j)
		if err != nil {
			return nil, &RenderError{Template: t.name, Err: err}
		}
		if err := m.add(part); err != nil {
			return nil, &RenderError{Template: t.name, Err: err}
		}
	}
	st := &Status{Injector: cfg.Name, Templates: names, NativeSidecars: res.Native, ConfigHash: cfg.Hash}
	if err := m.apply(meta, st); err != nil {
		return nil, &RenderError{Template: strings.Join(names, ","), Err: err}
	}
	sj, _ := json.Marshal(st)
	ann := childMap(meta, "annotations")
	ann[v1alpha1.SidecarStatusKey] = string(sj)
	res.Status = st
	res.Object = obj
	if res.JSON, err = json.Marshal(obj); err != nil {
		return nil, err
	}
	if in.WantPatch {
		ops, err := jsonpatch.CreatePatch(orig, res.JSON)
		if err != nil {
			return nil, &DecodeError{Err: err}
		}
		if res.Patch, err = json.Marshal(ops); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// decodeMap decodes a JSON object keeping numbers as json.Number, so integers
// survive untouched.
func decodeMap(b []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, fmt.Errorf("not a JSON object")
	}
	return m, nil
}

// childMap returns parent[key] as a map, creating it when absent or null.
func childMap(parent map[string]any, key string) map[string]any {
	if c, ok := parent[key].(map[string]any); ok {
		return c
	}
	c := map[string]any{}
	parent[key] = c
	return c
}

type injected struct {
	name string
	m    map[string]any
	init bool
}

// merger accumulates rendered partial pods, then applies them to the pod.
type merger struct {
	spec        map[string]any
	native      bool
	containers  []*injected
	volumes     []*injected
	pullSecrets []*injected
	labels      map[string]any
	annotations map[string]any
}

func (m *merger) add(part map[string]any) error {
	if md, ok := part["metadata"].(map[string]any); ok {
		if l, ok := md["labels"].(map[string]any); ok {
			m.labels = mergeFlat(m.labels, l)
		}
		if a, ok := md["annotations"].(map[string]any); ok {
			m.annotations = mergeFlat(m.annotations, a)
		}
	}
	spec, ok := part["spec"].(map[string]any)
	if !ok {
		return nil
	}
	var err error
	// Init containers first: in template order they run before its sidecars.
	if m.containers, err = addNamed(m.containers, spec["initContainers"], true, containerSchema, "initContainers"); err != nil {
		return err
	}
	if m.containers, err = addNamed(m.containers, spec["containers"], false, containerSchema, "containers"); err != nil {
		return err
	}
	if m.volumes, err = addNamed(m.volumes, spec["volumes"], false, volumeSchema, "volumes"); err != nil {
		return err
	}
	if m.pullSecrets, err = addNamed(m.pullSecrets, spec["imagePullSecrets"], false, nil, "imagePullSecrets"); err != nil {
		return err
	}
	for _, k := range []string{"initContainers", "containers", "volumes", "imagePullSecrets"} {
		delete(spec, k)
	}
	if len(spec) == 0 {
		return nil
	}
	merged, err := strategicpatch.StrategicMergeMapPatchUsingLookupPatchMeta(m.spec, spec, specSchema)
	if err != nil {
		return fmt.Errorf("merging spec: %w", err)
	}
	for k, v := range merged {
		m.spec[k] = v
	}
	return nil
}

func mergeFlat(dst, src map[string]any) map[string]any {
	if dst == nil {
		dst = make(map[string]any, len(src))
	}
	for k, v := range src {
		dst[k] = v
	}
	return dst
}

func addNamed(acc []*injected, list any, init bool, schema strategicpatch.LookupPatchMeta, field string) ([]*injected, error) {
	if list == nil {
		return acc, nil
	}
	items, ok := list.([]any)
	if !ok {
		return nil, fmt.Errorf("spec.%s is not a list", field)
	}
	for i, it := range items {
		im, ok := it.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("spec.%s[%d] is not a mapping", field, i)
		}
		name, _ := im["name"].(string)
		if name == "" {
			return nil, fmt.Errorf("spec.%s[%d] has no name", field, i)
		}
		if prev := findInjected(acc, name); prev != nil {
			if schema == nil {
				prev.m = im
				continue
			}
			merged, err := strategicpatch.StrategicMergeMapPatchUsingLookupPatchMeta(prev.m, im, schema)
			if err != nil {
				return nil, fmt.Errorf("merging spec.%s %q: %w", field, name, err)
			}
			prev.m = merged
			continue
		}
		acc = append(acc, &injected{name: name, m: im, init: init})
	}
	return acc, nil
}

func findInjected(acc []*injected, name string) *injected {
	for _, e := range acc {
		if e.name == name {
			return e
		}
	}
	return nil
}

func listOf(spec map[string]any, key string) []any {
	l, _ := spec[key].([]any)
	return l
}

// indexByName maps the name of each map element of l to its index.
func indexByName(l []any) map[string]int {
	idx := make(map[string]int, len(l))
	for i, it := range l {
		if im, ok := it.(map[string]any); ok {
			if n, ok := im["name"].(string); ok {
				idx[n] = i
			}
		}
	}
	return idx
}

func (m *merger) apply(meta map[string]any, st *Status) error {
	spec := m.spec
	containers, inits := listOf(spec, "containers"), listOf(spec, "initContainers")
	cIdx, iIdx := indexByName(containers), indexByName(inits)
	var front, back, sidecars []any
	st.Containers, st.InitContainers = []string{}, []string{}
	for _, e := range m.containers {
		// The pod's own container of that name wins, field by field, and stays put.
		if i, ok := cIdx[e.name]; ok {
			merged, err := overlay(e.m, containers[i])
			if err != nil {
				return fmt.Errorf("container %q: %w", e.name, err)
			}
			containers[i] = merged
			st.Containers = append(st.Containers, e.name)
			continue
		}
		if i, ok := iIdx[e.name]; ok {
			merged, err := overlay(e.m, inits[i])
			if err != nil {
				return fmt.Errorf("init container %q: %w", e.name, err)
			}
			inits[i] = merged
			st.InitContainers = append(st.InitContainers, e.name)
			continue
		}
		switch {
		case e.init && m.native:
			front = append(front, e.m)
			st.InitContainers = append(st.InitContainers, e.name)
		case e.init:
			back = append(back, e.m)
			st.InitContainers = append(st.InitContainers, e.name)
		case m.native:
			e.m["restartPolicy"] = string(corev1.ContainerRestartPolicyAlways)
			front = append(front, e.m)
			st.InitContainers = append(st.InitContainers, e.name)
		default:
			sidecars = append(sidecars, e.m)
			st.Containers = append(st.Containers, e.name)
		}
	}
	if len(front)+len(back) > 0 {
		all := make([]any, 0, len(front)+len(inits)+len(back))
		all = append(append(append(all, front...), inits...), back...)
		spec["initContainers"] = all
	}
	if len(sidecars) > 0 {
		spec["containers"] = append(containers, sidecars...)
	}
	st.Volumes = appendAbsent(spec, "volumes", m.volumes)
	st.ImagePullSecrets = appendAbsent(spec, "imagePullSecrets", m.pullSecrets)
	if len(m.labels) > 0 {
		addAbsentKeys(childMap(meta, "labels"), m.labels)
	}
	if len(m.annotations) > 0 {
		addAbsentKeys(childMap(meta, "annotations"), m.annotations)
	}
	return nil
}

// overlay merges the pod's container over the template's (pod wins).
func overlay(tmpl map[string]any, podContainer any) (any, error) {
	pc, ok := podContainer.(map[string]any)
	if !ok {
		return podContainer, nil
	}
	return strategicpatch.StrategicMergeMapPatchUsingLookupPatchMeta(tmpl, pc, containerSchema)
}

func appendAbsent(spec map[string]any, key string, add []*injected) []string {
	added := []string{}
	if len(add) == 0 {
		return added
	}
	l := listOf(spec, key)
	idx := indexByName(l)
	for _, e := range add {
		if _, ok := idx[e.name]; ok {
			continue
		}
		l = append(l, e.m)
		added = append(added, e.name)
	}
	if len(added) > 0 {
		spec[key] = l
	}
	return added
}

func addAbsentKeys(dst, src map[string]any) {
	for k, v := range src {
		if _, ok := dst[k]; !ok {
			dst[k] = v
		}
	}
}
