package operator

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/test/cluster"
)

// heapPeak samples the heap of this process, which runs the manager and
// its validating webhook, until stop is called; it returns the highest
// HeapAlloc above the value at start.
func heapPeak() (stop func() uint64) {
	var base runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	ctx, done := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var m runtime.MemStats
		cluster.Every(ctx, 5*time.Millisecond, func(context.Context) {
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > base.HeapAlloc && m.HeapAlloc-base.HeapAlloc > peak.Load() {
				peak.Store(m.HeapAlloc - base.HeapAlloc)
			}
		})
	}()
	return func() uint64 { done(); wg.Wait(); return peak.Load() }
}

// A template bomb applied through the API server (dry-run, as anyone with
// create on SidecarInjector can) is denied by the validating webhook with a
// message naming the template and the limit, within the webhook's timeout,
// and the manager's heap stays bounded. Before the render bounds, the
// first was admitted after 3 s (a 20 MB annotation, 180 MB allocated) and
// the second ran on after the API server's 5 s timeout.
func TestTemplateBombDenied(t *testing.T) {
	ctx := cluster.TestContext(t, 3*time.Minute)
	c := env.Client
	// The webhook is live once a plainly bad CR is denied (startup: the
	// configuration or the certificate may not be served yet).
	probe := cluster.SampleInjector(t, "bomb-probe")
	probe.Spec.Templates[0].Template = "{{ nosuchfunc }}"
	err := cluster.WaitFor(ctx, 60*time.Second, "validating webhook live", func(ctx context.Context) (bool, error) {
		err := c.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		return err != nil && strings.Contains(err.Error(), "denied the request"), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, body, limit string
	}{
		{"until", `{{ range until 20000000 }}x{{ end }}`, "MaxValueBytes"},
		{"output", `{{ range until 60000 }}{{ repeat 100 "x" }}{{ end }}`, "MaxRenderBytes"},
		{"loops", `{{ $l := until 60000 }}{{ range $l }}{{ range $l }}{{ end }}{{ end }}`, "MaxRender"},
		{"doubling", `{{ $s := "x" }}{{ range until 64 }}{{ $s = print $s $s }}{{ end }}{{ $s }}`, "MaxValueBytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			si := cluster.SampleInjector(t, "bomb-"+tc.name)
			si.Spec.Templates = append(si.Spec.Templates, v1alpha1.NamedTemplate{Name: "bomb",
				Template: "metadata:\n  annotations:\n    x: \"" + tc.body + "\"\n"})
			stop := heapPeak()
			start := time.Now()
			denied := c.Create(ctx, si.DeepCopy(), client.DryRunAll)
			took := time.Since(start)
			peak := stop()
			if denied == nil || !strings.Contains(denied.Error(), "denied the request") {
				t.Fatalf("bomb not denied by the webhook after %s (heap peak +%d MiB): %v", took, peak>>20, denied)
			}
			t.Logf("denied in %s, heap peak +%d MiB: %v", took.Round(time.Millisecond), peak>>20, denied)
			for _, want := range []string{"SidecarInjector bomb-" + tc.name, `template "bomb"`, tc.limit} {
				if !strings.Contains(denied.Error(), want) {
					t.Errorf("denial lacks %q", want)
				}
			}
			if !apierrors.IsInvalid(denied) {
				t.Errorf("denial is not 422 Invalid: %v", denied)
			}
			// The webhook's own answer, not the API server's 5 s timeout:
			// the message above already proves it; this bounds memory.
			if peak > 256<<20 {
				t.Errorf("manager heap grew by %d MiB", peak>>20)
			}
		})
	}
}
