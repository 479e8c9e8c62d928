package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/internal/stats"
)

// memoryResult is one algorithm at one budget, the limit spent at once: what its keys hold in Redis.
type memoryResult struct {
	algo         gate.Algorithm
	limit        int64
	window       time.Duration
	stateBytes   int64 // the algorithm's own keys (the sliding log's log is its state)
	idsBytes     int64 // the id record, right after the limit was spent (for sliding_log: 0, see stateBytes)
	idsEntries   int64
	steadyIDs    float64 // bytes of id record at a steady rate of limit per window (DedupWindow of ids)
	allowP50     time.Duration
	denyP50      time.Duration
	fillDuration time.Duration
}

var memoryBudgets = []struct {
	limit  int64
	window time.Duration
}{{10_000, time.Minute}, {100_000, 24 * time.Hour}}

func runMemory(ctx context.Context, rdb redis.UniversalClient, quick bool) ([]memoryResult, error) {
	var out []memoryResult
	for _, b := range memoryBudgets {
		limit := b.limit
		if quick {
			limit /= 10
		}
		for _, a := range gate.Algorithms {
			r, err := memoryOne(ctx, rdb, a, limit, b.window)
			if err != nil {
				return nil, fmt.Errorf("%s %d/%s: %w", a, limit, b.window, err)
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// memoryOne spends a budget of limit per window at once, 16 callers at a time, with 36-byte job ids; then
// times admissions (on the state one short of the limit, each released again) and denials (on the state at
// the limit), and reads MEMORY USAGE of every key.
func memoryOne(ctx context.Context, rdb redis.UniversalClient, algo gate.Algorithm, limit int64, w time.Duration) (memoryResult, error) {
	r := memoryResult{algo: algo, limit: limit, window: w}
	prefix := fmt.Sprintf("bench-mem-%d", time.Now().UnixNano())
	l, err := gate.New(rdb, gate.Options{Prefix: prefix, Providers: map[string]gate.Provider{"p": {Algorithm: algo, Policies: []gate.Policy{{Limit: limit, Window: w}}}}})
	if err != nil {
		return r, err
	}
	keys, _ := l.Keys("p")
	defer rdb.Del(context.WithoutCancel(ctx), keys...)
	began := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range int64(16) {
		wg.Go(func() {
			for i := g; i < limit-1; i += 16 {
				// A wait of two windows: the leaky bucket queues the budget over one window ahead.
				v, err := l.Reserve(ctx, "p", fmt.Sprintf("%08d-0000-4000-8000-%012d", i, i), 1, 2*w)
				if err == nil && !v.Allowed {
					err = fmt.Errorf("job %d denied: %+v", i, v)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return r, err
	}
	r.fillDuration = time.Since(began)
	var allow, deny []time.Duration
	for i := range 50 {
		id := fmt.Sprint("probe-", i)
		t := time.Now()
		v, err := l.Reserve(ctx, "p", id, 1, 2*w)
		if err != nil {
			return r, err
		}
		allow = append(allow, time.Since(t))
		if i < 49 {
			if _, err := l.Release(ctx, "p", id, 1, v.Slot()); err != nil {
				return r, err
			}
		}
	}
	for i := range 200 {
		t := time.Now()
		if _, err := l.Allow(ctx, "p", fmt.Sprint("denied-", i), 1); err != nil {
			return r, err
		}
		deny = append(deny, time.Since(t))
	}
	slices.Sort(allow)
	slices.Sort(deny)
	r.allowP50, r.denyP50 = stats.Percentile(allow, 50), stats.Percentile(deny, 50)
	for i, k := range keys {
		m, err := rdb.MemoryUsage(ctx, k, 0).Result()
		if err != nil && err != redis.Nil {
			return r, err
		}
		switch {
		case i == 0 && algo == gate.SlidingLog:
			r.stateBytes += m
		case i == 0:
			r.idsBytes = m
			// Jobs, not members: a job's other members (a cost above 1, the counters' marker) follow its
			// id, after a NUL.
			members, err := rdb.ZRange(ctx, k, 0, -1).Result()
			if err != nil {
				return r, err
			}
			for _, id := range members {
				if !strings.Contains(id, "\x00") {
					r.idsEntries++
				}
			}
		default:
			r.stateBytes += m
		}
	}
	if r.idsEntries > 0 {
		// At a steady limit per window, the record holds the ids of the last DedupWindow (or window).
		dedup := min(gate.DefaultDedupWindow, w)
		r.steadyIDs = float64(r.idsBytes) / float64(r.idsEntries) * float64(limit) * dedup.Seconds() / w.Seconds()
	}
	return r, nil
}

func memoryTable(b *strings.Builder, rs []memoryResult) {
	fmt.Fprintln(b, "| algorithm | budget | state | id record, limit just spent | id record, steady at the limit | admission p50 | denial p50 |")
	fmt.Fprintln(b, "|---|---|---|---|---|---|---|")
	for _, r := range rs {
		ids, steady := "— (the log)", "— (the log)"
		if r.algo != gate.SlidingLog {
			ids = fmt.Sprintf("%s (%d ids)", bytesH(r.idsBytes), r.idsEntries)
			steady = bytesH(int64(r.steadyIDs))
		}
		fmt.Fprintf(b, "| %s | %d/%s | %s | %s | %s | %s | %s |\n", r.algo, r.limit, fmtWindow(r.window), bytesH(r.stateBytes), ids, steady, ms(r.allowP50), ms(r.denyP50))
	}
}
