package demoenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// Render then Parse gives the variables back; bash sourcing the file sets
// the same values and puts the dirs in front of PATH.
func TestRenderParse(t *testing.T) {
	vars := map[string]string{Kubeconfig: "/d/_demo/kubeconfig", SSLCertFile: "/d/_demo/registry/trust.pem", ImageRegistry: "127.0.0.1:40001"}
	b, err := Render(vars, "/d/bin", "/d/bin/k8s")
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, vars) {
		t.Errorf("Parse(Render) = %v, want %v", got, vars)
	}
	p := filepath.Join(t.TempDir(), FileName)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("bash", "-c", `. "$1" && echo "$KUBECONFIG|$SSL_CERT_FILE|$IMAGE_REGISTRY|${PATH%%:*}"`, "bash", p).Output()
	if err != nil {
		t.Fatal(err)
	}
	if s := strings.TrimSpace(string(out)); s != "/d/_demo/kubeconfig|/d/_demo/registry/trust.pem|127.0.0.1:40001|/d/bin" {
		t.Errorf("sourced: %q", s)
	}
}

func TestBadInput(t *testing.T) {
	if _, err := Render(map[string]string{Kubeconfig: "it's"}); err == nil {
		t.Error("Render accepted a quote")
	}
	for _, bad := range []string{"KUBECONFIG=/x", "export KUBECONFIG=/x", "export KUBECONFIG='/x", "export K='a'b'"} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}
