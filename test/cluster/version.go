package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// KubeVersionEnv selects the control plane New starts: empty runs the
// current one (bin/k8s, Kubernetes v1.37); a minor such as "1.33" runs
// kube-apiserver, kube-controller-manager and kube-scheduler from
// bin/k8s-1.33, built by `hack/tools.sh compat` (make test-compat,
// docs/versions.md). etcd, kubectl, kwok and the real node's kubelet and
// kube-proxy stay the current ones: etcd v3.6 serves the v3.5 client of
// older API servers, and a kubelet newer than its API server is outside
// the version skew policy, which these API-server-level suites accept.
const KubeVersionEnv = "HOOKWRIGHT_KUBE_VERSION"

// CurrentMinor is the minor of bin/k8s (hack/tools.sh K8S_VERSION).
const CurrentMinor = 37

var minorRE = regexp.MustCompile(`^1\.([0-9]+)$`)

// controlPlaneDir is the directory under bin that KubeVersionEnv selects
// for kube-apiserver, kube-controller-manager and kube-scheduler ("" for
// the current bin/k8s) and its minor. The API server must be built there;
// the other two are checked when started.
func controlPlaneDir(bin string) (dir string, minor int, err error) {
	v := os.Getenv(KubeVersionEnv)
	if v == "" {
		return "", CurrentMinor, nil
	}
	m := minorRE.FindStringSubmatch(v)
	if m == nil {
		return "", 0, fmt.Errorf("%s=%q: want a Kubernetes minor such as 1.33", KubeVersionEnv, v)
	}
	minor, _ = strconv.Atoi(m[1])
	dir = filepath.Join(bin, "k8s-"+v)
	if err := builtIn(dir, "kube-apiserver"); err != nil {
		return "", 0, err
	}
	return dir, minor, nil
}

// builtIn checks that dir (a KubeVersionEnv directory) holds name.
func builtIn(dir, name string) error {
	if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
		m := strings.TrimPrefix(filepath.Base(dir), "k8s-")
		return fmt.Errorf("%s=%s: %s not built: run hack/tools.sh %s-%s (or hack/tools.sh compat): %w", KubeVersionEnv, m, filepath.Join(dir, name), name, m, err)
	}
	return nil
}

// componentPath is the binary of a control-plane component (kube-apiserver,
// kube-controller-manager, kube-scheduler) for the chosen minor.
func (c *Cluster) componentPath(name string) (string, error) {
	if c.cpDir == "" {
		return filepath.Join(c.Bin, "k8s", name), nil
	}
	return filepath.Join(c.cpDir, name), builtIn(c.cpDir, name)
}

// KubeMinor is the minor version of the API server the cluster runs
// (37 for v1.37.2), as chosen by KubeVersionEnv.
func (c *Cluster) KubeMinor() int { return c.minor }

// MinorAtLeast reports whether the API server is Kubernetes 1.m or newer.
// Tests of a feature that an older server lacks assert the fallback there
// (never skip silently).
func (c *Cluster) MinorAtLeast(m int) bool { return c.minor >= m }
