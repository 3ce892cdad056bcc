// Package e2e runs hookwright's end-to-end scenarios (issue #7) against a
// local control plane with kwok nodes for the oversold pool and a real node
// where the operator (config/default) and its webhook servers run in real
// containers: the same code as `make demo` (test/e2e/scenarios). Scenario
// 9 runs on a stack of its own, beside it (test/e2e/standalone).
//
// The bounds (repair within 1 s, hot reload within 1 s, restore
// within 5 s, new CA bundle within 2 s) are measured and logged as
// figures, with the ones over the bound named; what fails a scenario is
// its own wait running out (tens of times the bound), never a duration
// measured by polling the wall clock, which a loaded machine stretches.
//
// It must not import controllers or webhooks: the scenarios drive the
// operator and servers through the API server only.
package e2e

import (
	"os"
	"testing"

	"github.com/hookwright/hookwright/test/e2e/scenarios"
)

var env *scenarios.Env

func TestMain(m *testing.M) {
	os.Exit(scenarios.TestMain(m, &env))
}

// TestScenarios runs scenarios 1 to 8 in order.
//
// Scenario 7 runs the README's "OLM without Docker" block as written up to
// its last line, the one run of operator-sdk run bundle on the real node
// (test/olm has none); that line, make cleanup-bundle, runs after the
// other scenarios (scenarios.README) and must leave nothing of the install.
func TestScenarios(t *testing.T) {
	scenarios.RunInOrder(t, env, append(append([]scenarios.Scenario(nil), scenarios.Ordered...), scenarios.README))
}
