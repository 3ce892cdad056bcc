package sidecar

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadCPUTime is the CPU time the calling OS thread has used, from
// clock_gettime(CLOCK_THREAD_CPUTIME_ID) (clock_gettime(2); the kernel's
// per-thread sum of user and system time, in nanoseconds). It is the
// render's own CPU time only while the render's goroutine is locked to its
// thread (runtime.LockOSThread, see compiledTemplate.execute): then no
// other goroutine runs on that thread, and time the goroutine spends
// runnable but not running (CPU starvation) is not counted. ok is false
// when the clock cannot be read (seccomp, an exotic kernel); the render
// then has only its wall-clock bound.
func threadCPUTime() (d time.Duration, ok bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
