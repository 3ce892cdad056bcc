// Package helmchart generates the Helm chart dist/chart from config/, so the
// three install paths (the OLM bundle, kustomize's `make deploy`, Helm) are
// built from the same manifests and cannot drift.
//
// Like kubebuilder's helm/v2-alpha plugin it starts from kustomize's output,
// not from hand-written templates: Generate renders config/default (with the
// config/prometheus component added) and config/networkpolicy with the
// kustomize library the module pins, then turns each object into one
// template, replacing only the fields the values set (the release
// namespace, the image, replicas, resources, priority class, ownership
// labels, the CRDs' keep policy, the optional objects' toggles). The
// templates under static/ (helpers and the pre-install check) are copied
// as they are.
//
// `make chart` writes the result (cmd hack/chartgen); the package's test
// fails when the committed dist/chart differs from it. It must not import a
// Kubernetes client, the operator or the webhook servers.
package helmchart

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Dir is where the chart lives, relative to the repository root.
const Dir = "dist/chart"

// Namespace is config/default's namespace; the chart puts the release
// namespace in its place.
const Namespace = "hookwright-system"

// managerDeployment and managerContainer name what the values set.
const (
	managerDeployment = "hookwright-controller-manager"
	managerContainer  = "manager"
	// serverImageEnv is the operator's env var naming the servers' image.
	serverImageEnv = "RELATED_IMAGE_SERVER"
)

//go:embed all:static
var static embed.FS

// Placeholders put into the objects before they are written as YAML; the
// template text replaces them afterwards, once the YAML's own "{{" are
// escaped. Scalar ones stand for a value, line ones for whole lines.
var scalars = map[string]string{
	"__HW_NAMESPACE__":  "{{ .Release.Namespace }}",
	"__HW_SERVICE__":    "{{ .Release.Service }}",
	"__HW_RELEASE__":    "{{ .Release.Name }}",
	"__HW_CHART__":      `{{ include "hookwright.chart" . }}`,
	"__HW_IMAGE__":      `{{ include "hookwright.image" . }}`,
	"__HW_REPLICAS__":   "{{ .Values.replicas }}",
	"__HW_PULLPOLICY__": "{{ .Values.image.pullPolicy }}",
}

// lineRe matches a line holding a line placeholder: indent, key, value.
var lineRe = regexp.MustCompile(`(?m)^( *)(resources: __HW_RESOURCES__|__HW_PRIORITY__: x|__HW_CRD_KEEP__: x|__HW_MONITORING_LABELS__: x)$`)

func lineTemplate(indent, what string) string {
	switch what {
	case "resources: __HW_RESOURCES__":
		return fmt.Sprintf("%sresources:\n{{- toYaml .Values.resources | nindent %d }}", indent, len(indent)+2)
	case "__HW_PRIORITY__: x":
		return fmt.Sprintf("{{- with .Values.priorityClassName }}\n%spriorityClassName: {{ . | quote }}\n{{- end }}", indent)
	case "__HW_CRD_KEEP__: x":
		return fmt.Sprintf("{{- if .Values.crds.keep }}\n%shelm.sh/resource-policy: keep\n{{- end }}", indent)
	default: // monitoring labels
		return fmt.Sprintf("{{- with .Values.monitoring.additionalLabels }}\n{{- toYaml . | nindent %d }}\n{{- end }}", len(indent))
	}
}

// toggles wraps the objects of these kinds in a condition on a value.
var toggles = map[string]string{
	"ServiceMonitor": ".Values.monitoring.serviceMonitor.enabled",
	"PodMonitor":     ".Values.monitoring.podMonitor.enabled",
	"PrometheusRule": ".Values.monitoring.prometheusRule.enabled",
	"NetworkPolicy":  ".Values.networkPolicy.enabled",
}

// escaper keeps the YAML's own template text (the PrometheusRule's
// {{ $labels }}, the SidecarInjector docs in the CRDs) literal for Helm.
var escaper = strings.NewReplacer("{{", `{{ "{{" }}`, "}}", `{{ "}}" }}`)

// defaults are the values config/ sets, written into values.yaml.
type defaults struct {
	repository, tag string
	replicas        int64
	resources       any
}

// Generate renders root's config/ into the chart's files: paths relative
// to Dir, to their content. Errors name the config/ directory or object
// that could not be rendered.
func Generate(root string) (map[string][]byte, error) {
	mem, err := loadConfig(filepath.Join(root, "config"))
	if err != nil {
		return nil, err
	}
	objs, err := render(mem, "/config/default")
	if err != nil {
		return nil, err
	}
	netpol, err := render(mem, "/config/networkpolicy")
	if err != nil {
		return nil, err
	}
	objs = append(objs, netpol...)

	files := map[string][]byte{}
	var d *defaults
	for _, o := range objs {
		kind, _ := o["kind"].(string)
		name, _ := dig(o, "metadata", "name").(string)
		if kind == "Namespace" {
			// The release namespace: `helm install --namespace X --create-namespace`.
			continue
		}
		if kind == "Deployment" && name == managerDeployment {
			if d, err = templateDeployment(o); err != nil {
				return nil, err
			}
		}
		if err := templateObject(o, kind); err != nil {
			return nil, fmt.Errorf("%s %s: %w", kind, name, err)
		}
		text, err := toTemplate(o)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", kind, name, err)
		}
		if cond, ok := toggles[kind]; ok {
			text = "{{- if " + cond + " }}\n" + text + "{{- end }}\n"
		}
		file := path.Join("templates", strings.ToLower(kind)+"-"+strings.TrimPrefix(name, "hookwright-")+".yaml")
		if _, dup := files[file]; dup {
			return nil, fmt.Errorf("two objects map to %s", file)
		}
		files[file] = []byte(header + text)
	}
	if d == nil {
		return nil, fmt.Errorf("config/default renders no Deployment %s", managerDeployment)
	}
	if err := fs.WalkDir(static, "static", func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		b, err := static.ReadFile(p)
		files[strings.TrimPrefix(p, "static/")] = b
		return err
	}); err != nil {
		return nil, err
	}
	files["Chart.yaml"] = []byte(chartYAML(d))
	values, err := valuesYAML(d)
	if err != nil {
		return nil, err
	}
	files["values.yaml"] = values
	return files, nil
}

const header = "# Generated by `make chart` from config/ (internal/helmchart); do not edit.\n"

// loadConfig copies dir (config/) into an in-memory file system, with
// config/prometheus added to config/default's components: the chart
// carries the monitors and rules behind their toggles.
func loadConfig(dir string) (filesys.FileSystem, error) {
	mem := filesys.MakeFsInMemory()
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return mem.WriteFile(path.Join("/config", filepath.ToSlash(rel)), b)
	})
	if err != nil {
		return nil, fmt.Errorf("read config/: %w", err)
	}
	const k = "/config/default/kustomization.yaml"
	b, err := mem.ReadFile(k)
	if err != nil {
		return nil, err
	}
	var kust map[string]any
	if err := yaml.Unmarshal(b, &kust); err != nil {
		return nil, fmt.Errorf("config/default/kustomization.yaml: %w", err)
	}
	comps, _ := kust["components"].([]any)
	for _, c := range comps {
		if c == "../prometheus" {
			return mem, nil
		}
	}
	kust["components"] = append(comps, "../prometheus")
	if b, err = yaml.Marshal(kust); err != nil {
		return nil, err
	}
	return mem, mem.WriteFile(k, b)
}

// render runs kustomize on dir of mem.
func render(mem filesys.FileSystem, dir string) ([]map[string]any, error) {
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(mem, dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", strings.TrimPrefix(dir, "/"), err)
	}
	var out []map[string]any
	for _, r := range rm.Resources() {
		m, err := r.Map()
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// templateObject sets the placeholders every object gets: the release
// namespace for config/default's, Helm's ownership labels, the CRDs' keep
// policy, the monitors' extra labels.
func templateObject(o map[string]any, kind string) error {
	meta, ok := o["metadata"].(map[string]any)
	if !ok {
		return fmt.Errorf("no metadata")
	}
	if meta["namespace"] == Namespace {
		meta["namespace"] = "__HW_NAMESPACE__"
	}
	if subjects, ok := o["subjects"].([]any); ok {
		for _, s := range subjects {
			if s, ok := s.(map[string]any); ok && s["namespace"] == Namespace {
				s["namespace"] = "__HW_NAMESPACE__"
			}
		}
	}
	labels, _ := meta["labels"].(map[string]any)
	if labels == nil {
		labels = map[string]any{}
		meta["labels"] = labels
	}
	labels["app.kubernetes.io/managed-by"] = "__HW_SERVICE__"
	labels["app.kubernetes.io/instance"] = "__HW_RELEASE__"
	labels["helm.sh/chart"] = "__HW_CHART__"
	switch kind {
	case "CustomResourceDefinition":
		ann, _ := meta["annotations"].(map[string]any)
		if ann == nil {
			ann = map[string]any{}
			meta["annotations"] = ann
		}
		ann["__HW_CRD_KEEP__"] = "x"
	case "ServiceMonitor", "PodMonitor", "PrometheusRule":
		labels["__HW_MONITORING_LABELS__"] = "x"
	}
	return nil
}

// templateDeployment puts the values into the manager Deployment and
// returns config/'s settings of them as the defaults.
func templateDeployment(o map[string]any) (*defaults, error) {
	spec, _ := o["spec"].(map[string]any)
	podSpec, _ := dig(o, "spec", "template", "spec").(map[string]any)
	if spec == nil || podSpec == nil {
		return nil, fmt.Errorf("deployment %s: no pod template", managerDeployment)
	}
	d := &defaults{replicas: 1}
	switch r := spec["replicas"].(type) {
	case int:
		d.replicas = int64(r)
	case int64:
		d.replicas = r
	case float64:
		d.replicas = int64(r)
	}
	spec["replicas"] = "__HW_REPLICAS__"
	podSpec["__HW_PRIORITY__"] = "x"
	containers, _ := podSpec["containers"].([]any)
	for _, c := range containers {
		c, ok := c.(map[string]any)
		if !ok || c["name"] != managerContainer {
			continue
		}
		image, _ := c["image"].(string)
		i := strings.LastIndex(image, ":")
		if i < 0 || strings.Contains(image[i:], "/") {
			return nil, fmt.Errorf("deployment %s: image %q has no tag", managerDeployment, image)
		}
		d.repository, d.tag = image[:i], image[i+1:]
		c["image"] = "__HW_IMAGE__"
		c["imagePullPolicy"] = "__HW_PULLPOLICY__"
		d.resources = c["resources"]
		c["resources"] = "__HW_RESOURCES__"
		env, _ := c["env"].([]any)
		for _, e := range env {
			if e, ok := e.(map[string]any); ok && e["name"] == serverImageEnv {
				e["value"] = "__HW_IMAGE__"
			}
		}
	}
	if d.repository == "" {
		return nil, fmt.Errorf("deployment %s: no container %s", managerDeployment, managerContainer)
	}
	return d, nil
}

// toTemplate writes o as YAML, escapes its own template text and replaces
// the placeholders.
func toTemplate(o map[string]any) (string, error) {
	b, err := yaml.Marshal(o)
	if err != nil {
		return "", err
	}
	text := escaper.Replace(string(b))
	text = lineRe.ReplaceAllStringFunc(text, func(line string) string {
		m := lineRe.FindStringSubmatch(line)
		return lineTemplate(m[1], m[2])
	})
	keys := make([]string, 0, len(scalars))
	for k := range scalars {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		text = strings.ReplaceAll(text, k, scalars[k])
	}
	if strings.Contains(text, "__HW_") {
		return "", fmt.Errorf("placeholder left in %q", text)
	}
	return "---\n" + text, nil
}

func dig(o map[string]any, keys ...string) any {
	var cur any = o
	for _, k := range keys {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[k]
	}
	return cur
}

func chartYAML(d *defaults) string {
	return header + `apiVersion: v2
name: hookwright
description: Operator for two mutating admission webhooks, SidecarInjector and NodeOversell.
type: application
version: ` + strings.TrimPrefix(d.tag, "v") + `
appVersion: ` + d.tag + `
home: https://github.com/hookwright/hookwright
`
}

func valuesYAML(d *defaults) ([]byte, error) {
	res, err := yaml.Marshal(map[string]any{"resources": d.resources})
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString(header)
	fmt.Fprintf(&b, `# The operator image; its webhook servers run the same image.
image:
  repository: %s
  # Default: the chart's appVersion.
  tag: %q
  pullPolicy: IfNotPresent

# Operator replicas (one leads, the others stand by).
replicas: %d

# The manager container's resources.
%s
# PriorityClass of the operator pods ("" for none). The webhook servers' own
# priority class is set per CR (spec.server).
priorityClassName: ""

crds:
  # Keep the CRDs (and so every SidecarInjector and NodeOversell) on
  # helm uninstall: annotation helm.sh/resource-policy: keep, as
  # cert-manager's crds.keep.
  keep: true

# Admit only the webhook port (9443) to the webhook server pods; needs a CNI
# that enforces NetworkPolicy (config/networkpolicy).
networkPolicy:
  enabled: false

# Prometheus Operator objects (need the monitoring.coreos.com CRDs);
# config/prometheus and docs/alerts.md.
monitoring:
  # Labels added to each monitor and rule, e.g. the release label your
  # Prometheus selects them by.
  additionalLabels: {}
  # The operator's metrics Service (bind ClusterRole
  # hookwright-metrics-reader to Prometheus's ServiceAccount).
  serviceMonitor:
    enabled: false
  # The webhook server pods' metrics port.
  podMonitor:
    enabled: false
  # The alerts of docs/alerts.md.
  prometheusRule:
    enabled: false
`, d.repository, d.tag, d.replicas, res)
	return b.Bytes(), nil
}

// Write replaces root's Dir with the generated chart.
func Write(root string) error {
	files, err := Generate(root)
	if err != nil {
		return err
	}
	dir := filepath.Join(root, Dir)
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	for name, b := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}
