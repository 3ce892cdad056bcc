package sidecar

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"gomodules.xyz/jsonpatch/v2"
	"sigs.k8s.io/yaml"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

func goldenPodJSON(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(goldenDir, name))
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func patchOps(t *testing.T, p []byte) []jsonpatch.Operation {
	t.Helper()
	var ops []jsonpatch.Operation
	if err := json.Unmarshal(p, &ops); err != nil {
		t.Fatal(err)
	}
	return ops
}

// TestPatchLeavesForeignContainers: the patch only adds; the other
// webhook's init container and the pod's own entries are never rewritten.
func TestPatchLeavesForeignContainers(t *testing.T) {
	cfg := sampleConfig(t)
	res, err := Inject(cfg, testParams, Input{Raw: goldenPodJSON(t, "pod-foreign-init.yaml"), Namespace: "payments", WantPatch: true})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{
		"/spec/initContainers/0": true, "/spec/initContainers/1": true, "/spec/volumes/1": true,
		"/metadata/annotations/prometheus.io~1path": true, "/metadata/annotations/prometheus.io~1port": true,
		"/metadata/annotations/prometheus.io~1scrape": true, "/metadata/annotations/sidecar.hookwright.io~1status": true,
		"/metadata/labels/sidecar.hookwright.io~1revision": true,
	}
	ops := patchOps(t, res.Patch)
	for _, op := range ops {
		if op.Operation != "add" || !want[op.Path] {
			t.Errorf("unexpected op %s %s", op.Operation, op.Path)
		}
	}
	if len(ops) != len(want) {
		t.Errorf("%d ops, want %d: %s", len(ops), len(want), res.Patch)
	}
}

func TestManagedFieldsStripped(t *testing.T) {
	cfg := sampleConfig(t)
	pod := `{"metadata":{"name":"m","managedFields":[{"manager":"kubectl","operation":"Update"}]},"spec":{"containers":[{"name":"a","image":"a"}]}}`
	res, err := Inject(cfg, testParams, Input{Raw: []byte(pod), Namespace: "shop", WantPatch: true, WantJSON: true})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(res.Patch), "managedFields") {
		t.Errorf("patch touches managedFields: %s", res.Patch)
	}
	if strings.Contains(string(res.JSON), "managedFields") {
		t.Errorf("injected pod keeps managedFields")
	}
	// Applying the patch to the original keeps its managedFields.
	out := applyPatch(t, []byte(pod), res.Patch)
	if !strings.Contains(string(out), `"manager":"kubectl"`) {
		t.Errorf("patch removed managedFields: %s", out)
	}
}

// TestOverlayAndTemplateMerge: a later template's same-named container is
// merged onto the earlier one; the pod's init container of an injected name
// wins field by field and stays in place; pod labels and annotations win.
func TestOverlayAndTemplateMerge(t *testing.T) {
	cr := sampleCR(t)
	cr.Spec.Templates = append(cr.Spec.Templates, v1alpha1.NamedTemplate{Name: "debug", Template: `metadata:
  labels:
    tier: injected
  annotations:
    prometheus.io/scrape: "false"
spec:
  containers:
  - name: proxy
    args: ["run", "--debug"]
    env:
    - name: DEBUG
      value: "1"
  dnsPolicy: None
  dnsConfig:
    nameservers: ["10.0.0.10"]
`})
	cfg, err := Compile(cr)
	if err != nil {
		t.Fatal(err)
	}
	pod := `{"metadata":{"name":"o","labels":{"tier":"web"},"annotations":{"sidecar.hookwright.io/templates":"proxy,debug","sidecar.hookwright.io/native-sidecar":"off"}},
	"spec":{"initContainers":[{"name":"proxy-init","image":"my-init","args":["custom"]}],"containers":[{"name":"a","image":"a"}]}}`
	res, err := Inject(cfg, testParams, Input{Raw: []byte(pod), Namespace: "shop", WantJSON: true, WantPatch: true})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Metadata struct{ Labels, Annotations map[string]string }
		Spec     struct {
			DNSPolicy      string `json:"dnsPolicy"`
			InitContainers []struct {
				Name, Image string
				Args        []string
				Resources   map[string]any
			}
			Containers []struct {
				Name string
				Args []string
				Env  []struct{ Name, Value string }
			}
		}
	}
	if err := json.Unmarshal(res.JSON, &got); err != nil {
		t.Fatal(err)
	}
	if got.Metadata.Labels["tier"] != "web" || got.Metadata.Annotations["prometheus.io/scrape"] != "false" {
		t.Errorf("metadata: %+v", got.Metadata)
	}
	if got.Spec.DNSPolicy != "None" {
		t.Errorf("spec field from template not merged: %q", got.Spec.DNSPolicy)
	}
	ic := got.Spec.InitContainers
	if len(ic) != 1 || ic[0].Image != "my-init" || fmt.Sprint(ic[0].Args) != "[custom]" || ic[0].Resources == nil {
		t.Errorf("init container overlay: %+v", ic)
	}
	c := got.Spec.Containers
	if len(c) != 2 || c[1].Name != "proxy" || fmt.Sprint(c[1].Args) != "[run --debug]" {
		t.Fatalf("containers: %+v", c)
	}
	names := []string{}
	for _, e := range c[1].Env {
		names = append(names, e.Name)
	}
	if !strings.Contains(strings.Join(names, ","), "DEBUG") || !strings.Contains(strings.Join(names, ","), "SERVICE_NAME") {
		t.Errorf("env not merged across templates: %v", names)
	}
	if !jsonEqual(t, applyPatch(t, []byte(pod), res.Patch), res.JSON) {
		t.Error("patch does not reproduce the injected pod")
	}
	if res.Status.InitContainers[0] != "proxy-init" || res.Status.Containers[0] != "proxy" {
		t.Errorf("status %+v", res.Status)
	}
}

// TestHotSwapUnderLoad: requests keep being served while configs swap
// (run with -race).
func TestHotSwapUnderLoad(t *testing.T) {
	h := newTestHandler(t, sampleConfig(t))
	body := reviewFor(t, []byte(nginxPod), "shop", false)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				rec := serve(h, body, "application/json")
				if rec.Code != 200 {
					t.Errorf("status %d", rec.Code)
					return
				}
			}
		}()
	}
	for g := int64(2); g < 30; g++ {
		cr := sampleCR(t)
		cr.Generation = g
		if _, err := h.Store.update(cr); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if h.Store.Load().Generation != 29 {
		t.Errorf("serving %d", h.Store.Load().Generation)
	}
}

// TestInitContainerOverride: a pod that declares the sidecar as its own init
// container gets a pod the API server accepts: with native sidecars the
// merged container stays restartPolicy Always (so the template's probes are
// legal); when it is not Always (sidecars not native, or the pod chose
// another restartPolicy) the template's probes and lifecycle are left out
// with a warning.
func TestInitContainerOverride(t *testing.T) {
	cfg := sampleConfig(t)
	cases := []struct {
		name, native, podRP string
		wantRP              any
		wantProbes          bool
	}{
		{"native", "true", "", "Always", true},
		{"native, pod sets OnFailure", "true", `,"restartPolicy":"OnFailure"`, "OnFailure", false},
		{"not native", "false", "", nil, false},
		{"not native, pod sets Always", "false", `,"restartPolicy":"Always"`, "Always", true},
	}
	for _, c := range cases {
		pod := `{"metadata":{"name":"p","annotations":{"sidecar.hookwright.io/native-sidecar":"` + c.native + `"}},` +
			`"spec":{"initContainers":[{"name":"proxy","image":"x"` + c.podRP + `}],"containers":[{"name":"a","image":"a"}]}}`
		res, err := Inject(cfg, testParams, Input{Raw: []byte(pod), Namespace: "shop", WantJSON: true})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var out struct {
			Spec struct {
				InitContainers []map[string]any `json:"initContainers"`
			} `json:"spec"`
		}
		if err := json.Unmarshal(res.JSON, &out); err != nil {
			t.Fatal(err)
		}
		var proxy map[string]any
		for _, ic := range out.Spec.InitContainers {
			if ic["name"] == "proxy" {
				proxy = ic
			}
		}
		if proxy == nil || proxy["image"] != "x" || proxy["restartPolicy"] != c.wantRP {
			t.Errorf("%s: proxy %v, want image x and restartPolicy %v", c.name, proxy, c.wantRP)
			continue
		}
		_, hasReady := proxy["readinessProbe"]
		if hasReady != c.wantProbes {
			t.Errorf("%s: readinessProbe present %t, want %t", c.name, hasReady, c.wantProbes)
		}
		if _, hasStartup := proxy["startupProbe"]; hasStartup && !c.wantProbes {
			t.Errorf("%s: startupProbe kept on a non-sidecar init container", c.name)
		}
		warned := slices.ContainsFunc(res.Warnings, func(w string) bool { return strings.Contains(w, `init container "proxy" is not a native sidecar`) })
		if warned == c.wantProbes {
			t.Errorf("%s: warnings %q", c.name, res.Warnings)
		}
	}
	// A pod's own probe on such an init container is the pod's choice: kept.
	pod := `{"metadata":{"name":"p","annotations":{"sidecar.hookwright.io/native-sidecar":"false"}},"spec":{"initContainers":[{"name":"proxy","image":"x","readinessProbe":{"exec":{"command":["true"]}}}],"containers":[{"name":"a","image":"a"}]}}`
	res, err := Inject(cfg, testParams, Input{Raw: []byte(pod), Namespace: "shop", WantJSON: true})
	if err != nil || !strings.Contains(string(res.JSON), `"readinessProbe":{"exec"`) {
		t.Fatalf("pod probe lost: %v %s", err, res.JSON)
	}
}

// TestContainerOverrideNoRestartPolicy: a template native init sidecar
// overridden by a regular pod container does not put restartPolicy on it.
func TestContainerOverrideNoRestartPolicy(t *testing.T) {
	cr := sampleCR(t)
	cr.Spec.Templates = append(cr.Spec.Templates, v1alpha1.NamedTemplate{Name: "agent",
		Template: "spec:\n  initContainers:\n  - name: agent\n    image: agent\n    restartPolicy: Always\n"})
	cfg, err := Compile(cr)
	if err != nil {
		t.Fatal(err)
	}
	pod := `{"metadata":{"name":"p","annotations":{"sidecar.hookwright.io/templates":"agent"}},"spec":{"containers":[{"name":"agent","image":"mine"}]}}`
	res, err := Inject(cfg, testParams, Input{Raw: []byte(pod), Namespace: "shop", WantJSON: true})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(res.JSON), "restartPolicy") || !strings.Contains(string(res.JSON), `"image":"mine"`) {
		t.Fatalf("%s", res.JSON)
	}
}

// TestForDecisionsCannotRender: a decisions-only config (the fleet's)
// refuses to render instead of injecting nothing; the full one it came
// from still renders, and keeps its templates.
func TestForDecisionsCannotRender(t *testing.T) {
	cfg := sampleConfig(t)
	pod := goldenPodJSON(t, "pod-foreign-init.yaml")
	d := cfg.ForDecisions()
	if d.Hash != cfg.Hash || d.Name != cfg.Name {
		t.Errorf("ForDecisions: hash %q name %q, want %q %q", d.Hash, d.Name, cfg.Hash, cfg.Name)
	}
	if _, err := Inject(d, testParams, Input{Raw: pod}); !errors.Is(err, ErrDecisionsOnly) {
		t.Fatalf("Inject on ForDecisions: %v, want ErrDecisionsOnly", err)
	}
	res, err := Inject(cfg, testParams, Input{Raw: pod, Namespace: "payments"})
	if err != nil || len(res.Templates) == 0 {
		t.Fatalf("Inject on the full config after ForDecisions: %v, templates %v", err, res)
	}
}
