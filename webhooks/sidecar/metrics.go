package sidecar

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Metrics, registered on controller-runtime's registry (served on the
// manager's metrics endpoint). Reason labels take Code values or the
// handler's failure reasons, so cardinality stays bounded.
var (
	requestsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hookwright_sidecar_injection_requests_total",
		Help: "Admission requests received, by injector and outcome (Injected, Skipped, Failed).",
	}, []string{"injector", "outcome"})
	injectionsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hookwright_sidecar_injections_total",
		Help: "Pods injected, by injector and deciding rule.",
	}, []string{"injector", "reason"})
	skipsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hookwright_sidecar_injection_skips_total",
		Help: "Pods not injected, by injector and deciding rule.",
	}, []string{"injector", "reason"})
	failuresTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hookwright_sidecar_injection_failures_total",
		Help: "Requests that could not be served, by injector and reason.",
	}, []string{"injector", "reason"})
	warningsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hookwright_sidecar_injection_warnings_total",
		Help: "Admission warnings returned (ignored label/annotation values, allowed render failures).",
	}, []string{"injector"})
	durationSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "hookwright_sidecar_injection_duration_seconds",
		Help: "Time to answer an admission request, from body read to response written.",
		// 0.5 ms to 10 s: injection normally takes well under 10 ms.
		Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
	}, []string{"injector"})
	configGeneration = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "hookwright_sidecar_config_generation",
		Help: "Generation of the SidecarInjector being served.",
	}, []string{"injector"})
	configErrorsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hookwright_sidecar_config_errors_total",
		Help: "SidecarInjector versions that failed to compile and were not loaded.",
	}, []string{"injector"})
)

// Failure reasons of the handler.
const (
	FailBadMethod     = "BadMethod"
	FailContentType   = "ContentType"
	FailTooLarge      = "TooLarge"
	FailTimeout       = "BodyTimeout" // body not received within the request timeout
	FailBusy          = "Busy"        // in-flight body budget full
	FailBadReview     = "BadAdmissionReview"
	FailWrongResource = "WrongResource"
	FailDecode        = "PodDecode"
	FailRender        = "Render"
	FailNoConfig      = "NoConfig"
	FailInternal      = "Internal"
	// FailCanceled: the request context ended (API server timeout) mid-render.
	FailCanceled       = "Canceled"
	outcomeInjected    = "Injected"
	outcomeSkipped     = "Skipped"
	outcomeFailed      = "Failed"
	outcomeRenderAllow = "RenderFailedAllowed"
)

func init() {
	metrics.Registry.MustRegister(requestsTotal, injectionsTotal, skipsTotal, failuresTotal,
		warningsTotal, durationSeconds, configGeneration, configErrorsTotal)
}

// RecordConfig sets the served-generation gauge; call it from Store.OnChange.
func RecordConfig(c *Config) {
	configGeneration.WithLabelValues(c.Name).Set(float64(c.Generation))
}

// RecordConfigError counts a SidecarInjector version that did not compile.
func RecordConfigError(injector string) {
	configErrorsTotal.WithLabelValues(injector).Inc()
}
