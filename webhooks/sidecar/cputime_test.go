package sidecar

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// burnCR renders n regular expression searches of about 0.1-0.2 ms of CPU
// each (a 4,000-byte input, well within maxCallWork), two steps per
// search, and nothing else that a limit counts.
func burnCR(t *testing.T, n int) *Config {
	t.Helper()
	cfg, err := Compile(bombCR(`x`))
	if err != nil {
		t.Fatal(err)
	}
	cfg.templates["bomb"] = mustBomb(t, `{{ $s := repeat 4000 "a" }}{{ range until `+strconv.Itoa(n)+` }}{{ $_ := regexMatch "(a|aa)*c" $s }}{{ end }}`)
	return cfg
}

func renderBomb(cfg *Config) error {
	_, err := cfg.renderOne(context.Background(), cfg.templates["bomb"], trialData(cfg, false))
	return err
}

func limitOf(err error) string {
	var le *limitError
	if errors.As(err, &le) {
		return le.Limit
	}
	return ""
}

// A template that burns CPU is stopped by the CPU budget (shortened here)
// with the real meter, the render thread's CPU clock.
func TestRenderCPUBudget(t *testing.T) {
	longTimeout(t)          // the wall-clock bound too: only the CPU budget may end it
	cfg := burnCR(t, 20000) // seconds of CPU unbounded
	shortCPU(t, 50*time.Millisecond)
	if err := renderBomb(cfg); limitOf(err) != "MaxRenderCPUTime" {
		t.Fatalf("got %v, want the MaxRenderCPUTime limit", err)
	}
}

// threadCPU runs f on a locked thread and returns the CPU time it used
// there (the render locks the same thread again, so it is the render's).
func threadCPU(t *testing.T, f func()) time.Duration {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c0, ok := threadCPUTime()
	if !ok {
		t.Fatal("no thread CPU clock (clock_gettime CLOCK_THREAD_CPUTIME_ID)")
	}
	f()
	c1, _ := threadCPUTime()
	return c1 - c0
}

// A render starved of CPU (4 threads per core spinning beside it) is not
// denied by the CPU budget: it is charged only the CPU it got, however
// long it waited for it. The budget here is five times what the render
// costs on its own (at least 50 ms), so a wall-clock budget of that size
// would deny it once the spinners stretch it past that (they stretched
// its wall time 7 to 12 times on 2 cores). Only the outcome is asserted;
// the times are logged.
func TestRenderStarvedNotDenied(t *testing.T) {
	longTimeout(t)
	cfg := burnCR(t, 60)
	var alone time.Duration
	var err error
	alone = threadCPU(t, func() { err = renderBomb(cfg) })
	if err != nil {
		t.Fatal(err)
	}
	shortCPU(t, max(50*time.Millisecond, 5*alone))

	// As many Ps as threads, so the spinners compete with the render in the
	// kernel's scheduler as other processes on a loaded node do, slice by
	// slice, not only for a P every 10 ms.
	spinners := 4 * runtime.NumCPU()
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(spinners + 1))
	var stop atomic.Bool
	var running atomic.Int64
	var wg sync.WaitGroup
	for range spinners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			running.Add(1)
			for n := 0; !stop.Load(); n++ {
				_ = n * n
			}
		}()
	}
	for running.Load() < int64(spinners) {
		runtime.Gosched()
	}
	start := time.Now()
	starved := threadCPU(t, func() { err = renderBomb(cfg) })
	wall := time.Since(start)
	stop.Store(true)
	wg.Wait()
	t.Logf("render alone %v of CPU; beside %d spinners %v of CPU in %v of wall time (budget %v of CPU)",
		alone, spinners, starved, wall, renderCPU)
	if err != nil {
		t.Fatalf("starved render denied: %v", err)
	}
}

// With the meter injected, the budget follows the meter and nothing else:
// a meter that reports no CPU lets a render run past a 1 ms budget
// (however long it takes on the wall clock, within the outer bound); one
// that reports a second per reading stops it at the first check; without a
// readable clock the CPU budget is measured on the wall clock; and the
// outer wall-clock bound still ends a render the meter says is idle.
func TestRenderMeterInjected(t *testing.T) {
	longTimeout(t)
	cfg := burnCR(t, 200)
	meter := func(f func() (time.Duration, bool)) {
		cpuMeter = f
		t.Cleanup(func() { cpuMeter = threadCPUTime })
	}
	shortCPU(t, time.Millisecond)

	meter(func() (time.Duration, bool) { return 0, true })
	if err := renderBomb(cfg); err != nil {
		t.Fatalf("idle meter: %v", err)
	}

	var readings atomic.Int64
	meter(func() (time.Duration, bool) { return time.Duration(readings.Add(1)) * time.Second, true })
	if err := renderBomb(cfg); limitOf(err) != "MaxRenderCPUTime" {
		t.Fatalf("busy meter: got %v", err)
	}

	meter(func() (time.Duration, bool) { return 0, false })
	if err := renderBomb(cfg); limitOf(err) != "MaxRenderCPUTime" {
		t.Fatalf("no clock: got %v, want the CPU budget on the wall clock", err)
	}

	meter(func() (time.Duration, bool) { return 0, true })
	renderWall = time.Millisecond
	if err := renderBomb(cfg); limitOf(err) != "MaxRenderWallTime" {
		t.Fatalf("idle meter, 1 ms wall bound: got %v", err)
	}
}

// BenchmarkCPUMeter is the meter's cost: one reading of the thread's CPU
// clock (a render reads it once per 64 steps, plus at its start and end),
// and the thread lock each execution takes.
func BenchmarkCPUMeter(b *testing.B) {
	b.Run("read", func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for b.Loop() {
			if _, ok := threadCPUTime(); !ok {
				b.Fatal("no thread CPU clock")
			}
		}
	})
	b.Run("lock", func(b *testing.B) {
		for b.Loop() {
			runtime.LockOSThread()
			runtime.UnlockOSThread()
		}
	})
}
