package controllers

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/certificates/sources"
)

// Operator metrics, served with controller-runtime's on the manager's
// metrics endpoint. Label "kind" is the CR kind, "name" the CR name.
var (
	servingNotAfter = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "hookwright_serving_certificate_not_after_seconds",
		Help: "NotAfter of each webhook server's serving certificate, in Unix seconds.",
	}, []string{"kind", "name", "namespace", "secret"})
	bundleNotAfter = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "hookwright_cabundle_ca_not_after_seconds",
		Help: "NotAfter of each CA in the caBundle the operator publishes for a CR, in Unix seconds.",
	}, []string{"kind", "name", "ca"})
	driftRepairs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hookwright_drift_repairs_total",
		Help: "Owned objects the operator found changed and re-applied, by CR kind and object kind.",
	}, []string{"kind", "object"})
	repairConflicts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hookwright_repair_conflicts_total",
		Help: "Repairs skipped because another writer exhausted the repair budget of an object.",
	}, []string{"kind", "object"})
)

// The live check of each webhook (probe.go).
var (
	probeTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hookwright_webhook_probe_total",
		Help: "Probes of each webhook through the API server, by result: Reachable or the failing step (a WebhookReachable reason).",
	}, []string{"kind", "name", "result"})
	probeLastSuccess = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "hookwright_webhook_probe_last_success_timestamp_seconds",
		Help: "Start of the last probe that proved the API server calls the webhook and it answers right, in Unix seconds.",
	}, []string{"kind", "name"})
	probeDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "hookwright_webhook_probe_duration_seconds",
		Help:    "Duration of each probe request (the API server's admission round trip), in seconds.",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
	}, []string{"kind"})
)

// recordProbe counts one probe of CR kind/name that started at start.
func recordProbe(kind, name string, out probeOutcome, took time.Duration, start time.Time) {
	probeTotal.WithLabelValues(kind, name, out.Reason).Inc()
	probeDuration.WithLabelValues(kind).Observe(took.Seconds())
	if out.OK {
		probeLastSuccess.WithLabelValues(kind, name).Set(float64(start.UnixNano()) / 1e9)
	}
}

func init() {
	metrics.Registry.MustRegister(servingNotAfter, bundleNotAfter, driftRepairs, repairConflicts, probeTotal, probeLastSuccess, probeDuration)
}

// recordCertificate publishes the certificate figures of one CR.
func recordCertificate(kind, name, namespace, secret string, cs sources.State) {
	servingNotAfter.DeletePartialMatch(prometheus.Labels{"kind": kind, "name": name})
	bundleNotAfter.DeletePartialMatch(prometheus.Labels{"kind": kind, "name": name})
	if !cs.NotAfter.IsZero() {
		servingNotAfter.WithLabelValues(kind, name, namespace, secret).Set(float64(cs.NotAfter.Unix()))
	}
	if cas, err := pki.ParseCertsPEM(cs.CABundle); err == nil {
		for _, ca := range cas {
			bundleNotAfter.WithLabelValues(kind, name, ca.Subject.CommonName).Set(float64(ca.NotAfter.Unix()))
		}
	}
}

// forgetMetrics drops the series of a deleted CR.
func forgetMetrics(kind, name string) {
	probeTotal.DeletePartialMatch(prometheus.Labels{"kind": kind, "name": name})
	probeLastSuccess.DeletePartialMatch(prometheus.Labels{"kind": kind, "name": name})
	servingNotAfter.DeletePartialMatch(prometheus.Labels{"kind": kind, "name": name})
	bundleNotAfter.DeletePartialMatch(prometheus.Labels{"kind": kind, "name": name})
}
