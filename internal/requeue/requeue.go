// Package requeue holds the one piece of requeue arithmetic the operator's
// reconcilers and planners share. It is pure and imports only the standard
// library.
package requeue

import "time"

// Sooner returns the earlier of two requeue delays, where 0 (or less)
// means "no requeue asked" (controller-runtime's Result.RequeueAfter): a
// non-positive delay never wins over a positive one.
func Sooner(a, b time.Duration) time.Duration {
	switch {
	case a <= 0:
		return b
	case b <= 0:
		return a
	}
	return min(a, b)
}
