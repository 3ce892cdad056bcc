// Package sidecar is the SidecarInjector engine: the injection decision,
// template rendering and merging, the status annotation and the JSON patch
// (all pure functions of their inputs), plus the admission handler, its
// metrics, the hot-reloaded config store (fed by the informer shell in
// webhooks/configwatch) and the kube-inject file processing.
//
// Semantics follow Istio's injector (istio/istio pkg/kube/inject); see
// decide and inject for where they differ.
//
// Limitation: one pod is injected by one SidecarInjector. The status
// annotation, the inject key and the templates annotation are shared by all
// injectors, so once one has injected a pod every other skips it (code
// InjectedByOther, returned as an admission warning naming the first and
// shown by check-inject). To combine sidecars, put their templates in one
// SidecarInjector and select them with the templates annotation.
//
// It must not import controllers, internal/ packages or the other server
// (webhooks/oversell), nor anything that links a Kubernetes client: it
// uses api/v1alpha1, webhooks/serving and webhooks/jsonscan only, so the
// operator can call its decisions without a client
// (internal/importrules checks the whole dependency closure).
package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// CodeNoTemplates means the pod selects no template (empty annotation list and no defaultTemplates).
const CodeNoTemplates Code = "NoTemplates"

// Status is the JSON of the sidecar.hookwright.io/status annotation: what an
// injection added, so that a later pass (webhook after kube-inject, API server
// reinvocation) leaves the pod alone. Lists hold container, volume and
// secret names, in the order they were added; ConfigHash is Config.Hash.
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

// Input is one pod for Inject.
type Input struct {
	// Raw is the pod as valid JSON (the admission request's object, which
	// the AdmissionReview decode has validated). Parts the engine does not
	// change are located, not re-validated.
	Raw []byte
	// Namespace of the pod; defaults to the pod's metadata.namespace.
	Namespace string
	// NamespaceLabels, when non-nil, are checked against spec.namespaceSelector
	// (see DecideInput.NamespaceLabels).
	NamespaceLabels map[string]string
	// WantPatch asks for Result.Patch, WantJSON for Result.JSON.
	WantPatch, WantJSON bool
	// Context, when set, is checked before each template is rendered: the
	// webhook stops work the API server has given up on (its timeout).
	Context context.Context
}

// maxTemplateNames caps the distinct names in the templates annotation; it
// equals the API's limit on spec.templates, so a longer list cannot be valid.
const maxTemplateNames = 32

// parseTemplateNames parses a sidecar.hookwright.io/templates value: names
// separated by commas, blanks trimmed, empty entries skipped, duplicates
// dropped (first occurrence keeps its place; dups counts them). Each name
// must be a DNS-1123 label (what spec.templates[].name allows), and at most
// maxTemplateNames distinct names are accepted. The scan stops at the first
// error, so a huge value costs one pass at most.
func parseTemplateNames(v string) (names []string, dups int, err error) {
	for n := range strings.SplitSeq(v, ",") {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		if slices.Contains(names, n) {
			dups++
			continue
		}
		if len(validation.IsDNS1123Label(n)) > 0 {
			return nil, 0, fmt.Errorf("annotation %s: invalid template name %q: want lowercase letters, digits and '-', at most 63 characters", v1alpha1.SidecarTemplatesKey, short(n, 63))
		}
		if len(names) == maxTemplateNames {
			return nil, 0, fmt.Errorf("annotation %s: more than %d distinct template names", v1alpha1.SidecarTemplatesKey, maxTemplateNames)
		}
		names = append(names, n)
	}
	return names, dups, nil
}

// Result of Inject. JSON and Patch are nil when the pod is not injected.
type Result struct {
	// Decision is Decide's (with CodeNoTemplates when it said inject but
	// no template is selected).
	Decision Decision
	// PodName is the pod's name, or its generateName followed by "*".
	PodName string
	// Injected is true when templates were applied.
	Injected bool
	// Native tells whether sidecars went in as native sidecars (KEP-753).
	Native bool
	// Templates are the names rendered, in order.
	Templates []string
	// Status is what the status annotation records, nil when not injected.
	Status *Status
	// JSON is the injected pod (with Input.WantJSON). Top-level, metadata and spec keys are
	// sorted; the pod's own containers, volumes and other spec fields are
	// copied byte for byte from the input.
	JSON []byte
	// Patch is the RFC 6902 JSON patch from the input (managedFields
	// stripped) to JSON, marshalled; only with Input.WantPatch.
	Patch []byte
	// Warnings are ignored inputs, to return as admission warnings.
	Warnings []string
}

// DecodeError is a pod that does not decode; Err says where.
type DecodeError struct{ Err error }

// Error is "cannot decode pod: " and Err's message.
func (e *DecodeError) Error() string { return "cannot decode pod: " + e.Err.Error() }

// Unwrap returns Err.
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

// Inject is what the engine does to one pod: the webhook calls it for each
// admission (WantPatch), kube-inject and check-inject for each pod and pod
// template of a manifest (WantJSON), and the operator may call it to know
// what a running pod would get now. It needs no client: cfg is Compile's
// SidecarInjector, p the operator namespace and, for nativeSidecars Auto,
// the API server's version.
//
// It decides for the pod (Decide) and, when it is to be injected, renders the
// selected templates (sidecar.hookwright.io/templates, else
// spec.defaultTemplates) in order and merges each onto the pod:
//
//   - spec.containers and spec.initContainers entries are merged by name
//     across templates (strategic merge, later template wins); if the pod
//     already has a container (in either list) with that name, the pod's
//     fields win (strategic merge of the pod's container over the
//     template's) and it stays where the pod put it; a sidecar the pod
//     declares as an init container keeps restartPolicy Always with native
//     sidecars unless the pod set its own, and an init container left
//     without Always gets none of the template's probes or lifecycle (the
//     API server forbids them there), with a warning;
//   - with native sidecars (KEP-753), rendered spec.containers become
//     initContainers with restartPolicy Always, and injected init containers
//     go ahead of the pod's own init containers; without, injected init
//     containers are appended after the pod's (a traffic-capturing init
//     container must not break the pod's init containers) and sidecars
//     after the pod's containers; a template's initContainerPlacement puts
//     its init containers first or right after a named init container of
//     the pod instead (placeInit);
//   - volumes and imagePullSecrets are added when the pod has none of that
//     name; labels and annotations when the pod lacks the key;
//   - any other spec field is strategic-merged with the template winning,
//     as Istio does (k8s.io/apimachinery/pkg/util/strategicpatch).
//
// The templates annotation is read by parseTemplateNames; a bad list is a
// *renderError like an unknown name, so failurePolicy applies.
//
// Nothing the pod already has is removed or reordered. The status annotation
// records what was added. Only the parts of the pod that are read or changed
// are decoded: a pod's own containers are copied as raw JSON, so cost grows
// with the pod's size only through scanning. Errors are a *DecodeError (the
// pod is not a pod), a *RenderError (a template failed or the pod's
// templates annotation is bad: the webhook's failurePolicy applies),
// ErrDecisionsOnly (cfg came from ForDecisions), or the context's error.
func Inject(cfg *Config, p Params, in Input) (*Result, error) {
	if cfg.decisionsOnly {
		return nil, ErrDecisionsOnly
	}
	d, err := parsePod(in.Raw, cfg.needsSpec)
	if err != nil {
		return nil, &DecodeError{Err: err}
	}
	pod := d.pod
	ns := in.Namespace
	if ns == "" {
		ns = pod.Namespace
	}
	res := &Result{PodName: pod.Name}
	if res.PodName == "" && pod.GenerateName != "" {
		res.PodName = pod.GenerateName + "*"
	}
	var containers []string
	if _, ok := pod.Annotations[v1alpha1.SidecarStatusKey]; ok {
		// Only a pod with a status annotation needs them (is it stale?).
		if containers, err = d.containerNames(); err != nil {
			return nil, err
		}
	}
	res.Decision = Decide(cfg, p, DecideInput{Pod: pod, Namespace: ns, NamespaceLabels: in.NamespaceLabels, Containers: containers})
	res.Warnings = res.Decision.Warnings
	if !res.Decision.Inject {
		return res, nil
	}

	res.Native = nativeDefault(cfg.NativeSidecars, p.ServerVersion)
	if v, ok := pod.Annotations[v1alpha1.SidecarNativeKey]; ok {
		if b, valid := ParseBool(v); valid {
			res.Native = b
		} else {
			res.Warnings = append(res.Warnings, fmt.Sprintf("ignored annotation %s=%q: want true or false", v1alpha1.SidecarNativeKey, short(v, 63)))
		}
	}
	names := cfg.DefaultTemplates
	v, byPod := pod.Annotations[v1alpha1.SidecarTemplatesKey]
	if byPod {
		var dups int
		if names, dups, err = parseTemplateNames(v); err != nil {
			return nil, &RenderError{Err: err, ByPod: true}
		}
		if dups > 0 {
			res.Warnings = append(res.Warnings, fmt.Sprintf("ignored %d duplicate name(s) in annotation %s", dups, v1alpha1.SidecarTemplatesKey))
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
			return nil, &RenderError{Template: n, ByPod: byPod, Err: fmt.Errorf("no such template in SidecarInjector %s (annotation %s)", cfg.Name, v1alpha1.SidecarTemplatesKey)}
		}
		tmpls[i] = t
	}
	res.Templates = names

	data := &templateData{
		ObjectMeta:     &pod.ObjectMeta,
		Spec:           &pod.Spec,
		Namespace:      ns,
		Values:         deepCopyValue(cfg.values).(map[string]any),
		Injector:       cfg.Name,
		NativeSidecars: res.Native,
	}
	m := merger{native: res.Native}
	for _, t := range tmpls {
		if in.Context != nil {
			if err := in.Context.Err(); err != nil {
				return nil, err
			}
		}
		j, err := cfg.renderOne(in.Context, t, data)
		if err != nil {
			return nil, err
		}
		if j == nil {
			continue
		}
		if err := m.add(j, t); err != nil {
			return nil, &RenderError{Template: t.name, Err: err}
		}
	}
	st := &Status{Injector: cfg.Name, Templates: names, NativeSidecars: res.Native, ConfigHash: cfg.Hash}
	if err := m.apply(d, st); err != nil {
		var de *DecodeError
		if errors.As(err, &de) {
			return nil, err
		}
		return nil, &RenderError{Template: strings.Join(names, ","), Err: err}
	}
	res.Warnings = append(res.Warnings, m.warnings...)
	sj, _ := json.Marshal(st)
	childMap(d.meta, "annotations")[v1alpha1.SidecarStatusKey] = string(sj)
	// The revision label lets pods be selected by what they got.
	childMap(d.meta, "labels")[v1alpha1.SidecarRevisionKey] = cfg.Hash
	res.Status = st
	res.Injected = true
	if in.WantJSON {
		if res.JSON, err = d.marshal(); err != nil {
			return nil, err
		}
	}
	if in.WantPatch {
		if res.Patch, err = d.patch(); err != nil {
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

// injected is a list element from the templates. It stays the cached JSON
// until a merge needs it as a map.
type injected struct {
	name           string
	init           bool
	raw, nativeRaw []byte
	m              map[string]any
	// from is the last template that rendered the element: its
	// initContainerPlacement places it (later template wins, as for the
	// element's fields).
	from *compiledTemplate
}

func (e *injected) mapped() (map[string]any, error) {
	if e.m == nil {
		m, err := decodeMap(e.raw)
		if err != nil {
			return nil, err
		}
		e.m = m
	}
	return e.m, nil
}

// json returns the element, as a native sidecar (restartPolicy Always) when asked.
func (e *injected) json(nativeSidecar bool) ([]byte, error) {
	if e.m == nil {
		if nativeSidecar {
			return e.nativeRaw, nil
		}
		return e.raw, nil
	}
	if nativeSidecar {
		e.m["restartPolicy"] = string(corev1.ContainerRestartPolicyAlways)
	}
	return json.Marshal(e.m)
}

// merger accumulates rendered partial pods, then applies them to the pod.
type merger struct {
	native      bool
	containers  []*injected
	volumes     []*injected
	pullSecrets []*injected
	labels      map[string]any
	annotations map[string]any
	// rest are the spec patches without the four lists above, in template order.
	rest []map[string]any
	// warnings from apply: template fields left out to keep the pod valid.
	warnings []string
}

func (m *merger) add(p *preparedPart, t *compiledTemplate) error {
	if p.labels != nil {
		m.labels = mergeFlat(m.labels, p.labels)
	}
	if p.annotations != nil {
		m.annotations = mergeFlat(m.annotations, p.annotations)
	}
	var err error
	if m.containers, err = addNamed(m.containers, p.containers, containerSchema, t); err != nil {
		return err
	}
	if m.volumes, err = addNamed(m.volumes, p.volumes, volumeSchema, t); err != nil {
		return err
	}
	if m.pullSecrets, err = addNamed(m.pullSecrets, p.pullSecrets, nil, t); err != nil {
		return err
	}
	if p.rest != nil {
		rest, err := decodeMap(p.rest)
		if err != nil {
			return err
		}
		m.rest = append(m.rest, rest)
	}
	return nil
}

var listKeys = []string{"initContainers", "containers", "volumes", "imagePullSecrets"}

func mergeFlat(dst, src map[string]any) map[string]any {
	if dst == nil {
		dst = make(map[string]any, len(src))
	}
	for k, v := range src {
		dst[k] = v
	}
	return dst
}

// addNamed adds entries of template t to acc; an entry named like an
// earlier one is strategic-merged onto it (later template wins).
func addNamed(acc []*injected, entries []preparedEntry, schema strategicpatch.LookupPatchMeta, t *compiledTemplate) ([]*injected, error) {
	for _, pe := range entries {
		prev := findInjected(acc, pe.name)
		if prev == nil {
			acc = append(acc, &injected{name: pe.name, init: pe.init, raw: pe.raw, nativeRaw: pe.nativeRaw, from: t})
			continue
		}
		prev.from = t
		next := &injected{raw: pe.raw}
		nm, err := next.mapped()
		if err != nil {
			return nil, err
		}
		if schema == nil {
			prev.m = nm
			continue
		}
		pm, err := prev.mapped()
		if err != nil {
			return nil, err
		}
		if prev.m, err = strategicpatch.StrategicMergeMapPatchUsingLookupPatchMeta(pm, nm, schema); err != nil {
			return nil, fmt.Errorf("merging %q: %w", pe.name, err)
		}
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

func (m *merger) apply(d *podDoc, st *Status) error {
	if err := d.mergeRest(m.rest); err != nil {
		return err
	}
	containers, err := d.list("containers")
	if err != nil {
		return err
	}
	inits, err := d.list("initContainers")
	if err != nil {
		return err
	}
	st.Containers, st.InitContainers = []string{}, []string{}
	for _, e := range m.containers {
		// The pod's own container of that name wins, field by field, and stays put.
		nativeSidecar := m.native && !e.init
		if i := slices.Index(containers.names, e.name); i >= 0 {
			if _, err := containers.overlay(i, e, nativeSidecar); err != nil {
				return fmt.Errorf("container %q: %w", e.name, err)
			}
			st.Containers = append(st.Containers, e.name)
			continue
		}
		if i := slices.Index(inits.names, e.name); i >= 0 {
			dropped, err := inits.overlay(i, e, nativeSidecar)
			if err != nil {
				return fmt.Errorf("init container %q: %w", e.name, err)
			}
			if len(dropped) > 0 {
				m.warnings = append(m.warnings, fmt.Sprintf("init container %q is not a native sidecar (restartPolicy Always): the template's %s not applied", e.name, strings.Join(dropped, ", ")))
			}
			st.InitContainers = append(st.InitContainers, e.name)
			continue
		}
		b, err := e.json(nativeSidecar)
		if err != nil {
			return err
		}
		if !m.native && !e.init {
			containers.back = append(containers.back, b)
			st.Containers = append(st.Containers, e.name)
			continue
		}
		m.placeInit(inits, e, b)
		st.InitContainers = append(st.InitContainers, e.name)
	}
	if st.Volumes, err = d.appendAbsent("volumes", m.volumes); err != nil {
		return err
	}
	if st.ImagePullSecrets, err = d.appendAbsent("imagePullSecrets", m.pullSecrets); err != nil {
		return err
	}
	if len(m.labels) > 0 {
		addAbsentKeys(childMap(d.meta, "labels"), m.labels)
	}
	if len(m.annotations) > 0 {
		addAbsentKeys(childMap(d.meta, "annotations"), m.annotations)
	}
	return nil
}

// placeInit queues an injected init container (a template's init
// container, or with native sidecars any of its containers) where its
// template's initContainerPlacement says: First ahead of the pod's init
// containers, After right after the pod's own init container of that name.
// Without a placement, or when the pod lacks that init container (then
// with a warning, once per template), it goes ahead of the pod's init
// containers with native sidecars (so they start before the pod's own,
// Istio's order) and after them without (a traffic-capturing init
// container must not break the pod's init containers).
func (m *merger) placeInit(inits *rawList, e *injected, b json.RawMessage) {
	pl := e.from.placement
	switch pl.Position {
	case v1alpha1.InitContainersFirst:
		inits.front = append(inits.front, b)
		return
	case v1alpha1.InitContainersAfter:
		if i := slices.Index(inits.names, pl.After); i >= 0 {
			inits.insertAfter(i, b)
			return
		}
		where := "after the pod's init containers"
		if m.native {
			where = "ahead of the pod's init containers"
		}
		w := fmt.Sprintf("template %q: the pod has no init container %q (initContainerPlacement.after): its init containers go %s", e.from.name, short(pl.After, 63), where)
		if !slices.Contains(m.warnings, w) {
			m.warnings = append(m.warnings, w)
		}
	}
	if m.native {
		inits.front = append(inits.front, b)
	} else {
		inits.back = append(inits.back, b)
	}
}

func addAbsentKeys(dst, src map[string]any) {
	for k, v := range src {
		if _, ok := dst[k]; !ok {
			dst[k] = v
		}
	}
}
