// Package throttle writes a repeated log line at most once per interval, saying how many it swallowed:
// the rate limit docs/operations.md promises for every warning that repeats while something is down.
package throttle

import (
	"sync"
	"time"

	"go.uber.org/zap"
)

// Every is the interval the worker's repeated warnings share.
const Every = 10 * time.Second

// Log lets one line through per interval; the zero value uses Every. It is safe for concurrent use.
type Log struct {
	Interval time.Duration

	mu     sync.Mutex
	last   time.Time
	missed int
}

// Allow reports whether a line may go out at now, and how many were swallowed since the last one.
func (t *Log) Allow(now time.Time) (ok bool, suppressed int) {
	every := t.Interval
	if every <= 0 {
		every = Every
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.last.IsZero() && now.Sub(t.last) < every {
		t.missed++
		return false, 0
	}
	suppressed = t.missed
	t.last, t.missed = now, 0
	return true, suppressed
}

// Warn writes msg at warn level unless another line went out less than an interval before now, adding
// suppressed_since_last.
func (t *Log) Warn(log *zap.Logger, now time.Time, msg string, fields ...zap.Field) {
	if ok, missed := t.Allow(now); ok {
		log.Warn(msg, append(fields, zap.Int("suppressed_since_last", missed))...)
	}
}
