package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

func sampleInjector(t *testing.T) *v1alpha1.SidecarInjector {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "config", "samples", "admission_v1alpha1_sidecarinjector.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cr, err := sidecar.DecodeSidecarInjector(b)
	if err != nil {
		t.Fatal(err)
	}
	return cr
}

// TestCheckInjectBrokenInjector: without --injector, an injector that does
// not compile gets its own error line, the others are still checked, and the
// command fails at the end because the check is incomplete.
func TestCheckInjectBrokenInjector(t *testing.T) {
	good := sampleInjector(t)
	bad := good.DeepCopy()
	bad.Name = "broken"
	bad.Spec.Templates[0].Template = "{{ .Nope"
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(bad, good).Build()

	pod := filepath.Join(t.TempDir(), "pod.yaml")
	if err := os.WriteFile(pod, []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  containers: [{name: a, image: a}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := checkInjectCommand(&injectorSource{client: c, kubeVersion: "v1.33.0"})
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"-f", pod, "-n", "shop"})
	err := cmd.Execute()
	if err == nil || !strings.Contains(err.Error(), "1 of 2 SidecarInjectors not checked") {
		t.Errorf("err %v", err)
	}
	got := out.String()
	for _, want := range []string{
		"SidecarInjector broken: template \"proxy\"",
		"not checked: it does not compile",
		"sidecar-injector: would inject",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}

// TestCheckInjectSpared: check-inject names the spared set as the deciding
// rule: a critical pod, a mirror pod and a pod in a namespace of
// --excluded-namespaces are not injected, and why.
func TestCheckInjectSpared(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "cr.yaml")
	b, err := os.ReadFile(filepath.Join("..", "config", "samples", "admission_v1alpha1_sidecarinjector.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, b, 0o600); err != nil {
		t.Fatal(err)
	}
	pods := filepath.Join(t.TempDir(), "pods.yaml")
	if err := os.WriteFile(pods, []byte(`apiVersion: v1
kind: Pod
metadata: {name: cni}
spec: {priorityClassName: system-node-critical, containers: [{name: a, image: a}]}
---
apiVersion: v1
kind: Pod
metadata: {name: static, annotations: {kubernetes.io/config.mirror: "0a1b"}}
spec: {containers: [{name: a, image: a}]}
---
apiVersion: v1
kind: Pod
metadata: {name: csi, namespace: csi-system}
spec: {containers: [{name: a, image: a}]}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := checkInjectCommand(&injectorSource{})
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"-f", pods, "-n", "shop", "--config", cfg, "--excluded-namespaces", "csi-system"})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := out.String()
	for _, want := range []string{
		"spared: system-node-critical",
		"spared: mirror pod (annotation kubernetes.io/config.mirror)",
		"spared: namespace csi-system excluded installation-wide",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "would inject") {
		t.Errorf("a spared pod would be injected:\n%s", got)
	}
}
