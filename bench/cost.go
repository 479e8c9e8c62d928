package main

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/providers/sim"
)

// costResult is one contender's decision cost beside a plain GET.
type costResult struct {
	name             string
	p50, p99         time.Duration // serial latency
	ratio            float64       // p50 / GET's p50
	parallelPerSec   float64       // 16 goroutines
	redisUsPerDecide float64       // server-side µs per decision (INFO commandstats), 0 when no Redis
}

const (
	costSerial   = 3000
	costParallel = 16
)

// costLimits admit every decision of the run: the cost of an admission on a realistic log.
var costLimits = []sim.Window{{Limit: 20000, Per: time.Minute}}

func runCost(ctx context.Context, rdb redis.UniversalClient, parallelFor time.Duration) ([]costResult, error) {
	if err := rdb.Set(ctx, "bench:get", "x", time.Hour).Err(); err != nil {
		return nil, err
	}
	get := func(ctx context.Context, _ string) (bool, error) { return true, rdb.Get(ctx, "bench:get").Err() }
	base, err := measureCost(ctx, rdb, "GET", get, parallelFor, "get")
	if err != nil {
		return nil, err
	}
	base.ratio = 1
	out := []costResult{base}
	for i, c := range contenders {
		r, err := c.newRun(rdb, fmt.Sprintf("bench-cost-%d-%d", time.Now().UnixNano(), i), costLimits, costParallel)
		if err != nil {
			return nil, err
		}
		res, err := measureCost(ctx, rdb, c.name, r.decide, parallelFor, "evalsha")
		if err != nil {
			return nil, err
		}
		res.ratio = float64(res.p50) / float64(base.p50)
		out = append(out, res)
	}
	return out, nil
}

func measureCost(ctx context.Context, rdb redis.UniversalClient, name string, decide func(context.Context, string) (bool, error), parallelFor time.Duration, cmd string) (costResult, error) {
	r := costResult{name: name}
	for i := range 200 { // warm the connection and the script cache
		if _, err := decide(ctx, fmt.Sprint("warm-", i)); err != nil {
			return r, fmt.Errorf("%s: %w", name, err)
		}
	}
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		return r, err
	}
	lat := make([]time.Duration, 0, costSerial)
	for i := range costSerial {
		t := time.Now()
		if _, err := decide(ctx, fmt.Sprint("s-", i)); err != nil {
			return r, fmt.Errorf("%s: %w", name, err)
		}
		lat = append(lat, time.Since(t))
	}
	slices.Sort(lat)
	r.p50, r.p99 = percentile(lat, 50), percentile(lat, 99)
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return r, err
	}
	if m := regexp.MustCompile(`cmdstat_` + cmd + `:calls=(\d+),usec=(\d+)`).FindStringSubmatch(info); m != nil {
		calls, _ := strconv.ParseFloat(m[1], 64)
		usec, _ := strconv.ParseFloat(m[2], 64)
		if calls >= costSerial/2 { // the local limiter makes no calls
			r.redisUsPerDecide = usec / calls
		}
	}

	var n atomic.Int64
	pctx, cancel := context.WithTimeout(ctx, parallelFor)
	defer cancel()
	var wg sync.WaitGroup
	start := time.Now()
	for g := range costParallel {
		wg.Go(func() {
			for i := 0; pctx.Err() == nil; i++ {
				if _, err := decide(pctx, fmt.Sprintf("p-%d-%d", g, i)); err == nil {
					n.Add(1)
				}
			}
		})
	}
	wg.Wait()
	r.parallelPerSec = float64(n.Load()) / time.Since(start).Seconds()
	return r, nil
}
