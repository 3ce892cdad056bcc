package cluster

import (
	"math"
	"testing"
)

func TestWebhookLatencyMinusAndString(t *testing.T) {
	before := WebhookLatency{Count: 10, Sum: 0.1, Buckets: []LatencyBucket{{0.005, 8}, {0.025, 10}, {0.1, 10}, {1, 10}, {10, 10}}}
	after := WebhookLatency{Count: 110, Sum: 1.6, Buckets: []LatencyBucket{{0.005, 50}, {0.025, 100}, {0.1, 108}, {1, 109}, {10, 109}}}
	d := after.Minus(before)
	if d.Count != 100 || math.Abs(d.Sum-1.5) > 1e-9 {
		t.Fatalf("Minus: %+v", d)
	}
	if got, want := d.String(), "100 calls, mean 15ms; ≤0.005s 42, ≤0.025s 48, ≤0.1s 8, ≤1s 1, >10s 1"; got != want {
		t.Errorf("String:\n got %s\nwant %s", got, want)
	}
	if s := d.Slowest(); !math.IsInf(s, 1) {
		t.Errorf("Slowest with a call over every bound = %g, want +Inf", s)
	}
	in := WebhookLatency{Count: 3, Sum: 0.3, Buckets: []LatencyBucket{{0.005, 0}, {0.025, 1}, {0.1, 2}, {0.5, 3}, {1, 3}}}
	if s := in.Slowest(); s != 0.5 {
		t.Errorf("Slowest = %g, want 0.5", s)
	}
	if got, want := in.String(), "3 calls, mean 100ms; ≤0.025s 1, ≤0.1s 1, ≤0.5s 1"; got != want {
		t.Errorf("String:\n got %s\nwant %s", got, want)
	}
	if s := (WebhookLatency{}).String(); s != "0 calls" {
		t.Errorf("empty: %s", s)
	}
}
