package sidecar

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// stripInjected removes everything but the app container from an injected
// pod, keeping the status annotation: a copied pod spec or an edited
// manifest.
func stripInjected(t *testing.T, pod []byte, app string) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(pod, &m); err != nil {
		t.Fatal(err)
	}
	spec := m["spec"].(map[string]any)
	delete(spec, "initContainers")
	delete(spec, "volumes")
	var keep []any
	for _, c := range spec["containers"].([]any) {
		if c.(map[string]any)["name"] == app {
			keep = append(keep, c)
		}
	}
	spec["containers"] = keep
	if _, ok := m["metadata"].(map[string]any)["annotations"].(map[string]any)[v1alpha1.SidecarStatusKey]; !ok {
		t.Fatal("no status annotation to keep")
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Webhook path: a pod whose status annotation names containers it lacks is
// injected again, then left alone.
func TestStaleStatusReinjectedByWebhook(t *testing.T) {
	h := newTestHandler(t, sampleConfig(t))
	first := admit(t, h, []byte(nginxPod), "shop")
	injected := applyPatch(t, []byte(nginxPod), first.Patch)
	copied := stripInjected(t, injected, "nginx")

	resp := admit(t, h, copied, "shop")
	if !resp.Allowed || len(resp.Patch) == 0 {
		t.Fatalf("stale status not re-injected: %+v", resp)
	}
	if len(resp.Warnings) == 0 || !strings.Contains(strings.Join(resp.Warnings, "\n"), "names containers the pod lacks (proxy-init,proxy): injecting again") {
		t.Errorf("warnings %q", resp.Warnings)
	}
	again := applyPatch(t, copied, resp.Patch)
	if !jsonEqual(t, again, injected) {
		t.Errorf("re-injected pod differs from the first injection:\n%s\n%s", again, injected)
	}
	if r := admit(t, h, again, "shop"); len(r.Patch) != 0 {
		t.Errorf("re-injected pod patched again: %s", r.Patch)
	}
	// A status whose containers are all present is still "already injected".
	if r := admit(t, h, injected, "shop"); len(r.Patch) != 0 {
		t.Errorf("injected pod patched again: %s", r.Patch)
	}
}

// kube-inject path: the same through InjectStream, whose second pass is
// byte-identical.
func TestStaleStatusReinjectedByKubeInject(t *testing.T) {
	cfg := sampleConfig(t)
	var out bytes.Buffer
	if err := InjectStream(cfg, testParams, strings.NewReader(nginxPod+"\n"), &out, "default", func(string) {}); err != nil {
		t.Fatal(err)
	}
	copied := stripInjected(t, out.Bytes(), "nginx")
	var warns []string
	var again bytes.Buffer
	if err := InjectStream(cfg, testParams, bytes.NewReader(copied), &again, "default", func(w string) { warns = append(warns, w) }); err != nil {
		t.Fatal(err)
	}
	if !jsonEqual(t, again.Bytes(), out.Bytes()) {
		t.Fatalf("stale status not re-injected:\n%s", again.String())
	}
	if !strings.Contains(strings.Join(warns, "\n"), "names containers the pod lacks") {
		t.Errorf("warnings %q", warns)
	}
	var third bytes.Buffer
	if err := InjectStream(cfg, testParams, bytes.NewReader(again.Bytes()), &third, "default", func(string) {}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(third.Bytes(), again.Bytes()) {
		t.Error("third pass changed the output")
	}
}

// BenchmarkAlreadyInjected is the reinvocation path (reinvocationPolicy
// IfNeeded): an injected pod comes back, and its status annotation is
// checked against its containers before it is skipped.
func BenchmarkAlreadyInjected(b *testing.B) {
	cfg := sampleConfig(b)
	first, err := Inject(cfg, testParams, Input{Raw: []byte(nginxPod), Namespace: "shop", WantJSON: true})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		res, err := Inject(cfg, testParams, Input{Raw: first.JSON, Namespace: "shop", WantPatch: true})
		if err != nil || res.Injected {
			b.Fatal(err, res.Injected)
		}
	}
}
