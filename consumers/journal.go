package consumers

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/paygate/paygate/gate"
)

// The job journal (gate.Limiter.Journal): when each job's request left, and how its handling ended, so
// that `worker cancel` tells a job that left from one still queued, and `worker job show` says where a
// job is. Written in the background, a provider's entries together every journalEvery: it never holds a
// job up, and a Redis that does not answer costs a warning, not a job.

// journaler is the part of the gate that keeps the job journal.
type journaler interface {
	Journal(ctx context.Context, provider string, entries []gate.JournalEntry) error
}

// journalEvery is how often the entries gathered are written.
const journalEvery = 20 * time.Millisecond

// journalQueue gathers the entries to write, by provider.
type journalQueue struct {
	mu      sync.Mutex
	pending map[string][]gate.JournalEntry
}

// journal gathers one entry (a no-op where the gate keeps no journal).
func (w *Worker) journal(provider, id string, left time.Time, outcome Outcome) {
	if _, ok := w.gate.(journaler); !ok {
		return
	}
	q := &w.journalQ
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.pending == nil {
		q.pending = map[string][]gate.JournalEntry{}
	}
	q.pending[provider] = append(q.pending[provider], gate.JournalEntry{ID: id, Left: left, Outcome: string(outcome)})
}

// writeJournal writes the entries gathered every journalEvery until ctx ends, then once more.
func (w *Worker) writeJournal(ctx context.Context) {
	j, ok := w.gate.(journaler)
	if !ok {
		return
	}
	t := time.NewTicker(journalEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			w.flushJournal(ctx, j)
		case <-ctx.Done():
			w.flushJournal(context.WithoutCancel(ctx), j)
			return
		}
	}
}

// journalTimeout bounds one flush's call for a provider: entries do not pile up behind a hung Redis.
const journalTimeout = 2 * time.Second

func (w *Worker) flushJournal(ctx context.Context, j journaler) {
	q := &w.journalQ
	q.mu.Lock()
	pending := q.pending
	q.pending = nil
	q.mu.Unlock()
	for provider, entries := range pending {
		cctx, cancel := context.WithTimeout(ctx, journalTimeout)
		err := j.Journal(cctx, provider, entries)
		cancel()
		if err != nil {
			w.redisLog.Warn(w.log, w.now(), "job journal not written: worker cancel and job show may not see these jobs' requests",
				zap.String("provider", provider), zap.Int("jobs", len(entries)), zap.Error(err))
		}
	}
}
