// Package standalone runs the scenarios that need only a fresh stack (the
// same stack as test/e2e, started anew), so they run beside test/e2e in
// make test: the demo's scenario 9 (usage-aware oversell and held cuts),
// a real Prometheus scraping that install and firing an alert
// (test/e2e/scenarios/prometheus.go) and the Helm chart on the real node
// (test/e2e/scenarios/helm.go). Each
// removes everything it made, and the stack's Stop is checked for leaks.
//
// It must not import controllers or webhooks: the scenarios drive the
// operator and servers through the API server only.
package standalone

import (
	"os"
	"testing"

	"github.com/hookwright/hookwright/test/e2e/scenarios"
)

var env *scenarios.Env

func TestMain(m *testing.M) {
	os.Exit(scenarios.TestMain(m, &env))
}

// TestStandalone runs scenario 9 and the Prometheus scenario on the
// operator the stack installed, then replaces that install with the Helm
// chart.
func TestStandalone(t *testing.T) {
	scenarios.RunInOrder(t, env, scenarios.Standalone)
}
