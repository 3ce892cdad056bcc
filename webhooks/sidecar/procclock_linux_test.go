package sidecar

import (
	"time"

	"golang.org/x/sys/unix"
)

// processCPUTime is the CPU time the whole test process has used
// (clock_gettime(CLOCK_PROCESS_CPUTIME_ID): every thread, the garbage
// collector's too), so a cost measured with it does not grow with the
// machine's load as wall time does. ok is false when it cannot be read.
func processCPUTime() (time.Duration, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
