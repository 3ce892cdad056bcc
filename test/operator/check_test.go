package operator

import (
	"context"
	"encoding/json"
	"os/exec"
	"slices"
	"testing"

	"github.com/hookwright/hookwright/internal/healthcheck"
	"github.com/hookwright/hookwright/test/cluster"
)

// checkCRs runs the built `hookwright check -o json` against the
// package's cluster and wants, for each area ("SidecarInjector probe-si"),
// the CR's own checks to pass on what the operator really issued and
// published: Ready and WebhookReachable True, its webhook configuration
// there, its Service's EndpointSlices with a ready endpoint, and a
// caBundle whose CA verifies the serving certificate. The lifetimes may
// warn (this package's CA lives minutes). The operator's Deployment is
// not judged: the operator runs in this process. It returns the results.
func checkCRs(t *testing.T, ctx context.Context, areas ...string) []healthcheck.Result {
	t.Helper()
	bin := cluster.MustHookwrightBinary(t)
	cmd := exec.CommandContext(ctx, bin, "check", "-n", operatorNS, "--kubeconfig", env.Kubeconfig, "-o", "json")
	out, err := cmd.Output()
	// Exit 1 is expected: the operator's Deployment is absent.
	if _, exit := err.(*exec.ExitError); err != nil && !exit {
		t.Fatalf("hookwright check: %v", err)
	}
	var list struct {
		Items []healthcheck.Result `json:"items"`
	}
	if err := json.Unmarshal(out, &list); err != nil {
		t.Fatalf("hookwright check -o json: %v\n%s", err, out)
	}
	want := map[string][]healthcheck.Status{
		"cr-ready":             {healthcheck.OK},
		"cr-webhook-reachable": {healthcheck.OK},
		"webhook-endpoints":    {healthcheck.OK},
		"webhook-config":       {healthcheck.OK},
		"webhook-cabundle":     {healthcheck.OK},
		"serving-cert":         {healthcheck.OK, healthcheck.Warn},
		"webhook-ca":           {healthcheck.OK, healthcheck.Warn},
	}
	for _, area := range areas {
		seen := map[string]bool{}
		for _, r := range list.Items {
			if r.Area != area {
				continue
			}
			seen[r.ID] = true
			if st, judged := want[r.ID]; judged && !slices.Contains(st, r.Status) {
				t.Errorf("hookwright check, %s: %s %s: %s (hint: %s)", area, r.Status, r.Description, r.Message, r.Hint)
			}
		}
		for id := range want {
			if !seen[id] {
				t.Errorf("hookwright check, %s: no %s line", area, id)
			}
		}
	}
	return list.Items
}
