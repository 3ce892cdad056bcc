package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// KubeVersionEnv: unset is the current minor; a minor whose API server is
// built is its directory; anything else is a clear error naming the fix.
// A component missing there is named when started.
func TestControlPlaneDir(t *testing.T) {
	bin := t.TempDir()
	if err := os.MkdirAll(filepath.Join(bin, "k8s-1.33"), 0o755); err != nil {
		t.Fatal(err)
	}
	built := filepath.Join(bin, "k8s-1.33")
	if err := os.WriteFile(filepath.Join(built, "kube-apiserver"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		env, dir string
		minor    int
		err      string
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
		dir, minor, err := controlPlaneDir(bin)
		if dir != c.dir || minor != c.minor || (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%s=%q: %q %d %v, want %q %d %q", KubeVersionEnv, c.env, dir, minor, err, c.dir, c.minor, c.err)
		}
	}
	cl := &Cluster{Bin: bin, cpDir: built}
	if _, err := cl.componentPath("kube-scheduler"); err == nil || !strings.Contains(err.Error(), "run hack/tools.sh kube-scheduler-1.33") {
		t.Errorf("kube-scheduler missing in %s: %v", built, err)
	}
	cl.cpDir = ""
	if p, err := cl.componentPath("kube-scheduler"); err != nil || p != filepath.Join(bin, "k8s", "kube-scheduler") {
		t.Errorf("current kube-scheduler: %q %v", p, err)
	}
}
