package node

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/hack/ociimage"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

var (
	operatorImageOnce sync.Once
	operatorImageErr  error
	// operatorImage is the image pushed as serverImage.
	operatorImage v1.Image
)

// serverImage is the operator's server image in these tests: the
// operator image pushed to the test's registry, which the node's
// containerd pulls from like any registry (imagePullPolicy IfNotPresent).
const serverImage = registryHost + "/hookwright:v0.1.0"

// pushOperatorImage builds the operator image (hack/ociimage, as
// `make image`) and pushes it to the registry as serverImage, once for
// the package.
func pushOperatorImage(ctx context.Context, t *testing.T) {
	t.Helper()
	operatorImageOnce.Do(func() {
		root, err := cluster.RepoRoot()
		if err != nil {
			operatorImageErr = err
			return
		}
		imgs, err := ociimage.Build(ctx, ociimage.Options{Root: root, BinDir: filepath.Join(node.Dir, "operator-image")}, ociimage.SetOperator)
		if err != nil {
			operatorImageErr = err
			return
		}
		for _, img := range imgs {
			if img.Name == ociimage.OperatorName {
				operatorImage = img.Image
				operatorImageErr = ociimage.Push(ctx, registryAddr, ociimage.Named{Name: serverImage, Image: img.Image})
				return
			}
		}
		operatorImageErr = fmt.Errorf("ociimage.Build made no %s", ociimage.OperatorName)
	})
	if operatorImageErr != nil {
		t.Fatalf("operator image: %v", operatorImageErr)
	}
}

// killContainer kills a container's task with SIGKILL through the node's
// containerd (ctr), as an OOM kill or a crash would end it.
func killContainer(ctx context.Context, t *testing.T, containerID string) {
	t.Helper()
	id := strings.TrimPrefix(containerID, "containerd://")
	out, err := node.Exec(ctx, filepath.Join(env.Bin, "node", "ctr"), "--address", filepath.Join(node.Dir, "containerd", "containerd.sock"),
		"-n", "k8s.io", "tasks", "kill", "--signal", "SIGKILL", id)
	if err != nil {
		t.Fatalf("ctr tasks kill %s: %v\n%s", id, err, out)
	}
}

func fmtCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", k, m[k])
	}
	return b.String()
}

// reviewMetric is the counter of admission reviews a server of kind
// exports on its metrics port.
func reviewMetric(kind desired.Kind) string {
	if kind == desired.SidecarKind {
		return "hookwright_sidecar_injection_requests_total"
	}
	return "hookwright_oversell_review_duration_seconds_count"
}

// webhookRequests is the number of admission reviews a server pod has
// answered (reviewMetric, summed over its labels), read on its metrics
// port (plain HTTP, reached from the host through the node's pod route).
func webhookRequests(ctx context.Context, t *testing.T, podIP string, kind desired.Kind) float64 {
	t.Helper()
	body := httpGet(ctx, t, "http://"+net.JoinHostPort(podIP, strconv.Itoa(desired.MetricsPort))+"/metrics")
	n, err := sumMetric(body, reviewMetric(kind))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// sumMetric sums the samples of a metric over its labels in a Prometheus
// text exposition.
func sumMetric(body, name string) (float64, error) {
	var n float64
	for _, l := range strings.Split(body, "\n") {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metric line %q: %w", l, err)
		}
		n += v
	}
	return n, nil
}

// readyEndpoints counts the ready endpoints of a Service.
func readyEndpoints(ctx context.Context, ns, svc string) (int, error) {
	var eps discoveryv1.EndpointSliceList
	if err := env.Client.List(ctx, &eps, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: svc}); err != nil {
		return 0, err
	}
	n := 0
	for _, s := range eps.Items {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				n++
			}
		}
	}
	return n, nil
}
