// Package webhookprobe holds the pure decisions of the operator's live
// check of each webhook (controllers/probe.go is the I/O shell): when a CR's
// next probe is due, which labels make a probe object match a webhook's
// selectors, and which step failed given the API server's answer.
//
// It must not import a Kubernetes client: every function is a function of
// its inputs.
package webhookprobe

import "time"

// Policy is the probe rate of one CR.
type Policy struct {
	// Period is the time between two probes while the webhook answers and
	// nothing changes (steady state).
	Period time.Duration
	// MinGap is the shortest time between two probes of one CR, after a
	// change of its configuration or certificate.
	MinGap time.Duration
	// BackoffBase is the wait after a first failure; it doubles with each
	// further failure in a row, up to BackoffMax.
	BackoffBase, BackoffMax time.Duration
}

// DefaultPolicy is one probe per CR per minute in steady state, failing or
// not; a change is probed 5 s after the previous probe at the soonest.
var DefaultPolicy = Policy{Period: time.Minute, MinGap: 5 * time.Second, BackoffBase: 5 * time.Second, BackoffMax: time.Minute}

// History is what the schedule depends on, for one CR.
type History struct {
	// LastProbe is when the last probe started; zero: never probed.
	LastProbe time.Time
	// LastChange is when the CR's configuration or certificate (its
	// fingerprint) was last seen to change.
	LastChange time.Time
	// Failures counts the failed probes in a row (0: the last one passed).
	Failures int
}

// Wait is how long after now the next probe is due (0: now). Never
// probed: now. Changed since the last probe: MinGap after it. Passing:
// Period after it. Failing: BackoffBase·2^(Failures-1) after it, capped at
// BackoffMax. So with BackoffMax ≤ Period, a CR whose configuration does
// not change is probed at most once per Period after its first failures.
func (p Policy) Wait(h History, now time.Time) time.Duration {
	if h.LastProbe.IsZero() {
		return 0
	}
	var gap time.Duration
	switch {
	case h.LastChange.After(h.LastProbe):
		gap = p.MinGap
	case h.Failures == 0:
		gap = p.Period
	default:
		gap = p.BackoffBase
		for i := 1; i < h.Failures && gap < p.BackoffMax; i++ {
			gap *= 2
		}
		gap = min(gap, p.BackoffMax)
	}
	return max(0, h.LastProbe.Add(gap).Sub(now))
}

// Record returns h after a probe that started at start.
func Record(h History, start time.Time, ok bool) History {
	h.LastProbe = start
	if ok {
		h.Failures = 0
	} else {
		h.Failures++
	}
	return h
}
