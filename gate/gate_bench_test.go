package gate_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
)

// Run with: make bench-gate (go test -run '^$' -bench . -benchmem ./gate/), against Redis on loopback.
// Compare decisions with GET on the same client; nothing here asserts a time.

func benchClient(b *testing.B) redis.UniversalClient { return backends(b)[0].rdb }

// Two limits no benchmark reaches: every decision admits and the log is trimmed in steady state. The longest
// window keeps the log at a few thousand units, the size a real provider's log has (3000/min keeps at
// most 3000); each benchmark reports it as log_units.
var roomy = []gate.Policy{pol(gate.MaxSlidingLogLimit, 100*time.Millisecond), pol(gate.MaxSlidingLogLimit, 400*time.Millisecond)} // the largest a sliding log takes; no run reaches it

func reportLogSize(b *testing.B, rdb redis.UniversalClient, l *gate.Limiter) {
	keys, _ := l.Keys(prov)
	n, err := rdb.ZCard(context.Background(), keys[0]).Result()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(n), "log_units")
}

func BenchmarkGET(b *testing.B) {
	rdb := benchClient(b)
	ctx := context.Background()
	rdb.Set(ctx, "bench:get", "x", time.Minute)
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := rdb.Get(ctx, "bench:get").Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel16", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(8) // 8 x GOMAXPROCS(2) = 16 goroutines
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := rdb.Get(ctx, "bench:get").Err(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

func benchDecisions(b *testing.B, decide func(l *gate.Limiter, id string) error) {
	rdb := benchClient(b)
	b.Run("serial", func(b *testing.B) {
		l := newLimiter(b, rdb, 5*time.Millisecond, roomy...)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			if err := decide(l, strconv.Itoa(i)); err != nil {
				b.Fatal(err)
			}
		}
		reportLogSize(b, rdb, l)
	})
	b.Run("parallel16", func(b *testing.B) {
		l := newLimiter(b, rdb, 5*time.Millisecond, roomy...)
		var n atomic.Int64
		b.ReportAllocs()
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := decide(l, strconv.FormatInt(n.Add(1), 10)); err != nil {
					b.Error(err)
					return
				}
			}
		})
		reportLogSize(b, rdb, l)
	})
}

func BenchmarkAllow(b *testing.B) {
	ctx := context.Background()
	benchDecisions(b, func(l *gate.Limiter, id string) error {
		_, err := l.Allow(ctx, prov, id, 1)
		return err
	})
}

func BenchmarkReserve(b *testing.B) {
	ctx := context.Background()
	benchDecisions(b, func(l *gate.Limiter, id string) error {
		_, err := l.Reserve(ctx, prov, id, 1, 5*time.Second)
		return err
	})
}

// BenchmarkDenied: a full window, every decision a denial (what a worker sees under overload without
// reservations).
func BenchmarkDenied(b *testing.B) {
	ctx := context.Background()
	l := newLimiter(b, benchClient(b), 5*time.Millisecond, pol(100, time.Hour), pol(1000, 24*time.Hour))
	for i := range 100 {
		mustReserve(b, l, "fill-"+strconv.Itoa(i), 1, 0)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if v, err := l.Allow(ctx, prov, strconv.Itoa(i), 1); err != nil || v.Allowed {
			b.Fatal(v, err)
		}
	}
}

// BenchmarkRatioToGET interleaves GETs and Allow decisions on one client in blocks, so both see the same
// machine state, and reports the decision's cost as a multiple of a GET round trip (x_GET).
func BenchmarkRatioToGET(b *testing.B) {
	rdb := benchClient(b)
	ctx := context.Background()
	rdb.Set(ctx, "bench:get", "x", time.Minute)
	for _, mode := range []struct {
		name    string
		maxWait time.Duration
	}{{"allow", 0}, {"reserve", 5 * time.Second}} {
		b.Run(mode.name, func(b *testing.B) {
			l := newLimiter(b, rdb, 5*time.Millisecond, roomy...)
			var getNs, gateNs time.Duration
			const block = 64
			i := 0
			for b.Loop() {
				start := time.Now()
				for range block {
					if err := rdb.Get(ctx, "bench:get").Err(); err != nil {
						b.Fatal(err)
					}
				}
				mid := time.Now()
				for range block {
					i++
					if _, err := l.Reserve(ctx, prov, strconv.Itoa(i), 1, mode.maxWait); err != nil {
						b.Fatal(err)
					}
				}
				getNs += mid.Sub(start)
				gateNs += time.Since(mid)
			}
			b.ReportMetric(float64(gateNs)/float64(getNs), "x_GET")
			b.ReportMetric(float64(getNs.Nanoseconds())/float64(b.N*block), "GET_ns")
			b.ReportMetric(float64(gateNs.Nanoseconds())/float64(b.N*block), "decision_ns")
			reportLogSize(b, rdb, l)
		})
	}
}

// BenchmarkMemoryPerEntry measures, with MEMORY USAGE, the bytes one admitted job of cost 1 costs in
// Redis, at a log of 10 000 jobs.
func BenchmarkMemoryPerEntry(b *testing.B) {
	rdb := benchClient(b)
	ctx := context.Background()
	const n = 10_000
	for b.Loop() {
		l := newLimiter(b, rdb, 0, pol(gate.MaxSlidingLogLimit, time.Hour))
		ids := 0
		for range n {
			ids++
			// 36-character ids, like UUIDs.
			if _, err := l.Allow(ctx, prov, "0000000-0000-0000-0000-"+strconv.Itoa(1_000_000_000_000+ids), 1); err != nil {
				b.Fatal(err)
			}
		}
		keys, _ := l.Keys(prov)
		var total int64
		m, err := rdb.MemoryUsage(ctx, keys[0], 0).Result()
		if err != nil {
			b.Fatal(err)
		}
		total += m
		b.ReportMetric(float64(total)/n, "B/entry")
		rdb.Del(ctx, keys...)
	}
}

// BenchmarkAlgorithms: a Reserve under every algorithm, serially, on limits no run reaches (every decision
// admits), as BenchmarkReserve does for the sliding log.
func BenchmarkAlgorithms(b *testing.B) {
	rdb := benchClient(b)
	ctx := context.Background()
	for _, a := range gate.Algorithms {
		b.Run(string(a), func(b *testing.B) {
			l := newAlgo(b, rdb, a, 5*time.Millisecond, roomy...)
			b.ReportAllocs()
			if _, err := l.Reserve(ctx, prov, "warm", 1, 5*time.Second); err != nil { // loaded, warmed up
				b.Fatal(err)
			}
			before := scriptMicros(b, rdb)
			i := 0
			for b.Loop() {
				i++
				if _, err := l.Reserve(ctx, prov, strconv.Itoa(i), 1, 5*time.Second); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(scriptMicros(b, rdb)-before)/float64(b.N), "redis_us/op")
		})
	}
}

// BenchmarkAlgorithmMemory measures, with MEMORY USAGE, a provider's keys under every algorithm after 10 000
// admissions of 36-character ids within one window of 10 000/1h: the algorithm's own state (state_B) and
// the id record (ids_B, kept for DedupWindow after each slot; the sliding log's log is its id record).
func BenchmarkAlgorithmMemory(b *testing.B) {
	rdb := benchClient(b)
	ctx := context.Background()
	const n = 10_000
	for _, a := range gate.Algorithms {
		b.Run(string(a), func(b *testing.B) {
			for b.Loop() {
				l := newAlgo(b, rdb, a, 0, pol(n, time.Hour))
				for i := range n {
					if _, err := l.Reserve(ctx, prov, fmt.Sprintf("0000000-0000-0000-0000-%013d", i), 1, 2*time.Hour); err != nil {
						b.Fatal(err)
					}
				}
				keys, _ := l.Keys(prov)
				var state, ids int64
				for i, k := range keys {
					m, err := rdb.MemoryUsage(ctx, k, 0).Result()
					if err != nil && err != redis.Nil {
						b.Fatal(err)
					}
					switch {
					case i == 0:
						ids = m
					case i > 2:
						state += m
					}
				}
				b.ReportMetric(float64(state), "state_B")
				b.ReportMetric(float64(ids), "ids_B")
				b.ReportMetric(float64(ids)/n, "ids_B/entry")
				rdb.Del(ctx, keys...)
			}
		})
	}
}

// BenchmarkReserveAcked is the cost of redis.min_replicas_acked: each admission, then the WAIT for one
// replica on its own connection, against a primary and a replica of the benchmark's own, beside the same
// admissions without it. (docs/reliability.md quotes it.)
func BenchmarkReserveAcked(b *testing.B) {
	primary, _, _ := primaryAndReplica(b)
	ctx := context.Background()
	for _, acks := range []int{0, 1} {
		b.Run(fmt.Sprintf("min_replicas_acked=%d", acks), func(b *testing.B) {
			l, err := gate.New(primary.rdb, gate.Options{Prefix: uniquePrefix(b), Margin: 10 * time.Millisecond, MinReplicasAcked: acks,
				AckTimeout: 100 * time.Millisecond, Providers: map[string]gate.Provider{prov: {Policies: roomy}}})
			if err != nil {
				b.Fatal(err)
			}
			var n atomic.Int64
			b.Run("serial", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if v, err := l.Reserve(ctx, prov, strconv.FormatInt(n.Add(1), 10), 1, time.Second); err != nil || !v.Allowed {
						b.Fatalf("%+v %v", v, err)
					}
				}
			})
			b.Run("parallel16", func(b *testing.B) {
				b.ReportAllocs()
				b.SetParallelism(8)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if v, err := l.Reserve(ctx, prov, strconv.FormatInt(n.Add(1), 10), 1, time.Second); err != nil || !v.Allowed {
							b.Errorf("%+v %v", v, err)
							return
						}
					}
				})
			})
		})
	}
}

// BenchmarkReserveBatch decides 16 and 64 new jobs per call (lua/family's op 'batch', as a worker's batcher
// sends them under load), beside calls of one job, and reports the Redis-side time per job from INFO
// commandstats (redis_us/job) besides the round trip.
func BenchmarkReserveBatch(b *testing.B) {
	rdb := benchClient(b)
	ctx := context.Background()
	for _, size := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("jobs=%d", size), func(b *testing.B) {
			l := newLimiter(b, rdb, 10*time.Millisecond, roomy...)
			var n atomic.Int64
			ids := make([]string, size)
			costs := make([]int64, size)
			next := func() {
				for i := range ids {
					ids[i], costs[i] = strconv.FormatInt(n.Add(1), 10), 1
				}
			}
			next()
			gate.DecideBatch(ctx, l, prov, ids, costs, time.Second) // loaded
			before := scriptMicros(b, rdb)
			for b.Loop() {
				next()
				_, errs := gate.DecideBatch(ctx, l, prov, ids, costs, time.Second)
				if errs[0] != nil {
					b.Fatal(errs[0])
				}
			}
			b.ReportMetric(float64(scriptMicros(b, rdb)-before)/float64(b.N*size), "redis_us/job")
			reportLogSize(b, rdb, l)
		})
	}
}

// scriptMicros is the time Redis has spent in FCALL and EVALSHA, from INFO commandstats.
func scriptMicros(b *testing.B, rdb redis.UniversalClient) int64 {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total int64
	for line := range strings.SplitSeq(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_fcall:") && !strings.HasPrefix(line, "cmdstat_evalsha:") {
			continue
		}
		for f := range strings.SplitSeq(strings.TrimSpace(line[strings.IndexByte(line, ':')+1:]), ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				total += n
			}
		}
	}
	return total
}
