package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/internal/stats"
)

// scaleResult is the gate at one budget: a provider's log full to its limit.
type scaleResult struct {
	limit         int64
	window        time.Duration
	entries       int64
	bytes         int64 // MEMORY USAGE of the log key
	denyP50       time.Duration
	allowP50      time.Duration // on a log one short of full
	bytesPerEntry float64
}

var (
	scaleLimits  = []int64{10, 100, 1000, 10000}
	scaleWindows = []time.Duration{time.Second, time.Minute, time.Hour, 24 * time.Hour}
)

func runScale(ctx context.Context, rdb redis.UniversalClient) ([]scaleResult, error) {
	var out []scaleResult
	for _, w := range scaleWindows {
		for _, limit := range scaleLimits {
			if w == time.Second && limit > 1000 {
				continue // cannot be filled within its own window by one client here; see 1m
			}
			r, err := scaleOne(ctx, rdb, limit, w)
			if err != nil {
				return nil, err
			}
			out = append(out, r)
		}
	}
	return out, nil
}

func scaleOne(ctx context.Context, rdb redis.UniversalClient, limit int64, w time.Duration) (scaleResult, error) {
	r := scaleResult{limit: limit, window: w}
	prefix := fmt.Sprintf("bench-scale-%d", time.Now().UnixNano())
	l, err := gate.New(rdb, gate.Options{Prefix: prefix, Providers: map[string]gate.Provider{"p": {Policies: []gate.Policy{{Limit: limit, Window: w}}}}})
	if err != nil {
		return r, err
	}
	// Fill to one short of full with 36-byte ids, 16 at a time.
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range int64(16) {
		wg.Go(func() {
			for i := g; i < limit-1; i += 16 {
				if _, err := l.Reserve(ctx, "p", fmt.Sprintf("%08d-0000-4000-8000-%012d", i, i), 1, w); err != nil {
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
	timeOne := func(id string) (time.Duration, error) {
		t := time.Now()
		_, err := l.Allow(ctx, "p", id, 1)
		return time.Since(t), err
	}
	// One admission on the log one short of full (released again, 50 times), then denials on the full log.
	var allow []time.Duration
	for i := range 50 {
		id := fmt.Sprint("probe-", i)
		d, err := timeOne(id)
		if err != nil {
			return r, err
		}
		allow = append(allow, d)
		if i < 49 {
			if _, err := l.Release(ctx, "p", id, 1, time.Time{}); err != nil {
				return r, err
			}
		}
	}
	var deny []time.Duration
	for i := range 200 {
		d, err := timeOne(fmt.Sprint("denied-", i))
		if err != nil {
			return r, err
		}
		deny = append(deny, d)
	}
	slices.Sort(allow)
	slices.Sort(deny)
	r.allowP50, r.denyP50 = stats.Percentile(allow, 50), stats.Percentile(deny, 50)
	keys, err := l.Keys("p")
	if err != nil {
		return r, err
	}
	r.entries, _ = rdb.ZCard(ctx, keys[0]).Result()
	r.bytes, _ = rdb.MemoryUsage(ctx, keys[0], 0).Result()
	if r.entries > 0 {
		r.bytesPerEntry = float64(r.bytes) / float64(r.entries)
	}
	_ = rdb.Del(ctx, keys...).Err()
	return r, nil
}
