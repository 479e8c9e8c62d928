package consumers

import (
	"context"
	"slices"
	"sync"
	"time"
)

// reportLateness tells the gate, every ReportEvery, each provider's p99 lateness over this worker's
// wake-ups on reserved slots in the last 10s (0 when it had none), until ctx ends: the margin in force
// follows the fleet's, and this process learns it each time. (The ticker runs on the real clock.)
func (w *Worker) reportLateness(ctx context.Context) {
	every := w.cfg.ReportEvery
	if every <= 0 {
		every = time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for provider, l := range w.late {
			st, err := w.gate.ReportLateness(ctx, provider, w.id, l.p99(10*time.Second, w.now()))
			if err != nil {
				continue // Redis unreachable: the decisions say so; the next report tries again
			}
			w.metrics.margin.WithLabelValues(provider).Set(st.Margin.Seconds())
		}
	}
}

// lateness keeps a provider's recent wake-ups on reserved slots.
type lateness struct {
	mu   sync.Mutex
	ring [256]struct {
		late time.Duration
		at   time.Time
	}
	n, next int // samples in ring (up to its length), where the next goes
}

func newLateness(providers map[string]int64) map[string]*lateness {
	m := make(map[string]*lateness, len(providers))
	for p := range providers {
		m[p] = &lateness{}
	}
	return m
}

// add records a wake-up d late, at `at` (the worker's clock).
func (l *lateness) add(d time.Duration, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ring[l.next].late, l.ring[l.next].at = d, at
	l.next = (l.next + 1) % len(l.ring)
	l.n = min(l.n+1, len(l.ring))
}

// p99 is the 99th percentile of the samples of the last `within` before now, never their single largest
// (one wake-up is an accident, not a fleet's tail); 0 with fewer than two.
func (l *lateness) p99(within time.Duration, now time.Time) time.Duration {
	l.mu.Lock()
	var s []time.Duration
	for _, x := range l.ring[:l.n] {
		if now.Sub(x.at) <= within {
			s = append(s, x.late)
		}
	}
	l.mu.Unlock()
	if len(s) < 2 {
		return 0
	}
	slices.Sort(s)
	return s[min((len(s)*99+99)/100, len(s)-1)-1]
}
