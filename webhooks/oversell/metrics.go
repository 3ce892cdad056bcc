package oversell

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Metrics are the oversell server's Prometheus series. cpu values are in
// cores, memory in bytes, durations in seconds.
type Metrics struct {
	// RawAllocatable, EffectiveAllocatable and Ratio are per node and
	// resource; a restored node's series are deleted.
	RawAllocatable       *prometheus.GaugeVec
	EffectiveAllocatable *prometheus.GaugeVec
	Ratio                *prometheus.GaugeVec
	// Mutations counts reviews by outcome, writer class and reason.
	Mutations *prometheus.CounterVec
	// UntrustedAllocatableWrites counts non-reporting writes that carried a
	// cpu or memory allocatable different from the stored one, by user.
	UntrustedAllocatableWrites *prometheus.CounterVec
	// Duration is the handler latency from request to response.
	Duration prometheus.Histogram
	// ConfigRejected counts NodeOversell versions left out of the snapshot.
	ConfigRejected *prometheus.CounterVec
	// Policies is the number of NodeOversell objects being served.
	Policies prometheus.Gauge
}

// NewMetrics creates the series and registers them on reg (controller-runtime's
// metrics.Registry in the server). It returns the registration error, e.g.
// when called twice on one registry.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		RawAllocatable: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hookwright_oversell_node_raw_allocatable",
			Help: "Real allocatable of an amplified node (cpu in cores, memory in bytes).",
		}, []string{"node", "resource"}),
		EffectiveAllocatable: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hookwright_oversell_node_effective_allocatable",
			Help: "Published (amplified) allocatable of a node (cpu in cores, memory in bytes).",
		}, []string{"node", "resource"}),
		Ratio: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hookwright_oversell_node_ratio",
			Help: "Amplification ratio applied to a node's resource.",
		}, []string{"node", "resource"}),
		Mutations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hookwright_oversell_mutations_total",
			Help: "Node status reviews by outcome (patched, unchanged, skipped, ignored, error), writer class and reason.",
		}, []string{"outcome", "writer", "reason"}),
		UntrustedAllocatableWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hookwright_oversell_untrusted_allocatable_writes_total",
			Help: "Status writes by users other than the node's kubelet or a trusted reporter that tried to change cpu or memory allocatable.",
		}, []string{"user"}),
		Duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "hookwright_oversell_review_duration_seconds",
			Help:    "Time to answer one AdmissionReview, in seconds.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		ConfigRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hookwright_oversell_config_rejected_total",
			Help: "NodeOversell objects ignored because their content is invalid.",
		}, []string{"nodeoversell"}),
		Policies: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hookwright_oversell_policies",
			Help: "Number of valid NodeOversell objects served.",
		}),
	}
	for _, c := range []prometheus.Collector{m.RawAllocatable, m.EffectiveAllocatable, m.Ratio, m.Mutations,
		m.UntrustedAllocatableWrites, m.Duration, m.ConfigRejected, m.Policies} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// observeNode updates the per-node gauges after an applied decision.
func (m *Metrics) observeNode(node string, d *Decision) {
	if d.Restore {
		for r := Resource(0); r < numResources; r++ {
			m.RawAllocatable.DeleteLabelValues(node, resourceNames[r])
			m.EffectiveAllocatable.DeleteLabelValues(node, resourceNames[r])
			m.Ratio.DeleteLabelValues(node, resourceNames[r])
		}
		return
	}
	for r := Resource(0); r < numResources; r++ {
		if !d.Present[r] {
			continue
		}
		ratio := 1.0
		if d.Ratio[r].IsSet() {
			ratio = d.Ratio[r].Float()
		}
		m.RawAllocatable.WithLabelValues(node, resourceNames[r]).Set(metricValue(r, &d.Raw[r]))
		m.EffectiveAllocatable.WithLabelValues(node, resourceNames[r]).Set(metricValue(r, &d.Effective[r]))
		m.Ratio.WithLabelValues(node, resourceNames[r]).Set(ratio)
	}
}

// metricValue is cores for cpu (from whole millicores, so 15.2 stays 15.2)
// and bytes for memory.
func metricValue(r Resource, q *resource.Quantity) float64 {
	if r == CPU {
		return float64(q.MilliValue()) / 1000
	}
	return float64(q.Value())
}
