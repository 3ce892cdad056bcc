package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// KubeVersionEnv: unset is the current minor; a minor whose binary is
// built is its path; anything else is a clear error naming the fix.
func TestKubeAPIServerPath(t *testing.T) {
	bin := t.TempDir()
	if err := os.MkdirAll(filepath.Join(bin, "k8s-1.33"), 0o755); err != nil {
		t.Fatal(err)
	}
	built := filepath.Join(bin, "k8s-1.33", "kube-apiserver")
	if err := os.WriteFile(built, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		env, path string
		minor     int
		err       string
	}{
		{"", "", CurrentMinor, ""},
		{"1.33", built, 33, ""},
		{"1.35", "", 0, "run hack/tools.sh kube-apiserver-1.35"},
		{"v1.33", "", 0, "want a Kubernetes minor such as 1.33"},
		{"1.33.1", "", 0, "want a Kubernetes minor such as 1.33"},
		{"../k8s", "", 0, "want a Kubernetes minor such as 1.33"},
	}
	for _, c := range cases {
		t.Setenv(KubeVersionEnv, c.env)
		path, minor, err := kubeAPIServerPath(bin)
		if path != c.path || minor != c.minor || (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%s=%q: %q %d %v, want %q %d %q", KubeVersionEnv, c.env, path, minor, err, c.path, c.minor, c.err)
		}
	}
}
