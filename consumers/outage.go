package consumers

import (
	"sync"
	"time"
)

// gateOutage measures how long the gate has failed to answer this process, so that the deferrals of an
// outage walk up the delay tiers (Config.OutageTiers): while it is young a job comes back after the first
// tier, and after a longer one only once the outage has lasted that long. A deferral is never longer
// than the outage so far, so a job waits at most about as long again once Redis answers; and a job
// deferred through a 60s outage is deferred a dozen times rather than sixty.
type gateOutage struct {
	mu    sync.Mutex
	since time.Time // zero while the gate answers
}

// failed notes a call the gate could not answer at now and returns how long the outage has lasted.
func (o *gateOutage) failed(now time.Time) time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.since.IsZero() {
		o.since = now
	}
	return now.Sub(o.since)
}

// answered ends the outage.
func (o *gateOutage) answered() {
	o.mu.Lock()
	o.since = time.Time{}
	o.mu.Unlock()
}

// outageRetry is the deferral for a job the gate could not answer at now: the longest of the outage
// tiers the outage has outlasted, and at least Config.RedisRetry.
func (w *Worker) outageRetry(now time.Time) time.Duration {
	lasted := w.outage.failed(now)
	retry := w.cfg.RedisRetry
	for _, t := range w.cfg.OutageTiers {
		if t <= lasted {
			retry = max(retry, t)
		}
	}
	return retry
}
