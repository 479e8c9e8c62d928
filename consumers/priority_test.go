package consumers_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/consumers/memory"
	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/internal/testenv"
	"github.com/paygate/paygate/job"
)

func classBody(id string, class job.Priority) []byte {
	if class == "" {
		return body(id, "acme")
	}
	return fmt.Appendf(nil, `{"id":%q,"provider":"acme","amount":1,"currency":"EUR","priority":%q}`, id, class)
}

// Deliveries waiting their turn are taken high first, then normal, then low, whatever the order they were
// published in; with fair shares, the same inside each class.
func TestPriorityOrderInRun(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(fmt.Sprint("fair=", fair), func(t *testing.T) {
			g := &fakeGate{answers: []answer{{v: allow(0).v, block: 50 * time.Millisecond}, allow(0)}}
			p := &fakeProvider{}
			cfg := consumers.Config{Concurrency: 1, MaxInlineWait: time.Second, LowHorizon: 100 * time.Millisecond, MaxAttempts: 3,
				MaxDeferralAge: time.Hour, ShutdownTimeout: time.Second, BackoffBase: time.Second, BackoffMax: time.Minute,
				RedisRetry: time.Second, Providers: map[string]int64{"acme": 10}, ReadAhead: 20}
			if fair {
				cfg.Fair = map[string]map[string]int{"acme": {}}
			}
			w, err := consumers.New(cfg, g, map[string]consumers.Dispatcher{"acme": p}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			g.w = w
			b := memory.New(20, "acme")
			for _, class := range []job.Priority{job.Low, job.Normal, job.High} {
				for i := range 4 {
					if err := b.Publish(context.Background(), consumers.Route("acme", class), classBody(fmt.Sprint(class, i), class)); err != nil {
						t.Fatal(err)
					}
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- w.Run(ctx, b) }()
			for deadline := time.Now().Add(10 * time.Second); len(b.Settled()) < 12 && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			p.mu.Lock()
			order := p.jobs
			p.mu.Unlock()
			if len(order) != 12 {
				t.Fatalf("dispatched %v, want all 12", order)
			}
			// The first was taken before the others were waiting (its gate call blocks 50ms); then by class.
			rank := map[string]int{"high": 0, "normal": 1, "low": 2}
			for i := 2; i < len(order); i++ {
				if rank[strings.TrimRight(order[i-1], "0123456789")] > rank[strings.TrimRight(order[i], "0123456789")] {
					t.Fatalf("dispatched in order %v: want high, then normal, then low after the first", order)
				}
			}
		})
	}
}

// A job whose priority disagrees with the queue it arrived on is dead-lettered invalid, naming the field.
func TestPriorityMismatchIsInvalid(t *testing.T) {
	g := &fakeGate{answers: []answer{allow(0)}}
	p := &fakeProvider{}
	w, err := consumers.New(consumers.Config{Concurrency: 1, MaxInlineWait: time.Second, MaxAttempts: 3, MaxDeferralAge: time.Hour,
		ShutdownTimeout: time.Second, BackoffBase: time.Second, BackoffMax: time.Minute, RedisRetry: time.Second,
		Providers: map[string]int64{"acme": 10}}, g, map[string]consumers.Dispatcher{"acme": p}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := memory.New(20, "acme")
	for route, body := range map[string][]byte{
		"acme":      classBody("h", job.High),
		"acme.low":  classBody("n", ""),
		"acme.high": classBody("l", job.Low),
		"acme.Low":  nil, // no such route
	} {
		if body == nil {
			if err := b.Publish(context.Background(), route, classBody("x", job.Low)); err == nil {
				t.Fatalf("published on route %s", route)
			}
			continue
		}
		if err := b.Publish(context.Background(), route, body); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx, b) }()
	for deadline := time.Now().Add(5 * time.Second); len(b.Settled()) < 3 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"acme":      `priority: "high" arrived on the queue of acme (normal)`,
		"acme.low":  `priority: "normal" arrived on the queue of acme.low (low)`,
		"acme.high": `priority: "low" arrived on the queue of acme.high (high)`,
	}
	for _, s := range b.Settled() {
		if s.Kind != "dead" || s.Reason != consumers.ReasonInvalid || s.Why == nil || s.Why.Error() != want[s.Provider] {
			t.Errorf("%s: %s %s %v, want dead invalid %q", s.Provider, s.Kind, s.Reason, s.Why, want[s.Provider])
		}
	}
	if len(b.Settled()) != 3 || len(p.jobs) != 0 {
		t.Fatalf("settled %d, dispatched %v: want 3 dead, none sent", len(b.Settled()), p.jobs)
	}
}

// countingGate counts each job's ReserveFor calls.
type countingGate struct {
	*gate.Limiter
	mu    sync.Mutex
	calls map[string]int
}

func (g *countingGate) ReserveFor(ctx context.Context, provider, merchant, jobID string, cost int64, maxWait time.Duration) (gate.Verdict, error) {
	g.mu.Lock()
	g.calls[jobID]++
	g.mu.Unlock()
	return g.Limiter.ReserveFor(ctx, provider, merchant, jobID, cost, maxWait)
}

// Against the real gate, one process with 64 handlers: a backlog of low jobs alone uses the provider's budget with at most 1.3 gate
// calls per job (the lane, and the wait of half the horizon after a denial); high jobs published behind
// it reach the provider within the low horizon plus their own share of the budget.
func TestLowBacklogThenHigh(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer rdb.Close()
	const rate, lows, highs = 20, 100, 10
	horizon := 500 * time.Millisecond
	l, err := gate.New(rdb, gate.Options{Prefix: prefix(), Margin: 20 * time.Millisecond, StaleAfter: 10 * time.Millisecond,
		Providers: map[string]gate.Provider{"acme": {Policies: []gate.Policy{{Limit: rate, Window: time.Second}}}}})
	if err != nil {
		t.Fatal(err)
	}
	g := &countingGate{Limiter: l, calls: map[string]int{}}
	p := &fakeProvider{}
	// 64 handlers could hold 3.2 s of the budget ahead: the horizon, not the handlers, bounds the low jobs.
	w, err := consumers.New(consumers.Config{Concurrency: 64, MaxInlineWait: 5 * time.Second, LowHorizon: horizon, MaxAttempts: 3,
		MaxDeferralAge: time.Hour, ShutdownTimeout: 5 * time.Second, BackoffBase: time.Second, BackoffMax: time.Minute,
		RedisRetry: time.Second, LateLimit: 10 * time.Millisecond, Providers: map[string]int64{"acme": rate}},
		g, map[string]consumers.Dispatcher{"acme": p}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := memory.New(1000, "acme")
	for i := range lows {
		if err := b.Publish(context.Background(), "acme.low", classBody(fmt.Sprint("low", i), job.Low)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx, b) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}()
	sent := func() (map[string]time.Time, int) {
		p.mu.Lock()
		defer p.mu.Unlock()
		at := map[string]time.Time{}
		for i, id := range p.jobs {
			at[id] = p.at[i]
		}
		return at, len(p.jobs)
	}
	time.Sleep(time.Second) // low jobs alone, past the start
	_, before := sent()
	time.Sleep(time.Second)
	at, after := sent()
	// Sliding log paced over the window and the margin: rate/(1s+20ms) a second.
	if got := after - before; float64(got) < 0.9*rate {
		t.Errorf("low jobs alone: %d dispatched in a second, want ≥ %d (the budget used)", got, int(0.9*rate))
	}
	published := map[string]time.Time{}
	for i := range highs {
		id := fmt.Sprint("high", i)
		published[id] = time.Now()
		if err := b.Publish(context.Background(), "acme.high", classBody(id, job.High)); err != nil {
			t.Fatal(err)
		}
	}
	// Each high job: behind at most the horizon's low reservations and the high jobs before it, plus slack
	// for scheduling (two shared cores, other processes busy).
	bound := horizon + highs*time.Second/rate + 500*time.Millisecond
	allSent := func() bool {
		at, _ = sent()
		for id := range published {
			if _, ok := at[id]; !ok {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(10 * time.Second); !allSent() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	var latest time.Duration
	for id, pub := range published {
		latest = max(latest, at[id].Sub(pub))
	}
	t.Logf("the last high job reached the provider %v after it was published", latest.Round(time.Millisecond))
	for id, pub := range published {
		if got, ok := at[id]; !ok || got.Sub(pub) > bound {
			t.Errorf("%s reached the provider %v after it was published (sent %v), want within %v", id, got.Sub(pub), ok, bound)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if _, n := sent(); n == lows+highs {
			break
		}
	}
	at, n := sent()
	g.mu.Lock()
	defer g.mu.Unlock()
	calls, jobs := 0, 0
	for id, c := range g.calls {
		if strings.HasPrefix(id, "low") {
			if _, ok := at[id]; ok {
				calls, jobs = calls+c, jobs+1
			}
		}
	}
	perJob := float64(calls) / float64(max(jobs, 1))
	t.Logf("%d low jobs sent with %d gate calls: %.2f a job; %d of %d sent", jobs, calls, perJob, n, lows+highs)
	if jobs < lows*9/10 || perJob > 1.3 {
		t.Fatalf("%d low jobs sent with %.2f gate calls each, want ≥ %d jobs and ≤ 1.3 calls each", jobs, perJob, lows*9/10)
	}
}

// fleetWaiting is consumers.Waiting in memory, for several workers.
type fleetWaiting struct {
	mu    sync.Mutex
	until time.Time
	notes int
}

func (f *fleetWaiting) NoteWaiting(_ context.Context, _ string, d time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.until, f.notes = time.Now().Add(d), f.notes+1
	return nil
}

func (f *fleetWaiting) Waiting(context.Context, string) (time.Duration, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return max(time.Until(f.until), 0), nil
}

// The fleet's word: a worker that finds high deliveries waiting for its handlers tells the fleet, and a
// worker with low jobs alone holds its lane while the fleet says so (a Kafka member out of high jobs while
// another has some), then asks.
func TestLaneYieldsToTheFleet(t *testing.T) {
	shared := &fleetWaiting{}
	newWorker := func(b *memory.Broker, p *fakeProvider) *consumers.Worker {
		g := &fakeGate{answers: []answer{{v: allow(0).v, block: 20 * time.Millisecond}}}
		w, err := consumers.New(consumers.Config{Concurrency: 1, MaxInlineWait: 5 * time.Second, LowHorizon: 400 * time.Millisecond,
			MaxAttempts: 3, MaxDeferralAge: time.Hour, ShutdownTimeout: time.Second, BackoffBase: time.Second, BackoffMax: time.Minute,
			RedisRetry: time.Second, Providers: map[string]int64{"acme": 10}}, g, map[string]consumers.Dispatcher{"acme": p}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		g.w = w
		w.UseWaiting(shared)
		return w
	}
	run := func(w *consumers.Worker, b *memory.Broker) func() {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- w.Run(ctx, b) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}
	// A: high jobs waiting for its one handler.
	highs, highP := memory.New(20, "acme"), &fakeProvider{}
	for i := range 5 {
		if err := highs.Publish(context.Background(), "acme.high", classBody(fmt.Sprint("high", i), job.High)); err != nil {
			t.Fatal(err)
		}
	}
	stopA := run(newWorker(highs, highP), highs)
	for deadline := time.Now().Add(5 * time.Second); len(highs.Settled()) < 5 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	stopA()
	told := time.Now()
	shared.mu.Lock()
	notes := shared.notes
	shared.mu.Unlock()
	if notes == 0 {
		t.Fatal("high deliveries waited for A's handler; the fleet was not told")
	}
	// B: low jobs alone, while the fleet's word holds (400ms from A's last note).
	lows, lowP := memory.New(20, "acme"), &fakeProvider{}
	if err := lows.Publish(context.Background(), "acme.low", classBody("low0", job.Low)); err != nil {
		t.Fatal(err)
	}
	stopB := run(newWorker(lows, lowP), lows)
	defer stopB()
	for deadline := time.Now().Add(5 * time.Second); len(lows.Settled()) < 1 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	lowP.mu.Lock()
	defer lowP.mu.Unlock()
	if len(lowP.at) != 1 {
		t.Fatalf("low job sent %d times", len(lowP.at))
	}
	shared.mu.Lock()
	until := shared.until
	shared.mu.Unlock()
	if lowP.at[0].Before(until) || until.Sub(told) < 200*time.Millisecond {
		t.Fatalf("low job sent %v after A stopped, the fleet's word held until %v after: want it held back until then",
			lowP.at[0].Sub(told), until.Sub(told))
	}
}

// Low deliveries held back while the fleet says higher classes wait, more than the worker reads ahead:
// a shutdown still ends at once, every one of them back in its queue.
func TestShutdownWithLowsHeldBack(t *testing.T) {
	shared := &fleetWaiting{until: time.Now().Add(time.Hour)}
	g := &fakeGate{answers: []answer{allow(0)}}
	p := &fakeProvider{}
	w, err := consumers.New(consumers.Config{Concurrency: 1, MaxInlineWait: 5 * time.Second, LowHorizon: 400 * time.Millisecond,
		MaxAttempts: 3, MaxDeferralAge: time.Hour, ShutdownTimeout: 2 * time.Second, BackoffBase: time.Second, BackoffMax: time.Minute,
		RedisRetry: time.Second, Providers: map[string]int64{"acme": 10}}, g, map[string]consumers.Dispatcher{"acme": p}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	g.w = w
	w.UseWaiting(shared)
	b := memory.New(100, "acme")
	for i := range 40 { // beyond the 8 a handler's class queue reads ahead
		if err := b.Publish(context.Background(), "acme.low", classBody(fmt.Sprint("low", i), job.Low)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx, b) }()
	time.Sleep(300 * time.Millisecond)
	cancel()
	stopped := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the shutdown")
	}
	// The low job yielding in the lane holds nothing at the gate: it goes back at once, not at the
	// shutdown timeout (2s).
	if took := time.Since(stopped); took > time.Second {
		t.Fatalf("shutdown took %v, want the low jobs back at once", took)
	}
	if n := b.Pending("acme.low"); n != 40 || len(p.jobs) != 0 {
		t.Fatalf("%d low jobs back in their queue, %d sent; want all 40 back, none sent while the fleet's word held", n, len(p.jobs))
	}
}
