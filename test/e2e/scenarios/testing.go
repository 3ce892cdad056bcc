package scenarios

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// TestMain is the TestMain of a package whose tests run scenarios: it
// starts the demo's stack, sets *env to it, runs m's tests, stops the
// stack and fails when anything outlives it (processes, the real node's
// containers, cgroups, mounts, network, CNI and log files). It returns
// the exit code.
func TestMain(m *testing.M, env **Env) int {
	// envtest logs through controller-runtime; the test process has
	// nothing else to say there (the operator and servers log to files).
	ctrllog.SetLogger(logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	code := 1
	start := time.Now()
	e, err := Start(ctx, Options{
		Logf: func(f string, a ...any) { fmt.Printf(f+"\n", a...) },
	})
	*env = e
	fmt.Printf("e2e: stack up in %s\n", time.Since(start).Round(time.Millisecond))
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: start:", err)
	} else {
		code = m.Run()
		if code != 0 {
			fmt.Fprintf(os.Stderr, "pods in %s:\n%s", OperatorNamespace, e.PodsLogTail(ctx))
		}
	}
	if e != nil && e.Cluster != nil {
		e.Stop()
		for _, l := range e.Cluster.Leaks() {
			fmt.Fprintln(os.Stderr, "leak:", l)
			code = 1
		}
	}
	return code
}

// RunInOrder runs list on e as subtests of t, in order; each depends on
// the state the previous one leaves, so a failure stops the rest. A
// scenario fails on its own errors, never on a duration: a timing over
// its issue's bound is logged as a figure.
func RunInOrder(t *testing.T, e *Env, list []Scenario) {
	for _, s := range list {
		ok := t.Run(s.Name, func(t *testing.T) {
			ctx, cancel := s.Context(context.Background())
			defer cancel()
			r := Run(ctx, e, s)
			var b bytes.Buffer
			r.Write(&b)
			t.Log("\n" + b.String())
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			for _, tm := range r.Timings {
				if tm.Bound > 0 && tm.Took > tm.Bound {
					t.Logf("figure over its bound: %s took %s (the issue's bound %s; a loaded machine stretches it)", tm.What, tm.Took, tm.Bound)
				}
			}
		})
		if !ok {
			t.FailNow()
		}
	}
}
