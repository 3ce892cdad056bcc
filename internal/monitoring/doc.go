// Package monitoring ties the Prometheus and Grafana files of config/ to the
// binaries: config/prometheus/prometheusrule.yaml (the alerts of
// docs/alerts.md) and config/grafana/hookwright-dashboard.json. Its code
// only reads those files (RuleGroups, RuleExprs, DashboardExprs,
// MetricNames), for its tests and for the end-to-end scenario that loads
// them into a real Prometheus (test/e2e/scenarios/prometheus.go). Its tests
// check that
//   - every metric an alert or panel names is one our binaries register (the
//     operator's collectors, registered at init on controller-runtime's
//     metrics.Registry, and the servers', from sidecar.NewMetrics and
//     oversell.NewMetrics) or one the API server's admission code exports
//     (k8s.io/apiserver/pkg/admission/metrics, at the module's pinned
//     version, as kube-apiserver v1.37.2 serves it);
//   - the rules pass `promtool test rules` on testdata/rules_test.yaml
//     (input series, expected alerts) and every dashboard expression parses
//     (`promtool check rules` on it as a recording rule).
//
// promtool is bin/promtool (hack/tools.sh promtool, part of make test's
// tools); the tests fail, never skip, without it.
//
// The package (its non-test code)
// imports only the standard library and sigs.k8s.io/yaml.
package monitoring
