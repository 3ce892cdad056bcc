package sidecar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// TemplateData is the dot of every template.
type TemplateData struct {
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
	Template string
	Err      error
}

func (e *RenderError) Error() string { return fmt.Sprintf("template %q: %v", e.Template, e.Err) }
func (e *RenderError) Unwrap() error { return e.Err }

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// renderOne executes t and returns the JSON of the partial pod, nil when the
// template rendered nothing. The result is validated: top-level keys are only
// metadata and spec, metadata only labels and annotations with string values,
// and duplicate keys are rejected (YAMLToJSONStrict) so a value cannot
// shadow a key written by the template.
func (c *Config) renderOne(t *compiledTemplate, data *TemplateData) ([]byte, error) {
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	defer bufPool.Put(buf)
	if err := t.tmpl.Execute(buf, data); err != nil {
		return nil, &RenderError{Template: t.name, Err: err}
	}
	if j, ok := t.cache.get(buf.Bytes()); ok {
		return j, nil
	}
	j, err := yaml.YAMLToJSONStrict(buf.Bytes())
	if err != nil {
		return nil, &RenderError{Template: t.name, Err: fmt.Errorf("rendered invalid YAML: %w", err)}
	}
	if bytes.Equal(j, []byte("null")) {
		j = nil
	} else if err := checkPartialPod(j); err != nil {
		return nil, &RenderError{Template: t.name, Err: err}
	}
	t.cache.put(buf.Bytes(), j)
	return j, nil
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
