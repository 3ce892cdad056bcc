package oversell

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hookwright/hookwright/webhooks/serving"
)

// Label bounds. Node and user names come from request bodies, which any
// client that reaches the Service can write, so each label takes a bounded
// set of values. maxNodeSeries is Kubernetes' largest supported cluster
// (5,000 nodes: kubernetes.io/docs/setup/best-practices/cluster-large);
// nodes beyond it get no per-node gauges and are counted in
// hookwright_oversell_node_series_dropped_total. Users beyond maxUserSeries
// are counted under otherUser; the handler also logs each such write with
// its user. Each value is bounded in length too, or a few thousand names of
// a body's size (3 MiB) would hold gigabytes: a node name longer than a
// Node's (a DNS subdomain, 253 bytes) gets no series, a user name longer
// than maxUserLabelBytes counts under otherUser.
const (
	maxNodeSeries     = 5000
	maxUserSeries     = 100
	maxNodeLabelBytes = 253
	maxUserLabelBytes = 512
	otherUser         = "other"
)

// labelSet admits at most max distinct values of at most maxLen bytes,
// first come; forget makes room again.
type labelSet struct {
	mu     sync.Mutex
	max    int
	maxLen int
	seen   map[string]struct{}
}

func newLabelSet(max, maxLen int) *labelSet {
	return &labelSet{max: max, maxLen: maxLen, seen: map[string]struct{}{}}
}

// admit reports whether v is, or now becomes, one of the set's values; a
// value longer than maxLen never is.
func (s *labelSet) admit(v string) bool {
	if len(v) > s.maxLen {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.seen[v]; ok {
		return true
	}
	if len(s.seen) >= s.max {
		return false
	}
	s.seen[v] = struct{}{}
	return true
}

func (s *labelSet) forget(v string) {
	s.mu.Lock()
	delete(s.seen, v)
	s.mu.Unlock()
}

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
	// NodeSeriesDropped counts applied decisions for nodes beyond
	// maxNodeSeries, whose gauges were not recorded.
	NodeSeriesDropped prometheus.Counter

	nodes, users *labelSet
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
			Help: "Node status reviews by outcome (patched, held, unchanged, skipped, ignored, error), writer class and reason.",
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
		NodeSeriesDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hookwright_oversell_node_series_dropped_total",
			Help: "Applied decisions for nodes beyond the per-node series bound (5000 nodes), whose gauges were not recorded.",
		}),
		nodes: newLabelSet(maxNodeSeries, maxNodeLabelBytes),
		users: newLabelSet(maxUserSeries, maxUserLabelBytes),
	}
	if err := serving.Register(reg, m.RawAllocatable, m.EffectiveAllocatable, m.Ratio, m.Mutations,
		m.UntrustedAllocatableWrites, m.Duration, m.ConfigRejected, m.Policies, m.NodeSeriesDropped); err != nil {
		return nil, err
	}
	return m, nil
}

// untrustedWrite counts a non-reporting allocatable write by user, or by
// otherUser once maxUserSeries users have been seen.
func (m *Metrics) untrustedWrite(user string) {
	if !m.users.admit(user) {
		user = otherUser
	}
	m.UntrustedAllocatableWrites.WithLabelValues(user).Inc()
}

// observeNode updates the per-node gauges after an applied decision; a
// restored node's series are deleted and its place in the bound freed.
func (m *Metrics) observeNode(node string, d *Decision) {
	if d.Restore {
		for r := Resource(0); r < numResources; r++ {
			m.RawAllocatable.DeleteLabelValues(node, resourceNames[r])
			m.EffectiveAllocatable.DeleteLabelValues(node, resourceNames[r])
			m.Ratio.DeleteLabelValues(node, resourceNames[r])
		}
		m.nodes.forget(node)
		return
	}
	if !m.nodes.admit(node) {
		m.NodeSeriesDropped.Inc()
		return
	}
	for r := Resource(0); r < numResources; r++ {
		if !d.Present[r] {
			continue
		}
		ratio := 1.0
		if d.Ratio[r].IsSet() {
			ratio = d.Ratio[r].float()
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
