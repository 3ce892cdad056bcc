package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

const twoContexts = `apiVersion: v1
kind: Config
clusters:
- name: one
  cluster: {server: "https://one.example:6443"}
- name: two
  cluster: {server: "https://two.example:6443"}
users:
- name: u
  user: {token: t}
contexts:
- name: one
  context: {cluster: one, user: u}
- name: two
  context: {cluster: two, user: u}
current-context: one
`

// TestRestConfigFlags: --kubeconfig and --context pick the cluster, and with
// no configuration at all the error names both ways out.
func TestRestConfigFlags(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("HOME", dir)
	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")

	_, err := (&injectorSource{}).restConfig()
	if err == nil || !strings.Contains(err.Error(), "--config FILE") || !strings.Contains(err.Error(), "--kubeconfig") || strings.Contains(err.Error(), "KUBERNETES_MASTER") {
		t.Errorf("no config: %v", err)
	}

	kc := filepath.Join(dir, "kc.yaml")
	if err := os.WriteFile(kc, []byte(twoContexts), 0o600); err != nil {
		t.Fatal(err)
	}
	for ctx, want := range map[string]string{"": "https://one.example:6443", "two": "https://two.example:6443"} {
		cfg, err := (&injectorSource{cluster: clusterAt(kc, ctx)}).restConfig()
		if err != nil || cfg.Host != want {
			t.Errorf("context %q: %v %v, want host %s", ctx, cfg, err, want)
		}
	}
	if _, err := (&injectorSource{cluster: clusterAt(kc, "three")}).restConfig(); err == nil || !strings.Contains(err.Error(), "three") {
		t.Errorf("unknown context: %v", err)
	}
	if _, err := (&injectorSource{cluster: clusterAt(filepath.Join(dir, "missing"), "")}).restConfig(); err == nil {
		t.Error("missing kubeconfig accepted")
	}
	// $KUBECONFIG still works without the flag.
	t.Setenv("KUBECONFIG", kc)
	if cfg, err := (&injectorSource{}).restConfig(); err != nil || cfg.Host != "https://one.example:6443" {
		t.Errorf("KUBECONFIG: %v %v", cfg, err)
	}
	// Both commands take the flags.
	for _, c := range []func() *cobra.Command{newKubeInjectCommand, newCheckInjectCommand} {
		cmd := c()
		if cmd.Flags().Lookup("kubeconfig") == nil || cmd.Flags().Lookup("context") == nil {
			t.Errorf("%s lacks --kubeconfig/--context", cmd.Name())
		}
	}
}

// TestLoadServesThePinnedRevision: kube-inject and check-inject compile
// what the servers serve: with spec.revision pinned and resolved in
// status.pinned, the pinned values, not the spec's.
func TestLoadServesThePinnedRevision(t *testing.T) {
	si := sampleInjector(t)
	old := withValues(t, si, "proxy:1.4.2", "proxy:1.4.1")
	si.Spec.Revision = "sidecar-injector-1"
	si.Status.Pinned = &v1alpha1.PinnedRevision{Revision: si.Spec.Revision, Templates: old.Spec.Templates,
		DefaultTemplates: old.Spec.DefaultTemplates, Values: old.Spec.Values}
	src := &injectorSource{client: fakeCluster(t, si), injector: si.Name, kubeVersion: "v1.33.0", operatorNamespace: "hookwright-system"}
	cfgs, _, params, err := src.load(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(livePod("lab", "web"))
	res, err := sidecar.Inject(cfgs[0], params, sidecar.Input{Raw: raw, WantJSON: true})
	if err != nil || !res.Injected {
		t.Fatalf("inject: %v %+v", err, res)
	}
	if !strings.Contains(string(res.JSON), "proxy:1.4.1") || strings.Contains(string(res.JSON), "proxy:1.4.2") {
		t.Errorf("injected the spec, not the pinned revision:\n%s", res.JSON)
	}
}
