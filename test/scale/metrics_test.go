package scale

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// families parses a Prometheus text exposition.
func families(body []byte) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(bytes.NewReader(body))
}

// sum adds the values of family name's series whose labels match want
// ("" matches an absent or empty label; a label in want that a series
// lacks matches only "").
func sum(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f := fams[name]
	if f == nil {
		return 0
	}
	total := 0.0
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		ok := true
		for k, v := range want {
			if labels[k] != v {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		switch {
		case m.Counter != nil:
			total += m.Counter.GetValue()
		case m.Gauge != nil:
			total += m.Gauge.GetValue()
		case m.Untyped != nil:
			total += m.Untyped.GetValue()
		}
	}
	return total
}

// apiCounters are the kube-apiserver counters the measurement reads.
type apiCounters struct {
	statusPatches float64 // PATCH nodes/status (apiserver_request_total)
	nodeGets      float64 // GET nodes
	leaseUpdates  float64 // PUT leases
	nodeWrites    float64 // etcd updates of nodes (etcd_requests_total)
	leaseWrites   float64 // etcd updates of leases
	webhookCalls  float64 // calls of the oversell webhook (apiserver_admission_webhook_admission_duration_seconds_count)
}

func (a apiCounters) minus(b apiCounters) apiCounters {
	return apiCounters{
		statusPatches: a.statusPatches - b.statusPatches,
		nodeGets:      a.nodeGets - b.nodeGets,
		leaseUpdates:  a.leaseUpdates - b.leaseUpdates,
		nodeWrites:    a.nodeWrites - b.nodeWrites,
		leaseWrites:   a.leaseWrites - b.leaseWrites,
		webhookCalls:  a.webhookCalls - b.webhookCalls,
	}
}

// readAPI scrapes kube-apiserver's /metrics.
func readAPI(ctx context.Context) (apiCounters, error) {
	body, err := env.Clientset.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return apiCounters{}, fmt.Errorf("kube-apiserver /metrics: %w", err)
	}
	fams, err := families(body)
	if err != nil {
		return apiCounters{}, err
	}
	// etcd_requests_total labels its object type "resource" (and "group")
	// in current releases, "type" in older ones.
	etcd := func(op, res string) float64 {
		return sum(fams, "etcd_requests_total", map[string]string{"operation": op, "resource": res}) +
			sum(fams, "etcd_requests_total", map[string]string{"operation": op, "type": res})
	}
	var webhook float64
	if f := fams["apiserver_admission_webhook_admission_duration_seconds"]; f != nil {
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if l.GetName() == "name" && l.GetValue() == webhookName && m.Histogram != nil {
					webhook += float64(m.Histogram.GetSampleCount())
				}
			}
		}
	}
	return apiCounters{
		statusPatches: sum(fams, "apiserver_request_total", map[string]string{"verb": "PATCH", "resource": "nodes", "subresource": "status"}),
		nodeGets:      sum(fams, "apiserver_request_total", map[string]string{"verb": "GET", "resource": "nodes", "subresource": ""}),
		leaseUpdates:  sum(fams, "apiserver_request_total", map[string]string{"verb": "PUT", "resource": "leases"}),
		nodeWrites:    etcd("update", "nodes"),
		leaseWrites:   etcd("update", "leases"),
		webhookCalls:  webhook,
	}, nil
}

// serverCounters are the oversell server's own figures.
type serverCounters struct {
	reviews float64 // hookwright_oversell_mutations_total, all outcomes
	held    float64 // outcome="held"
	cpu     float64 // process_cpu_seconds_total
	rss     float64 // process_resident_memory_bytes
	// policies is hookwright_oversell_policies (valid NodeOversells served).
	policies float64
}

func (s *server) read(ctx context.Context) (serverCounters, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/metrics", s.metricsPort), nil)
	if err != nil {
		return serverCounters{}, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return serverCounters{}, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return serverCounters{}, err
	}
	if res.StatusCode != http.StatusOK {
		return serverCounters{}, fmt.Errorf("server /metrics: %s: %s", res.Status, strings.TrimSpace(string(body)))
	}
	fams, err := families(body)
	if err != nil {
		return serverCounters{}, err
	}
	return serverCounters{
		reviews:  sum(fams, "hookwright_oversell_mutations_total", nil),
		held:     sum(fams, "hookwright_oversell_mutations_total", map[string]string{"outcome": "held"}),
		cpu:      sum(fams, "process_cpu_seconds_total", nil),
		rss:      sum(fams, "process_resident_memory_bytes", nil),
		policies: sum(fams, "hookwright_oversell_policies", nil),
	}, nil
}
