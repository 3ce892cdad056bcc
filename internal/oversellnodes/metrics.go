package oversellnodes

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/hookwright/hookwright/webhooks/oversell"
)

// maxNodeSeries bounds the per-node series of one NodeOversell, as the
// oversell server bounds its own; the counts by source cover every node.
const maxNodeSeries = 5000

// Operator metrics of the usage-aware ratio, the holds and the back-off,
// served on the manager's metrics endpoint.
var (
	nodeRatio = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "hookwright_oversell_node_target_ratio",
		Help: "The ratio the operator set for a node (its target annotation), by resource and source (static, usage, fallback, pressure).",
	}, []string{"nodeoversell", "node", "resource", "source"})
	nodesBySource = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "hookwright_oversell_nodes_by_source",
		Help: "Nodes of a NodeOversell by the source of their cpu ratio (static, usage, fallback, pressure) and held (above their target for their pods).",
	}, []string{"nodeoversell", "source"})
	targetWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hookwright_oversell_target_writes_total",
		Help: "nodes/status writes of a node's target (a changed ratio, source, hold or pressure state, or a release).",
	}, []string{"nodeoversell"})
	taintWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hookwright_oversell_taint_writes_total",
		Help: "Writes of the NoSchedule taint oversell.hookwright.io/held, by the value set (ratio-cut, pressure, or \"\" for removed).",
	}, []string{"value"})
	targetMetricErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hookwright_oversell_usage_metrics_errors_total",
		Help: "Passes of a usage-aware NodeOversell that could not read metrics.k8s.io (every node fell back).",
	}, []string{"nodeoversell"})
)

func init() {
	metrics.Registry.MustRegister(nodeRatio, nodesBySource, targetWrites, taintWrites, targetMetricErrors)
}

// seriesMu guards the per-node series bookkeeping.
var seriesMu sync.Mutex

// observeTargets replaces one NodeOversell's node series with a pass's.
func observeTargets(name string, outs []*nodeOutcome) {
	seriesMu.Lock()
	defer seriesMu.Unlock()
	nodeRatio.DeletePartialMatch(prometheus.Labels{"nodeoversell": name})
	nodesBySource.DeletePartialMatch(prometheus.Labels{"nodeoversell": name})
	counts := map[string]float64{"static": 0, "usage": 0, "fallback": 0, "pressure": 0, "held": 0}
	n := 0
	for _, o := range outs {
		if o.released {
			continue
		}
		if s := o.d.Source[oversell.CPU]; s != "" {
			counts[s]++
		}
		if len(o.d.Held) > 0 {
			counts["held"]++
		}
		if n >= maxNodeSeries {
			continue
		}
		n++
		for r, x := range o.d.Ratio {
			if x.IsSet() {
				nodeRatio.WithLabelValues(name, o.name, oversell.Resource(r).String(), o.d.Source[r]).Set(float64(x.Micro()) / 1e6)
			}
		}
	}
	for s, c := range counts {
		nodesBySource.WithLabelValues(name, s).Set(c)
	}
}

// ForgetMetrics drops a deleted NodeOversell's series.
func ForgetMetrics(name string) {
	seriesMu.Lock()
	defer seriesMu.Unlock()
	nodeRatio.DeletePartialMatch(prometheus.Labels{"nodeoversell": name})
	nodesBySource.DeletePartialMatch(prometheus.Labels{"nodeoversell": name})
}
