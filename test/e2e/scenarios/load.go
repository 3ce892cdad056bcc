package scenarios

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// startAdmissionLoad sends rate dry-run pod creates per second, in turn
// to each load's namespace, each counted in its load, with at most
// inflight creates waiting at once: a tick that finds them all waiting is
// skipped and counted, as a client's rate limiter would. Uncapped, a
// starved API server piled up goroutines and requests of the harness's
// system:masters client, which API Priority and Fairness exempts, until
// the operator's own Lease renewals timed out (a CPU-bound job beside the
// suite, 2026-12-05). The returned stop ends the load, waits for the
// creates in flight (their answers are not counted) and returns the
// skipped ticks.
func startAdmissionLoad(ctx context.Context, c client.Client, loads []*admissionLoad, rate, inflight int, prefix string) (stop func() int64) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var skipped atomic.Int64
	slots := make(chan struct{}, inflight)
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			select {
			case slots <- struct{}{}:
			default:
				skipped.Add(1)
				continue
			}
			l := loads[i%len(loads)]
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				p := &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{GenerateName: prefix, Namespace: l.ns},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: nginx}}},
				}
				err := c.Create(ctx, p, client.DryRunAll)
				if ctx.Err() == nil {
					l.record(p, err)
				}
			}()
		}
	}()
	return func() int64 {
		cancel()
		wg.Wait()
		return skipped.Load()
	}
}
