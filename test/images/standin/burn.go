package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
)

// burner spins goroutines while on: the CPU usage metrics-server measures
// for the pod, up to the container's cpu limit.
type burner struct {
	on   atomic.Bool
	mu   sync.Mutex
	wake *sync.Cond
	// spins counts loop rounds, so a test sees the burner work.
	spins atomic.Uint64
}

func newBurner(ctx context.Context, threads int, on bool) *burner {
	b := &burner{}
	b.wake = sync.NewCond(&b.mu)
	b.on.Store(on)
	for range threads {
		go b.spin(ctx)
	}
	go func() {
		<-ctx.Done()
		b.set(false)
		b.mu.Lock()
		b.wake.Broadcast()
		b.mu.Unlock()
	}()
	return b
}

func (b *burner) spin(ctx context.Context) {
	for ctx.Err() == nil {
		if !b.on.Load() {
			b.mu.Lock()
			for !b.on.Load() && ctx.Err() == nil {
				b.wake.Wait()
			}
			b.mu.Unlock()
			continue
		}
		x := uint64(1)
		for i := 0; i < 1<<20; i++ {
			x = x*6364136223846793005 + 1442695040888963407
		}
		b.spins.Add(x&1 + 1)
	}
}

func (b *burner) set(on bool) {
	b.mu.Lock()
	b.on.Store(on)
	b.wake.Broadcast()
	b.mu.Unlock()
}

func (b *burner) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/on", func(w http.ResponseWriter, _ *http.Request) {
		b.set(true)
		fmt.Fprintln(w, "burning")
	})
	mux.HandleFunc("/off", func(w http.ResponseWriter, _ *http.Request) {
		b.set(false)
		fmt.Fprintln(w, "idle")
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "burning=%t spins=%d\n", b.on.Load(), b.spins.Load())
	})
	return mux
}
