package sidecar

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// A --config file never met the API's validation: Compile refuses an
// initContainerPlacement the CRD would refuse, naming the template.
func TestCompilePlacement(t *testing.T) {
	for _, c := range []struct {
		p    v1alpha1.InitContainerPlacement
		want string
	}{
		{v1alpha1.InitContainerPlacement{Position: v1alpha1.InitContainersAfter}, "after is required with position After"},
		{v1alpha1.InitContainerPlacement{Position: v1alpha1.InitContainersFirst, After: "agent"}, `after "agent" is not allowed with position First`},
		{v1alpha1.InitContainerPlacement{Position: "Last"}, `position "Last": want First or After`},
		{v1alpha1.InitContainerPlacement{Position: v1alpha1.InitContainersAfter, After: "Agent_1"}, `after "Agent_1": a lowercase RFC 1123 label`},
	} {
		cr := sampleCR(t)
		p := c.p
		cr.Spec.Templates[0].InitContainerPlacement = &p
		_, err := Compile(cr)
		if err == nil || !strings.Contains(err.Error(), `template "proxy": initContainerPlacement: `+c.want) {
			t.Errorf("%+v: %v, want %q", c.p, err, c.want)
		}
	}
}

// The webhook answers a pod without the named init container with the
// placement warning, prefixed by the injector's name, as kube-inject warns
// (testdata/placement/pod-agent-absent.yaml.warnings).
func TestPlacementWarningInAdmission(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(placementDir, "injector.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cr, err := DecodeSidecarInjector(b)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Compile(cr)
	if err != nil {
		t.Fatal(err)
	}
	pod := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"initContainers":[{"name":"migrate","image":"m"}],"containers":[{"name":"app","image":"a"}]}}`)
	resp := admit(t, newTestHandler(t, cfg), pod, "shop")
	want := `placement: template "proxy": the pod has no init container "vault-agent" (initContainerPlacement.after): its init containers go ahead of the pod's init containers`
	if !resp.Allowed || !slices.Contains(resp.Warnings, want) {
		t.Fatalf("allowed %v, warnings %q, want %q", resp.Allowed, resp.Warnings, want)
	}
}

// check-inject tells where the init containers go, and warns as the
// webhook does when the named one is absent.
func TestCheckPodsPlacement(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(placementDir, "injector.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cr, err := DecodeSidecarInjector(b)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Compile(cr)
	if err != nil {
		t.Fatal(err)
	}
	var sites []PodSite
	for _, f := range []string{"deployment-after-agent.yaml", "pod-agent-absent.yaml"} {
		src, err := os.ReadFile(filepath.Join(placementDir, f))
		if err != nil {
			t.Fatal(err)
		}
		sites = append(sites, podsOf(t, src)...)
	}
	var out strings.Builder
	if err := CheckPods(&out, []*Config{cfg}, testParams, sites, func(string) map[string]string { return nil }); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Deployment/shop (namespace shop):\n  placement: would inject [Policy]",
		"    init containers, in start order: setup, log-init, log-shipper, migrate, vault-agent, proxy-init, proxy, warmup\n",
		"Pod/no-agent (namespace shop):",
		"    init containers, in start order: proxy-init, proxy, setup, log-init, log-shipper, migrate\n",
		`    warning: template "proxy": the pod has no init container "vault-agent" (initContainerPlacement.after)`,
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
