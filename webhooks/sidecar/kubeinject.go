package sidecar

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// PodSite is a pod, or a pod template inside a workload, found in a manifest.
type PodSite struct {
	// Ref is "Kind/name" of the object holding the pod (a List item keeps its own kind).
	Ref string
	// Namespace of the object, or the default namespace.
	Namespace string
	// Pod is the pod object itself (kind Pod) or a synthetic Pod built from
	// the template's metadata and spec.
	Pod map[string]any
	// Misplaced lists the inject label/annotation keys found on the
	// workload's own metadata but not on its pod template, where they do nothing.
	Misplaced []string

	obj, template map[string]any
}

// podTemplatePaths are the workload kinds kube-inject handles (as Istio's
// IntoObject does) and where their pod template lives.
var podTemplatePaths = map[string][]string{
	"apps/Deployment":        {"spec", "template"},
	"apps/DaemonSet":         {"spec", "template"},
	"apps/StatefulSet":       {"spec", "template"},
	"apps/ReplicaSet":        {"spec", "template"},
	"/ReplicationController": {"spec", "template"},
	"batch/Job":              {"spec", "template"},
	"batch/CronJob":          {"spec", "jobTemplate", "spec", "template"},
}

// FindPods returns the pods and pod templates in obj, descending into v1
// Lists. Other kinds yield nothing.
func FindPods(obj map[string]any, defaultNamespace string) []PodSite {
	apiVersion, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	group := ""
	if i := strings.Index(apiVersion, "/"); i >= 0 {
		group = apiVersion[:i]
	}
	meta, _ := obj["metadata"].(map[string]any)
	name, _ := meta["name"].(string)
	if name == "" {
		name, _ = meta["generateName"].(string)
	}
	ns, _ := meta["namespace"].(string)
	if ns == "" {
		ns = defaultNamespace
	}
	ref := kind + "/" + name
	if apiVersion == "v1" && (kind == "List" || strings.HasSuffix(kind, "List")) {
		var out []PodSite
		items, _ := obj["items"].([]any)
		for _, it := range items {
			if m, ok := it.(map[string]any); ok {
				out = append(out, FindPods(m, defaultNamespace)...)
			}
		}
		return out
	}
	if apiVersion == "v1" && kind == "Pod" {
		return []PodSite{{Ref: ref, Namespace: ns, Pod: obj, obj: obj}}
	}
	path := podTemplatePaths[group+"/"+kind]
	if path == nil {
		return nil
	}
	cur := obj
	for _, k := range path {
		next, ok := cur[k].(map[string]any)
		if !ok {
			return nil
		}
		cur = next
	}
	tmeta, _ := cur["metadata"].(map[string]any)
	if tmeta == nil {
		tmeta = map[string]any{}
	}
	pod := map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": tmeta, "spec": cur["spec"]}
	return []PodSite{{Ref: ref, Namespace: ns, Pod: pod, Misplaced: misplaced(meta, tmeta), obj: obj, template: cur}}
}

// misplaced reports inject/templates/native keys on a workload's own
// metadata that its pod template lacks: the webhook only sees pods.
func misplaced(own, tmpl map[string]any) []string {
	var out []string
	for _, field := range []string{"labels", "annotations"} {
		o, _ := own[field].(map[string]any)
		t, _ := tmpl[field].(map[string]any)
		for _, k := range []string{v1alpha1.SidecarInjectKey, v1alpha1.SidecarTemplatesKey, v1alpha1.SidecarNativeKey} {
			v, ok := o[k]
			if !ok {
				continue
			}
			if _, ok := t[k]; ok {
				continue
			}
			out = append(out, fmt.Sprintf("%s %s=%v is on the object's own metadata.%s, where it has no effect: put it in the pod template's metadata.%s", strings.TrimSuffix(field, "s"), k, v, field, field))
		}
	}
	return out
}

// injectObject injects every pod and pod template in obj in place. It reports
// whether anything changed; warn receives skips and ignored values, each
// prefixed with the object reference.
func injectObject(cfg *Config, p Params, obj map[string]any, defaultNamespace string, warn func(string)) (bool, error) {
	changed := false
	for _, s := range FindPods(obj, defaultNamespace) {
		for _, m := range s.Misplaced {
			warn(s.Ref + ": " + m)
		}
		raw, err := json.Marshal(s.Pod)
		if err != nil {
			return changed, err
		}
		res, err := Inject(cfg, p, Input{Raw: raw, Namespace: s.Namespace, WantJSON: true})
		if err != nil {
			return changed, fmt.Errorf("%s: %w", s.Ref, err)
		}
		for _, w := range res.Warnings {
			warn(s.Ref + ": " + w)
		}
		if !res.Injected {
			warn(fmt.Sprintf("%s: not injected: %s", s.Ref, res.Decision.Reason))
			continue
		}
		injected, err := decodeMap(res.JSON)
		if err != nil {
			return changed, err
		}
		changed = true
		if s.template == nil {
			for k := range s.obj {
				delete(s.obj, k)
			}
			for k, v := range injected {
				s.obj[k] = v
			}
			continue
		}
		s.template["metadata"] = injected["metadata"]
		s.template["spec"] = injected["spec"]
	}
	return changed, nil
}

// InjectStream runs injectObject over a multi-document YAML stream or a JSON
// stream (detected from the first non-space byte) and writes the result in
// the same format. Documents that do not change are written back byte for
// byte, so a second pass over the output reproduces it exactly.
func InjectStream(cfg *Config, p Params, r io.Reader, w io.Writer, defaultNamespace string, warn func(string)) error {
	br := bufio.NewReader(r)
	if isJSONStream(br) {
		return injectJSONStream(cfg, p, br, w, defaultNamespace, warn)
	}
	yr := utilyaml.NewYAMLReader(br)
	first := true
	// Errors name the document, counted from 1 in stream order.
	for n := 1; ; n++ {
		doc, err := yr.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("YAML document %d: %w", n, err)
		}
		out, err := injectYAMLDoc(cfg, p, doc, defaultNamespace, warn)
		if err != nil {
			return fmt.Errorf("YAML document %d: %w", n, err)
		}
		if !first {
			if _, err := io.WriteString(w, "---\n"); err != nil {
				return err
			}
		}
		first = false
		if len(out) > 0 && out[len(out)-1] != '\n' {
			out = append(out, '\n')
		}
		if _, err := w.Write(out); err != nil {
			return err
		}
	}
}

func injectYAMLDoc(cfg *Config, p Params, doc []byte, ns string, warn func(string)) ([]byte, error) {
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return nil, fmt.Errorf("parsing YAML document: %w", err)
	}
	if !bytes.HasPrefix(j, []byte("{")) {
		return doc, nil
	}
	obj, err := decodeMap(j)
	if err != nil {
		return nil, err
	}
	changed, err := injectObject(cfg, p, obj, ns, warn)
	if err != nil || !changed {
		return doc, err
	}
	j, err = json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	return yaml.JSONToYAML(j)
}

func isJSONStream(br *bufio.Reader) bool {
	for i := 1; ; i++ {
		b, err := br.Peek(i)
		if err != nil {
			return false
		}
		switch b[i-1] {
		case ' ', '\t', '\r', '\n':
			continue
		case '{', '[':
			return true
		}
		return false
	}
}

func injectJSONStream(cfg *Config, p Params, r io.Reader, w io.Writer, ns string, warn func(string)) error {
	dec := json.NewDecoder(r)
	for n := 1; ; n++ {
		var raw json.RawMessage
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("JSON document %d: %w", n, err)
		}
		out := []byte(raw)
		if bytes.HasPrefix(raw, []byte("{")) {
			obj, err := decodeMap(raw)
			if err != nil {
				return fmt.Errorf("JSON document %d: %w", n, err)
			}
			changed, err := injectObject(cfg, p, obj, ns, warn)
			if err != nil {
				return fmt.Errorf("JSON document %d: %w", n, err)
			}
			if changed {
				if out, err = json.MarshalIndent(obj, "", "  "); err != nil {
					return err
				}
			}
		}
		if _, err := w.Write(append(out, '\n')); err != nil {
			return err
		}
	}
}

// CheckPods writes, for every pod site and every config, whether the config
// would inject it and the exact deciding rule, plus warnings (ignored
// values, inject keys placed on a workload's own metadata) and render
// failures. nsLabels returns a namespace's labels, or nil when unknown, in
// which case namespaceSelector is reported as not checked.
func CheckPods(w io.Writer, cfgs []*Config, p Params, sites []PodSite, nsLabels func(string) map[string]string) error {
	if len(sites) == 0 {
		_, err := fmt.Fprintln(w, "no pod or pod template found")
		return err
	}
	var b strings.Builder
	for _, s := range sites {
		fmt.Fprintf(&b, "%s (namespace %s):\n", s.Ref, s.Namespace)
		for _, m := range s.Misplaced {
			fmt.Fprintf(&b, "  note: %s\n", m)
		}
		raw, err := json.Marshal(s.Pod)
		if err != nil {
			return err
		}
		labels := nsLabels(s.Namespace)
		for _, cfg := range cfgs {
			res, err := Inject(cfg, p, Input{Raw: raw, Namespace: s.Namespace, NamespaceLabels: labels, WantJSON: true})
			var rerr *RenderError
			switch {
			case errors.As(err, &rerr):
				fmt.Fprintf(&b, "  %s: would try to inject, but rendering fails: %v (failurePolicy %s: pod would be %s)\n",
					cfg.Name, rerr, cfg.FailurePolicy, map[bool]string{true: "admitted without sidecars", false: "rejected"}[cfg.FailurePolicy == v1alpha1.FailurePolicyIgnore])
				continue
			case err != nil:
				fmt.Fprintf(&b, "  %s: error: %v\n", cfg.Name, err)
				continue
			}
			d := res.Decision
			if res.Injected {
				mode := "regular sidecars"
				if res.Native {
					mode = "native sidecars (initContainers, restartPolicy Always)"
				}
				fmt.Fprintf(&b, "  %s: would inject [%s]: %s; templates %s; %s\n", cfg.Name, d.Code, d.Reason, strings.Join(res.Templates, ","), mode)
				if inits := initContainerNames(res.JSON); len(inits) > 0 {
					// Where initContainerPlacement put them.
					fmt.Fprintf(&b, "    init containers, in start order: %s\n", strings.Join(inits, ", "))
				}
			} else {
				fmt.Fprintf(&b, "  %s: would NOT inject [%s]: %s\n", cfg.Name, d.Code, d.Reason)
			}
			for _, wmsg := range res.Warnings {
				fmt.Fprintf(&b, "    warning: %s\n", wmsg)
			}
			if res.Injected && labels == nil && cfg.namespaceSelector != nil {
				fmt.Fprintf(&b, "    note: namespaceSelector %s not checked (namespace labels unknown)\n", cfg.namespaceSelector)
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// initContainerNames lists spec.initContainers of an injected pod's JSON.
func initContainerNames(pod []byte) []string {
	var p struct {
		Spec struct {
			InitContainers []struct {
				Name string `json:"name"`
			} `json:"initContainers"`
		} `json:"spec"`
	}
	if json.Unmarshal(pod, &p) != nil {
		return nil
	}
	names := make([]string, len(p.Spec.InitContainers))
	for i, c := range p.Spec.InitContainers {
		names[i] = c.Name
	}
	return names
}

// ReadObjects parses a multi-document YAML or JSON stream into objects. An
// error names the document, counted from 1.
func ReadObjects(r io.Reader) ([]map[string]any, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	var out []map[string]any
	for n := 1; ; n++ {
		var raw json.RawMessage
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		if !bytes.HasPrefix(bytes.TrimSpace(raw), []byte("{")) {
			continue
		}
		obj, err := decodeMap(raw)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		out = append(out, obj)
	}
}
