package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/providers/sim"
)

// A contender is one way a team could hold many workers to a provider's limits. Each worker gets an
// acquirer; acquire blocks until the job may be sent and reports how many limiter calls that took.
type contender struct {
	name string
	// newRun prepares a run against limits with k workers, under a fresh key prefix.
	newRun func(rdb redis.UniversalClient, prefix string, limits []sim.Window, k int) (run, error)
}

type run interface {
	worker(i int) acquirer
	// decide makes one decision without waiting, for the cost benchmark.
	decide(ctx context.Context, id string) (bool, error)
}

type acquirer interface {
	acquire(ctx context.Context, id string) (calls int, err error)
}

type acquireFunc func(ctx context.Context, id string) (int, error)

func (f acquireFunc) acquire(ctx context.Context, id string) (int, error) { return f(ctx, id) }

// naiveBackoff is the fixed pause of the blog-pattern script after a denial.
const naiveBackoff = 50 * time.Millisecond

var contenders = []contender{
	{"paygate worker", newWorkerCore},
	{"paygate reserve", newPaygate(gate.SlidingLog, true)},
	{"paygate allow+retry", newPaygate(gate.SlidingLog, false)},
	{"paygate sliding_window", newPaygate(gate.SlidingWindow, true)},
	{"paygate token_bucket", newPaygate(gate.TokenBucket, true)},
	{"paygate gcra", newPaygate(gate.GCRA, true)},
	{"paygate fixed_window", newPaygate(gate.FixedWindow, true)},
	{"paygate leaky_bucket", newPaygate(gate.LeakyBucket, true)},
	{"redis_rate (GCRA)", newRedisRate},
	{"naive sliding log", newNaive},
	{"fixed window", newFixedWindow},
	{"x/time/rate per worker", newLocal},
}

func policies(limits []sim.Window) []gate.Policy {
	var ps []gate.Policy
	for _, l := range limits {
		ps = append(ps, gate.Policy{Limit: int64(l.Limit), Window: l.Per})
	}
	return ps
}

// paygate: the gate as the worker uses it, with the default margin, under one of its algorithms.
// Reservation mode sleeps until the slot it is given (and, denied, for the RetryAfter it is told: a leaky
// bucket's full queue denies whatever the max wait); allow mode asks for now-or-never and sleeps the
// RetryAfter it is told.
type paygateRun struct {
	l       *gate.Limiter
	reserve bool
}

func newPaygate(algo gate.Algorithm, reserve bool) func(redis.UniversalClient, string, []sim.Window, int) (run, error) {
	return func(rdb redis.UniversalClient, prefix string, limits []sim.Window, _ int) (run, error) {
		l, err := gate.New(rdb, gate.Options{Prefix: prefix, Margin: 10 * time.Millisecond, StaleAfter: 5 * time.Millisecond,
			Providers: map[string]gate.Provider{"p": {Algorithm: algo, Policies: policies(limits)}}})
		return &paygateRun{l: l, reserve: reserve}, err
	}
}

func (r *paygateRun) worker(int) acquirer {
	return acquireFunc(func(ctx context.Context, id string) (int, error) {
		wait := time.Duration(0)
		if r.reserve {
			wait = 5 * time.Second
		}
		for calls := 1; ; calls++ {
			v, err := r.l.Reserve(ctx, "p", id, 1, wait)
			if err != nil {
				return calls, err
			}
			if v.Allowed {
				consumers.Sleep(ctx, v.Delay)
				return calls, ctx.Err()
			}
			if !consumers.Sleep(ctx, v.RetryAfter) {
				return calls, ctx.Err()
			}
		}
	})
}

func (r *paygateRun) decide(ctx context.Context, id string) (bool, error) {
	wait := time.Duration(0)
	if r.reserve {
		wait = 5 * time.Second
	}
	v, err := r.l.Reserve(ctx, "p", id, 1, wait)
	return v.Allowed, err
}

// redis_rate: GCRA with burst = limit per period; several limits are asked in turn (tokens taken from
// an earlier limit are not given back when a later one denies, as a caller of the library would do).
type redisRateRun struct {
	l      *redis_rate.Limiter
	prefix string
	limits []redis_rate.Limit
}

func newRedisRate(rdb redis.UniversalClient, prefix string, limits []sim.Window, _ int) (run, error) {
	r := &redisRateRun{l: redis_rate.NewLimiter(rdb), prefix: prefix}
	for _, w := range limits {
		r.limits = append(r.limits, redis_rate.Limit{Rate: w.Limit, Burst: w.Limit, Period: w.Per})
	}
	return r, nil
}

func (r *redisRateRun) try(ctx context.Context) (bool, time.Duration, int, error) {
	calls := 0
	for i, lim := range r.limits {
		calls++
		res, err := r.l.Allow(ctx, r.prefix+":"+strconv.Itoa(i), lim)
		if err != nil {
			return false, 0, calls, err
		}
		if res.Allowed == 0 {
			return false, res.RetryAfter, calls, nil
		}
	}
	return true, 0, calls, nil
}

func (r *redisRateRun) worker(int) acquirer {
	return acquireFunc(func(ctx context.Context, _ string) (int, error) {
		total := 0
		for {
			ok, retry, calls, err := r.try(ctx)
			total += calls
			if err != nil || ok {
				return total, err
			}
			if !consumers.Sleep(ctx, max(retry, time.Millisecond)) {
				return total, ctx.Err()
			}
		}
	})
}

func (r *redisRateRun) decide(ctx context.Context, _ string) (bool, error) {
	ok, _, _, err := r.try(ctx)
	return ok, err
}

// The naive sliding log from the common blog pattern: client clock in ns, the timestamp as the member,
// ZREMRANGEBYSCORE / ZCARD / ZADD, a fixed backoff on denial. One key per limit, checked in one script.
var naiveScript = redis.NewScript(`
local now = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  local window, limit = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  redis.call('ZREMRANGEBYSCORE', key, 0, now - window)
  if redis.call('ZCARD', key) >= limit then return 0 end
end
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, now, now)
  redis.call('PEXPIRE', key, math.ceil(tonumber(ARGV[2 * i]) / 1000000))
end
return 1`)

type scriptRun struct {
	rdb    redis.UniversalClient
	script *redis.Script
	keys   func(now time.Time) []string
	args   func(now time.Time) []any
	// after a denial: a fixed pause, or until the next window (fixed windows)
	backoff func(now time.Time) time.Duration
	ok      int64 // the script's reply that means allowed
}

func newNaive(rdb redis.UniversalClient, prefix string, limits []sim.Window, _ int) (run, error) {
	var keys []string
	for i := range limits {
		keys = append(keys, fmt.Sprintf("%s:{p}:%d", prefix, i))
	}
	return &scriptRun{rdb: rdb, script: naiveScript, ok: 1,
		keys: func(time.Time) []string { return keys },
		args: func(now time.Time) []any {
			a := []any{now.UnixNano()}
			for _, w := range limits {
				a = append(a, w.Per.Nanoseconds(), w.Limit)
			}
			return a
		},
		backoff: func(time.Time) time.Duration { return naiveBackoff },
	}, nil
}

// Fixed windows: INCR + PEXPIRE on a counter per window (window index from the client clock); a denial
// waits for the next boundary of the shortest window.
var fixedScript = redis.NewScript(`
for i, key in ipairs(KEYS) do
  if tonumber(redis.call('GET', key) or 0) >= tonumber(ARGV[2 * i - 1]) then return i end
end
for i, key in ipairs(KEYS) do
  if redis.call('INCR', key) == 1 then redis.call('PEXPIRE', key, ARGV[2 * i]) end
end
return 0`)

func newFixedWindow(rdb redis.UniversalClient, prefix string, limits []sim.Window, _ int) (run, error) {
	return &scriptRun{rdb: rdb, script: fixedScript, ok: 0,
		keys: func(now time.Time) []string {
			var ks []string
			for i, w := range limits {
				ks = append(ks, fmt.Sprintf("%s:{p}:%d:%d", prefix, i, now.UnixNano()/int64(w.Per)))
			}
			return ks
		},
		args: func(time.Time) []any {
			var a []any
			for _, w := range limits {
				a = append(a, w.Limit, (2 * w.Per).Milliseconds())
			}
			return a
		},
		backoff: func(now time.Time) time.Duration {
			per := limits[0].Per
			return per - time.Duration(now.UnixNano()%int64(per))
		},
	}, nil
}

func (r *scriptRun) decide(ctx context.Context, _ string) (bool, error) {
	now := time.Now()
	n, err := r.script.Run(ctx, r.rdb, r.keys(now), r.args(now)...).Int64()
	return err == nil && n == r.ok, err
}

func (r *scriptRun) worker(int) acquirer {
	return acquireFunc(func(ctx context.Context, id string) (int, error) {
		for calls := 1; ; calls++ {
			ok, err := r.decide(ctx, id)
			if err != nil || ok {
				return calls, err
			}
			if !consumers.Sleep(ctx, r.backoff(time.Now())) {
				return calls, ctx.Err()
			}
		}
	})
}

// x/time/rate in each worker, each given limit/k of every limit (burst limit/k, at least 1): no Redis.
type localRun struct {
	limits []sim.Window
	k      int
	one    *rate.Limiter // for the cost benchmark
}

func newLocal(_ redis.UniversalClient, _ string, limits []sim.Window, k int) (run, error) {
	return &localRun{limits: limits, k: k, one: rate.NewLimiter(rate.Inf, 1)}, nil
}

func (r *localRun) worker(int) acquirer {
	var ls []*rate.Limiter
	for _, w := range r.limits {
		per := float64(w.Limit) / float64(r.k)
		ls = append(ls, rate.NewLimiter(rate.Limit(per/w.Per.Seconds()), max(1, w.Limit/r.k)))
	}
	return acquireFunc(func(ctx context.Context, _ string) (int, error) {
		for _, l := range ls {
			if err := l.Wait(ctx); err != nil {
				return 0, err
			}
		}
		return 0, nil
	})
}

func (r *localRun) decide(context.Context, string) (bool, error) { return r.one.Allow(), nil }
