package operator

import (
	"testing"
	"time"

	"github.com/hookwright/hookwright/internal/fleet"
	"github.com/hookwright/hookwright/test/cluster"
)

// The rollout's check for pods/resize (fleet.ResizeServed) against real
// discovery: served on every supported minor (beta and on in 1.33 and
// 1.34, locked on from 1.35). On 1.33 and 1.34 the feature gate can be
// turned off, and then the subresource is gone and ResizeUnavailable is
// the reason a resources change falls back to a restart
// (docs/versions.md).
func TestResizeSubresourceDiscovery(t *testing.T) {
	t.Parallel()
	ctx := cluster.TestContext(t, 2*time.Minute)
	list, err := env.Clientset.Discovery().ServerResourcesForGroupVersion("v1")
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := fleet.ResizeServed(list.APIResources); !ok {
		t.Fatalf("Kubernetes 1.%d: pods/resize not served: %s", env.KubeMinor(), why)
	}
	if env.MinorAtLeast(35) {
		t.Logf("Kubernetes 1.%d: pods/resize served; gate InPlacePodVerticalScaling is locked on from 1.35, so no server without it can be started here", env.KubeMinor())
		return
	}
	c, err := cluster.New(ctx, cluster.Options{
		APIServerArgs: map[string][]string{"feature-gates": {"InPlacePodVerticalScaling=false"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	list, err = c.Clientset.Discovery().ServerResourcesForGroupVersion("v1")
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := fleet.ResizeServed(list.APIResources); ok || why != fleet.ResizeUnavailable {
		t.Fatalf("Kubernetes 1.%d with InPlacePodVerticalScaling=false: served %t (%q)", c.KubeMinor(), ok, why)
	}
}
