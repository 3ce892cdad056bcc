package serving

import "github.com/prometheus/client_golang/prometheus"

// Register registers every collector on reg and returns the first error
// (e.g. a second registration of the same series). It is the one metrics
// convention of the servers: each builds its series in NewMetrics(reg)
// from a registry it is given (controller-runtime's metrics.Registry in
// the binary, a fresh prometheus.NewRegistry() in tests), never in init().
func Register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
