package requeue

import (
	"testing"
	"time"
)

func TestSooner(t *testing.T) {
	for _, tc := range []struct{ a, b, want time.Duration }{
		{0, 0, 0},
		{0, time.Second, time.Second},
		{time.Second, 0, time.Second},
		{-time.Second, 2 * time.Second, 2 * time.Second},
		{time.Second, 2 * time.Second, time.Second},
		{3 * time.Second, 2 * time.Second, 2 * time.Second},
	} {
		if got := Sooner(tc.a, tc.b); got != tc.want {
			t.Errorf("Sooner(%s, %s) = %s, want %s", tc.a, tc.b, got, tc.want)
		}
	}
}
