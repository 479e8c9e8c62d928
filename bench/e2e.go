package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/providers/sim"
	"github.com/paygate/paygate/wire"
)

// e2eResult is the worker's throughput through a broker to an unlimited provider.
type e2eResult struct {
	broker  string
	workers int
	batch   int  // the gate's gate.batch; 0: no gate
	results bool // results.enabled: every job's result published before its ack
	jobs    int
	perSec  float64
	calls   int64 // the gate's script calls (FCALL, EVALSHA)
	moves   int64 // of them, the lateness guard's: a late slot postponed, a late write's entry moved
	// cost is the gate's share of throughput, 1 - gate/no gate, the median over the rounds of each round's
	// own ratio (0 for the no-gate runs); for the run with results, the results' share, 1 - results
	// on/results off, both batched.
	cost float64
	// CPU per job accepted while it was measured (from the workers being ready to the last acceptance):
	// Redis's (INFO cpu) and this process's (the worker core, the simulated provider, kfake for Kafka).
	redisCPU, ownCPU time.Duration
}

// openGate is no gate at all: every job goes at once (the "gate off" side of the ratio).
type openGate struct{}

func (openGate) ReserveFor(context.Context, string, string, string, int64, time.Duration) (gate.Verdict, error) {
	return gate.Verdict{Allowed: true, Now: time.Now()}, nil
}
func (openGate) ReleaseFor(context.Context, string, string, string, int64, time.Time) (int64, error) {
	return 0, nil
}
func (openGate) Departed(context.Context, string, string, string, time.Time, time.Duration) (time.Time, error) {
	return time.Time{}, nil
}
func (openGate) Postpone(context.Context, string, string, string, time.Time) (time.Time, error) {
	return time.Time{}, nil
}
func (openGate) Pause(context.Context, string, time.Time) error   { return nil }
func (openGate) Sent(context.Context, string, string) error       { return nil }
func (openGate) Land(context.Context, string, string) error       { return nil }
func (openGate) CountEvent(context.Context, string, string) error { return nil }
func (openGate) ReportLateness(context.Context, string, string, time.Duration) (gate.MarginState, error) {
	return gate.MarginState{}, nil
}
func (openGate) ReportThrottle(context.Context, string, string) (gate.MarginState, error) {
	return gate.MarginState{}, nil
}

var e2eTiers = []time.Duration{time.Second, 5 * time.Second}

// e2eShape is how a run's workers are set.
type e2eShape struct {
	name        string
	concurrency int           // worker.concurrency
	prefetch    int           // broker.rabbitmq.prefetch
	linger      time.Duration // gate.batch_linger
}

// e2eShapes: config's defaults, read from the config package, and a worker set for thousands of jobs a
// second (docs/operations.md): more handlers, so that more of them ask at once and each call decides
// more jobs, and a linger that gathers them.
var e2eShapes = []e2eShape{
	defaultsShape(config.Default()),
	{"Workers set for throughput", 64, 256, 500 * time.Microsecond},
}

// defaultsShape is how config's defaults set a worker: its concurrency, its RabbitMQ prefetch and its
// linger, whatever they are.
func defaultsShape(d *config.Config) e2eShape {
	return e2eShape{"Workers as config's defaults set them", d.Worker.Concurrency, d.Broker.RabbitMQ.Prefetch, d.Gate.BatchLinger}
}

// e2eRounds: each round runs every setting once, one after another, so that the machine's drift (its
// speed changes by a third over minutes here) weighs on the gate and its baseline alike.
const e2eRounds = 5

// e2eSetting is one run's: the gate's batch (0: no gate), whether results are published, and the most
// calls on their way at once (gate.batch_calls; 0: config's default).
type e2eSetting struct {
	batch   int
	results bool
	calls   int
}

// e2eSettings are the runs of each round, in order: no gate, one job a call, batched, batched with results,
// and batched with up to e2eCalls calls on their way at once (gate.batch_calls).
var e2eSettings = []e2eSetting{{0, false, 0}, {1, false, 0}, {config.Default().Gate.Batch, false, 0}, {config.Default().Gate.Batch, true, 0},
	{config.Default().Gate.Batch, false, e2eCalls}}

// e2eCalls is gate.batch_calls in the last run of each round.
const e2eCalls = 4

func runE2E(ctx context.Context, redisAddr, amqpURL string, jobs int, shape e2eShape) ([]e2eResult, error) {
	var out []e2eResult
	batches := e2eSettings
	for _, kind := range []string{"rabbitmq", "kafka (kfake)"} {
		if kind == "rabbitmq" && amqpURL == noAMQP {
			continue // no RabbitMQ on this machine
		}
		for _, workers := range []int{1, 3} {
			if workers > 1 && kind != "rabbitmq" {
				continue // see the report: kfake's rebalancing, not the worker, sets the pace
			}
			runs := make([][]e2eResult, len(batches))
			for range e2eRounds {
				for i, set := range batches {
					var r e2eResult
					var err error
					pprof.Do(ctx, pprof.Labels("gate", e2eLabel(set.batch)), func(ctx context.Context) {
						r, err = e2eOne(ctx, kind, redisAddr, amqpURL, workers, set, jobs, shape)
					})
					if err != nil {
						return nil, fmt.Errorf("%s, %d workers, batch %d, results %v, %s: %w", kind, workers, set.batch, set.results, shape.name, err)
					}
					switch {
					case set.results:
						r.cost = 1 - r.perSec/runs[i-1][len(runs[i])].perSec // against the same run without results
					case i > 0:
						r.cost = 1 - r.perSec/runs[0][len(runs[i])].perSec
					}
					runs[i] = append(runs[i], r)
				}
			}
			for _, rs := range runs {
				costs := make([]float64, len(rs))
				for i, r := range rs {
					costs[i] = r.cost
				}
				slices.Sort(costs)
				slices.SortFunc(rs, func(a, b e2eResult) int { return cmp.Compare(a.perSec, b.perSec) })
				median := rs[len(rs)/2] // its throughput and CPU; the cost is the median of the rounds' ratios
				median.cost = costs[len(costs)/2]
				out = append(out, median)
			}
		}
	}
	return out, nil
}

// e2eConfig is the configuration of one run's workers: config's defaults but for the broker's names, a
// provider p with a budget no client here can fill, unpaced (burst = its limit: the gate's cost per
// decision is measured, not a pace), and no warm-up (a fresh prefix would otherwise hold p for its first
// seconds: the run measures the steady state).
func e2eConfig(kind, name, redisAddr, url string, brokers []string, shape e2eShape) *config.Config {
	c := config.Default()
	c.Redis.Addrs, c.Redis.KeyPrefix, c.Gate.WarmUp = []string{redisAddr}, name, false
	c.Broker.RabbitMQ.Exchange, c.Broker.RabbitMQ.Prefetch = name, shape.prefetch
	c.Worker.Concurrency, c.Gate.BatchLinger = shape.concurrency, shape.linger
	c.Broker.Kafka.Brokers, c.Broker.Kafka.Group, c.Broker.Kafka.TopicPrefix = brokers, name, name
	if kind != "rabbitmq" {
		c.Broker.Kind = "kafka"
	}
	c.Worker.MaxDeferralAge, c.Worker.ShutdownTimeout, c.Worker.DelayTiers = time.Hour, 5*time.Second, e2eTiers
	c.Providers["p"] = config.Provider{URL: url, Timeout: 5 * time.Second,
		Limits: []config.Limit{{Requests: gate.MaxSlidingLogLimit, Per: time.Second}}, Burst: gate.MaxSlidingLogLimit}.WithDefaults()
	return c
}

// e2eLabel names a run's gate setting in a CPU profile (-cpuprofile): none, one (job a call), batched.
func e2eLabel(batch int) string {
	switch batch {
	case 0:
		return "none"
	case 1:
		return "one"
	}
	return "batched"
}

func e2eOne(ctx context.Context, kind, redisAddr, amqpURL string, workers int, set e2eSetting, jobs int, shape e2eShape) (e2eResult, error) {
	batch := set.batch
	res := e2eResult{broker: kind, workers: workers, batch: batch, results: set.results, jobs: jobs}
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	name := fmt.Sprintf("bench-e2e-%d", time.Now().UnixNano())
	ref, err := sim.Start("127.0.0.1:0", sim.Options{Limits: []sim.Window{{Limit: 1 << 30, Per: time.Second}}})
	if err != nil {
		return res, err
	}
	defer ref.Close()
	var brokers []string
	if kind != "rabbitmq" {
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return res, err
		}
		defer c.Close()
		brokers = c.ListenAddrs()
	}
	cfg := e2eConfig(kind, name, redisAddr, ref.URL()+"/pay", brokers, shape)
	cfg.Gate.Batch = max(batch, 1)
	cfg.Results.Enabled = set.results
	if set.calls > 0 {
		cfg.Gate.BatchCalls = set.calls
	}
	var calls, moves atomic.Int64
	o := wire.Options{Secret: func(string) string { return amqpURL }}
	if kind == "rabbitmq" {
		defer func() { _ = wire.DeleteBroker(context.WithoutCancel(ctx), cfg, o) }()
	}

	producer, err := wire.OpenBroker(ctx, cfg, o)
	if err != nil {
		return res, err
	}
	defer producer.Close()
	// Queued up front: the workers' pace, not the publishers', is measured.
	var pub sync.WaitGroup
	perr := make(chan error, 16)
	for g := range 16 { // enough publishers to stay ahead of the workers
		pub.Go(func() {
			for i := g; i < jobs; i += 16 {
				body := fmt.Appendf(nil, `{"id":"%s-%d","provider":"p","amount":100,"currency":"EUR"}`, name, i)
				if err := producer.Publish(ctx, "p", body); err != nil {
					perr <- err
					return
				}
			}
		})
	}
	pub.Wait()
	close(perr)
	if err := <-perr; err != nil {
		return res, err
	}
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var closers []func()
	defer func() {
		stop()
		wg.Wait()
		for _, c := range closers {
			c()
		}
	}()
	var readies []func() error
	for range workers {
		parts, err := wire.Build(ctx, cfg, o)
		if err != nil {
			return res, err
		}
		closers = append(closers, parts.Close)
		readies = append(readies, parts.Broker.Ready)
		var g consumers.Gate = openGate{}
		if batch > 0 {
			g = parts.Gate
			parts.Redis.AddHook(scriptCalls{&calls, &moves})
		}
		w, err := parts.Worker(g, nil, nil)
		if err != nil {
			return res, err
		}
		wg.Go(func() { _ = w.Run(wctx, parts.Broker) })
	}
	// Throughput counts from the first acceptance, so joining the group is not in it.
	readyBy := time.Now().Add(time.Minute)
	for _, ready := range readies {
		for ready() != nil {
			if time.Now().After(readyBy) || ctx.Err() != nil {
				return res, fmt.Errorf("workers not ready: %v", ready())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	cpu0, err := cpuNow(ctx, rdb)
	if err != nil {
		return res, err
	}
	from := ref.Stats().Accepted
	deadline := time.Now().Add(2 * time.Minute)
	for ref.Stats().Accepted < int64(jobs) {
		if time.Now().After(deadline) {
			return res, fmt.Errorf("%d of %d jobs accepted in 2 minutes", ref.Stats().Accepted, jobs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cpu1, err := cpuNow(ctx, rdb)
	if err != nil {
		return res, err
	}
	st := ref.Stats()
	if n := st.Accepted - from; n > 0 {
		res.redisCPU, res.ownCPU = (cpu1.redis-cpu0.redis)/time.Duration(n), (cpu1.own-cpu0.own)/time.Duration(n)
	}
	// From the first acceptance to the last: joining a consumer group is not throughput.
	res.perSec = float64(st.Accepted-1) / st.LastAccepted.Sub(*st.FirstAccepted).Seconds() // publishing overlaps
	res.calls, res.moves = calls.Load(), moves.Load()
	return res, nil
}

// cpuTimes is CPU used so far by Redis (its INFO cpu: every thread, user and system) and by this process.
type cpuTimes struct{ redis, own time.Duration }

func cpuNow(ctx context.Context, rdb *redis.Client) (cpuTimes, error) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return cpuTimes{}, err
	}
	var t cpuTimes
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_sys" && k != "used_cpu_user") {
			continue
		}
		sec, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return cpuTimes{}, fmt.Errorf("INFO cpu %s: %w", k, err)
		}
		t.redis += time.Duration(sec * float64(time.Second))
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return cpuTimes{}, err
	}
	t.own = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return t, nil
}

// pingCPU is Redis's CPU for one PING sent alone (each awaited before the next), the floor of any call
// on this machine: reading, writing and waking for it.
func pingCPU(ctx context.Context, redisAddr string) (time.Duration, error) {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	const n = 5000
	c0, err := cpuNow(ctx, rdb)
	if err != nil {
		return 0, err
	}
	for range n {
		if err := rdb.Ping(ctx).Err(); err != nil {
			return 0, err
		}
	}
	c1, err := cpuNow(ctx, rdb)
	if err != nil {
		return 0, err
	}
	return (c1.redis - c0.redis) / n, nil
}

// scriptCalls counts the gate's script calls (FCALL, EVALSHA, EVAL) on a worker's Redis client, and
// among them the lateness guard's moves (lua/family's ops postpone and depart), when moves is set.
type scriptCalls struct{ n, moves *atomic.Int64 }

func (s scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch cmd.Name() {
		case "fcall", "evalsha", "eval":
			s.n.Add(1)
			if s.moves != nil {
				// FCALL name numkeys key... op ...: the op follows the keys
				if a := cmd.Args(); len(a) > 3 {
					if nk, ok := a[2].(int); ok && len(a) > 3+nk && (a[3+nk] == "postpone" || a[3+nk] == "depart") {
						s.moves.Add(1)
					}
				}
			}
		}
		return next(ctx, cmd)
	}
}
func (s scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// footprint runs a real worker process at a provider's full budget (100/1s and 3000/1m, RabbitMQ) and
// reports its peak RSS and the Redis memory of the provider's log.
type footprintResult struct {
	rssKB       int64
	logBytes    int64
	logEntries  int64
	accepted    int64
	violations  int64
	runFor      time.Duration
	bytesPerJob float64
}

// runFootprint measures a worker at steady state: its gate's warm-up is off, since a fresh prefix would
// otherwise hold the provider for its first seconds (gate.warmup) and the run would not be at full budget.
func runFootprint(ctx context.Context, rdb redis.UniversalClient, redisAddr, amqpURL string, runFor time.Duration) (footprintResult, error) {
	var res footprintResult
	dir, err := os.MkdirTemp("", "paygate-bench-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "worker")
	build := exec.Command("go", "build", "-o", bin, "./cmd/worker")
	build.Dir = ".." // in paygate's own module: its go.mod and go.sum, not bench's
	if out, err := build.CombinedOutput(); err != nil {
		return res, fmt.Errorf("build worker: %v %s", err, out)
	}
	limits := []sim.Window{{Limit: 100, Per: time.Second}, {Limit: 3000, Per: time.Minute}}
	ref, err := sim.Start("127.0.0.1:0", sim.Options{Limits: limits, Latency: 20 * time.Millisecond, Jitter: 10 * time.Millisecond})
	if err != nil {
		return res, err
	}
	defer ref.Close()
	x := fmt.Sprintf("bench-rss-%d", time.Now().UnixNano())
	cfg := filepath.Join(dir, "config.yaml")
	yaml := fmt.Sprintf(`http: {listen: "127.0.0.1:0"}
redis: {addrs: [%q], key_prefix: %s}
gate: {warmup: false}
broker: {kind: rabbitmq, rabbitmq: {exchange: %s}}
worker: {delay_tiers: [1s, 5s]}
providers:
  acme:
    url: %s/pay
    timeout: 5s
    limits: [{requests: 100, per: 1s}, {requests: 3000, per: 1m}]
`, redisAddr, x, x, ref.URL())
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		return res, err
	}
	c, err := config.Load(cfg)
	if err != nil {
		return res, err
	}
	defer func() {
		_ = wire.DeleteBroker(context.WithoutCancel(ctx), c, wire.Options{Secret: func(string) string { return amqpURL }})
	}()
	env := append(os.Environ(), "PAYGATE_AMQP_URL="+amqpURL)
	enq := exec.CommandContext(ctx, bin, "enqueue", "--config", cfg, "--provider", "acme", "--count", strconv.Itoa(int(runFor.Seconds())*150))
	enq.Env = env
	if out, err := enq.CombinedOutput(); err != nil {
		return res, fmt.Errorf("enqueue: %v %s", err, out)
	}
	w := exec.CommandContext(ctx, bin, "run", "--config", cfg)
	w.Env = env
	if err := w.Start(); err != nil {
		return res, err
	}
	if !consumers.Sleep(ctx, runFor) {
		_ = w.Process.Kill()
		_ = w.Wait()
		return res, ctx.Err()
	}
	keys := []string{x + ":{acme}:log"}
	res.logEntries, _ = rdb.ZCard(ctx, keys[0]).Result()
	res.logBytes, _ = rdb.MemoryUsage(ctx, keys[0], 0).Result()
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", w.Process.Pid))
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			res.rssKB, _ = strconv.ParseInt(strings.Fields(v)[0], 10, 64)
		}
	}
	_ = w.Process.Signal(os.Interrupt)
	_ = w.Wait()
	st := ref.Stats()
	res.accepted, res.violations, res.runFor = st.Accepted, st.Violations, runFor
	if res.logEntries > 0 {
		res.bytesPerJob = float64(res.logBytes) / float64(res.logEntries)
	}
	_ = rdb.Del(ctx, keys[0]).Err()
	return res, nil
}
