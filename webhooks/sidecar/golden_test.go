package sidecar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	"sigs.k8s.io/yaml"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

const goldenDir = "testdata/inject"

// TestGolden runs every testdata/inject/X.yaml through kube-inject and
// compares with X.yaml.injected (REFRESH_GOLDEN=1 rewrites them), checks that
// a second kube-inject pass is byte-identical, and that the webhook's patch
// applied to each input pod gives the kube-inject pod, and is empty for the
// injected pod.
func TestGolden(t *testing.T) { runGolden(t, sampleConfig(t), goldenDir) }

// TestGoldenPlacement is TestGolden for initContainerPlacement, with the
// SidecarInjector of testdata/placement/injector.yaml: templates placed
// First, After the pod's own agent, and by default, with native sidecars
// and without, with the named init container present and absent. Each
// X.yaml.warnings holds the warnings kube-inject gave (the webhook returns
// the same as admission warnings).
func TestGoldenPlacement(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(placementDir, "injector.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cr, err := DecodeSidecarInjector(b)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Compile(cr)
	if err != nil {
		t.Fatal(err)
	}
	runGolden(t, cfg, placementDir)
}

const placementDir = "testdata/placement"

func runGolden(t *testing.T, cfg *Config, dir string) {
	inputs, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no inputs: %v", err)
	}
	refresh := os.Getenv("REFRESH_GOLDEN") != ""
	for _, in := range inputs {
		if filepath.Base(in) == "injector.yaml" {
			continue
		}
		t.Run(filepath.Base(in), func(t *testing.T) {
			src, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			got, warnings := kubeInject(t, cfg, src)
			golden := in + ".injected"
			if refresh {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("missing golden (run with REFRESH_GOLDEN=1): %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("kube-inject output differs from %s (REFRESH_GOLDEN=1 to accept):\n%s", golden, lineDiff(string(want), string(got)))
			}
			t.Logf("warnings: %q", warnings)
			if wf := in + ".warnings"; dir == placementDir {
				gotW := []byte(strings.Join(warnings, "\n") + "\n")
				if refresh {
					if err := os.WriteFile(wf, gotW, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				wantW, err := os.ReadFile(wf)
				if err != nil {
					t.Fatalf("missing warnings golden (run with REFRESH_GOLDEN=1): %v", err)
				}
				if !bytes.Equal(gotW, wantW) {
					t.Errorf("warnings differ from %s:\n%s", wf, lineDiff(string(wantW), string(gotW)))
				}
			}

			again, _ := kubeInject(t, cfg, got)
			if !bytes.Equal(again, got) {
				t.Errorf("second kube-inject pass changed the output:\n%s", lineDiff(string(got), string(again)))
			}

			compareWebhook(t, cfg, src, got)
		})
	}
	t.Run("no stale goldens", func(t *testing.T) {
		goldens, _ := filepath.Glob(filepath.Join(dir, "*.injected"))
		warns, _ := filepath.Glob(filepath.Join(dir, "*.warnings"))
		for _, g := range append(goldens, warns...) {
			if _, err := os.Stat(strings.TrimSuffix(strings.TrimSuffix(g, ".injected"), ".warnings")); err != nil {
				t.Errorf("stale golden %s has no input", g)
			}
		}
	})
}

func kubeInject(t *testing.T, cfg *Config, src []byte) ([]byte, []string) {
	t.Helper()
	var out bytes.Buffer
	var warnings []string
	if err := InjectStream(cfg, testParams, bytes.NewReader(src), &out, "default", func(s string) { warnings = append(warnings, s) }); err != nil {
		t.Fatal(err)
	}
	return out.Bytes(), warnings
}

// podsOf lists the pods and pod templates of a multi-document YAML stream.
func podsOf(t *testing.T, src []byte) []PodSite {
	t.Helper()
	var sites []PodSite
	for _, doc := range strings.Split(string(src), "\n---\n") {
		j, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(j, []byte("{")) {
			continue
		}
		obj, err := decodeMap(j)
		if err != nil {
			t.Fatal(err)
		}
		sites = append(sites, FindPods(obj, "default")...)
	}
	return sites
}

func compareWebhook(t *testing.T, cfg *Config, src, injected []byte) {
	t.Helper()
	h := newTestHandler(t, cfg)
	in, out := podsOf(t, src), podsOf(t, injected)
	if len(in) != len(out) {
		t.Fatalf("%d pods in input, %d in output", len(in), len(out))
	}
	for i := range in {
		podJSON, _ := json.Marshal(in[i].Pod)
		resp := admit(t, h, podJSON, in[i].Namespace)
		if !resp.Allowed {
			t.Fatalf("%s denied: %v", in[i].Ref, resp.Result)
		}
		patched := podJSON
		if len(resp.Patch) > 0 {
			p, err := jsonpatch.DecodePatch(resp.Patch)
			if err != nil {
				t.Fatal(err)
			}
			if patched, err = p.Apply(podJSON); err != nil {
				t.Fatalf("%s: applying patch: %v", in[i].Ref, err)
			}
		}
		wantJSON, _ := json.Marshal(out[i].Pod)
		if !jsonEqual(t, patched, wantJSON) {
			t.Errorf("%s: webhook result differs from kube-inject:\n%s", in[i].Ref, lineDiff(pretty(wantJSON), pretty(patched)))
		}
		// The injected pod passes the webhook again without a second sidecar.
		again := admit(t, h, patched, in[i].Namespace)
		if !again.Allowed || len(again.Patch) != 0 {
			t.Errorf("%s: re-admitting the injected pod gave patch %s", in[i].Ref, again.Patch)
		}
	}
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatal(err)
	}
	return reflect.DeepEqual(x, y)
}

func pretty(j []byte) string {
	y, _ := yaml.JSONToYAML(j)
	return string(y)
}

// lineDiff is a small line diff: enough to spot a golden mismatch.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	n := max(len(w), len(g))
	shown := 0
	for i := 0; i < n && shown < 40; i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			fmt.Fprintf(&b, "line %d:\n- %s\n+ %s\n", i+1, wl, gl)
			shown++
		}
	}
	return b.String()
}

// manyEnvPod is a pod whose only container has n env vars.
func manyEnvPod(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"many-env","namespace":"shop","labels":{"app":"many-env"}},"spec":{"containers":[{"name":"app","image":"registry.example.com/app:1","env":[`)
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"ENV_VAR_%05d","value":"value-of-environment-variable-%05d"}`, i, i)
	}
	b.WriteString(`]}]}}`)
	return []byte(b.String())
}

// TestManyEnvVars: a pod with 2,000 env vars goes through both paths, keeps
// every env var in order, and is idempotent.
func TestManyEnvVars(t *testing.T) {
	cfg := sampleConfig(t)
	pod := manyEnvPod(2000)
	y, err := yaml.JSONToYAML(pod)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := kubeInject(t, cfg, y)
	again, _ := kubeInject(t, cfg, got)
	if !bytes.Equal(got, again) {
		t.Fatal("second pass changed the output")
	}
	compareWebhook(t, cfg, y, got)
	var p struct {
		Spec struct {
			Containers []struct {
				Name string
				Env  []struct{ Name string }
			}
			InitContainers []struct{ Name string }
		}
		Metadata struct{ Annotations map[string]string }
	}
	if err := yaml.Unmarshal(got, &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Spec.Containers) != 1 || len(p.Spec.Containers[0].Env) != 2000 {
		t.Fatalf("containers %+v", len(p.Spec.Containers))
	}
	for i, e := range p.Spec.Containers[0].Env {
		if e.Name != fmt.Sprintf("ENV_VAR_%05d", i) {
			t.Fatalf("env[%d] = %s", i, e.Name)
		}
	}
	if len(p.Spec.InitContainers) != 2 || p.Spec.InitContainers[1].Name != "proxy" {
		t.Fatalf("initContainers %+v", p.Spec.InitContainers)
	}
	if p.Metadata.Annotations[v1alpha1.SidecarStatusKey] == "" {
		t.Fatal("no status annotation")
	}
}
