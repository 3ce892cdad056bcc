package cluster

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// TestContext is a context for one test, cancelled when it ends. d is
// what the test needs on an idle machine; the deadline is three times that
// and at least 10 min, since it only guards against a hang and a loaded
// 2-core machine runs a test two to three times slower.
func TestContext(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), max(3*d, 10*time.Minute))
	t.Cleanup(cancel)
	return ctx
}

// Condition is what a poll asks: true once the awaited state holds. An
// error is remembered and polling goes on, unless it is Permanent.
type Condition func(context.Context) (bool, error)

// WaitFor polls cond every 100 ms until it returns true, its error is
// permanent (wrapped in Permanent), ctx ends or timeout passes. The error
// names what was awaited and the last condition error.
func WaitFor(ctx context.Context, timeout time.Duration, what string, cond Condition) error {
	_, err := Poll(ctx, 100*time.Millisecond, timeout, what, cond)
	return err
}

// Poll is WaitFor at another interval (a measured wait polls every few
// milliseconds, so the figure is not rounded up to the interval), and it
// returns how long cond took to hold. The first call is at once. The wait
// between calls grows with the time already waited, to a twentieth of it
// but never past MaxPollGap (nor below interval): a figure stays within
// 5 % of the truth, while a wait of minutes does not send the API server
// 200 requests a second (in test/operator those polls cost its API
// server 12 of 124 CPU-seconds on 2 cores; the suite is CPU-bound).
func Poll(ctx context.Context, interval, timeout time.Duration, what string, cond Condition) (time.Duration, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	tick := time.NewTimer(interval)
	defer tick.Stop()
	for {
		ok, err := cond(ctx)
		if err != nil {
			var perm *permanentError
			if errors.As(err, &perm) {
				return time.Since(start), fmt.Errorf("%s: %w", what, perm.err)
			}
			last = err
		}
		if ok {
			return time.Since(start), nil
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return time.Since(start), fmt.Errorf("timed out after %s waiting for %s; last error: %w", timeout, what, last)
			}
			return time.Since(start), fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		case <-tick.C:
			tick.Reset(pollGap(interval, time.Since(start)))
		}
	}
}

// MaxPollGap bounds how far Poll stretches a short interval.
const MaxPollGap = 100 * time.Millisecond

// pollGap is the wait before Poll's next call after waited: interval,
// stretched to waited/20 up to MaxPollGap; an interval above MaxPollGap
// stays as it is.
func pollGap(interval, waited time.Duration) time.Duration {
	gap := min(waited/20, MaxPollGap)
	return max(gap, interval)
}

// During calls check every interval for d (the first call at once) and
// returns its first error: for what must keep holding, not become true.
// It returns ctx's error if ctx ends first.
func During(ctx context.Context, d, interval time.Duration, check func(context.Context) error) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if err := check(ctx); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
	return nil
}

// Every calls fn at once and then interval after each call returns, until
// ctx ends: the loop of a load generator or a sampler running beside a
// test. It returns when ctx ends.
func Every(ctx context.Context, interval time.Duration, fn func(context.Context)) {
	for ctx.Err() == nil {
		fn(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(interval):
		}
	}
}

type permanentError struct{ err error }

func (p *permanentError) Error() string { return p.err.Error() }

// Permanent marks a Condition's error as final: the poll stops with it.
func Permanent(err error) error { return &permanentError{err: err} }

// WatchFunc opens a watch from the options' resourceVersion, e.g. a
// typed client's Watch with a field or label selector set.
type WatchFunc func(context.Context, metav1.ListOptions) (watch.Interface, error)

// Watch calls each on every event of the watch w opens from
// resourceVersion rv, in order, until each returns true or an error, ctx
// ends or timeout passes; the error names what was awaited. It is for
// what a poll can miss: a state that does not last, or a count of writes
// (a heartbeat, a renewal). A watch the API server closes is reopened
// where it stopped (client-go's RetryWatcher), so no event is missed; one
// that cannot resume (an Error event, e.g. 410 Gone) fails Watch.
func Watch(ctx context.Context, timeout time.Duration, what, rv string, w WatchFunc, each func(watch.Event) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	lw := &cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		return w(ctx, o)
	}}
	_, err := watchtools.Until(ctx, rv, lw, func(ev watch.Event) (bool, error) {
		if ev.Type == watch.Error {
			// E.g. 410 Gone: the watch cannot resume, events were lost.
			return false, fmt.Errorf("watch ended: %w", apierrors.FromObject(ev.Object))
		}
		return each(ev)
	})
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil && wait.Interrupted(err):
		return fmt.Errorf("timed out after %s watching for %s", timeout, what)
	default:
		return fmt.Errorf("%s: %w", what, err)
	}
}
