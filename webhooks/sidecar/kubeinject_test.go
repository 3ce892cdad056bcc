package sidecar

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

func TestFindPodsKinds(t *testing.T) {
	tmpl := map[string]any{"metadata": map[string]any{"labels": map[string]any{"app": "x"}}, "spec": map[string]any{"containers": []any{}}}
	for _, tc := range []struct {
		apiVersion, kind string
		spec             map[string]any
		want             int
	}{
		{"v1", "Pod", map[string]any{}, 1},
		{"apps/v1", "Deployment", map[string]any{"template": tmpl}, 1},
		{"apps/v1", "DaemonSet", map[string]any{"template": tmpl}, 1},
		{"apps/v1", "StatefulSet", map[string]any{"template": tmpl}, 1},
		{"apps/v1", "ReplicaSet", map[string]any{"template": tmpl}, 1},
		{"v1", "ReplicationController", map[string]any{"template": tmpl}, 1},
		{"batch/v1", "Job", map[string]any{"template": tmpl}, 1},
		{"batch/v1", "CronJob", map[string]any{"jobTemplate": map[string]any{"spec": map[string]any{"template": tmpl}}}, 1},
		{"example.com/v1", "Deployment", map[string]any{"template": tmpl}, 0},
		{"v1", "Service", map[string]any{}, 0},
		{"apps/v1", "Deployment", map[string]any{}, 0},
	} {
		obj := map[string]any{"apiVersion": tc.apiVersion, "kind": tc.kind, "metadata": map[string]any{"name": "n"}, "spec": tc.spec}
		if got := len(FindPods(obj, "default")); got != tc.want {
			t.Errorf("%s %s: %d sites, want %d", tc.apiVersion, tc.kind, got, tc.want)
		}
	}
	list := map[string]any{"apiVersion": "v1", "kind": "List", "items": []any{
		map[string]any{"apiVersion": "v1", "kind": "List", "items": []any{
			map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": "inner"}, "spec": map[string]any{}},
		}},
		map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": "outer", "namespace": "ns1"}, "spec": map[string]any{}},
	}}
	sites := FindPods(list, "default")
	if len(sites) != 2 || sites[0].Ref != "Pod/inner" || sites[0].Namespace != "default" || sites[1].Namespace != "ns1" {
		t.Fatalf("%+v", sites)
	}
}

// TestInjectJSONStream: JSON in, JSON out, idempotent, non-pods untouched.
func TestInjectJSONStream(t *testing.T) {
	cfg := sampleConfig(t)
	in := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"big":12345678901234567890}}
` + nginxPod + "\n"
	var out bytes.Buffer
	if err := InjectStream(cfg, testParams, strings.NewReader(in), &out, "default", func(string) {}); err != nil {
		t.Fatal(err)
	}
	first, rest, _ := strings.Cut(out.String(), "\n")
	if first != `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"big":12345678901234567890}}` {
		t.Errorf("ConfigMap changed: %s", first)
	}
	if !strings.Contains(rest, `"restartPolicy": "Always"`) || !strings.Contains(rest, "sidecar.hookwright.io/status") {
		t.Errorf("pod not injected:\n%s", rest)
	}
	var again bytes.Buffer
	if err := InjectStream(cfg, testParams, bytes.NewReader(out.Bytes()), &again, "default", func(string) {}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), again.Bytes()) {
		t.Error("second pass changed the JSON output")
	}
}

func TestInjectStreamErrors(t *testing.T) {
	cfg := sampleConfig(t)
	for _, in := range []string{"a: [unclosed\n", "{\"apiVersion\": ", "kind: Pod\n---\n: :\n  - ]"} {
		if err := InjectStream(cfg, testParams, strings.NewReader(in), &bytes.Buffer{}, "default", func(string) {}); err == nil {
			t.Errorf("no error for %q", in)
		}
	}
}

func TestCheckPods(t *testing.T) {
	cfg := sampleConfig(t)
	src := `apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels:
    sidecar.hookwright.io/inject: "true"
spec:
  template:
    metadata:
      annotations:
        sidecar.hookwright.io/inject: "maybe"
    spec:
      containers:
      - name: web
        image: web
---
apiVersion: v1
kind: Pod
metadata:
  name: sys
  namespace: kube-system
spec:
  containers:
  - name: a
    image: a
`
	objs, err := ReadObjects(strings.NewReader(src))
	if err != nil || len(objs) != 2 {
		t.Fatalf("%d objects, %v", len(objs), err)
	}
	var sites []PodSite
	for _, o := range objs {
		sites = append(sites, FindPods(o, "shop")...)
	}
	var out bytes.Buffer
	nsLabels := func(ns string) map[string]string {
		if ns == "shop" {
			return map[string]string{}
		}
		return nil
	}
	if err := CheckPods(&out, []*Config{cfg}, testParams, sites, nsLabels); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Deployment/web (namespace shop):",
		"note: label sidecar.hookwright.io/inject=true is on the object's own metadata.labels",
		`would NOT inject [NamespaceSelector]: namespace "shop" labels do not match namespaceSelector sidecar-injection=enabled`,
		"Pod/sys (namespace kube-system):",
		`would NOT inject [SystemNamespace]`,
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	labelled := func(string) map[string]string { return map[string]string{"sidecar-injection": "enabled"} }
	if err := CheckPods(&out, []*Config{cfg}, testParams, sites[:1], labelled); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"would inject [Policy]",
		`warning: ignored annotation sidecar.hookwright.io/inject="maybe"`,
		"native sidecars",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestTemplateReadingSpec: a template that reads .Spec gets the decoded spec.
func TestTemplateReadingSpec(t *testing.T) {
	cr := sampleCR(t)
	cr.Spec.Templates = append(cr.Spec.Templates, v1alpha1.NamedTemplate{Name: "ports", Template: `metadata:
  annotations:
    {{- $p := list }}{{ range .Spec.Containers }}{{ range .Ports }}{{ $p = append $p (toString .ContainerPort) }}{{ end }}{{ end }}
    example.com/ports: {{ join "," $p | quote }}
`})
	cfg, err := Compile(cr)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.needsSpec {
		t.Fatal("needsSpec not detected")
	}
	pod := `{"metadata":{"name":"p","annotations":{"sidecar.hookwright.io/templates":"ports"}},"spec":{"containers":[{"name":"a","image":"a","ports":[{"containerPort":80},{"containerPort":443}]}]}}`
	res, err := Inject(cfg, testParams, Input{Raw: []byte(pod), Namespace: "shop", WantJSON: true})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Metadata struct{ Annotations map[string]string }
	}
	if err := json.Unmarshal(res.JSON, &got); err != nil {
		t.Fatal(err)
	}
	if got.Metadata.Annotations["example.com/ports"] != "80,443" {
		t.Errorf("annotation %q", got.Metadata.Annotations["example.com/ports"])
	}
}

// TestKubeInjectMatchesWebhookForWorkloads: the sample's containers for a
// Deployment's pod template (no name, no app label) are the same whether
// kube-inject renders them (no generateName yet, namespace assumed) or the
// webhook does for the ReplicaSet's pod (generateName, real namespace).
func TestKubeInjectMatchesWebhookForWorkloads(t *testing.T) {
	cfg := sampleConfig(t)
	deploy := `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web"},"spec":{"selector":{"matchLabels":{"tier":"web"}},` +
		`"template":{"metadata":{"labels":{"tier":"web"},"annotations":{"sidecar.hookwright.io/templates":"proxy,logging"}},"spec":{"containers":[{"name":"web","image":"nginx"}]}}}}`
	var out bytes.Buffer
	if err := InjectStream(cfg, testParams, strings.NewReader(deploy), &out, "default", func(string) {}); err != nil {
		t.Fatal(err)
	}
	var d struct {
		Spec struct {
			Template struct {
				Spec json.RawMessage `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(out.Bytes(), &d); err != nil {
		t.Fatal(err)
	}
	pod := `{"metadata":{"generateName":"web-7d9f8b6c5-","namespace":"prod","labels":{"tier":"web","pod-template-hash":"7d9f8b6c5"},` +
		`"annotations":{"sidecar.hookwright.io/templates":"proxy,logging"}},"spec":{"containers":[{"name":"web","image":"nginx"}]}}`
	res, err := Inject(cfg, testParams, Input{Raw: []byte(pod), Namespace: "prod", WantJSON: true})
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		Spec json.RawMessage `json:"spec"`
	}
	if err := json.Unmarshal(res.JSON, &p); err != nil {
		t.Fatal(err)
	}
	if !jsonEqual(t, d.Spec.Template.Spec, p.Spec) {
		t.Errorf("kube-inject and webhook differ:\n%s\n%s", d.Spec.Template.Spec, p.Spec)
	}
	for _, leak := range []string{"prod", "default", "web-7d9f8b6c5"} {
		if strings.Contains(string(p.Spec), leak) {
			t.Errorf("spec depends on the pod's name or namespace (%q): %s", leak, p.Spec)
		}
	}
}

// TestInjectStreamErrorNamesDocument: a parse error says which document.
func TestInjectStreamErrorNamesDocument(t *testing.T) {
	cfg := sampleConfig(t)
	for in, want := range map[string]string{
		"kind: ConfigMap\n---\nkind: Pod\n---\na: [unclosed\n": "YAML document 3:",
		`{"kind":"ConfigMap"} {"kind": `:                       "JSON document 2:",
		"apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: a, image: a}]}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: q, annotations: {sidecar.hookwright.io/templates: nope}}\nspec: {containers: [{name: a, image: a}]}\n": `YAML document 2: `,
	} {
		err := InjectStream(cfg, testParams, strings.NewReader(in), &bytes.Buffer{}, "default", func(string) {})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
	if _, err := ReadObjects(strings.NewReader("kind: A\n---\nkind: B\n---\n: :\n  - ]")); err == nil || !strings.Contains(err.Error(), "document 3:") {
		t.Errorf("ReadObjects: %v", err)
	}
}

// TestDecodeNotASidecarInjector: a Pod given as the config is named as one.
func TestDecodeNotASidecarInjector(t *testing.T) {
	_, err := DecodeSidecarInjector([]byte("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: a, image: a}]\n"))
	if err == nil || !strings.Contains(err.Error(), `not a SidecarInjector: got apiVersion "v1" kind "Pod"`) || strings.Contains(err.Error(), "unknown field") {
		t.Errorf("%v", err)
	}
	// A real SidecarInjector with a typo still gets the strict error.
	_, err = DecodeSidecarInjector([]byte("apiVersion: admission.hookwright.io/v1alpha1\nkind: SidecarInjector\nmetadata: {name: s}\nspec: {polcy: Enabled}\n"))
	if err == nil || !strings.Contains(err.Error(), `unknown field "polcy"`) {
		t.Errorf("%v", err)
	}
}
