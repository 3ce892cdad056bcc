package scenarios

import (
	"context"
	"fmt"
	"strings"
	"time"

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

// serverProcs returns pod UID → "pid/starts" of the pod runner's processes
// for the CR's server Deployment.
func serverProcs(e *Env, kind desired.Kind, cr string) map[types.UID]string {
	out := map[types.UID]string{}
	prefix := kind.BaseName(cr) + "-"
	for _, p := range e.Runner.Pods() {
		if p.Namespace != OperatorNamespace || !strings.HasPrefix(p.Name, prefix) {
			continue
		}
		for _, c := range p.Containers {
			out[p.UID] = fmt.Sprintf("%s pid %d starts %d", p.Name, c.PID, c.Starts)
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
	before := serverProcs(e, desired.SidecarKind, SampleInjectorName)
	if len(before) == 0 {
		return fmt.Errorf("no injector server processes")
	}
	if img, err := proxyImage(ctx, e, "reload-before"); err != nil || img != sampleProxyImage {
		return fmt.Errorf("before the change: proxy image %q (%v), want %s", img, err, sampleProxyImage)
	}
	start := time.Now()
	if err := patchProxyImage(ctx, e, newProxyImage); err != nil {
		return err
	}
	var tries int
	for {
		tries++
		img, err := proxyImage(ctx, e, fmt.Sprintf("reload-%d", tries))
		if err != nil {
			return err
		}
		if img == newProxyImage {
			break
		}
		if time.Since(start) > 60*time.Second {
			return fmt.Errorf("proxy image still %s 60 s after the change", img)
		}
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(start)
	r.timing("proxy tag 1.4.2 → 1.4.3: next pod carries the new tag", took, time.Second)
	after := serverProcs(e, desired.SidecarKind, SampleInjectorName)
	if fmt.Sprint(after) != fmt.Sprint(before) {
		return fmt.Errorf("injector servers changed: before %v, after %v", before, after)
	}
	r.check("proxy image %s in the next dry-run pod (%d tries); same %d server processes, none restarted", newProxyImage, tries, len(after))
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
	before = serverProcs(e, desired.OversellKind, no.Name)
	start = time.Now()
	if err := patchRatios(ctx, e, no.Name, "2.5", ""); err != nil {
		return err
	}
	took, err := waitPoolCPU(ctx, e, "10", ptr.To(true), 60*time.Second)
	if err != nil {
		return err
	}
	r.timing("cpu ratio 2 → 2.5: every pool node shows 10 CPU", took, 5*time.Second)
	if after := serverProcs(e, desired.OversellKind, no.Name); fmt.Sprint(after) != fmt.Sprint(before) {
		return fmt.Errorf("oversell servers changed: before %v, after %v", before, after)
	}
	r.check("cpu ratio 2 → 2.5: 10 CPU on every pool node, same oversell server processes")
	if err := patchRatios(ctx, e, no.Name, "2", ""); err != nil {
		return err
	}
	if _, err := waitPoolCPU(ctx, e, "8", ptr.To(true), 60*time.Second); err != nil {
		return err
	}
	return nil
}
