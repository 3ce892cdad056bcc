//go:build !linux

package sidecar

import "time"

// processCPUTime reports no process clock off Linux: costs are measured on
// the wall clock there.
func processCPUTime() (time.Duration, bool) { return 0, false }
