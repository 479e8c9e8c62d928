package consumers_test

import (
	"testing"
	"time"

	"github.com/paygate/paygate/consumers"
)

// Backoff: exponential from the base, capped, and jittered over the whole of [0, cap).
func TestBackoff(t *testing.T) {
	const base, maxDelay = 100 * time.Millisecond, 5 * time.Second
	for attempt := 1; attempt <= 70; attempt++ {
		ceiling := maxDelay
		if attempt < 7 {
			ceiling = base << (attempt - 1)
		}
		seen := map[time.Duration]bool{}
		for range 200 {
			d := consumers.Backoff(attempt, base, maxDelay)
			if d < 0 || d >= ceiling {
				t.Fatalf("attempt %d: %v outside [0, %v)", attempt, d, ceiling)
			}
			seen[d] = true
		}
		if len(seen) < 100 {
			t.Fatalf("attempt %d: only %d distinct delays in 200: not jittered", attempt, len(seen))
		}
	}
}
