package gate_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
)

// breakerSettings are the tests' breaker: 3 failures in a row open it for 150ms, doubling up to 500ms; a
// probe's holder has 400ms; the hold reaches 1s (the tests' max wait) past the probe's due moment.
var breakerSettings = gate.Breaker{Failures: 3, OpenFor: 150 * time.Millisecond, OpenMax: 500 * time.Millisecond,
	Probe: 400 * time.Millisecond, Reach: time.Second}

const breakerWait = time.Second // every reserve's max wait: breakerSettings.Reach

// newBreakerLimiter is a gate over one provider at 100/1s with breaker b, under prefix ("": a new one).
func newBreakerLimiter(t *testing.T, rdb redis.UniversalClient, prefix string, b gate.Breaker) (*gate.Limiter, string) {
	t.Helper()
	if prefix == "" {
		prefix = uniquePrefix(t)
	}
	l, err := gate.New(rdb, gate.Options{Prefix: prefix, Margin: 10 * time.Millisecond,
		Providers: map[string]gate.Provider{prov: {Policies: []gate.Policy{pol(100, time.Second)}, Breaker: b}}})
	if err != nil {
		t.Fatal(err)
	}
	return l, prefix
}

// breakerCall fails the test on an error.
func breakerCall(t *testing.T, what string) func(gate.BreakerState, error) gate.BreakerState {
	return func(st gate.BreakerState, err error) gate.BreakerState {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return st
	}
}

// openBreaker reports failures in a row until the breaker opens, and returns the state that opened it.
func openBreaker(t *testing.T, l *gate.Limiter) gate.BreakerState {
	t.Helper()
	ctx := context.Background()
	for i := range breakerSettings.Failures {
		st := breakerCall(t, "fail")(l.ReportFailure(ctx, prov, fmt.Sprintf("f%d", i), time.Time{}))
		if opened := i == breakerSettings.Failures-1; st.Changed != opened || (st.Phase == gate.BreakerOpen) != opened || !st.Counted {
			t.Fatalf("failure %d of %d: %+v", i+1, breakerSettings.Failures, st)
		}
		if st.Phase == gate.BreakerOpen {
			return st
		}
	}
	panic("unreachable")
}

// untilRedis waits until the Redis clock has passed at.
func untilRedis(t *testing.T, rdb redis.UniversalClient, at time.Time) {
	t.Helper()
	for redisTime(t, rdb) <= at.UnixMicro() {
		time.Sleep(10 * time.Millisecond)
	}
}

// pauseOf reads the provider's pause key (µs; 0: none).
func pauseOf(t *testing.T, rdb redis.UniversalClient, l *gate.Limiter) int64 {
	t.Helper()
	keys, err := l.Keys(prov)
	if err != nil {
		t.Fatal(err)
	}
	v, err := rdb.Get(context.Background(), keys[1]).Int64()
	if err == redis.Nil {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// A run of failures opens the breaker only when nothing answered in between; open, its hold is the
// provider's pause, and a reserve is denied until the probe is due (RetryAfter), not reserved at the
// hold's end.
func TestBreakerOpensAfterFailuresInARow(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l, _ := newBreakerLimiter(t, rdb, "", breakerSettings)
		fail := breakerCall(t, "fail")
		answer := breakerCall(t, "answer")
		if st := fail(l.ReportFailure(ctx, prov, "a", time.Time{})); st.Phase != gate.BreakerClosed || st.Failures != 1 || st.Seq == 0 {
			t.Fatalf("first failure: %+v, want closed with 1 failure, a run announced (seq)", st)
		}
		fail(l.ReportFailure(ctx, prov, "b", time.Time{}))
		if st := answer(l.ReportAnswer(ctx, prov, "c")); st.Failures != 0 || st.Phase != gate.BreakerClosed {
			t.Fatalf("an answer after 2 failures: %+v, want the run ended", st)
		}
		before := answer(l.ReportAnswer(ctx, prov, "d")) // nothing to end: not written
		st := openBreaker(t, l)
		if st.Opened != 1 || st.OpenFor != breakerSettings.OpenFor || st.Seq <= before.Seq ||
			!st.Until.Equal(st.Now.Add(breakerSettings.OpenFor)) || !st.Hold.Equal(st.Until.Add(breakerSettings.Reach)) {
			t.Fatalf("opened: %+v", st)
		}
		if p := pauseOf(t, rdb, l); p != st.Hold.UnixMicro() {
			t.Fatalf("pause %d, want the hold %d", p, st.Hold.UnixMicro())
		}
		v := mustReserve(t, l, "job", 1, breakerWait)
		if v.Allowed || !v.Paused || v.RetryAfter > breakerSettings.OpenFor || v.RetryAfter <= 0 {
			t.Fatalf("reserve while open: %+v, want denied by the pause until the probe is due (<= %s)", v, breakerSettings.OpenFor)
		}
		if got := breakerCall(t, "read")(l.ReadBreaker(ctx, prov)); got.Phase != gate.BreakerOpen || got.Seq != st.Seq || got.Changed {
			t.Fatalf("read: %+v, want %+v unchanged", got, st)
		}
	})
}

// Exactly one job gets the probe, once it is due; its reserve goes through the hold (alone and in a
// batch) while every other job's is denied. Its answer closes the breaker and lifts the hold.
func TestBreakerProbeIsOneJob(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l, _ := newBreakerLimiter(t, rdb, "", breakerSettings)
		st := openBreaker(t, l)
		if early := breakerCall(t, "probe")(l.TakeProbe(ctx, prov, "early")); early.Granted || early.Phase != gate.BreakerOpen {
			t.Fatalf("probe before it is due: %+v", early)
		}
		untilRedis(t, rdb, st.Until)
		var mu sync.Mutex
		var granted []string
		var wg sync.WaitGroup
		for i := range 16 {
			wg.Go(func() {
				id := fmt.Sprintf("taker-%d", i)
				got, err := l.TakeProbe(ctx, prov, id)
				if err != nil {
					t.Error(err)
					return
				}
				if got.Granted {
					mu.Lock()
					granted = append(granted, id)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if len(granted) != 1 {
			t.Fatalf("granted to %v, want exactly one job", granted)
		}
		holder := granted[0]
		again := breakerCall(t, "probe")(l.TakeProbe(ctx, prov, holder))
		if !again.Granted || again.Changed || again.Phase != gate.BreakerProbing || again.Probe != holder {
			t.Fatalf("the holder asks again: %+v", again)
		}
		if other := mustReserve(t, l, "other", 1, breakerWait); other.Allowed {
			t.Fatalf("another job's reserve while probing: %+v, want denied", other)
		}
		vs, errs := gate.DecideBatch(ctx, l, prov, []string{"other2", holder}, []int64{1, 1}, breakerWait)
		if errs[0] != nil || errs[1] != nil || vs[0].Allowed || !vs[1].Allowed || vs[1].Paused || vs[1].Delay > 50*time.Millisecond {
			t.Fatalf("batch of another job and the probe: %+v %v, want the probe alone admitted now", vs, errs)
		}
		closed := breakerCall(t, "answer")(l.ReportAnswer(ctx, prov, holder))
		if !closed.Changed || closed.Phase != gate.BreakerClosed || !closed.Hold.IsZero() || closed.OpenFor != breakerSettings.OpenFor {
			t.Fatalf("the probe's answer: %+v, want closed", closed)
		}
		if p := pauseOf(t, rdb, l); p != 0 {
			t.Fatalf("pause %d after closing, want none", p)
		}
		if v := mustReserve(t, l, "after", 1, breakerWait); !v.Allowed || v.Paused {
			t.Fatalf("reserve after closing: %+v", v)
		}
	})
}

// The probe's failure reopens the breaker for twice as long, up to open_max; other failures while open
// or probing (requests in flight when it opened) count for nothing, nor do failures of requests sent
// before it closed.
func TestBreakerReopensDoubling(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l, _ := newBreakerLimiter(t, rdb, "", breakerSettings)
		fail := breakerCall(t, "fail")
		st := openBreaker(t, l)
		if late := fail(l.ReportFailure(ctx, prov, "in-flight", time.Time{})); late.Counted || late.Changed || late.Seq != st.Seq {
			t.Fatalf("a failure while open: %+v, want not counted", late)
		}
		for _, want := range []time.Duration{300 * time.Millisecond, 500 * time.Millisecond, 500 * time.Millisecond} {
			untilRedis(t, rdb, st.Until)
			holder := fmt.Sprintf("probe-%s", want)
			if got := breakerCall(t, "probe")(l.TakeProbe(ctx, prov, holder)); !got.Granted {
				t.Fatalf("probe: %+v", got)
			}
			if other := fail(l.ReportFailure(ctx, prov, "not-the-probe", time.Time{})); other.Counted || other.Phase != gate.BreakerProbing {
				t.Fatalf("another failure while probing: %+v, want not counted", other)
			}
			st = fail(l.ReportFailure(ctx, prov, holder, time.Time{}))
			if !st.Counted || !st.Changed || st.Phase != gate.BreakerOpen || st.OpenFor != want || !st.Until.Equal(st.Now.Add(want)) {
				t.Fatalf("the probe failed: %+v, want reopened for %s", st, want)
			}
			if p := pauseOf(t, rdb, l); p != st.Hold.UnixMicro() {
				t.Fatalf("pause %d, want the new hold %d", p, st.Hold.UnixMicro())
			}
		}
		if st.Opened != 4 {
			t.Fatalf("opened %d times, want 4", st.Opened)
		}
		untilRedis(t, rdb, st.Until)
		breakerCall(t, "probe")(l.TakeProbe(ctx, prov, "last"))
		closed := breakerCall(t, "answer")(l.ReportAnswer(ctx, prov, "last"))
		if stale := fail(l.ReportFailure(ctx, prov, "sent-before", closed.Now.Add(-time.Millisecond))); stale.Counted || stale.Failures != 0 {
			t.Fatalf("a failure of a request sent before the close: %+v, want not counted", stale)
		}
		if fresh := fail(l.ReportFailure(ctx, prov, "sent-after", closed.Now.Add(time.Millisecond))); !fresh.Counted || fresh.Failures != 1 {
			t.Fatalf("a failure of a request sent after the close: %+v, want counted", fresh)
		}
		// Closed, the next opening starts from open_for again.
		for i := 1; i < breakerSettings.Failures; i++ {
			st = fail(l.ReportFailure(ctx, prov, fmt.Sprint("again-", i), time.Time{}))
		}
		if st.Phase != gate.BreakerOpen || st.OpenFor != breakerSettings.OpenFor {
			t.Fatalf("opened again: %+v, want open for %s", st, breakerSettings.OpenFor)
		}
	})
}

// A probe's holder that never reports (killed) holds it only for its time; then another job takes it,
// and the first holder can neither close nor reopen the breaker, nor go through the new hold.
func TestBreakerProbeLapses(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l, _ := newBreakerLimiter(t, rdb, "", breakerSettings)
		st := openBreaker(t, l)
		untilRedis(t, rdb, st.Until)
		first := breakerCall(t, "probe")(l.TakeProbe(ctx, prov, "dead"))
		if second := breakerCall(t, "probe")(l.TakeProbe(ctx, prov, "next")); second.Granted || !second.Until.Equal(first.Until) {
			t.Fatalf("before the holder's time lapsed: %+v, want refused until %s", second, first.Until)
		}
		untilRedis(t, rdb, first.Until)
		second := breakerCall(t, "probe")(l.TakeProbe(ctx, prov, "next"))
		if !second.Granted || !second.Changed || second.Probe != "next" {
			t.Fatalf("after the holder's time lapsed: %+v", second)
		}
		if v := mustReserve(t, l, "dead", 1, breakerWait); v.Allowed {
			t.Fatalf("the lapsed holder's reserve: %+v, want held", v)
		}
		if got := breakerCall(t, "answer")(l.ReportAnswer(ctx, prov, "dead")); got.Phase != gate.BreakerProbing || got.Changed {
			t.Fatalf("the lapsed holder's answer: %+v, want nothing changed", got)
		}
		if got := breakerCall(t, "fail")(l.ReportFailure(ctx, prov, "dead", time.Time{})); got.Phase != gate.BreakerProbing || got.Counted {
			t.Fatalf("the lapsed holder's failure: %+v, want nothing changed", got)
		}
		if v := mustReserve(t, l, "next", 1, breakerWait); !v.Allowed {
			t.Fatalf("the new holder's reserve: %+v", v)
		}
	})
}

// A 429's pause is never cut short by the breaker: one the hold covers stays in force when the breaker
// closes, and one reaching past the hold holds the probe too.
func TestBreakerKeepsThrottlePauses(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l, _ := newBreakerLimiter(t, rdb, "", breakerSettings)
		st := openBreaker(t, l)
		throttle := st.Now.Add(breakerSettings.OpenFor + 700*time.Millisecond) // within the hold (open_for + 1s)
		if err := l.Pause(ctx, prov, time.Now().Add(time.Until(throttle))); err != nil {
			t.Fatal(err)
		}
		if p := pauseOf(t, rdb, l); p != st.Hold.UnixMicro() {
			t.Fatalf("pause %d, want the hold %d (longer)", p, st.Hold.UnixMicro())
		}
		untilRedis(t, rdb, st.Until)
		breakerCall(t, "probe")(l.TakeProbe(ctx, prov, "p"))
		closed := breakerCall(t, "answer")(l.ReportAnswer(ctx, prov, "p"))
		if p := pauseOf(t, rdb, l); closed.Phase != gate.BreakerClosed || p < closed.Now.UnixMicro() || p > throttle.Add(50*time.Millisecond).UnixMicro() {
			t.Fatalf("closed %+v with pause %d: want the 429's (about %d) still in force", closed, p, throttle.UnixMicro())
		}

		// A 429 beyond the hold: the probe waits for it.
		st = openBreaker(t, l)
		if err := l.Pause(ctx, prov, time.Now().Add(breakerSettings.OpenFor+breakerSettings.Reach+time.Second)); err != nil {
			t.Fatal(err)
		}
		untilRedis(t, rdb, st.Until)
		refused := breakerCall(t, "probe")(l.TakeProbe(ctx, prov, "q"))
		if refused.Granted || refused.Until.UnixMicro() != pauseOf(t, rdb, l) {
			t.Fatalf("probe under a longer 429: %+v, want refused until the 429's end %d", refused, pauseOf(t, rdb, l))
		}
	})
}

// The breaker lives in Redis: a fleet restarted (new limiters on the same keys) finds it open, with the
// interval it had reached, and is held by it.
func TestBreakerSurvivesRestartOfWorkers(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l, prefix := newBreakerLimiter(t, rdb, "", breakerSettings)
		st := openBreaker(t, l)
		untilRedis(t, rdb, st.Until)
		breakerCall(t, "probe")(l.TakeProbe(ctx, prov, "p1"))
		st = breakerCall(t, "fail")(l.ReportFailure(ctx, prov, "p1", time.Time{}))

		restarted, _ := newBreakerLimiter(t, rdb, prefix, breakerSettings)
		got := breakerCall(t, "read")(restarted.ReadBreaker(ctx, prov))
		if got.Phase != gate.BreakerOpen || got.OpenFor != 2*breakerSettings.OpenFor || !got.Until.Equal(st.Until) || got.Opened != 2 {
			t.Fatalf("after a restart: %+v, want %+v", got, st)
		}
		if v := mustReserve(t, restarted, "job", 1, breakerWait); v.Allowed {
			t.Fatalf("reserve after a restart: %+v, want held", v)
		}
		untilRedis(t, rdb, got.Until)
		breakerCall(t, "probe")(restarted.TakeProbe(ctx, prov, "p2"))
		// 150ms doubled twice is 600ms, capped at open_max (500ms).
		if again := breakerCall(t, "fail")(restarted.ReportFailure(ctx, prov, "p2", time.Time{})); again.OpenFor != breakerSettings.OpenMax {
			t.Fatalf("reopened after a restart: %+v, want open for %s", again, breakerSettings.OpenMax)
		}
	})
}

// Every change the workers act on is announced on <prefix>:pauses, and reads back as what the calls
// returned.
func TestBreakerAnnounces(t *testing.T) {
	rdb := backends(t)[0].rdb
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, prefix := newBreakerLimiter(t, rdb, "", breakerSettings)
	ps := rdb.Subscribe(ctx, prefix+":pauses")
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	heard := func(want gate.BreakerState) {
		t.Helper()
		msg, err := ps.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		a, err := gate.ParseAnnouncement(msg.Payload)
		if err != nil {
			t.Fatal(err)
		}
		b := a.Breaker
		if a.Kind != gate.AnnounceBreaker || a.Provider != prov || a.String() != msg.Payload || b.Phase != want.Phase || b.Seq != want.Seq ||
			b.Failures != want.Failures || !b.Hold.Equal(want.Hold) || !b.Now.Equal(want.Now) ||
			(want.Phase != gate.BreakerClosed && !b.Until.Equal(want.Until)) {
			t.Fatalf("%q read as %+v, want %+v", msg.Payload, a, want)
		}
	}
	heard(breakerCall(t, "fail")(l.ReportFailure(ctx, prov, "a", time.Time{}))) // a run began
	heard(breakerCall(t, "answer")(l.ReportAnswer(ctx, prov, "b")))             // and ended
	for i := range breakerSettings.Failures - 1 {
		st := breakerCall(t, "fail")(l.ReportFailure(ctx, prov, fmt.Sprint("c", i), time.Time{}))
		if i == 0 {
			heard(st)
		}
	}
	st := breakerCall(t, "fail")(l.ReportFailure(ctx, prov, "d", time.Time{}))
	heard(st) // opened
	untilRedis(t, rdb, st.Until)
	heard(breakerCall(t, "probe")(l.TakeProbe(ctx, prov, "e")))
	heard(breakerCall(t, "answer")(l.ReportAnswer(ctx, prov, "e"))) // closed
}

// A provider without a breaker is closed and costs no Redis call; bad settings are refused.
func TestBreakerOff(t *testing.T) {
	single := backends(t)[0].rdb
	l, _ := newBreakerLimiter(t, single, "", gate.Breaker{})
	if l.HasBreaker(prov) {
		t.Fatal("a breaker with 0 failures is on")
	}
	st, err := l.ReportFailure(context.Background(), prov, "a", time.Time{})
	if err != nil || st.Phase != gate.BreakerClosed || st.Seq != 0 {
		t.Fatalf("%+v %v", st, err)
	}
	for _, b := range []gate.Breaker{
		{Failures: -1},
		{Failures: 1, OpenFor: 0, OpenMax: time.Second, Probe: time.Second},
		{Failures: 1, OpenFor: 2 * time.Second, OpenMax: time.Second, Probe: time.Second},
		{Failures: 1, OpenFor: time.Second, OpenMax: time.Second},
	} {
		if _, err := gate.New(single, gate.Options{Prefix: "x", Providers: map[string]gate.Provider{prov: {Policies: []gate.Policy{pol(1, time.Second)}, Breaker: b}}}); err == nil {
			t.Errorf("%+v accepted", b)
		}
	}
}
