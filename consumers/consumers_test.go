package consumers_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/consumers/memory"
	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/internal/testenv"
	"github.com/paygate/paygate/job"
	"github.com/paygate/paygate/providers"
	"github.com/paygate/paygate/providers/sim"
)

func prefix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "ctest-" + hex.EncodeToString(b[:])
}

// harness is a worker over an in-memory broker, the real gate on real Redis, and httptest providers.
type harness struct {
	t        *testing.T
	broker   *memory.Broker
	gate     *gate.Limiter
	worker   *consumers.Worker
	dispatch map[string]consumers.Dispatcher
	calls    map[string]*atomic.Int64
	cfg      consumers.Config // the worker's, defaults filled in
}

type provider struct {
	name    string
	algo    gate.Algorithm // "": sliding_log
	limits  []gate.Policy
	handler http.HandlerFunc
}

func newHarness(t *testing.T, rdb redis.UniversalClient, cfg consumers.Config, ps ...provider) *harness {
	t.Helper()
	h := &harness{t: t, calls: map[string]*atomic.Int64{}}
	policies := map[string]gate.Provider{}
	dispatch := map[string]consumers.Dispatcher{}
	cfg.Providers = map[string]int64{}
	var names []string
	for _, p := range ps {
		names = append(names, p.name)
		policies[p.name] = gate.Provider{Algorithm: p.algo, Policies: p.limits}
		cfg.Providers[p.name] = p.limits[0].Limit
		calls := &atomic.Int64{}
		h.calls[p.name] = calls
		handler := p.handler
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			handler(w, r)
		}))
		t.Cleanup(srv.Close)
		cl, err := providers.New(p.name, config.Provider{URL: srv.URL, Timeout: 2 * time.Second, RetryAfterDefault: time.Second, RetryAfterMax: time.Hour}, providers.Options{Concurrency: 4})
		if err != nil {
			t.Fatal(err)
		}
		dispatch[p.name] = cl
	}
	// As in the worker: the late limit is half the gate's margin.
	l, err := gate.New(rdb, gate.Options{Prefix: prefix(), Providers: policies, Margin: 2 * cfg.LateLimit, StaleAfter: cfg.LateLimit})
	if err != nil {
		t.Fatal(err)
	}
	h.gate = l
	h.broker = memory.New(1000, names...)
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 4
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = 8
	}
	if cfg.MaxDeferralAge == 0 {
		cfg.MaxDeferralAge = 24 * time.Hour
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 5 * time.Second
	}
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase, cfg.BackoffMax, cfg.RedisRetry = time.Second, 10*time.Minute, time.Second
	}
	h.dispatch, h.cfg = dispatch, cfg
	h.worker, err = consumers.New(cfg, l, dispatch, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func status(code int, retryAfter string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.WriteHeader(code)
		fmt.Fprint(w, `{"error":"as configured"}`)
	}
}

func body(id, provider string) []byte {
	return fmt.Appendf(nil, `{"id":%q,"provider":%q,"amount":1250,"currency":"EUR"}`, id, provider)
}

// handleOne feeds one delivery through the core and returns how it was settled.
func (h *harness) handleOne(provider string, publish func() error) memory.Settled {
	h.t.Helper()
	if err := publish(); err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := h.broker.Consume(ctx, provider)
	if err != nil {
		h.t.Fatal(err)
	}
	d := <-ch
	cancel()
	h.worker.Handle(context.Background(), provider, d)
	s := h.broker.Settled()
	if len(s) == 0 {
		h.t.Fatal("not settled")
	}
	return s[len(s)-1]
}

// TestRedisOutcomes is TestOutcomes' integration counterpart: a few of its rows through the real gate on
// real Redis and a provider over HTTP.
func TestRedisOutcomes(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { rdb.Close(); dead.Close() }) // after the parallel subtests
	roomy := []gate.Policy{{Limit: 100, Window: time.Second}}
	tests := []struct {
		name       string
		rdb        redis.UniversalClient
		limits     []gate.Policy
		handler    http.HandlerFunc
		body       []byte
		attempt    int
		firstSeen  time.Duration // ago
		preconsume int           // jobs admitted at the gate first
		want       memory.Settled
		wantCalls  int64
		wantInWhy  string
	}{
		{name: "accepted", handler: status(200, ""), want: memory.Settled{Kind: "ack"}, wantCalls: 1},
		{name: "not JSON", body: []byte("hello"), want: memory.Settled{Kind: "dead", Reason: consumers.ReasonInvalid}, wantInWhy: "body is not JSON"},
		{name: "bad amount", body: []byte(`{"id":"x","provider":"acme","amount":-1,"currency":"EUR"}`), want: memory.Settled{Kind: "dead", Reason: consumers.ReasonInvalid}, wantInWhy: "amount: must be > 0"},
		{name: "wrong queue", body: body("x", "other"), want: memory.Settled{Kind: "dead", Reason: consumers.ReasonInvalid}, wantInWhy: `provider: "other" is not configured`},
		{name: "permanent", handler: status(422, ""), want: memory.Settled{Kind: "dead", Reason: consumers.ReasonPermanent, Attempt: 1}, wantCalls: 1, wantInWhy: "422"},
		{name: "transient", handler: status(500, ""), want: memory.Settled{Kind: "defer", Attempt: 1}, wantCalls: 1, wantInWhy: "500"},
		{name: "transient, attempts exhausted", handler: status(503, ""), attempt: 7, want: memory.Settled{Kind: "dead", Reason: consumers.ReasonExhausted, Attempt: 8}, wantCalls: 1},
		{name: "throttled", handler: status(429, "2"), attempt: 3, want: memory.Settled{Kind: "defer", Attempt: 3, After: 2 * time.Second}, wantCalls: 1, wantInWhy: "throttled"},
		{name: "too old", handler: status(200, ""), firstSeen: 25 * time.Hour, want: memory.Settled{Kind: "dead", Reason: consumers.ReasonDeferralAge}, wantInWhy: "max_deferral_age"},
		{name: "gate denies", handler: status(200, ""), limits: []gate.Policy{{Limit: 1, Window: time.Hour}}, preconsume: 1, want: memory.Settled{Kind: "defer"}, wantInWhy: "no slot within"},
		{name: "redis down: fail closed", rdb: dead, handler: status(200, ""), want: memory.Settled{Kind: "defer", After: time.Second}, wantInWhy: "dial tcp 127.0.0.1:1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := tt.rdb
			if r == nil {
				r = rdb
			}
			limits := tt.limits
			if limits == nil {
				limits = roomy
			}
			handler := tt.handler
			if handler == nil {
				handler = status(200, "")
			}
			h := newHarness(t, r, consumers.Config{MaxInlineWait: time.Second, BackoffBase: time.Second, BackoffMax: time.Minute, RedisRetry: time.Second},
				provider{name: "acme", limits: limits, handler: handler})
			for i := range tt.preconsume {
				if _, err := h.gate.Allow(context.Background(), "acme", fmt.Sprint("pre-", i), 1); err != nil {
					t.Fatal(err)
				}
			}
			b := tt.body
			if b == nil {
				b = body("pay-1", "acme")
			}
			got := h.handleOne("acme", func() error {
				return h.broker.PublishAged("acme", b, tt.attempt, time.Now().Add(-tt.firstSeen))
			})
			if got.Kind != tt.want.Kind || got.Reason != tt.want.Reason || got.Attempt != tt.want.Attempt ||
				(tt.want.After > 0 && got.After != tt.want.After) {
				t.Fatalf("settled %+v, want %+v", got, tt.want)
			}
			if tt.wantInWhy != "" && (got.Why == nil || !strings.Contains(got.Why.Error(), tt.wantInWhy)) {
				t.Fatalf("why %v, want it to mention %q", got.Why, tt.wantInWhy)
			}
			if n := h.calls["acme"].Load(); n != tt.wantCalls {
				t.Fatalf("provider called %d times, want %d", n, tt.wantCalls)
			}
			if got.Kind == "defer" && tt.want.Attempt == 1 && (got.After <= 0 || got.After > time.Second) {
				t.Fatalf("first transient retry after %v, want (0, 1s] (full jitter under the base)", got.After)
			}
		})
	}
}

// A 429 pauses the provider for every worker: the gate holds the next decision until the pause ends.
func TestThrottlePausesTheCluster(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer rdb.Close()
	h := newHarness(t, rdb, consumers.Config{MaxInlineWait: time.Second},
		provider{name: "acme", limits: []gate.Policy{{Limit: 100, Window: time.Second}}, handler: status(429, "3")})
	h.handleOne("acme", func() error { return h.broker.Publish(context.Background(), "acme", body("a", "acme")) })
	v, err := h.gate.Allow(context.Background(), "acme", "someone-else", 1)
	if err != nil {
		t.Fatal(err)
	}
	if v.Allowed || !v.Paused || v.RetryAfter < 2*time.Second {
		t.Fatalf("another worker's decision after the 429: %+v, want paused ~3s", v)
	}
}

// A throttled provider never starves another: A at 1/s with a backlog, B unlimited; B's jobs all flow
// while A's trickle.
func TestNoHeadOfLineBlocking(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer rdb.Close()
	h := newHarness(t, rdb, consumers.Config{MaxInlineWait: 5 * time.Second, Concurrency: 4},
		provider{name: "slow", limits: []gate.Policy{{Limit: 1, Window: time.Second}}, handler: status(200, "")},
		provider{name: "fast", limits: []gate.Policy{{Limit: 100000, Window: time.Second}}, handler: status(200, "")})
	ctx := context.Background()
	for i := range 30 {
		_ = h.broker.Publish(ctx, "slow", body(fmt.Sprint("s", i), "slow"))
	}
	for i := range 200 {
		_ = h.broker.Publish(ctx, "fast", body(fmt.Sprint("f", i), "fast"))
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- h.worker.Run(runCtx, h.broker) }()
	for h.calls["fast"].Load() < 200 {
		time.Sleep(10 * time.Millisecond)
	}
	slowDone := h.calls["slow"].Load()
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if slowDone > 10 {
		t.Fatalf("slow provider took %d jobs while fast took 200: the test did not overload it", slowDone)
	}
	acked := map[string]int{}
	for _, s := range h.broker.Settled() {
		if s.Kind == "ack" {
			acked[s.Provider]++
		}
	}
	if acked["fast"] != 200 {
		t.Fatalf("fast acked %d of 200", acked["fast"])
	}
}

// SIGTERM with jobs in flight: each one settles or returns to the queue; nothing is lost.
func TestShutdownSettlesOrRequeues(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer rdb.Close()
	var started sync.WaitGroup
	started.Add(2)
	var once [2]sync.Once
	var n atomic.Int64
	slowOK := func(w http.ResponseWriter, r *http.Request) {
		if i := n.Add(1); i <= 2 {
			once[i-1].Do(started.Done)
		}
		time.Sleep(300 * time.Millisecond)
		w.WriteHeader(200)
	}
	h := newHarness(t, rdb, consumers.Config{MaxInlineWait: time.Second, Concurrency: 2, ShutdownTimeout: 5 * time.Second},
		provider{name: "acme", limits: []gate.Policy{{Limit: 1000, Window: time.Second}}, handler: slowOK})
	ctx, stop := context.WithCancel(context.Background())
	const jobs = 10
	for i := range jobs {
		_ = h.broker.Publish(ctx, "acme", body(fmt.Sprint("j", i), "acme"))
	}
	done := make(chan error)
	go func() { done <- h.worker.Run(ctx, h.broker) }()
	started.Wait() // two jobs are at the provider
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	acked, requeued := 0, 0
	for _, s := range h.broker.Settled() {
		switch s.Kind {
		case "ack":
			acked++
		case "requeue":
			requeued++
		default:
			t.Fatalf("unexpected settlement %+v", s)
		}
	}
	if acked < 2 || acked+h.broker.Pending("acme") != jobs {
		t.Fatalf("acked %d, requeued %d, pending %d of %d: a job went missing", acked, requeued, h.broker.Pending("acme"), jobs)
	}
}

// Found in review: a late duplicate must not release its entry (it belongs to a request the first
// delivery may have sent; the redelivery, long after that slot, is moved to a new one and must not release
// that either), and a worker that is always late defers its job rather than send it late.
func TestLatenessGuardEdges(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	t.Cleanup(func() { rdb.Close() })
	h := newHarness(t, rdb, consumers.Config{MaxInlineWait: time.Second, LateLimit: time.Nanosecond},
		provider{name: "acme", limits: []gate.Policy{{Limit: 3, Window: time.Hour}}, handler: status(200, "")})
	ctx := context.Background()
	if _, err := h.gate.Allow(ctx, "acme", "sent", 1); err != nil { // the first delivery's admission
		t.Fatal(err)
	}
	// Every wake-up is "late" (limit 1ns): the redelivery is moved, wakes late, asks again, and after
	// MaxLateTries is deferred, its entry kept (the provider may count it).
	got := h.handleOne("acme", func() error { return h.broker.Publish(ctx, "acme", body("sent", "acme")) })
	if got.Kind != "defer" || h.calls["acme"].Load() != 0 {
		t.Fatalf("redelivered duplicate, always late: %+v, provider calls %d", got, h.calls["acme"].Load())
	}
	st, err := h.gate.Status(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if st.Units != 1 {
		t.Fatalf("%d units in the log, want 1: the redelivery moved its entry, and kept it though late", st.Units)
	}
	// A fresh job, always late: the hour has room for it now, so the gate moves its unit there (Postpone)
	// and it is sent once, on its unit, none given back or spent twice. (With no room now it would give
	// the slot back and ask again, and after MaxLateTries be deferred: TestOutcomes.)
	got = h.handleOne("acme", func() error { return h.broker.Publish(ctx, "acme", body("fresh", "acme")) })
	if got.Kind != "ack" || h.calls["acme"].Load() != 1 {
		t.Fatalf("always-late fresh job: %+v, provider calls %d (want postponed, sent once)", got, h.calls["acme"].Load())
	}
	if st, _ := h.gate.Status(ctx, "acme"); st.Units != 2 {
		t.Fatalf("%d units after the late job, want 2 (the redelivery's and its own)", st.Units)
	}
}

// queued is the gate as a job meets it behind a call on its way (gate.batch): its reserve leaves by
// after the job asked. It counts what the lateness guard does: postponing, giving the slot back.
type queued struct {
	consumers.Gate
	by                  time.Duration
	unknown             bool // the verdict does not say when its call left (Verdict.Asked zero)
	postponed, released atomic.Int64
}

func (q *queued) ReserveFor(ctx context.Context, provider, merchant, jobID string, cost int64, maxWait time.Duration) (gate.Verdict, error) {
	time.Sleep(q.by)
	v, err := q.Gate.ReserveFor(ctx, provider, merchant, jobID, cost, maxWait)
	if q.unknown {
		v.Asked = time.Time{}
	}
	return v, err
}

func (q *queued) Postpone(ctx context.Context, provider, merchant, jobID string, slot time.Time) (time.Time, error) {
	q.postponed.Add(1)
	return q.Gate.Postpone(ctx, provider, merchant, jobID, slot)
}

func (q *queued) ReleaseFor(ctx context.Context, provider, merchant, jobID string, cost int64, slot time.Time) (int64, error) {
	q.released.Add(1)
	return q.Gate.ReleaseFor(ctx, provider, merchant, jobID, cost, slot)
}

// A job that waited for a call to carry its reserve (a batch under load) was not late while it waited:
// its slot was not decided yet. The lateness guard counts from when the deciding call left
// (gate.Verdict.Asked), so a queue wait of four times the late limit sends the job on its slot, without
// a Postpone call (which under load costs one more Redis call per job). Where the verdict does not say,
// the guard counts from the job's asking, as before: the same wait reads as late and the job is
// postponed.
func TestQueueWaitIsNotLateness(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	t.Cleanup(func() { rdb.Close() })
	for _, c := range []struct {
		name      string
		unknown   bool
		postponed int64
	}{{"asked known", false, 0}, {"asked unknown", true, 1}} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, rdb, consumers.Config{MaxInlineWait: time.Second, LateLimit: 100 * time.Millisecond},
				provider{name: "acme", limits: []gate.Policy{{Limit: 10, Window: time.Second}}, handler: status(200, "")})
			// A late limit far above this machine's scheduling jitter: only the queue wait can pass it.
			q := &queued{Gate: h.gate, by: 400 * time.Millisecond, unknown: c.unknown}
			var err error
			if h.worker, err = consumers.New(h.cfg, q, h.dispatch, nil, nil); err != nil {
				t.Fatal(err)
			}
			got := h.handleOne("acme", func() error { return h.broker.Publish(context.Background(), "acme", body("a", "acme")) })
			if got.Kind != "ack" || h.calls["acme"].Load() != 1 {
				t.Fatalf("settled %+v, provider calls %d: want sent once and acked", got, h.calls["acme"].Load())
			}
			if q.postponed.Load() != c.postponed || q.released.Load() != 0 {
				t.Fatalf("postponed %d, released %d; want %d postponed, none released", q.postponed.Load(), q.released.Load(), c.postponed)
			}
		})
	}
}

// Found in review: a dispatch cut short by the shutdown timeout is not a failed attempt; the job goes
// back to its queue.
func TestShutdownTimeoutIsNotAnAttempt(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	t.Cleanup(func() { rdb.Close() })
	started := make(chan struct{}, 1)
	hang := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // the server notices the client leaving only once it read the body
		started <- struct{}{}
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	}
	h := newHarness(t, rdb, consumers.Config{MaxInlineWait: time.Second, Concurrency: 1, MaxAttempts: 8, ShutdownTimeout: 200 * time.Millisecond},
		provider{name: "acme", limits: []gate.Policy{{Limit: 10, Window: time.Second}}, handler: hang})
	if err := h.broker.PublishAged("acme", body("last-try", "acme"), 7, time.Now()); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- h.worker.Run(ctx, h.broker) }()
	<-started
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s := h.broker.Settled()
	if len(s) != 1 || s[0].Kind != "requeue" || h.broker.Pending("acme") != 1 {
		t.Fatalf("settled %+v, pending %d: want the job requeued, not dead-lettered as exhausted", s, h.broker.Pending("acme"))
	}
}

// A retry after a failed request is a new request at a new time: it must take a unit of its own. The
// referee (the strict simulator, 1 per second) fails job a's first request with a 500; a's retry, 300ms
// later, and then b must each be a full window apart from every accepted request. Reusing a's entry (a
// duplicate at its old slot) would send the retry at once and b one window after the failed request:
// 2 accepted within one second.
func TestRetryAfterFailureTakesItsOwnUnit(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer rdb.Close()
	ref, err := sim.New(sim.Options{Limits: []sim.Window{{Limit: 1, Per: time.Second}}})
	if err != nil {
		t.Fatal(err)
	}
	var failed atomic.Bool
	h := newHarness(t, rdb, consumers.Config{MaxInlineWait: 3 * time.Second, LateLimit: 15 * time.Millisecond},
		provider{name: "acme", limits: []gate.Policy{{Limit: 1, Window: time.Second}}, handler: func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Idempotency-Key") == "a" && !failed.Swap(true) {
				status(500, "")(w, r)
				return
			}
			ref.ServeHTTP(w, r)
		}})
	first := h.handleOne("acme", func() error { return h.broker.Publish(context.Background(), "acme", body("a", "acme")) })
	if first.Kind != "defer" || first.Attempt != 1 {
		t.Fatalf("a's failed request settled %+v, want a deferral as attempt 1", first)
	}
	time.Sleep(300 * time.Millisecond) // the retry comes back from a delay tier, well past the margin
	for _, s := range []struct {
		id      string
		attempt int
	}{{"a", 1}, {"b", 0}} {
		got := h.handleOne("acme", func() error {
			return h.broker.PublishAged("acme", body(s.id, "acme"), s.attempt, time.Now())
		})
		if got.Kind != "ack" {
			t.Fatalf("%s settled %+v, want ack", s.id, got)
		}
	}
	if st := ref.Stats(); st.Accepted != 2 || st.Violations != 0 {
		t.Fatalf("referee saw %d accepted, %d violations; want 2 and 0", st.Accepted, st.Violations)
	}
}

// A 429 is a refusal the provider did not count: the job's unit goes back to the budget.
func TestThrottleReleasesTheUnit(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer rdb.Close()
	h := newHarness(t, rdb, consumers.Config{MaxInlineWait: time.Second},
		provider{name: "acme", limits: []gate.Policy{{Limit: 5, Window: time.Minute}}, handler: status(429, "1")})
	h.handleOne("acme", func() error { return h.broker.Publish(context.Background(), "acme", body("a", "acme")) })
	st, err := h.gate.Status(context.Background(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	if used := st.Policies[0].Used; used != 0 {
		t.Fatalf("after a 429 the log holds %d units, want 0 (released)", used)
	}
}

// stalled is a dispatcher that stalls before the request of the jobs named is written: the process was
// starved after its lateness guard let the job go.
type stalled struct {
	consumers.Dispatcher
	by   time.Duration
	jobs map[string]bool
}

func (s stalled) Dispatch(ctx context.Context, j *job.Job) (*providers.Answer, error) {
	if s.jobs[j.ID] {
		time.Sleep(s.by)
	}
	return s.Dispatcher.Dispatch(ctx, j)
}

// A request written past DepartLimit after its slot (a stall after the wake-up), whether it waited for the
// slot (a, after w) or got it at once (a alone), is recorded where it went: the request one window on is
// spaced from when the provider got it. At a stall past the whole margin, without the move b would reach
// the provider 0.8s after a, at a limit of 1 per 1s; at a stall past DepartLimit but within the late
// limit, b comes the stall less than a window and the margin after a unless a's entry moved. A 429 then
// releases the unit at its new slot. A move the replicas did not acknowledge (redis.min_replicas_acked)
// stands on the primary all the same: the worker keeps its new slot, and counts it.
func TestLateWriteIsRecordedWhereItWent(t *testing.T) {
	for _, c := range []struct {
		name          string
		jobs          []string // a is stalled; b comes last
		margin, stall time.Duration
		unacked       bool // the gate reports every departure unacknowledged
	}{
		{"sent at once, past the late limit", []string{"a", "b"}, 100 * time.Millisecond, 300 * time.Millisecond, false},
		{"waited for its slot, past DepartLimit", []string{"w", "a", "b"}, 800 * time.Millisecond, 350 * time.Millisecond, false},
		{"sent at once, past DepartLimit, within the late limit", []string{"a", "b"}, 800 * time.Millisecond, 350 * time.Millisecond, false},
		{"sent at once, the move not acknowledged", []string{"a", "b"}, 100 * time.Millisecond, 300 * time.Millisecond, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if lim := consumers.DepartLimit(c.margin / 2); c.stall <= lim {
				t.Fatalf("stall %s within DepartLimit %s: the case tests nothing", c.stall, lim)
			}
			testLateWrite(t, c.jobs, c.margin, c.stall, c.unacked)
		})
	}
}

// unackedDepartures is a gate whose replicas never acknowledge a departure: the move is made, and
// reported unacknowledged (gate.Limiter.Departed under Options.MinReplicasAcked).
type unackedDepartures struct {
	consumers.Gate
	reported atomic.Int64
}

func (u *unackedDepartures) Departed(ctx context.Context, provider, merchant, jobID string, slot time.Time, late time.Duration) (time.Time, error) {
	at, err := u.Gate.Departed(ctx, provider, merchant, jobID, slot, late)
	if err != nil || at.IsZero() {
		return at, err
	}
	u.reported.Add(1)
	return at, fmt.Errorf("gate: depart %s/%s: %w: 0 of 1 within 50ms", provider, jobID, gate.ErrUnacknowledged)
}

func testLateWrite(t *testing.T, jobs []string, margin, stall time.Duration, unacked bool) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	t.Cleanup(func() { rdb.Close() })
	const window = time.Second
	var mu sync.Mutex
	var arrived []time.Time
	answer := 200
	h := newHarness(t, rdb, consumers.Config{MaxInlineWait: 3 * time.Second, LateLimit: margin / 2},
		provider{name: "acme", limits: []gate.Policy{{Limit: 1, Window: window}}, handler: func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			arrived = append(arrived, time.Now())
			code := answer
			mu.Unlock()
			status(code, "1")(w, r)
		}})
	ctx := context.Background()
	h.dispatch["acme"] = stalled{Dispatcher: h.dispatch["acme"], by: stall, jobs: map[string]bool{"a": true, "c": true}}
	u := &unackedDepartures{Gate: h.gate}
	if unacked {
		var err error
		if h.worker, err = consumers.New(h.cfg, u, h.dispatch, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range jobs {
		if got := h.handleOne("acme", func() error { return h.broker.Publish(ctx, "acme", body(id, "acme")) }); got.Kind != "ack" {
			t.Fatalf("%s: %+v, want acked", id, got)
		}
	}
	mu.Lock()
	// b's slot is a window and the margin after a's entry: after a's write if it moved, else after its
	// slot, the stall before it. Half the stall allows for a's trip to the handler.
	n := len(jobs)
	if len(arrived) != n {
		mu.Unlock()
		t.Fatalf("arrivals %v: want %d", arrived, n)
	}
	if apart := arrived[n-1].Sub(arrived[n-2]); apart < window+margin-stall/2 {
		mu.Unlock()
		t.Fatalf("b %s after a, want a's entry moved: a window and the margin (%s) apart, not less a's stall (%s)", apart, margin, stall)
	}
	answer = 429
	mu.Unlock()
	if got := h.handleOne("acme", func() error { return h.broker.Publish(ctx, "acme", body("c", "acme")) }); got.Kind != "defer" || h.calls["acme"].Load() != int64(n+1) {
		t.Fatalf("c: %+v after %d requests, want sent, throttled and deferred", got, h.calls["acme"].Load())
	}
	st, err := h.gate.Status(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if used := st.Policies[0].Used; used != 0 {
		t.Fatalf("after c's 429 the window holds %d units, want 0 (c's released at its moved slot)", used)
	}
	if unacked && u.reported.Load() != 2 {
		t.Fatalf("%d departures reported unacknowledged, want a's and c's", u.reported.Load())
	}
}

func TestGateID(t *testing.T) {
	if got := consumers.GateID("pay-1", 0); got != "pay-1" {
		t.Fatalf("attempt 0: %q, want the job id", got)
	}
	if a, b := consumers.GateID("pay-1", 1), consumers.GateID("pay-1", 2); a == b || a == "pay-1" || !strings.HasPrefix(a, "pay-1") {
		t.Fatalf("attempts 1 and 2: %q %q, want distinct ids of their own", a, b)
	}
}

// A redelivery of the same attempt long after its slot (its deferral failed to publish, a crash before
// the request) is a new request: the gate moves its entry to a new slot. Job a's request at s gets a 500;
// the same delivery comes back 1.2s later and is accepted; b must then wait a full window after it.
// Going out as a plain duplicate would leave the log saying "a at s" and let b go at once: 2 within one
// second.
func TestStaleRedeliveryIsMoved(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer rdb.Close()
	ref, err := sim.New(sim.Options{Limits: []sim.Window{{Limit: 1, Per: time.Second}, {Limit: 10, Per: time.Minute}}})
	if err != nil {
		t.Fatal(err)
	}
	var failed atomic.Bool
	h := newHarness(t, rdb, consumers.Config{MaxInlineWait: 3 * time.Second, LateLimit: 15 * time.Millisecond},
		provider{name: "acme", limits: []gate.Policy{{Limit: 1, Window: time.Second}, {Limit: 10, Window: time.Minute}}, handler: func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Idempotency-Key") == "a" && !failed.Swap(true) {
				status(500, "")(w, r)
				return
			}
			ref.ServeHTTP(w, r)
		}})
	h.handleOne("acme", func() error { return h.broker.Publish(context.Background(), "acme", body("a", "acme")) })
	time.Sleep(1200 * time.Millisecond)
	for _, id := range []string{"a", "b"} { // a: the same attempt (0) again, as if its deferral was lost
		if got := h.handleOne("acme", func() error { return h.broker.PublishAged("acme", body(id, "acme"), 0, time.Now()) }); got.Kind != "ack" {
			t.Fatalf("%s settled %+v, want ack", id, got)
		}
	}
	if st := ref.Stats(); st.Accepted != 2 || st.Violations != 0 {
		t.Fatalf("referee saw %d accepted, %d violations; want 2 and 0", st.Accepted, st.Violations)
	}
}

// A job the provider accepted but whose ack failed is marked sent at the gate: its redelivery, however
// late, is a plain duplicate of the counted request, not moved to spend a new unit.
func TestAcceptedButUnsettledIsMarkedSent(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer rdb.Close()
	h := newHarness(t, rdb, consumers.Config{MaxInlineWait: time.Second, LateLimit: 15 * time.Millisecond},
		provider{name: "acme", limits: []gate.Policy{{Limit: 5, Window: time.Hour}}, handler: status(200, "")})
	ctx := context.Background()
	if err := h.broker.Publish(ctx, "acme", body("a", "acme")); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	ch, err := h.broker.Consume(cctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	d := <-ch
	h.broker.Crash() // the delivery is abandoned: it comes again, and acking this one fails
	h.worker.Handle(ctx, "acme", d)
	keys, err := h.gate.Keys("acme")
	if err != nil {
		t.Fatal(err)
	}
	slot := rdb.ZScore(ctx, keys[0], "a").Val()
	time.Sleep(100 * time.Millisecond) // well past its slot
	again := <-ch
	cancel()
	h.worker.Handle(ctx, "acme", again)
	if s := h.broker.Settled(); len(s) != 1 || s[0].Kind != "ack" {
		t.Fatalf("settled %+v, want the redelivery acked", s)
	}
	if now := rdb.ZScore(ctx, keys[0], "a").Val(); now != slot || slot == 0 {
		t.Fatalf("a's entry moved from %v to %v: the redelivery of an accepted job spent a new unit", slot, now)
	}
}

// Two workers on one gate, each following the announcements (gate.Limiter.Watch): worker B
// holds a slot about a second ahead when worker A's request is throttled (429, Retry-After 3). B holds
// the job: it is deferred, never sent into the throttle, and its unit goes back.
func TestAnnouncedPauseHoldsReservedJobs(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer rdb.Close()
	var sentB atomic.Int64
	throttling := make(chan struct{})
	h := newHarness(t, rdb, consumers.Config{MaxInlineWait: 3 * time.Second},
		provider{name: "acme", limits: []gate.Policy{{Limit: 1, Window: time.Second}}, handler: func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Idempotency-Key") != "a" {
				sentB.Add(1)
				w.WriteHeader(http.StatusOK)
				return
			}
			close(throttling)
			time.Sleep(300 * time.Millisecond) // B reserves meanwhile
			status(http.StatusTooManyRequests, "3")(w, r)
		}})
	b, err := consumers.New(consumers.Config{MaxInlineWait: 3 * time.Second, Concurrency: 4, MaxAttempts: 8, MaxDeferralAge: time.Hour,
		ShutdownTimeout: 5 * time.Second, BackoffBase: time.Second, BackoffMax: time.Minute, RedisRetry: time.Second,
		Providers: map[string]int64{"acme": 1}}, h.gate, h.dispatch, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var watchers sync.WaitGroup
	for _, w := range []*consumers.Worker{h.worker, b} {
		watchers.Go(func() { _ = h.gate.Watch(ctx, rdb, w) })
	}
	time.Sleep(200 * time.Millisecond) // the subscriptions are asynchronous
	for _, id := range []string{"a", "b"} {
		if err := h.broker.Publish(ctx, "acme", body(id, "acme")); err != nil {
			t.Fatal(err)
		}
	}
	deliveries, err := h.broker.Consume(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	da, db := <-deliveries, <-deliveries
	done := make(chan struct{})
	go func() { h.worker.Handle(context.Background(), "acme", da); close(done) }()
	<-throttling
	b.Handle(context.Background(), "acme", db) // reserves a slot about 1s ahead, sleeps, wakes inside A's pause
	<-done
	cancel()
	watchers.Wait()
	var settledB memory.Settled
	for _, st := range h.broker.Settled() {
		if strings.Contains(string(st.Body), `"id":"b"`) {
			settledB = st
		}
	}
	if settledB.Kind != "defer" || sentB.Load() != 0 || settledB.After < time.Second {
		t.Fatalf("B's job: settled %q after %v, sent %d times; want deferred past A's pause, never sent", settledB.Kind, settledB.After, sentB.Load())
	}
	keys, err := h.gate.Keys("acme")
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.ZScore(context.Background(), keys[0], "b").Err(); err != redis.Nil {
		t.Fatalf("B's unit is still in the log (%v), want it released", err)
	}
}

// A job sleeping on its slot when the gate's state is lost (here: the keys deleted, as a Redis restart
// without persistence leaves them) is not sent on that slot, which the new state does not know: the
// warm-up's announcement (gate.Limiter.Watch) makes the worker give it up and ask again, and the job goes
// once the warm-up, which then needs to cover only consumers.LossNotice rather than the whole
// max_inline_wait, has passed.
func TestLostStateDropsSleepingReservation(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer rdb.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var sentAt []time.Time
	var mu sync.Mutex
	h := newHarness(t, rdb, consumers.Config{}, provider{name: "acme", limits: []gate.Policy{{Limit: 1, Window: time.Second}},
		handler: func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			sentAt = append(sentAt, time.Now())
			mu.Unlock()
			w.WriteHeader(http.StatusOK)
		}})
	const margin = 20 * time.Millisecond
	pfx := prefix()
	l, err := gate.New(rdb, gate.Options{Prefix: pfx, Margin: margin, StaleAfter: margin / 2, WarmUp: true, Horizon: consumers.LossNotice,
		Providers: map[string]gate.Provider{"acme": {Policies: []gate.Policy{{Limit: 1, Window: time.Second}}}}})
	if err != nil {
		t.Fatal(err)
	}
	w, err := consumers.New(consumers.Config{Concurrency: 1, MaxInlineWait: 3 * time.Second, MaxAttempts: 8, MaxDeferralAge: time.Hour,
		ShutdownTimeout: 5 * time.Second, BackoffBase: time.Second, BackoffMax: time.Minute, RedisRetry: time.Second,
		LateLimit: margin / 2, Providers: map[string]int64{"acme": 1}}, l, h.dispatch, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = l.Watch(ctx, rdb, w) }()
	keys, _ := l.Keys("acme")
	for rdb.PubSubNumSub(ctx, pfx+":pauses").Val()[pfx+":pauses"] < 1 { // the subscription is asynchronous
		time.Sleep(10 * time.Millisecond)
	}
	rdb.Set(ctx, keys[len(keys)-1], 1, time.Hour) // the state exists: no warm-up yet
	if v, err := l.Allow(ctx, "acme", "x", 1); err != nil || !v.Allowed {
		t.Fatalf("x: %+v %v", v, err)
	}
	if err := h.broker.Publish(ctx, "acme", body("a", "acme")); err != nil {
		t.Fatal(err)
	}
	deliveries, err := h.broker.Consume(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { w.Handle(ctx, "acme", <-deliveries); close(done) }() // reserves a slot a window after x's
	time.Sleep(300 * time.Millisecond)
	if err := rdb.Del(ctx, keys...).Err(); err != nil { // the loss, under a's sleeping reservation
		t.Fatal(err)
	}
	warm, err := l.Allow(ctx, "acme", "y", 1) // the next decision: the warm-up begins, and is announced
	if err != nil || warm.Allowed || !warm.Paused {
		t.Fatalf("the decision after the loss: %+v %v, want held by the warm-up", warm, err)
	}
	<-done
	warmEnd := warm.Now.Add(time.Second + margin + consumers.LossNotice)
	mu.Lock()
	defer mu.Unlock()
	st := h.broker.Settled()
	if len(sentAt) != 1 || len(st) != 1 || st[0].Kind != "ack" {
		t.Fatalf("a sent %d times, settled %+v; want once, acked", len(sentAt), st)
	}
	if sentAt[0].Before(warmEnd) {
		t.Fatalf("a sent %v before the warm-up's end: on its old slot, which the new state does not know", warmEnd.Sub(sentAt[0]))
	}
}

// The margin follows the fleet: a worker running reports its p99 lateness on reserved slots every
// ReportEvery (the gate keeps one report per worker), and a 429 on a request sent on its slot in time
// widens the margin in force (the provider counted more than the gate admitted); later decisions use it,
// and the late limit follows at half of it.
func TestWorkerReportsToTheMargin(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer rdb.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var calls atomic.Int64
	h := newHarness(t, rdb, consumers.Config{}, provider{name: "acme", limits: []gate.Policy{{Limit: 100, Window: time.Second}},
		handler: func(w http.ResponseWriter, r *http.Request) {
			if calls.Add(1) == 25 { // after enough wake-ups for a report
				status(http.StatusTooManyRequests, "1")(w, r)
				return
			}
			w.WriteHeader(http.StatusOK)
		}})
	pfx := prefix()
	// The ceiling is one doubling up: whatever the lateness reports (every 50ms, on a loaded machine)
	// make the margin, the throttle takes it to the ceiling, and no report can widen it past that.
	l, err := gate.New(rdb, gate.Options{Prefix: pfx, Margin: 10 * time.Millisecond, MarginMax: 20 * time.Millisecond, StaleAfter: 5 * time.Millisecond,
		Providers: map[string]gate.Provider{"acme": {Policies: []gate.Policy{{Limit: 100, Window: time.Second}}, Burst: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	w, err := consumers.New(consumers.Config{Concurrency: 4, MaxInlineWait: 3 * time.Second, MaxAttempts: 8, MaxDeferralAge: time.Hour,
		ShutdownTimeout: 5 * time.Second, BackoffBase: time.Second, BackoffMax: time.Minute, RedisRetry: time.Second,
		LateLimit: 5 * time.Millisecond, ReportEvery: 50 * time.Millisecond, Providers: map[string]int64{"acme": 100}},
		l, h.dispatch, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	const jobs = 30 // paced 10.2ms apart: the 25th is throttled, the rest held by the pause
	for i := range jobs {
		if err := h.broker.Publish(ctx, "acme", body(fmt.Sprint("j", i), "acme")); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, h.broker) }()
	deadline := time.Now().Add(10 * time.Second)
	for len(h.broker.Settled()) < jobs && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // a report or more after the last wake-up
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The pause holds every job that checks it after the 429 is read. Those of the other three handlers
	// already past that check (their slots came while the 429 was on its way back, 10ms apart: on a loaded
	// machine one may) still go: at most Concurrency-1 more.
	if n := calls.Load(); n < 25 || n > 25+3 {
		t.Fatalf("%d requests, want 25 and at most 3 more already under way (settled %+v)", n, h.broker.Settled())
	}
	st, err := l.ReadMargin(context.Background(), "acme")
	if err != nil || st.Margin != 20*time.Millisecond || !strings.HasPrefix(st.Why, "throttled") {
		t.Fatalf("margin after the throttle: %+v %v, want widened to the ceiling, 20ms, by the throttle", st, err)
	}
	reports, err := rdb.HKeys(context.Background(), pfx+":{acme}:lateness").Result()
	if err != nil {
		t.Fatal(err)
	}
	workers := 0
	for _, k := range reports {
		if !strings.HasPrefix(k, "_") {
			workers++
		}
	}
	if workers != 1 {
		t.Fatalf("lateness reports %v, want this worker's", reports)
	}
	if v := mustReserveC(t, l, "later"); v.Margin != st.Margin {
		t.Fatalf("a later decision: %+v, want it made with the margin in force", v)
	}
}

func mustReserveC(t *testing.T, l *gate.Limiter, id string) gate.Verdict {
	t.Helper()
	v, err := l.Reserve(context.Background(), "acme", id, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The core does not know which algorithm counts a provider: under every one, an accepted job is acked, its
// redelivery is a duplicate that takes no second unit, and a 429 pauses every worker and gives its unit back.
func TestEveryAlgorithm(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	t.Cleanup(func() { rdb.Close() })
	for _, algo := range gate.Algorithms {
		t.Run(string(algo), func(t *testing.T) {
			t.Parallel()
			throttle := func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				if strings.Contains(string(b), "pay-2") {
					status(429, "3")(w, r)
					return
				}
				status(200, "")(w, r)
			}
			limit := gate.Policy{Limit: 5, Window: time.Hour}
			if algo == gate.LeakyBucket {
				limit.Window = 5 * time.Second // it spaces jobs a second apart: within the inline wait
			}
			h := newHarness(t, rdb, consumers.Config{MaxInlineWait: 3 * time.Second},
				provider{name: "acme", algo: algo, limits: []gate.Policy{limit}, handler: throttle})
			publish := func(id string) func() error {
				return func() error { return h.broker.Publish(context.Background(), "acme", body(id, "acme")) }
			}
			if got := h.handleOne("acme", publish("pay-1")); got.Kind != "ack" {
				t.Fatalf("pay-1: %+v", got)
			}
			if got := h.handleOne("acme", publish("pay-1")); got.Kind != "ack" {
				t.Fatalf("pay-1 again: %+v", got)
			}
			if got := h.handleOne("acme", publish("pay-2")); got.Kind != "defer" || got.After != 3*time.Second {
				t.Fatalf("pay-2 (429): %+v", got)
			}
			v, err := h.gate.Allow(context.Background(), "acme", "someone-else", 1)
			if err != nil || v.Allowed || !v.Paused {
				t.Fatalf("another worker after the 429: %+v %v, want paused", v, err)
			}
			st, err := h.gate.Status(context.Background(), "acme")
			if err != nil {
				t.Fatal(err)
			}
			// pay-1 once (the leaky bucket has leaked it by now), pay-2's unit given back; under the
			// counters, pay-1's id has its marker beside it in the id record
			members := int64(1)
			if algo == gate.SlidingWindow || algo == gate.FixedWindow {
				members = 2
			}
			if p := st.Policies[0]; p.Used+p.Reserved > 1 || st.Units != members {
				t.Fatalf("status %+v: want at most one unit spent and pay-1 alone in the id record", st)
			}
			if n := h.calls["acme"].Load(); n != 3 {
				t.Fatalf("provider called %d times, want 3 (pay-1 twice with one key, pay-2 once)", n)
			}
		})
	}
}
