package scenarios

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/hookwright/hookwright/internal/monitoring"
	"github.com/hookwright/hookwright/test/cluster"
)

// The Prometheus scenario's objects and the alert it fires.
const (
	promNamespace = "prometheus-e2e"
	promAccount   = "prometheus"
	// promReader binds config/rbac's metrics-reader role (with
	// config/default's prefix) to Prometheus's ServiceAccount, as
	// docs/alerts.md asks.
	promReader        = "hookwright-e2e-prometheus"
	metricsReaderRole = "hookwright-metrics-reader"
	failingOpenAlert  = "HookwrightWebhookFailingOpen"
	failOpenMetric    = "apiserver_admission_webhook_fail_open_count"
	injectWebhookName = "inject.sidecar.hookwright.io"
	// promInterval is the scrape and rule evaluation interval: short, so
	// the scenario waits seconds; the rules are the shipped ones.
	promInterval = "2s"
)

// conditionalMetrics are the metrics alerts name that have no series
// until what they count happens, and when that is.
var conditionalMetrics = map[string]string{
	failOpenMetric:                       "a call failed open (the scenario's last step)",
	"hookwright_sidecar_rollout_blocked": "a SidecarInjector has spec.rollout (internal/rollout)",
}

// Prometheus is issue 26's real Prometheus (bin/prometheus, built from
// source with the Kubernetes service discovery only), run by make test on
// test/e2e/standalone's stack, not by the demo (its tools do not include
// prometheus). On the install config/default made:
//   - Prometheus scrapes what config/prometheus's monitors select,
//     translated as Prometheus Operator would (the PodMonitor's selector
//     and port over the pods of the operator's namespace; the
//     ServiceMonitor's over its EndpointSlices, HTTPS with the token of a
//     ServiceAccount bound to the metrics-reader role), and the API
//     server, and evaluates the PrometheusRule's groups as shipped;
//   - every server pod the monitors select, the operator and the API
//     server are scraped up; every alert rule loads and evaluates; every
//     metric an alert names is in Prometheus's store (the API server's
//     fail-open counter once a call failed open); every dashboard
//     expression evaluates;
//   - a dry-run pod create in a namespace labelled for the sample
//     injector is injected; with that injector's server stopped
//     (failurePolicy Ignore, the CR paused, its Deployment scaled to 0),
//     such creates are admitted without sidecars, and
//     HookwrightWebhookFailingOpen fires for inject.sidecar.hookwright.io
//     with its runbook link;
//   - the server is brought back (unpaused, failurePolicy Fail, Ready).
//
// Everything it made is removed at its end (cleanPrometheus).
func Prometheus(ctx context.Context, e *Env, r *Result) error {
	root, err := cluster.RepoRoot()
	if err != nil {
		return err
	}
	groups, err := monitoring.RuleGroups(filepath.Join(root, monitoring.RulesFile))
	if err != nil {
		return err
	}
	dashboard, err := monitoring.DashboardExprs(filepath.Join(root, monitoring.DashboardFile))
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp(e.Cluster.Dir, "prometheus-")
	if err != nil {
		return err
	}
	defer e.cleanPrometheus(context.Background())
	var monitors []monitor
	for _, f := range []string{"podmonitor.yaml", "monitor.yaml"} {
		m, err := loadMonitor(filepath.Join(root, "config", "prometheus", f))
		if err != nil {
			return err
		}
		monitors = append(monitors, m)
	}
	config, err := e.prometheusConfig(ctx, dir, monitors, groups)
	if err != nil {
		return err
	}
	port, err := cluster.FreePort()
	if err != nil {
		return err
	}
	start := time.Now()
	p, err := cluster.StartProcess("prometheus", dir, filepath.Join(e.Cluster.Bin, "prometheus"), []string{
		"--config.file=" + config, "--storage.tsdb.path=" + filepath.Join(dir, "data"),
		fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port),
	}, nil)
	if err != nil {
		return err
	}
	defer func() { _ = p.Stop(10 * time.Second) }()
	api := promAPI{base: fmt.Sprintf("http://127.0.0.1:%d", port), hc: &http.Client{Timeout: 10 * time.Second}}
	fail := func(err error) error { return fmt.Errorf("%w\nprometheus log:\n%s", err, p.Tail(3000)) }

	pools, err := e.awaitTargets(ctx, api, monitors[0])
	if err != nil {
		return fail(err)
	}
	r.timing("prometheus started → every target scraped up", time.Since(start), 0)
	r.check("prometheus scrapes %s", pools)

	alerts := monitoring.RuleExprs(groups)
	if err := awaitRulesHealthy(ctx, api, len(alerts)); err != nil {
		return fail(err)
	}
	r.check("the PrometheusRule's %d alerts load and evaluate without error", len(alerts))
	var want []string
	for _, a := range alerts {
		for _, n := range monitoring.MetricNames(a.Text) {
			if _, later := conditionalMetrics[n]; !later && !slices.Contains(want, n) {
				want = append(want, n)
			}
		}
	}
	sort.Strings(want)
	if err := cluster.WaitFor(ctx, time.Minute, "every metric the alerts name in prometheus", func(ctx context.Context) (bool, error) {
		missing, err := absent(ctx, api, want)
		if err != nil || len(missing) > 0 {
			return false, fmt.Errorf("absent: %v (%v)", missing, err)
		}
		return true, nil
	}); err != nil {
		return fail(err)
	}
	r.check("every metric the alerts name is scraped: %s (not yet: %v)", strings.Join(want, " "), conditionalMetrics)
	empty := 0
	for _, d := range dashboard {
		var res []json.RawMessage
		if err := api.get(ctx, "/api/v1/query", url.Values{"query": {d.Text}}, &struct {
			Result *[]json.RawMessage `json:"result"`
		}{&res}); err != nil {
			return fail(fmt.Errorf("dashboard %s: %w", d.Where, err))
		}
		if len(res) == 0 {
			empty++
		}
	}
	r.check("every dashboard expression (%d) evaluates; %d have no series yet (no admission of that kind so far)", len(dashboard), empty)

	p0, err := dryRunIn(ctx, e, promNamespace, "in-scope")
	if err != nil {
		return err
	}
	if err := injectedOnce(p0); err != nil {
		return fmt.Errorf("namespace %s is not in the sample injector's scope: %w", promNamespace, err)
	}
	if firing, err := alertFiring(ctx, api, failingOpenAlert, injectWebhookName); err != nil || firing != nil {
		return fail(fmt.Errorf("%s for %s before the server stopped: %+v (%v)", failingOpenAlert, injectWebhookName, firing, err))
	}
	if err := e.stopInjectorServer(ctx); err != nil {
		return err
	}
	start = time.Now()
	admitted := 0
	var alert *promAlert
	if _, err := cluster.Poll(ctx, time.Second, 3*time.Minute, failingOpenAlert+" firing", func(ctx context.Context) (bool, error) {
		// A new counter series first seen at 1 has no increase: creates go
		// on until the alert fires.
		p, err := dryRunIn(ctx, e, promNamespace, fmt.Sprintf("fail-open-%d", admitted))
		if err != nil {
			return false, cluster.Permanent(fmt.Errorf("dry-run create with the server stopped (failurePolicy Ignore): %w", err))
		}
		if err := untouched(p); err != nil {
			return false, cluster.Permanent(err)
		}
		admitted++
		alert, err = alertFiring(ctx, api, failingOpenAlert, injectWebhookName)
		return alert != nil, err
	}); err != nil {
		return fail(err)
	}
	r.timing("injector server stopped → "+failingOpenAlert+" firing", time.Since(start), 0)
	if !strings.HasSuffix(alert.Annotations["runbook_url"], "#"+strings.ToLower(failingOpenAlert)) || alert.Labels["severity"] != "warning" {
		return fmt.Errorf("%s: labels %v annotations %v, want severity warning and the runbook's section", failingOpenAlert, alert.Labels, alert.Annotations)
	}
	r.check("injector server stopped: %d dry-run creates in %s admitted without sidecars; %s firing for %s (%s)",
		admitted, promNamespace, failingOpenAlert, injectWebhookName, alert.Annotations["description"])

	start = time.Now()
	if err := e.restartInjectorServer(ctx); err != nil {
		return err
	}
	r.timing("CR unpaused, failurePolicy Fail → server Ready", time.Since(start), 0)
	r.check("the injector's server back: the CR unpaused with spec.failurePolicy Fail, every CR Ready")
	return nil
}

// restartInjectorServer undoes stopInjectorServer: the CR unpaused with
// the sample's failurePolicy Fail, and every CR Ready again.
func (e *Env) restartInjectorServer(ctx context.Context) error {
	if _, _, err := e.RunKubectl(ctx, nil, "annotate", "sidecarinjector", SampleInjectorName, pauseReconcile+"-"); err != nil {
		return err
	}
	if _, _, err := e.RunKubectl(ctx, nil, "patch", "sidecarinjector", SampleInjectorName, "--type=merge", "-p", `{"spec":{"failurePolicy":"Fail"}}`); err != nil {
		return err
	}
	return e.WaitReady(ctx, 3*time.Minute)
}

// prometheusConfig writes Prometheus's configuration and the rules file
// into dir and returns the configuration's path.
func (e *Env) prometheusConfig(ctx context.Context, dir string, monitors []monitor, groups []any) (string, error) {
	token, err := e.prometheusToken(ctx)
	if err != nil {
		return "", err
	}
	cfg := e.Cluster.Config
	if len(cfg.CertData) == 0 || len(cfg.KeyData) == 0 || len(cfg.CAData) == 0 {
		return "", fmt.Errorf("the cluster's admin config has no client certificate to scrape the API server with")
	}
	files := map[string][]byte{"token": []byte(token), "apiserver.crt": cfg.CertData, "apiserver.key": cfg.KeyData, "ca.crt": cfg.CAData}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return "", err
		}
	}
	host, err := url.Parse(cfg.Host)
	if err != nil {
		return "", err
	}
	var jobs []any
	for _, m := range monitors {
		jobs = append(jobs, m.job(e.Cluster.Kubeconfig, dir))
	}
	jobs = append(jobs, map[string]any{
		"job_name": "apiserver", "scheme": "https",
		"static_configs": []any{map[string]any{"targets": []string{host.Host}}},
		"tls_config": map[string]any{"ca_file": filepath.Join(dir, "ca.crt"),
			"cert_file": filepath.Join(dir, "apiserver.crt"), "key_file": filepath.Join(dir, "apiserver.key")},
	})
	if err := writeYAMLFile(filepath.Join(dir, "rules.yaml"), map[string]any{"groups": groups}); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "prometheus.yml")
	return path, writeYAMLFile(path, map[string]any{
		"global":         map[string]any{"scrape_interval": promInterval, "scrape_timeout": promInterval, "evaluation_interval": promInterval},
		"rule_files":     []string{filepath.Join(dir, "rules.yaml")},
		"scrape_configs": jobs,
	})
}

// prometheusToken creates Prometheus's ServiceAccount, binds the
// metrics-reader role to it and returns a token of it.
func (e *Env) prometheusToken(ctx context.Context) (string, error) {
	c := e.Cluster.Client
	for _, o := range []client.Object{
		// Labelled for the sample's injection: the fail-open creates go here.
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: promNamespace, Labels: map[string]string{"sidecar-injection": "enabled"}}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: promNamespace, Name: promAccount}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: promReader},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: metricsReaderRole},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: promNamespace, Name: promAccount}}},
	} {
		if err := c.Create(ctx, o); err != nil {
			return "", err
		}
	}
	tr, err := e.Cluster.Clientset.CoreV1().ServiceAccounts(promNamespace).CreateToken(ctx, promAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return tr.Status.Token, nil
}

// cleanPrometheus removes what the scenario made and brings the injector's
// server back, whatever step it stopped at.
func (e *Env) cleanPrometheus(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	c := e.Cluster.Client
	_ = deleteAndAwait(ctx, c, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: promReader}})
	_ = deleteAndAwait(ctx, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: promNamespace}})
	_ = e.restartInjectorServer(ctx)
}

// monitor is what a PodMonitor or ServiceMonitor of config/prometheus
// says about where to scrape.
type monitor struct {
	Kind     string
	Metadata struct{ Name string }
	Spec     struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		}
		PodMetricsEndpoints []monitorEndpoint `json:"podMetricsEndpoints"`
		Endpoints           []monitorEndpoint `json:"endpoints"`
	}
}

type monitorEndpoint struct {
	Port, Path, Scheme string
	TLSConfig          struct {
		InsecureSkipVerify bool `json:"insecureSkipVerify"`
	} `json:"tlsConfig"`
	BearerTokenFile string `json:"bearerTokenFile"`
}

var unsafeLabelChars = regexp.MustCompile(`[^a-zA-Z0-9_]`)

// loadMonitor reads a PodMonitor or ServiceMonitor with one endpoint and
// a selector.
func loadMonitor(path string) (monitor, error) {
	var m monitor
	b, err := os.ReadFile(path)
	if err != nil {
		return m, err
	}
	if err := yaml.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("%s: %w", path, err)
	}
	if n := len(m.endpoints()); n != 1 || len(m.Spec.Selector.MatchLabels) == 0 {
		return m, fmt.Errorf("%s: %d endpoints and %d selector labels, want one endpoint and a selector", path, n, len(m.Spec.Selector.MatchLabels))
	}
	return m, nil
}

func (m monitor) endpoints() []monitorEndpoint {
	if m.Kind == "ServiceMonitor" {
		return m.Spec.Endpoints
	}
	return m.Spec.PodMetricsEndpoints
}

// pool is the scrape pool (job) name Prometheus Operator gives the
// monitor's endpoint in the operator's namespace.
func (m monitor) pool() string {
	return fmt.Sprintf("%s/%s/%s/0", strings.ToLower(m.Kind[:1])+m.Kind[1:], OperatorNamespace, m.Metadata.Name)
}

// job translates the monitor into a scrape job over the operator's
// namespace, as Prometheus Operator does: keep the pods (or the
// EndpointSlices' Services) carrying every label of the selector, keep
// the named port, and scrape it with the monitor's scheme and path. A
// ServiceMonitor's bearer token file is the scenario's token in dir.
func (m monitor) job(kubeconfig, dir string) map[string]any {
	role, object, portLabel := "pod", "pod", "__meta_kubernetes_pod_container_port_name"
	if m.Kind == "ServiceMonitor" {
		role, object, portLabel = "endpointslice", "service", "__meta_kubernetes_endpointslice_port_name"
	}
	var relabel []any
	keys := make([]string, 0, len(m.Spec.Selector.MatchLabels))
	for k := range m.Spec.Selector.MatchLabels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		l := unsafeLabelChars.ReplaceAllString(k, "_")
		relabel = append(relabel, map[string]any{"action": "keep",
			"source_labels": []string{"__meta_kubernetes_" + object + "_label_" + l, "__meta_kubernetes_" + object + "_labelpresent_" + l},
			"regex":         regexp.QuoteMeta(m.Spec.Selector.MatchLabels[k]) + ";true"})
	}
	ep := m.endpoints()[0]
	relabel = append(relabel, map[string]any{"action": "keep", "source_labels": []string{portLabel}, "regex": regexp.QuoteMeta(ep.Port)})
	if role == "pod" {
		relabel = append(relabel, map[string]any{"action": "drop", "source_labels": []string{"__meta_kubernetes_pod_phase"}, "regex": "Failed|Succeeded"})
	}
	relabel = append(relabel, map[string]any{"source_labels": []string{"__meta_kubernetes_pod_name"}, "target_label": "pod"})
	job := map[string]any{
		"job_name":        m.pool(),
		"scheme":          ep.Scheme,
		"metrics_path":    ep.Path,
		"relabel_configs": relabel,
		"kubernetes_sd_configs": []any{map[string]any{"role": role, "kubeconfig_file": kubeconfig,
			"namespaces": map[string]any{"names": []string{OperatorNamespace}}}},
	}
	if ep.TLSConfig.InsecureSkipVerify {
		job["tls_config"] = map[string]any{"insecure_skip_verify": true}
	}
	if ep.BearerTokenFile != "" {
		job["authorization"] = map[string]any{"credentials_file": filepath.Join(dir, "token")}
	}
	return job
}

func writeYAMLFile(path string, v any) error {
	b, err := yaml.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// promAPI is Prometheus's HTTP API (/api/v1).
type promAPI struct {
	base string
	hc   *http.Client
}

// get decodes the data of a successful answer into data.
func (a promAPI) get(ctx context.Context, path string, q url.Values, data any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base+path+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	var env struct {
		Status string
		Error  string
		Data   json.RawMessage
	}
	if err := json.Unmarshal(b, &env); err != nil {
		return fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	if env.Status != "success" {
		return fmt.Errorf("GET %s?%s: %s", path, q.Encode(), env.Error)
	}
	return json.Unmarshal(env.Data, data)
}

// awaitTargets waits until the three scrape pools have targets, every
// target is up, and the pod monitor's pool has one per pod its selector
// matches; it returns the pools and their target counts.
func (e *Env) awaitTargets(ctx context.Context, api promAPI, pods monitor) (string, error) {
	var summary string
	err := cluster.WaitFor(ctx, 2*time.Minute, "every target up", func(ctx context.Context) (bool, error) {
		var d struct {
			ActiveTargets []struct {
				ScrapePool string            `json:"scrapePool"`
				Labels     map[string]string `json:"labels"`
				Health     string            `json:"health"`
				LastError  string            `json:"lastError"`
			} `json:"activeTargets"`
		}
		if err := api.get(ctx, "/api/v1/targets", url.Values{"state": {"active"}}, &d); err != nil {
			return false, err
		}
		var list corev1.PodList
		if err := e.Cluster.Client.List(ctx, &list, client.InNamespace(OperatorNamespace), client.MatchingLabels(pods.Spec.Selector.MatchLabels)); err != nil {
			return false, err
		}
		count := map[string]int{}
		for _, t := range d.ActiveTargets {
			if t.Health != "up" {
				return false, fmt.Errorf("target %s %s: %s %s", t.ScrapePool, t.Labels["instance"], t.Health, t.LastError)
			}
			count[t.ScrapePool]++
		}
		summary = fmt.Sprint(count)
		if len(count) != 3 || count[pods.pool()] != len(list.Items) {
			return false, fmt.Errorf("targets %v, %d pods match %s", count, len(list.Items), pods.pool())
		}
		return true, nil
	})
	return summary, err
}

// awaitRulesHealthy waits until Prometheus has n alerting rules, each
// evaluated without error.
func awaitRulesHealthy(ctx context.Context, api promAPI, n int) error {
	return cluster.WaitFor(ctx, time.Minute, "every alert rule evaluated", func(ctx context.Context) (bool, error) {
		var d struct {
			Groups []struct {
				Rules []struct {
					Name, Health, LastError string
				}
			}
		}
		if err := api.get(ctx, "/api/v1/rules", url.Values{"type": {"alert"}}, &d); err != nil {
			return false, err
		}
		got := 0
		for _, g := range d.Groups {
			for _, r := range g.Rules {
				if r.Health != "ok" {
					return false, fmt.Errorf("rule %s: %s %s", r.Name, r.Health, r.LastError)
				}
				got++
			}
		}
		return got == n, fmt.Errorf("%d alert rules loaded, want %d", got, n)
	})
}

// absent returns the metric names with no series in Prometheus.
func absent(ctx context.Context, api promAPI, names []string) ([]string, error) {
	var out []string
	for _, n := range names {
		var res []json.RawMessage
		if err := api.get(ctx, "/api/v1/query", url.Values{"query": {"count(" + n + ")"}}, &struct {
			Result *[]json.RawMessage `json:"result"`
		}{&res}); err != nil {
			return nil, err
		}
		if len(res) == 0 {
			out = append(out, n)
		}
	}
	return out, nil
}

type promAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"`
}

// alertFiring returns the firing alert named alert whose label name is
// webhook, or nil.
func alertFiring(ctx context.Context, api promAPI, alert, webhook string) (*promAlert, error) {
	var d struct {
		Alerts []promAlert `json:"alerts"`
	}
	if err := api.get(ctx, "/api/v1/alerts", nil, &d); err != nil {
		return nil, err
	}
	for i, a := range d.Alerts {
		if a.Labels["alertname"] == alert && a.Labels["name"] == webhook && a.State == "firing" {
			return &d.Alerts[i], nil
		}
	}
	return nil, nil
}
