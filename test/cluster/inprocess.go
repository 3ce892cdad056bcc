package cluster

import (
	"iter"

	dto "github.com/prometheus/client_model/go"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// ReconcileTotal is controller_runtime_reconcile_total of one controller
// (every result), the reconciles it finished, from controller-runtime's
// registry in this process: for the suites that run the operator
// in-process (test/operator, test/node, test/usage).
func ReconcileTotal(controller string) (float64, error) {
	fams, err := crmetrics.Registry.Gather()
	if err != nil {
		return 0, err
	}
	var n float64
	for m := range Labelled(fams, "controller_runtime_reconcile_total", "controller", controller) {
		n += m.GetCounter().GetValue()
	}
	return n, nil
}

// Labelled yields the metrics of the family named name in fams that have
// the label label=value.
func Labelled(fams []*dto.MetricFamily, name, label, value string) iter.Seq[*dto.Metric] {
	return func(yield func(*dto.Metric) bool) {
		for _, f := range fams {
			if f.GetName() != name {
				continue
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == label && l.GetValue() == value && !yield(m) {
						return
					}
				}
			}
		}
	}
}
