package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/test/cluster"
)

// TestLiveAgainstAPIServer: pods stored by a real API server (which
// defaults fieldRef apiVersions, requests from limits, ports, pull policy)
// compare equal to what the engine renders except for what changed: an
// image change is InPlace, for check-inject --live and status --what-if.
// Then `hookwright check` on the same API server (checkAgainstAPIServer),
// which shares it to spare the suite a second control plane.
//
// It starts a control plane, so `make test-unit` skips it.
func TestLiveAgainstAPIServer(t *testing.T) {
	cluster.RequireControlPlane(t)
	ctx := context.Background()
	env, err := cluster.New(ctx, cluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Stopping removes the cluster with everything the test created.
	t.Cleanup(func() {
		if !env.StopChecked(os.Stderr) {
			t.Error("cluster left processes or files behind")
		}
	})
	c := env.Client
	si := sampleInjector(t)
	old := withValues(t, si, "proxy:1.4.2", "proxy:1.4.1")
	if err := c.Create(ctx, si.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	if _, err := env.CreateNamespace(ctx, "lab", map[string]string{"sidecar-injection": "enabled"}); err != nil {
		t.Fatal(err)
	}
	p := injectedBy(t, old, livePod("lab", "web"))
	p.ResourceVersion = ""
	if err := c.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := checkInjectCommand(&injectorSource{client: c})
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"--kube-version", "v1.33.0", "-n", "lab", "--live", "web"})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "change: InPlace") || strings.Count(out.String(), " changed: ") != 1 {
		t.Errorf("--live:\n%s", out.String())
	}

	next := withValues(t, si, "proxy:1.4.2", "proxy:1.5.0")
	next.TypeMeta = metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "SidecarInjector"}
	b, _ := sigsyaml.Marshal(next)
	f := filepath.Join(t.TempDir(), "cr.yaml")
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	cmd = statusCommand(&injectorSource{client: c, kubeVersion: "v1.33.0"})
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"--what-if", "-f", f})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "1 counted pods, 1 would not be current (0 of them current or not counted today): 1 in place, 0 by restart") {
		t.Errorf("--what-if:\n%s", out.String())
	}
	t.Run("check", func(t *testing.T) { checkAgainstAPIServer(t, env) })
}
