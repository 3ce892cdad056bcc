package sidecar

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hookwright/hookwright/webhooks/serving"
)

// Metrics are the injector's Prometheus series. Reason labels take code
// values or the handler's failure reasons, so cardinality stays bounded;
// injector is the SidecarInjector's name.
type Metrics struct {
	requests, injections, skips, failures *prometheus.CounterVec
	warnings, configErrors                *prometheus.CounterVec
	duration                              *prometheus.HistogramVec
	configGeneration                      *prometheus.GaugeVec
}

// NewMetrics creates the series and registers them on reg (controller-runtime's
// metrics.Registry in the server, served on its metrics endpoint). It
// returns the registration error, e.g. when called twice on one registry.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hookwright_sidecar_injection_requests_total",
			Help: "Admission requests received, by injector and outcome (Injected, Skipped, Failed).",
		}, []string{"injector", "outcome"}),
		injections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hookwright_sidecar_injections_total",
			Help: "Pods injected, by injector and deciding rule.",
		}, []string{"injector", "reason"}),
		skips: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hookwright_sidecar_injection_skips_total",
			Help: "Pods not injected, by injector and deciding rule.",
		}, []string{"injector", "reason"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hookwright_sidecar_injection_failures_total",
			Help: "Requests that could not be served, by injector and reason.",
		}, []string{"injector", "reason"}),
		warnings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hookwright_sidecar_injection_warnings_total",
			Help: "Admission warnings returned (ignored label/annotation values, allowed render failures).",
		}, []string{"injector"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "hookwright_sidecar_injection_duration_seconds",
			Help: "Time to answer an admission request, from body read to response written.",
			// 0.5 ms to 10 s: injection normally takes well under 10 ms.
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
		}, []string{"injector"}),
		configGeneration: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hookwright_sidecar_config_generation",
			Help: "Generation of the SidecarInjector being served.",
		}, []string{"injector"}),
		configErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hookwright_sidecar_config_errors_total",
			Help: "SidecarInjector versions that failed to compile and were not loaded.",
		}, []string{"injector"}),
	}
	if err := serving.Register(reg, m.requests, m.injections, m.skips, m.failures,
		m.warnings, m.duration, m.configGeneration, m.configErrors); err != nil {
		return nil, err
	}
	return m, nil
}

// Failure reasons of the handler.
const (
	failBadMethod     = "BadMethod"
	failContentType   = "ContentType"
	failTooLarge      = "TooLarge"
	failTimeout       = "BodyTimeout" // body not received within the request timeout
	failBusy          = "Busy"        // in-flight body budget full
	failBadReview     = "BadAdmissionReview"
	failWrongResource = "WrongResource"
	failDecode        = "PodDecode"
	failRender        = "Render"
	failNoConfig      = "NoConfig"
	failInternal      = "Internal"
	// failCanceled: the request context ended (API server timeout) mid-render.
	failCanceled       = "Canceled"
	outcomeInjected    = "Injected"
	outcomeSkipped     = "Skipped"
	outcomeFailed      = "Failed"
	outcomeRenderAllow = "RenderFailedAllowed"
)

// recordConfig sets the served-generation gauge; Store.Offer calls it after
// every swap.
func (m *Metrics) recordConfig(c *Config) {
	m.configGeneration.WithLabelValues(c.Name).Set(float64(c.Generation))
}

// recordConfigError counts a SidecarInjector version that did not compile.
func (m *Metrics) recordConfigError(injector string) {
	m.configErrors.WithLabelValues(injector).Inc()
}

// fail counts a request that could not be served.
func (m *Metrics) fail(injector, reason string) {
	m.requests.WithLabelValues(injector, outcomeFailed).Inc()
	m.failures.WithLabelValues(injector, reason).Inc()
}
