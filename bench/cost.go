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

	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/internal/stats"
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
	var out []costResult
	for i, c := range contenders {
		r, err := c.newRun(rdb, fmt.Sprintf("bench-cost-%d-%d", time.Now().UnixNano(), i), costLimits, costParallel)
		if err != nil {
			return nil, err
		}
		base, res, err := measureCost(ctx, rdb, c.name, r.decide, get, parallelFor)
		if err != nil {
			return nil, err
		}
		if i == 0 { // the GET beside the first contender stands for all
			base.ratio = 1
			base.parallelPerSec = parallel(ctx, get, parallelFor)
			out = append(out, base)
		}
		out = append(out, res)
	}
	return out, nil
}

// measureCost times decide and a GET interleaved, call by call, so that whatever else the machine does
// weighs on both alike; the ratio is of their medians. Then 16 goroutines of decide for parallelFor.
func measureCost(ctx context.Context, rdb redis.UniversalClient, name string, decide, get func(context.Context, string) (bool, error), parallelFor time.Duration) (costResult, costResult, error) {
	r, base := costResult{name: name}, costResult{name: "GET"}
	for i := range 200 { // warm the connection and the script cache
		if _, err := decide(ctx, fmt.Sprint("warm-", i)); err != nil {
			return base, r, fmt.Errorf("%s: %w", name, err)
		}
	}
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		return base, r, err
	}
	lat := make([]time.Duration, 0, costSerial)
	getLat := make([]time.Duration, 0, costSerial)
	for i := range costSerial {
		t := time.Now()
		if _, err := get(ctx, ""); err != nil {
			return base, r, err
		}
		getLat = append(getLat, time.Since(t))
		t = time.Now()
		if _, err := decide(ctx, fmt.Sprint("s-", i)); err != nil {
			return base, r, fmt.Errorf("%s: %w", name, err)
		}
		lat = append(lat, time.Since(t))
	}
	slices.Sort(lat)
	slices.Sort(getLat)
	r.p50, r.p99 = stats.Percentile(lat, 50), stats.Percentile(lat, 99)
	base.p50, base.p99 = stats.Percentile(getLat, 50), stats.Percentile(getLat, 99)
	r.ratio = float64(r.p50) / float64(base.p50)
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return base, r, err
	}
	r.redisUsPerDecide, base.redisUsPerDecide = usPerCall(info, "evalsha", "fcall"), usPerCall(info, "get")

	r.parallelPerSec = parallel(ctx, decide, parallelFor)
	return base, r, nil
}

// parallel is how many decisions 16 goroutines make per second.
func parallel(ctx context.Context, decide func(context.Context, string) (bool, error), d time.Duration) float64 {
	var n atomic.Int64
	pctx, cancel := context.WithTimeout(ctx, d)
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
	return float64(n.Load()) / time.Since(start).Seconds()
}

// usPerCall reads the server-side µs per call of commands (together) from INFO commandstats (0 when they
// were barely called: the local limiter makes no Redis calls). A script runs as EVALSHA or, paygate's on
// Redis 7, as FCALL.
func usPerCall(info string, cmds ...string) float64 {
	calls, usec := commandStats(info, cmds...)
	if calls < costSerial/2 {
		return 0
	}
	return float64(usec) / float64(calls)
}

// commandStats is the calls and µs of commands (together) in INFO commandstats.
func commandStats(info string, cmds ...string) (calls, usec int64) {
	for _, cmd := range cmds {
		m := regexp.MustCompile(`cmdstat_` + cmd + `:calls=(\d+),usec=(\d+)`).FindStringSubmatch(info)
		if m == nil {
			continue
		}
		c, _ := strconv.ParseInt(m[1], 10, 64)
		u, _ := strconv.ParseInt(m[2], 10, 64)
		calls, usec = calls+c, usec+u
	}
	return calls, usec
}

// batchCost is the Redis-side time of batched decisions: size callers reserve at once, round after round,
// through a gate with gate.batch = size and the longest linger, so that each call decides exactly size
// jobs (the linger ends when size are queued); µs inside Redis (INFO commandstats) over jobs admitted.
type batchCost struct {
	size          int
	calls, jobs   int64
	redisUsPerJob float64
}

// batchSizes are the batches measured: one job a call, then gate.batch's usual range.
var batchSizes = []int{1, 16, 32, 64}

// batchJobs is how many jobs each size decides (after as many to warm up): the log of sliding_log holds a
// few thousand units, as a real provider's does.
const batchJobs = 12288

func runBatchCost(ctx context.Context, rdb redis.UniversalClient) ([]batchCost, error) {
	var out []batchCost
	for _, size := range batchSizes {
		l, err := gate.New(rdb, gate.Options{Prefix: fmt.Sprintf("bench-batch-%d-%d", time.Now().UnixNano(), size),
			Batch: size, BatchLinger: gate.MaxBatchLinger,
			Providers: map[string]gate.Provider{"p": {Policies: []gate.Policy{{Limit: gate.MaxSlidingLogLimit, Window: time.Minute}}}}})
		if err != nil {
			return nil, err
		}
		// round has size callers reserve at once; rounds makes batchJobs / size of them.
		round := func(tag string, r int) error {
			var wg sync.WaitGroup
			errs := make(chan error, size)
			for g := range size {
				wg.Go(func() {
					v, err := l.Reserve(ctx, "p", fmt.Sprintf("%s-%d-%d", tag, r, g), 1, time.Second)
					if err == nil && !v.Allowed {
						err = fmt.Errorf("denied: %+v", v)
					}
					if err != nil {
						errs <- err
					}
				})
			}
			wg.Wait()
			close(errs)
			return <-errs
		}
		rounds := func(tag string) error {
			for r := range batchJobs / size {
				if err := round(tag, r); err != nil {
					return fmt.Errorf("batch of %d: %w", size, err)
				}
			}
			return nil
		}
		if err := rounds("warm"); err != nil {
			return nil, err
		}
		before, err := scriptStats(ctx, rdb)
		if err != nil {
			return nil, err
		}
		if err := rounds("b"); err != nil {
			return nil, err
		}
		after, err := scriptStats(ctx, rdb)
		if err != nil {
			return nil, err
		}
		jobs := int64(batchJobs / size * size)
		out = append(out, batchCost{size: size, calls: after[0] - before[0], jobs: jobs, redisUsPerJob: float64(after[1]-before[1]) / float64(jobs)})
	}
	return out, nil
}

// scriptStats is {calls, µs} of the scripts (FCALL and EVALSHA together) from INFO commandstats.
func scriptStats(ctx context.Context, rdb redis.UniversalClient) ([2]int64, error) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return [2]int64{}, err
	}
	calls, usec := commandStats(info, "fcall", "evalsha")
	return [2]int64{calls, usec}, nil
}
