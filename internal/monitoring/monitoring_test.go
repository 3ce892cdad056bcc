package monitoring

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	admissionmetrics "k8s.io/apiserver/pkg/admission/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"

	// The operator's collectors register on ctrlmetrics.Registry at init.
	_ "github.com/hookwright/hookwright/controllers"
	_ "github.com/hookwright/hookwright/internal/oversellnodes"
	"github.com/hookwright/hookwright/webhooks/oversell"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

const root = "../.."

var (
	rulesFile     = filepath.Join(root, RulesFile)
	dashboardFile = filepath.Join(root, DashboardFile)
	promtool      = filepath.Join(root, "bin/promtool")
)

func ruleGroups(t *testing.T) []any {
	t.Helper()
	g, err := RuleGroups(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func ruleExprs(t *testing.T) []Expr { return RuleExprs(ruleGroups(t)) }

func dashboardExprs(t *testing.T) []Expr {
	t.Helper()
	e, err := DashboardExprs(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestMetricNames(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{`time() - max by (kind, name) (a_b) > 300`, []string{"a_b"}},
		{`sum by (le) (rate(x_bucket{name=~"a.b|c"}[5m])) / on (node) y unless z offset 5m`, []string{"x_bucket", "y", "z"}},
		{`min(a) - time() < 14 * 86400 and b == 1e3`, []string{"a", "b"}},
	} {
		got := MetricNames(c.in)
		if strings.Join(got, ",") != strings.Join(c.want, ",") {
			t.Errorf("MetricNames(%q) = %v, want %v", c.in, got, c.want)
		}
	}
}

// ours returns the registries our binaries serve: the operator's
// (controller-runtime's, with every collector its packages register at
// init) and one per server, built as cmd/ builds them.
func ours(t *testing.T) map[string]*prometheus.Registry {
	t.Helper()
	op, ok := ctrlmetrics.Registry.(*prometheus.Registry)
	if !ok {
		t.Fatalf("controller-runtime's registry is a %T", ctrlmetrics.Registry)
	}
	sc, ov := prometheus.NewRegistry(), prometheus.NewRegistry()
	if _, err := sidecar.NewMetrics(sc); err != nil {
		t.Fatal(err)
	}
	if _, err := oversell.NewMetrics(ov); err != nil {
		t.Fatal(err)
	}
	return map[string]*prometheus.Registry{"operator": op, "sidecar server": sc, "oversell server": ov}
}

// registered reports whether reg holds a collector of metric name: a
// gauge of that name then fails to register for its different help and
// labels. Unregistered, the probe gauge is removed again.
func registered(t *testing.T, reg *prometheus.Registry, name string) bool {
	t.Helper()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: "registration probe of internal/monitoring"})
	err := reg.Register(g)
	if err == nil {
		reg.Unregister(g)
		return false
	}
	if !strings.Contains(err.Error(), "previously registered descriptor with the same fully-qualified name") {
		t.Fatalf("probe %s: %v", name, err)
	}
	return true
}

// apiServerMetrics returns the names of the admission webhook metrics the
// API server exports, by recording one of each through its own code.
func apiServerMetrics(t *testing.T) map[string]bool {
	t.Helper()
	ctx := context.Background()
	m := admissionmetrics.Metrics
	attr := admission.NewAttributesRecord(nil, nil, schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, "ns", "p",
		schema.GroupVersionResource{Version: "v1", Resource: "pods"}, "", admission.Create, nil, false, nil)
	m.ObserveWebhook(ctx, "inject.sidecar.hookwright.io", time.Millisecond, false, attr, "admit", 200)
	m.ObserveWebhookRejection(ctx, "inject.sidecar.hookwright.io", "admit", "CREATE", admissionmetrics.WebhookRejectionCallingWebhookError, 500)
	m.ObserveWebhookFailOpen(ctx, "inject.sidecar.hookwright.io", "admit")
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, f := range families {
		out[f.GetName()] = true
	}
	for _, want := range []string{"apiserver_admission_webhook_fail_open_count", "apiserver_admission_webhook_request_total"} {
		if !out[want] {
			t.Fatalf("the API server's admission metrics lack %s; gathered %v", want, out)
		}
	}
	return out
}

// stems returns name and, for a histogram's or summary's series, the
// metric it belongs to.
func stems(name string) []string {
	out := []string{name}
	for _, s := range []string{"_bucket", "_sum", "_count"} {
		if strings.HasSuffix(name, s) {
			out = append(out, strings.TrimSuffix(name, s))
		}
	}
	return out
}

// TestExpressionsNameExportedMetrics checks every metric the alerts and
// the dashboard select: ours must be registered by our code, the API
// server's exported by its admission code, and no other is allowed.
func TestExpressionsNameExportedMetrics(t *testing.T) {
	regs := ours(t)
	apiserver := apiServerMetrics(t)
	// The probe itself: a known name is found, an unknown one is not.
	if !registered(t, regs["operator"], "hookwright_sidecar_fleet_pods") || registered(t, regs["operator"], "hookwright_no_such_metric") {
		t.Fatal("the registration probe does not tell registered names from others")
	}
	exprs := append(ruleExprs(t), dashboardExprs(t)...)
	used := map[string]bool{}
	for _, e := range exprs {
		names := MetricNames(e.Text)
		if len(names) == 0 {
			t.Errorf("%s: no metric in %q", e.Where, e.Text)
		}
	next:
		for _, n := range names {
			used[n] = true
			for _, s := range stems(n) {
				if strings.HasPrefix(s, "apiserver_") && apiserver[s] {
					continue next
				}
				if strings.HasPrefix(s, "hookwright_") {
					for _, reg := range regs {
						if registered(t, reg, s) {
							continue next
						}
					}
				}
			}
			t.Errorf("%s: metric %s is neither registered by our binaries nor exported by the API server's admission code", e.Where, n)
		}
	}
	var list []string
	for n := range used {
		list = append(list, n)
	}
	sort.Strings(list)
	t.Logf("%d expressions use %d metrics: %s", len(exprs), len(list), strings.Join(list, " "))
}

// runPromtool runs bin/promtool in dir; a missing promtool fails the test
// (make test builds it: hack/tools.sh promtool).
func runPromtool(t *testing.T, dir string, args ...string) string {
	t.Helper()
	bin, err := filepath.Abs(promtool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("promtool is needed: %v (build it with hack/tools.sh promtool)", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

func writeYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestRulesWithPromtool runs `promtool test rules` on testdata/rules_test.yaml
// against the PrometheusRule's groups: each alert fires on its input series
// with its labels and annotations, and stays silent on the healthy ones.
func TestRulesWithPromtool(t *testing.T) {
	dir := t.TempDir()
	writeYAML(t, filepath.Join(dir, "rules.yaml"), map[string]any{"groups": ruleGroups(t)})
	b, err := os.ReadFile("testdata/rules_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules_test.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, dir, "check", "rules", "rules.yaml")
	out := runPromtool(t, dir, "test", "rules", "rules_test.yaml")
	t.Log(strings.TrimSpace(out))

	// Every alert of the rule file has a test case.
	tested := string(b)
	for _, e := range ruleExprs(t) {
		name := strings.TrimPrefix(e.Where, "alert ")
		if !strings.Contains(tested, "alertname: "+name+"\n") {
			t.Errorf("testdata/rules_test.yaml has no case for %s", name)
		}
	}
}

// TestDashboardExpressionsParse feeds every dashboard expression to
// `promtool check rules` as a recording rule.
func TestDashboardExpressionsParse(t *testing.T) {
	var rules []any
	for i, e := range dashboardExprs(t) {
		rules = append(rules, map[string]any{"record": fmt.Sprintf("dashboard:expr_%d", i), "expr": e.Text})
	}
	dir := t.TempDir()
	writeYAML(t, filepath.Join(dir, "dashboard.yaml"), map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	t.Log(strings.TrimSpace(runPromtool(t, dir, "check", "rules", "dashboard.yaml")))
}
