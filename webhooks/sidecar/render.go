package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"text/template"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// templateData is the dot of every template.
type templateData struct {
	// ObjectMeta and Spec are the pod's (managedFields cleared).
	ObjectMeta *metav1.ObjectMeta
	Spec       *corev1.PodSpec
	// Namespace of the pod, also when ObjectMeta.Namespace is empty.
	Namespace string
	// Values is a private copy of the CR's spec.values.
	Values map[string]any
	// Injector is the SidecarInjector's name.
	Injector string
	// NativeSidecars tells whether sidecars will be native (KEP-753): the
	// engine moves rendered spec.containers into initContainers with
	// restartPolicy Always, so a template only needs this for extras such as
	// a startupProbe.
	NativeSidecars bool
}

// RenderError is a template that failed to execute or rendered something
// that is not a partial pod.
type RenderError struct {
	// Template is the template's name, empty when the error is about the
	// selection of templates rather than one of them.
	Template string
	// Err is the failure.
	Err error
	// ByPod marks errors caused by the pod itself (its templates
	// annotation), not by the SidecarInjector: the webhook answers them
	// with 400, never 500.
	ByPod bool
}

// Error names the template, when there is one, and the failure.
func (e *RenderError) Error() string {
	if e.Template == "" {
		// Not about one template (e.g. a malformed templates annotation).
		return e.Err.Error()
	}
	return fmt.Sprintf("template %q: %v", e.Template, e.Err)
}

// Unwrap returns Err (a *limitError when a render limit stopped it).
func (e *RenderError) Unwrap() error { return e.Err }

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// preparedPart is one template's rendered partial pod, validated and split
// into what the merge needs. It is cached and shared: never mutate it.
type preparedPart struct {
	// json is the whole rendered document as JSON.
	json                []byte
	labels, annotations map[string]any
	// containers lists the template's initContainers, then its containers.
	containers  []preparedEntry
	volumes     []preparedEntry
	pullSecrets []preparedEntry
	// rest is the JSON of the spec without the four lists, nil when empty.
	rest []byte
}

// preparedEntry is a named list element as JSON; for a regular container,
// nativeRaw is the same with restartPolicy Always.
type preparedEntry struct {
	name      string
	init      bool
	raw       []byte
	nativeRaw []byte
}

// renderOne executes t and returns the prepared partial pod, nil when the
// template rendered nothing. The execution is bounded (see maxRenderBytes
// and the limits beside it) and stops once ctx (nil: never) is done; a
// limit yields a *renderError wrapping a *limitError. The result is
// validated: top-level keys are only metadata and spec, metadata only
// labels and annotations with string values, spec decodes as a PodSpec,
// list elements have names, and duplicate keys are rejected
// (YAMLToJSONStrict) so a value cannot shadow a key written by the template.
func (c *Config) renderOne(ctx context.Context, t *compiledTemplate, data *templateData) (*preparedPart, error) {
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	defer bufPool.Put(buf)
	if err := t.execute(ctx, buf, data); err != nil {
		return nil, err
	}
	if p, ok := t.cache.get(buf.Bytes()); ok {
		return p, nil
	}
	j, err := yaml.YAMLToJSONStrict(buf.Bytes())
	if err != nil {
		return nil, &RenderError{Template: t.name, Err: fmt.Errorf("rendered invalid YAML: %w", err)}
	}
	var p *preparedPart
	if !bytes.Equal(j, []byte("null")) {
		if err := checkPartialPod(j); err != nil {
			return nil, &RenderError{Template: t.name, Err: err}
		}
		if p, err = prepare(j); err != nil {
			return nil, &RenderError{Template: t.name, Err: err}
		}
	}
	t.cache.put(buf.Bytes(), p)
	return p, nil
}

// execute runs t into buf within the render limits; errors are *renderError.
//
// The execution runs on one OS thread, locked for its duration, so that
// the thread's CPU clock is the render's own CPU time (renderState). All of
// it runs there: text/template executes synchronously in the calling
// goroutine, and no function of the FuncMap (sprig's, the bounded
// replacements, the pod accessors) starts a goroutine or waits for one.
// The YAML decoding that follows is not metered: maxRenderBytes bounds it.
func (t *compiledTemplate) execute(ctx context.Context, buf *bytes.Buffer, data *templateData) error {
	u, err := t.unit()
	if err != nil {
		return &RenderError{Template: t.name, Err: err}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	u.st.reset(ctx, time.Now())
	u.w.buf = buf
	err = u.tmpl.Execute(&u.w, data)
	if err == nil {
		// The clocks are read every 64 steps; a slow last call (sortAlpha of
		// a long list takes tens of ms) must not finish a render past its
		// limit.
		err = u.st.checkTime()
	}
	u.w.buf = nil
	u.st.ctx = nil // the pool must not keep a request alive
	t.units.Put(u)
	if err != nil {
		return &RenderError{Template: t.name, Err: err}
	}
	return nil
}

// execUnit is a clone of a compiled template with its functions bound to st.
type execUnit struct {
	tmpl *template.Template
	st   *renderState
	w    limitedWriter // reused: an interface conversion per render would allocate
}

// unit takes a clone from the pool or makes one (a pool miss costs a
// Clone and a FuncMap, about what a few renders cost).
func (t *compiledTemplate) unit() (*execUnit, error) {
	if u, ok := t.units.Get().(*execUnit); ok {
		return u, nil
	}
	tm, err := t.tmpl.Clone()
	if err != nil {
		return nil, err
	}
	st := &renderState{}
	tm.Funcs(funcMap(st))
	return &execUnit{tmpl: tm, st: st, w: limitedWriter{st: st}}, nil
}

func prepare(j []byte) (*preparedPart, error) {
	part, err := decodeMap(j)
	if err != nil {
		return nil, err
	}
	p := &preparedPart{json: j}
	if md, ok := part["metadata"].(map[string]any); ok {
		p.labels, _ = md["labels"].(map[string]any)
		p.annotations, _ = md["annotations"].(map[string]any)
	}
	spec, ok := part["spec"].(map[string]any)
	if !ok {
		return p, nil
	}
	// Init containers first: in template order they run before its sidecars.
	if p.containers, err = prepareList(p.containers, spec["initContainers"], true, "initContainers"); err != nil {
		return nil, err
	}
	if p.containers, err = prepareList(p.containers, spec["containers"], false, "containers"); err != nil {
		return nil, err
	}
	if p.volumes, err = prepareList(nil, spec["volumes"], false, "volumes"); err != nil {
		return nil, err
	}
	if p.pullSecrets, err = prepareList(nil, spec["imagePullSecrets"], false, "imagePullSecrets"); err != nil {
		return nil, err
	}
	for _, k := range listKeys {
		delete(spec, k)
	}
	for k := range spec {
		if strings.HasPrefix(k, "$") {
			return nil, fmt.Errorf("spec-level patch directive %q is not supported", k)
		}
	}
	if len(spec) > 0 {
		if p.rest, err = json.Marshal(spec); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func prepareList(acc []preparedEntry, list any, init bool, field string) ([]preparedEntry, error) {
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
		e := preparedEntry{name: name, init: init}
		var err error
		if e.raw, err = json.Marshal(im); err != nil {
			return nil, err
		}
		if field == "containers" {
			im["restartPolicy"] = string(corev1.ContainerRestartPolicyAlways)
			if e.nativeRaw, err = json.Marshal(im); err != nil {
				return nil, err
			}
		}
		acc = append(acc, e)
	}
	return acc, nil
}

func checkPartialPod(j []byte) error {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(j, &top); err != nil {
		return fmt.Errorf("rendered YAML is not a mapping with metadata and spec")
	}
	for k := range top {
		if k != "metadata" && k != "spec" {
			return fmt.Errorf("rendered top-level key %q: only metadata and spec are allowed", k)
		}
	}
	if m, ok := top["metadata"]; ok {
		var meta map[string]json.RawMessage
		if err := json.Unmarshal(m, &meta); err != nil {
			return fmt.Errorf("rendered metadata is not a mapping")
		}
		for k, v := range meta {
			if k != "labels" && k != "annotations" {
				return fmt.Errorf("rendered metadata.%s: only labels and annotations are allowed", k)
			}
			var kv map[string]string
			if err := json.Unmarshal(v, &kv); err != nil {
				return fmt.Errorf("rendered metadata.%s must map strings to strings", k)
			}
		}
	}
	if s, ok := top["spec"]; ok {
		var spec corev1.PodSpec
		if err := json.Unmarshal(s, &spec); err != nil {
			return fmt.Errorf("rendered spec is not a pod spec: %w", err)
		}
	}
	return nil
}

// deepCopyValue copies JSON-shaped data (maps, slices, scalars) so templates
// can use sprig's mutating functions (set, merge, append) on .Values safely.
func deepCopyValue(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = deepCopyValue(e)
		}
		return m
	case []any:
		s := make([]any, len(x))
		for i, e := range x {
			s[i] = deepCopyValue(e)
		}
		return s
	}
	return v
}
