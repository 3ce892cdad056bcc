package scenarios

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

const (
	// SampleInjectorName is the sample SidecarInjector's name.
	SampleInjectorName = "sidecar-injector"
	sampleProxyImage   = "ghcr.io/hookwright/proxy:1.4.2"
	newProxyImage      = "ghcr.io/hookwright/proxy:1.4.3"
)

// serverProcs returns pod UID → "name container ID restarts N" of the
// CR's server pods (from the kubelet's pod status): the same map before
// and after a change means no server was replaced or restarted.
func serverProcs(ctx context.Context, e *Env, kind desired.Kind, cr string) map[types.UID]string {
	out := map[types.UID]string{}
	var pods corev1.PodList
	if err := e.Cluster.Client.List(ctx, &pods, client.InNamespace(OperatorNamespace)); err != nil {
		out["error"] = err.Error()
		return out
	}
	prefix := kind.BaseName(cr) + "-"
	for _, p := range pods.Items {
		if !strings.HasPrefix(p.Name, prefix) || p.DeletionTimestamp != nil {
			continue
		}
		for _, c := range p.Status.ContainerStatuses {
			out[p.UID] = fmt.Sprintf("%s container %s restarts %d", p.Name, c.ContainerID, c.RestartCount)
		}
	}
	return out
}

func proxyImage(ctx context.Context, e *Env, name string) (string, error) {
	p, err := dryRunPod(ctx, e, name)
	if err != nil {
		return "", err
	}
	if err := injectedOnce(p); err != nil {
		return "", err
	}
	for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
		if c.Name == "proxy" {
			return c.Image, nil
		}
	}
	return "", fmt.Errorf("no proxy container")
}

func patchProxyImage(ctx context.Context, e *Env, image string) error {
	si := &v1alpha1.SidecarInjector{}
	si.Name = SampleInjectorName
	patch := fmt.Sprintf(`{"spec":{"values":{"proxy":{"image":%q}}}}`, image)
	return e.Cluster.Client.Patch(ctx, si, client.RawPatch(types.MergePatchType, []byte(patch)))
}

// HotReload is scenario 3: a changed template value reaches the next pod
// with no server restart, and a changed ratio reaches every node's
// allocatable.
func HotReload(ctx context.Context, e *Env, r *Result) error {
	before := serverProcs(ctx, e, desired.SidecarKind, SampleInjectorName)
	if len(before) == 0 {
		return fmt.Errorf("no injector server pods")
	}
	if img, err := proxyImage(ctx, e, "reload-before"); err != nil || img != sampleProxyImage {
		return fmt.Errorf("before the change: proxy image %q (%v), want %s", img, err, sampleProxyImage)
	}
	start := time.Now()
	if err := patchProxyImage(ctx, e, newProxyImage); err != nil {
		return err
	}
	var tries int
	var img string
	var imgErr error
	_, err := cluster.Poll(ctx, 10*time.Millisecond, 60*time.Second, "proxy image "+newProxyImage, func(ctx context.Context) (bool, error) {
		tries++
		if img, imgErr = proxyImage(ctx, e, fmt.Sprintf("reload-%d", tries)); imgErr != nil {
			return false, cluster.Permanent(imgErr)
		}
		return img == newProxyImage, nil
	})
	if imgErr != nil {
		return imgErr
	}
	if err != nil {
		return fmt.Errorf("proxy image still %s 60 s after the change", img)
	}
	took := time.Since(start)
	r.timing("proxy tag 1.4.2 → 1.4.3: next pod carries the new tag", took, time.Second)
	after := serverProcs(ctx, e, desired.SidecarKind, SampleInjectorName)
	if fmt.Sprint(after) != fmt.Sprint(before) {
		return fmt.Errorf("injector servers changed: before %v, after %v", before, after)
	}
	r.check("proxy image %s in the next dry-run pod (%d tries); same %d server pods and containers, none restarted", newProxyImage, tries, len(after))
	if err := patchProxyImage(ctx, e, sampleProxyImage); err != nil {
		return err
	}

	// The NodeOversell was deleted by scenario 2: apply the sample as it is.
	no := &v1alpha1.NodeOversell{}
	if err := cluster.LoadSample(oversellSample, no); err != nil {
		return err
	}
	start = time.Now()
	if err := e.Cluster.Client.Create(ctx, no); err != nil {
		return err
	}
	if _, err := waitPoolCPU(ctx, e, "8", ptr.To(true), 2*time.Minute); err != nil {
		return err
	}
	r.timing("sample NodeOversell re-applied (new server pods, cert, webhook) → 8 CPU", time.Since(start), 0)
	if err := e.WaitReady(ctx, 2*time.Minute); err != nil {
		return err
	}
	before = serverProcs(ctx, e, desired.OversellKind, no.Name)
	if err := patchRatios(ctx, e, no.Name, "2.5", ""); err != nil {
		return err
	}
	took, err = waitPoolCPU(ctx, e, "10", ptr.To(true), 60*time.Second)
	if err != nil {
		return err
	}
	r.timing("cpu ratio 2 → 2.5: every pool node shows 10 CPU", took, 5*time.Second)
	if after := serverProcs(ctx, e, desired.OversellKind, no.Name); fmt.Sprint(after) != fmt.Sprint(before) {
		return fmt.Errorf("oversell servers changed: before %v, after %v", before, after)
	}
	r.check("cpu ratio 2 → 2.5: 10 CPU on every pool node, same oversell server pods and containers")
	if err := patchRatios(ctx, e, no.Name, "2", ""); err != nil {
		return err
	}
	if _, err := waitPoolCPU(ctx, e, "8", ptr.To(true), 60*time.Second); err != nil {
		return err
	}
	return nil
}
