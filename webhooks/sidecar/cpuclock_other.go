//go:build !linux

package sidecar

import "time"

// threadCPUTime reports no thread clock off Linux (the servers run on
// Linux; this keeps kube-inject building elsewhere): there the CPU budget
// is measured on the wall clock, as every budget was before the meter.
func threadCPUTime() (time.Duration, bool) { return 0, false }
