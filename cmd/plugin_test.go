package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hookwright/hookwright/internal/version"
	"github.com/hookwright/hookwright/test/cluster"
)

// TestKubectlPlugin: the real kubectl finds this binary as its plugin
// kubectl-hookwright on PATH (the test binary, linked under that name,
// runs main), passes it the arguments, and completes its commands
// through kubectl_complete-hookwright as make kubectl-plugin installs it.
// It needs bin/k8s/kubectl, not a control plane.
func TestKubectlPlugin(t *testing.T) {
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	kubectl := filepath.Join(root, "bin", "k8s", "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		if os.Getenv(cluster.NoControlPlaneEnv) != "" {
			// make test-unit does not build the tools; make test does.
			t.Skipf("%v (make tools builds it)", err)
		}
		t.Fatalf("%v (make tools builds it)", err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Symlink(self, filepath.Join(dir, "kubectl-hookwright")); err != nil {
		t.Fatal(err)
	}
	// What the Makefile's kubectl-plugin target writes.
	helper := "#!/bin/sh\nexec kubectl-hookwright __complete \"$@\"\n"
	if err := os.WriteFile(filepath.Join(dir, "kubectl_complete-hookwright"), []byte(helper), 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(kubectl, args...)
		cmd.Env = append(os.Environ(), "PATH="+dir, "HOME="+t.TempDir(), "KUBECONFIG=")
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			t.Fatalf("kubectl %v: %v\n%s%s", args, err, out.String(), errOut.String())
		}
		return out.String()
	}
	if got := run("plugin", "list"); !strings.Contains(got, filepath.Join(dir, "kubectl-hookwright")) {
		t.Errorf("kubectl plugin list:\n%s", got)
	}
	if got := run("hookwright", "version"); got != version.String()+"\n" {
		t.Errorf("kubectl hookwright version: %q, want %q", got, version.String()+"\n")
	}
	if got := run("hookwright", "check", "--help"); !strings.Contains(got, "kubectl hookwright check [--pre] [flags]") ||
		!strings.Contains(got, "--as string") || !strings.Contains(got, "--context string") {
		t.Errorf("kubectl hookwright check --help:\n%s", got)
	}
	got := run("__complete", "hookwright", "che")
	for _, w := range []string{"check\t", "check-inject\t"} {
		if !strings.Contains(got, w) {
			t.Errorf("kubectl __complete hookwright che lacks %q:\n%s", w, got)
		}
	}
}
