package consumers

import (
	"math/rand/v2"
	"time"
)

// Backoff is the wait before transient attempt number attempt (1 for the first retry): exponential from
// base, capped at maxDelay, with full jitter (uniform in [0, cap)), so retries of many jobs (or
// reconnections of many workers) spread out.
func Backoff(attempt int, base, maxDelay time.Duration) time.Duration {
	ceiling := maxDelay
	if shift := max(attempt, 1) - 1; shift < 62 && base<<shift > 0 && base<<shift < maxDelay {
		ceiling = base << shift
	}
	if ceiling <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(ceiling)))
}
