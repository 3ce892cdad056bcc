package scenarios

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"
)

// Result is what a scenario checked and measured.
type Result struct {
	// Name is the scenario's title, e.g. "1. Injection".
	Name string
	// Checks are the facts verified, in order.
	Checks []string
	// Timings are the measured durations with the bounds.
	Timings []Timing
	// Took is the scenario's wall time.
	Took time.Duration
	// Err is the first check that failed; the scenario stops there.
	Err error
}

// Timing is a measured duration and the bound the issue sets (0: none).
type Timing struct {
	What  string
	Took  time.Duration
	Bound time.Duration
}

// WithinBound reports whether the timing meets the bound.
func (t Timing) WithinBound() bool { return t.Bound == 0 || t.Took <= t.Bound }

func (r *Result) check(format string, args ...any) {
	r.Checks = append(r.Checks, fmt.Sprintf(format, args...))
}

func (r *Result) timing(what string, took, bound time.Duration) {
	r.Timings = append(r.Timings, Timing{What: what, Took: took, Bound: bound})
}

// Passed reports no failed check and every timing within its bound.
func (r *Result) Passed() bool {
	if r.Err != nil {
		return false
	}
	for _, t := range r.Timings {
		if !t.WithinBound() {
			return false
		}
	}
	return true
}

// Write prints the result as a short readable block.
func (r *Result) Write(w io.Writer) {
	status := "PASS"
	switch {
	case r.Err != nil:
		status = "FAIL"
	case !r.Passed():
		status = "SLOW"
	}
	fmt.Fprintf(w, "%s  %s (%s)\n", status, r.Name, r.Took.Round(100*time.Millisecond))
	for _, c := range r.Checks {
		fmt.Fprintf(w, "      ok    %s\n", c)
	}
	for _, t := range r.Timings {
		mark := "time"
		if !t.WithinBound() {
			mark = "SLOW"
		}
		bound := ""
		if t.Bound > 0 {
			bound = fmt.Sprintf(" (issue's bound %s)", t.Bound)
		}
		fmt.Fprintf(w, "      %s  %-58s %8s%s\n", mark, t.What, fmtDur(t.Took), bound)
	}
	if r.Err != nil {
		fmt.Fprintf(w, "      FAIL  %s\n", strings.ReplaceAll(r.Err.Error(), "\n", "\n            "))
	}
}

func fmtDur(d time.Duration) string {
	if d < 10*time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(100 * time.Millisecond).String()
}

// Scenario is one of the end-to-end scenarios.
type Scenario struct {
	Name string
	Run  func(ctx context.Context, e *Env, r *Result) error
	// Timeout bounds the scenario; DefaultTimeout when zero.
	Timeout time.Duration
}

// DefaultTimeout bounds a scenario that sets no Timeout: a deadline for
// a machine loaded far beyond the scenarios' own minute or two.
const DefaultTimeout = 10 * time.Minute

// Context returns ctx bounded by the scenario's timeout.
func (s Scenario) Context(ctx context.Context) (context.Context, context.CancelFunc) {
	t := s.Timeout
	if t == 0 {
		t = DefaultTimeout
	}
	return context.WithTimeout(ctx, t)
}

// All are the scenarios in the order `make demo` runs them (each leaves the
// stack as the next expects it). A new one goes at the end: from scenario
// 7 on, the operator is the one `make run-bundle-upgrade VERSION=0.1.1`
// installed (CSV hookwright.v0.1.1 in OperatorNamespace) with
// config/samples applied and Ready.
var All = append(append([]Scenario(nil), Ordered...), Usage)

// Ordered are scenarios 1 to 8, which test/e2e runs on one stack.
var Ordered = []Scenario{
	{Name: "1. Injection", Run: Injection},
	{Name: "2. Oversell", Run: Oversell},
	{Name: "3. Hot reload", Run: HotReload},
	{Name: "4. Self-healing webhooks", Run: SelfHealing},
	{Name: "5. OLM", Run: OLMInstall},
	// Two waits for admissions and one for the rotation, each minutes long
	// on a starved machine.
	{Name: "6. CA rotation under load", Run: Rotation, Timeout: 15 * time.Minute},
	// Two image builds and two OLM installs: longer than the others.
	{Name: "7. operator-sdk run bundle", Run: RunBundle, Timeout: 15 * time.Minute},
	// In place, an outage's missing pods, Restart, and back (lab as before).
	{Name: "8. Rollout", Run: Rollout, Timeout: 10 * time.Minute},
}

// Usage is scenario 9. It needs only an operator install, whichever
// scenario left it, so make test runs it on a stack of its own
// (test/e2e/standalone) beside test/e2e: the suite's longest package is
// then two shorter ones.
var Usage = Scenario{Name: "9. Usage-aware oversell and held cuts", Run: UsageAware}

// Standalone are the scenarios test/e2e/standalone runs on a fresh stack:
// scenario 9, then a real Prometheus scraping it and the Helm chart (not
// the demo's: they need prometheus and helm, which the demo does not build).
var Standalone = []Scenario{Usage,
	{Name: "Prometheus scraping the demo", Run: Prometheus, Timeout: 10 * time.Minute},
	{Name: "Helm chart on the real node", Run: Helm, Timeout: 15 * time.Minute}}

// README is the README's "OLM without Docker" block (READMEOLM), which
// test/e2e runs after Ordered.
var README = Scenario{Name: "README: OLM without Docker", Run: READMEOLM, Timeout: 15 * time.Minute}

// Run runs s and returns its result.
func Run(ctx context.Context, e *Env, s Scenario) *Result {
	r := &Result{Name: s.Name}
	start := time.Now()
	r.Err = s.Run(ctx, e, r)
	r.Took = time.Since(start)
	return r
}
