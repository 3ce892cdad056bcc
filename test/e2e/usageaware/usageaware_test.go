// Package usageaware runs the demo's scenario 9 (usage-aware oversell and
// held cuts, test/e2e/scenarios/usage.go) on a stack of its own: the same
// stack as test/e2e, started fresh, so the two run side by side in make
// test. The scenario removes everything it made, and the stack's Stop is
// checked for leaks.
//
// It must not import controllers or webhooks: the scenario drives the
// operator and servers through the API server only.
package usageaware

import (
	"os"
	"testing"

	"github.com/hookwright/hookwright/test/e2e/scenarios"
)

var env *scenarios.Env

func TestMain(m *testing.M) {
	os.Exit(scenarios.TestMain(m, &env))
}

// TestUsageAware runs scenario 9 on the operator the stack installed.
func TestUsageAware(t *testing.T) {
	scenarios.RunInOrder(t, env, []scenarios.Scenario{scenarios.Usage})
}
