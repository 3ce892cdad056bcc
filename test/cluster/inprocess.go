package cluster

import (
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
	for _, f := range fams {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == controller {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n, nil
}
