package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/job"
	"github.com/paygate/paygate/providers"
	"github.com/paygate/paygate/providers/sim"
	"github.com/paygate/paygate/wire"
)

// paygate worker: the worker core's own path (consumers.Worker.Handle) for every job, as `worker run`
// takes it: reserve, wait in-process, the lateness guard (a slot woken on more than half the margin late
// is given back and asked again; three times late, the job goes back to the broker), then dispatch.
// Each bench worker is one consumers.Worker with one handler. Its dispatcher does not send: it lets the
// harness send, at the moment the core dispatches. A job the core defers (sent back to the broker in
// production) is handled again after the deferral, as the broker would bring it back.
type workerRun struct {
	l       *gate.Limiter
	core    consumers.Config
	counted *callCounter
	own     *redis.Client // the run's own Redis client, when it has one (fastWorkerCore): it counts scripts
	scripts atomic.Int64  // the gate's script calls on own
	ready   sync.Map      // job id -> chan struct{}, closed when the core dispatches it
}

// newWorkerCore is the worker core as the example config sets it; calls per job are the Reserves and
// Releases of the jobs sent (callCounter), as for every contender of section 2.
func newWorkerCore(rdb redis.UniversalClient, prefix string, limits []sim.Window, _ int) (run, error) {
	c := workerConfig(prefix, limits)
	l, err := wire.Gate(c, rdb, wire.Worker)
	return &workerRun{l: l, core: wire.Core(c), counted: &callCounter{Gate: l}}, err
}

// fastWorkerCore is the worker core with gate.batch_linger set, on a Redis client of its own (on rdb's
// server) that counts the gate's script calls: at thousands of jobs a second a batched call decides the
// reserves of several workers, so calls per job are Redis calls over jobs sent (every job there is sent:
// nothing is denied within its wait), not the jobs' own Reserves.
func fastWorkerCore(linger time.Duration) func(redis.UniversalClient, string, []sim.Window, int) (run, error) {
	return func(rdb redis.UniversalClient, prefix string, limits []sim.Window, _ int) (run, error) {
		c := workerConfig(prefix, limits)
		c.Gate.BatchLinger = linger
		single, ok := rdb.(*redis.Client)
		if !ok {
			return nil, fmt.Errorf("bench: the worker core runs on a single Redis, got %T", rdb)
		}
		own := redis.NewClient(single.Options())
		r := &workerRun{core: wire.Core(c), own: own}
		own.AddHook(scriptCalls{n: &r.scripts})
		l, err := wire.Gate(c, own, wire.Worker)
		r.l, r.counted = l, &callCounter{Gate: l}
		return r, err
	}
}

// close closes the run's own Redis client, if it has one.
func (r *workerRun) close() {
	if r.own != nil {
		_ = r.own.Close()
	}
}

// scriptCallsMade is the run's gate script calls so far, when they are counted (accuracyOne's calls per job).
func (r *workerRun) scriptCallsMade() (int64, bool) { return r.scripts.Load(), r.own != nil }

// workerConfig is config's defaults with the provider p at these limits (paced, burst 1), and no
// warm-up: each contender starts on an empty state, and the accuracy runs measure the steady state.
func workerConfig(prefix string, limits []sim.Window) *config.Config {
	p := config.Provider{URL: "http://127.0.0.1:1/unused", Timeout: 5 * time.Second}
	for _, l := range limits {
		p.Limits = append(p.Limits, config.Limit{Requests: int64(l.Limit), Per: l.Per})
	}
	c := config.Default()
	c.Redis.KeyPrefix, c.Gate.WarmUp = prefix, false
	c.Worker.Concurrency, c.Worker.MaxDeferralAge, c.Worker.ShutdownTimeout = 1, time.Hour, 5*time.Second
	c.Providers["p"] = p.WithDefaults()
	return c
}

func (r *workerRun) worker(int) acquirer {
	w, err := consumers.New(r.core, r.counted, map[string]consumers.Dispatcher{"p": dispatchFunc(r.dispatched)}, nil, nil)
	if err != nil {
		panic(err) // the configuration above is fixed and valid
	}
	return acquireFunc(func(ctx context.Context, id string) (int, error) {
		ready := make(chan struct{})
		r.ready.Store(id, ready)
		defer r.ready.Delete(id)
		body := fmt.Appendf(nil, `{"id":%q,"provider":"p","amount":100,"currency":"EUR"}`, id)
		for {
			d := &benchDelivery{body: body, first: time.Now()}
			w.Handle(ctx, "p", d)
			select {
			case <-ready:
				return r.counted.take(id), nil
			default:
			}
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			if d.deferred < 0 {
				return 0, errors.New("bench: the worker core dead-lettered or requeued a valid job")
			}
			if !consumers.Sleep(ctx, d.deferred) { // the broker's delay tier
				return 0, ctx.Err()
			}
		}
	})
}

func (r *workerRun) dispatched(_ context.Context, j *job.Job) error {
	if ch, ok := r.ready.Load(j.ID); ok {
		close(ch.(chan struct{}))
	}
	return nil
}

func (r *workerRun) decide(ctx context.Context, id string) (bool, error) {
	v, err := r.l.Reserve(ctx, "p", id, 1, 5*time.Second)
	return v.Allowed, err
}

type dispatchFunc func(ctx context.Context, j *job.Job) error

func (f dispatchFunc) Dispatch(ctx context.Context, j *job.Job) (*providers.Answer, error) {
	return nil, f(ctx, j)
}

// callCounter counts the gate calls each job id made (Reserve and Release).
type callCounter struct {
	consumers.Gate
	calls sync.Map // id -> *atomic.Int64
}

func (c *callCounter) count(id string) {
	n, _ := c.calls.LoadOrStore(id, &atomic.Int64{})
	n.(*atomic.Int64).Add(1)
}

func (c *callCounter) take(id string) int {
	n, ok := c.calls.LoadAndDelete(id)
	if !ok {
		return 0
	}
	return int(n.(*atomic.Int64).Load())
}

func (c *callCounter) ReserveFor(ctx context.Context, provider, merchant, id string, cost int64, maxWait time.Duration) (gate.Verdict, error) {
	c.count(id)
	return c.Gate.ReserveFor(ctx, provider, merchant, id, cost, maxWait)
}

func (c *callCounter) ReleaseFor(ctx context.Context, provider, merchant, id string, cost int64, slot time.Time) (int64, error) {
	c.count(id)
	return c.Gate.ReleaseFor(ctx, provider, merchant, id, cost, slot)
}

// benchDelivery is one delivery to the core: acked, or deferred (for `deferred`), never lost.
type benchDelivery struct {
	body     []byte
	first    time.Time
	deferred time.Duration // -1: dead-lettered or requeued
}

func (d *benchDelivery) Body() []byte                  { return d.body }
func (d *benchDelivery) Attempt() int                  { return 0 }
func (d *benchDelivery) FirstSeen() time.Time          { return d.first }
func (d *benchDelivery) Ack(context.Context) error     { return nil }
func (d *benchDelivery) Requeue(context.Context) error { d.deferred = -1; return nil }
func (d *benchDelivery) Defer(_ context.Context, after time.Duration, _ int, _ error) error {
	d.deferred = after
	return nil
}
func (d *benchDelivery) DeadLetter(context.Context, consumers.Reason, int, error) error {
	d.deferred = -1
	return nil
}
