package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// TestStatusWhatIf: a new proxy image would leave two injected pods
// outdated, fixable in place; the bare pod stays missing (by restart); a
// new init image makes every one a restart. Nothing is written.
func TestStatusWhatIf(t *testing.T) {
	si := sampleInjector(t)
	lab := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "lab", Labels: map[string]string{"sidecar-injection": "enabled"}}}
	shop := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{"sidecar-injection": "enabled"}}}
	c := fakeCluster(t, si, lab, shop, injectedBy(t, si, livePod("lab", "web-1")), injectedBy(t, si, livePod("shop", "web-1")),
		livePod("lab", "web-bare"))
	write := func(cr *v1alpha1.SidecarInjector) string {
		cr.TypeMeta = metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "SidecarInjector"}
		b, err := sigsyaml.Marshal(cr)
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(t.TempDir(), "cr.yaml")
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	run := func(args ...string) (string, error) {
		cmd := statusCommand(&injectorSource{client: c, kubeVersion: "v1.33.0"})
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(args)
		err := cmd.Execute()
		return out.String(), err
	}
	image := write(withValues(t, si, "proxy:1.4.2", "proxy:1.5.0"))
	got, err := run("--what-if", "-f", image)
	if err != nil {
		t.Fatalf("%v\n%s", err, got)
	}
	for _, want := range []string{
		"SidecarInjector sidecar-injector: revision ",
		"3 counted pods, 3 would not be current (2 of them current or not counted today): 2 in place, 1 by restart",
		"Current -> Outdated  2",
		"lab        2       1    1         1",
		"shop       1       1    1         0",
		"example: pod lab/web-1, Outdated",
		"initContainers/proxy changed: image ghcr.io/hookwright/proxy:1.4.2 -> ghcr.io/hookwright/proxy:1.5.0",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	both := write(withValues(t, withValues(t, si, "proxy:1.4.2", "proxy:1.5.0"), "proxy-init:1.4.2", "proxy-init:1.5.0"))
	out, err := run("--what-if", "-f", both, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var rep whatIfReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if rep.Name != "sidecar-injector" || rep.Change != 3 || rep.InPlace != 0 || rep.Restart != 3 || len(rep.Namespaces) != 2 || rep.Example == nil {
		t.Errorf("json %+v", rep)
	}
	if y, err := run("--what-if", "-f", image, "-o", "yaml"); err != nil || !strings.Contains(y, "inPlace: 2") {
		t.Errorf("yaml %v:\n%s", err, y)
	}
	if _, err := run("--what-if"); err == nil || !strings.Contains(err.Error(), "go together") {
		t.Errorf("--what-if without -f: %v", err)
	}
	// Nothing written: the CR in the cluster is unchanged.
	live := &v1alpha1.SidecarInjector{}
	if err := c.Get(t.Context(), client.ObjectKey{Name: "sidecar-injector"}, live); err != nil || string(live.Spec.Values.Raw) != string(si.Spec.Values.Raw) {
		t.Errorf("cluster CR changed: %v", err)
	}
}
