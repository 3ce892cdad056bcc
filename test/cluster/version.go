package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
)

// KubeVersionEnv selects the kube-apiserver New starts: empty runs the
// current one (bin/k8s, Kubernetes v1.37); a minor such as "1.33" runs
// bin/k8s-1.33/kube-apiserver, built by `hack/tools.sh kube-apiserver-1.33`
// (make test-compat, docs/versions.md). etcd, kubectl, kube-controller-manager,
// kube-scheduler, kwok and the real node's kubelet stay the current ones: etcd
// v3.6 serves the v3.5 client of older API servers, and the components newer
// than the API server are outside the version skew policy, which the
// compat suites accept to test the API server alone.
const KubeVersionEnv = "HOOKWRIGHT_KUBE_VERSION"

// CurrentMinor is the minor of bin/k8s (hack/tools.sh K8S_VERSION).
const CurrentMinor = 37

var minorRE = regexp.MustCompile(`^1\.([0-9]+)$`)

// kubeAPIServerPath is the kube-apiserver binary KubeVersionEnv selects
// under bin ("" for the current one) and its minor.
func kubeAPIServerPath(bin string) (path string, minor int, err error) {
	v := os.Getenv(KubeVersionEnv)
	if v == "" {
		return "", CurrentMinor, nil
	}
	m := minorRE.FindStringSubmatch(v)
	if m == nil {
		return "", 0, fmt.Errorf("%s=%q: want a Kubernetes minor such as 1.33", KubeVersionEnv, v)
	}
	minor, _ = strconv.Atoi(m[1])
	path = filepath.Join(bin, "k8s-"+v, "kube-apiserver")
	if _, err := os.Stat(path); err != nil {
		return "", 0, fmt.Errorf("%s=%s: %s not built: run hack/tools.sh kube-apiserver-%s: %w", KubeVersionEnv, v, path, v, err)
	}
	return path, minor, nil
}

// KubeMinor is the minor version of the API server the cluster runs
// (37 for v1.37.2), as chosen by KubeVersionEnv.
func (c *Cluster) KubeMinor() int { return c.minor }

// MinorAtLeast reports whether the API server is Kubernetes 1.m or newer.
// Tests of a feature that an older server lacks assert the fallback there
// (never skip silently).
func (c *Cluster) MinorAtLeast(m int) bool { return c.minor >= m }
