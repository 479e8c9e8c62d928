package gate_test

import (
	"context"
	"errors"
	"strconv"

	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/internal/testenv"
)

// The gate's edge cases from an adversarial review of lua/ and gate/ (each failed before lua/family became
// the one driver of every algorithm).

// Finding 1 and 4: a job's cost is written as one ZADD no longer (Lua's unpack stops at 8000 values), and
// the counting algorithms keep two members per job whatever its cost. Any cost the limits allow works
// under every algorithm.
func TestLargeCostEveryAlgorithm(t *testing.T) {
	eachAlgorithm(t, family, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		l := newAlgo(t, rdb, algo, 0, pol(10000, time.Hour))
		for _, id := range []string{"a", "b"} {
			if v := mustReserve(t, l, id, 5000, 2*time.Hour); !v.Allowed {
				t.Fatalf("%s at cost 5000 of 10000/1h: %+v", id, v)
			}
		}
		if v := mustReserve(t, l, "a", 5000, 2*time.Hour); !v.Allowed || !v.Duplicate {
			t.Fatalf("a again: %+v, want a duplicate", v)
		}
		if v := mustReserve(t, l, "c", 1, 0); v.Allowed {
			t.Fatalf("c after 10000 units: %+v", v)
		}
		keys, _ := l.Keys(prov)
		members := rdb.ZCard(context.Background(), keys[0]).Val()
		want := int64(4) // id and id\0 5000, twice
		switch algo {
		case gate.SlidingLog:
			want = 10000 // its log: one member per unit
		case gate.SlidingWindow, gate.FixedWindow:
			want = 6 // and the marker of the counters that took it
		}
		if members != want {
			t.Fatalf("id record holds %d members, want %d", members, want)
		}
	})
}

// Finding 4: a job of cost 300000 (valid under 10 000 000/day) costs the counting algorithms two members
// (and the counters their marker),
// and sliding_log refuses limits it cannot keep.
func TestHugeCostCounters(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	t.Cleanup(func() { rdb.Close() })
	for _, algo := range gate.Algorithms[1:] {
		l := newAlgo(t, rdb, algo, 0, pol(10_000_000, 24*time.Hour))
		if v := mustReserve(t, l, "big", 300000, 48*time.Hour); !v.Allowed {
			t.Fatalf("%s: cost 300000: %+v", algo, v)
		}
		keys, _ := l.Keys(prov)
		if n := rdb.ZCard(context.Background(), keys[0]).Val(); n != recordMembers(algo, 1)+1 {
			t.Fatalf("%s: id record holds %d members for one job", algo, n)
		}
		st, err := l.Status(context.Background(), prov)
		if err != nil || st.Policies[0].Used+st.Policies[0].Reserved != 300000 && algo != gate.LeakyBucket {
			t.Fatalf("%s: status %+v %v", algo, st, err)
		}
	}
	_, err := gate.New(rdb, gate.Options{Prefix: "x", Providers: map[string]gate.Provider{prov: {Policies: []gate.Policy{pol(gate.MaxSlidingLogLimit+1, time.Hour)}}}})
	if err == nil || !strings.Contains(err.Error(), "sliding_log keeps one entry per unit of cost and takes limits up to 100000") {
		t.Fatalf("sliding_log over its largest limit: %v", err)
	}
}

// Finding 2: the same cost-5000 job tried three times under sliding_window charged 15000 units and was
// never admitted (each try wrote its counters, then failed). Now it is admitted once and charged once.
func TestRetriedBigJobChargesOnce(t *testing.T) {
	for _, algo := range []gate.Algorithm{gate.SlidingWindow, gate.TokenBucket, gate.GCRA, gate.FixedWindow} {
		rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
		t.Cleanup(func() { rdb.Close() })
		l := newAlgo(t, rdb, algo, 0, pol(100000, 24*time.Hour))
		for try := range 3 {
			v := mustReserve(t, l, "job", 5000, 0)
			if !v.Allowed || v.Duplicate != (try > 0) {
				t.Fatalf("%s: try %d: %+v", algo, try, v)
			}
		}
		st, err := l.Status(context.Background(), prov)
		if err != nil || st.Policies[0].Used != 5000 || st.Policies[0].Remaining != 95000 {
			t.Fatalf("%s: status after three tries %+v %v, want 5000 used", algo, st.Policies, err)
		}
	}
}

// Finding 3: sliding_log removed a stale job's units before the write that failed. With 10000/1h: X admitted
// at cost 3000 and sent; redelivered (stale) at cost 5000; then four jobs of 2500: at most 10000 units in
// the hour, so two of them.
func TestMoveNeverExceeds(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		l := newAlgoOpts(t, rdb, gate.Options{StaleAfter: time.Millisecond}, gate.Provider{Policies: []gate.Policy{pol(10000, time.Hour)}})
		if v := mustReserve(t, l, "x", 3000, 0); !v.Allowed {
			t.Fatalf("x: %+v", v)
		}
		time.Sleep(5 * time.Millisecond)
		if v := mustReserve(t, l, "x", 5000, 0); !v.Allowed || !v.Moved {
			t.Fatalf("x redelivered at cost 5000: %+v, want moved", v)
		}
		admitted := 0
		for i := range 4 {
			if mustReserve(t, l, id(i), 2500, 0).Allowed {
				admitted++
			}
		}
		if admitted != 2 {
			t.Fatalf("%d jobs of 2500 admitted after 5000 units, want 2", admitted)
		}
		if st, _ := l.Status(context.Background(), prov); st.Units != 10000 {
			t.Fatalf("log holds %d units, want 10000", st.Units)
		}
	})
}

// Finding 5: the holder of an admission released it (woken late) while a duplicate delivery of the same job,
// just let go on it, was sending: at 2/1s the provider received 3 requests within 1.3ms. A duplicate let
// go now marks the admission; its release gives nothing back.
func TestReleaseUnderDuplicate(t *testing.T) {
	eachAlgorithm(t, family, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		ctx := context.Background()
		l := newAlgo(t, rdb, algo, 0, pol(2, time.Hour))
		a := mustReserve(t, l, "a", 1, 0)
		if d := mustReserve(t, l, "a", 1, 0); !a.Allowed || !d.Allowed || !d.Duplicate {
			t.Fatalf("a, then its duplicate: %+v %+v", a, d)
		}
		if n, err := l.Release(ctx, prov, "a", 1, a.Slot()); err != nil || n != 0 {
			t.Fatalf("release under a duplicate gave back %d units (%v), want 0", n, err)
		}
		if v := mustReserve(t, l, "b", 1, 2*time.Hour); !v.Allowed { // a leaky bucket queues it
			t.Fatalf("b: %+v", v)
		}
		if v := mustReserve(t, l, "c", 1, 0); v.Allowed {
			t.Fatalf("c admitted: the released unit came back under a duplicate: %+v", v)
		}
	})
}

// Finding 6: Release and Sent made none of the id checks decide makes: Release of "a\x003" removed the
// third unit of job a.
func TestReleaseAndSentCheckIDs(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	l := newLimiter(t, rdb, 0, pol(3, time.Hour))
	if v := mustReserve(t, l, "a", 3, 0); !v.Allowed {
		t.Fatalf("a: %+v", v)
	}
	for _, bad := range []string{"a\x003", "", strings.Repeat("x", gate.MaxIDLen+1)} {
		if _, err := l.Release(ctx, prov, bad, 1, time.Time{}); !errors.Is(err, gate.ErrInvalid) {
			t.Errorf("release %q: %v, want ErrInvalid", bad, err)
		}
		if err := l.Sent(ctx, prov, bad); !errors.Is(err, gate.ErrInvalid) {
			t.Errorf("sent %q: %v, want ErrInvalid", bad, err)
		}
	}
	if st, _ := l.Status(ctx, prov); st.Units != 3 {
		t.Fatalf("log holds %d units, want a's 3", st.Units)
	}
}

// Finding 7: after a denied stale move, sliding_log put the units back without an expiry (when taking them
// out had emptied the log, the key went, and came back without one).
func TestDeniedMoveKeepsExpirySlidingLog(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l := newAlgoOpts(t, rdb, gate.Options{StaleAfter: time.Millisecond}, gate.Provider{Policies: []gate.Policy{pol(2, time.Hour)}})
		if v := mustReserve(t, l, "a", 1, 0); !v.Allowed {
			t.Fatalf("a: %+v", v)
		}
		if err := l.Pause(ctx, prov, time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		// Stale against the pause's end, and no slot within its max wait: denied, a's unit stays.
		if v := mustReserve(t, l, "a", 1, 0); v.Allowed || v.AdmittedAt.IsZero() {
			t.Fatalf("a, stale, paused: %+v, want denied", v)
		}
		keys, _ := l.Keys(prov)
		if ttl := rdb.PTTL(ctx, keys[0]).Val(); ttl <= 0 {
			t.Fatalf("log's expiry after a denied move: %v", ttl)
		}
		if st, _ := l.Status(ctx, prov); st.Units != 1 {
			t.Fatalf("log holds %d units after a denied move, want 1", st.Units)
		}
	})
}

// Finding 8: windows equal once rounded to the µs shared state: token_bucket admitted 11 in one second
// under 5/1s and 10/999999999ns.
func TestWindowsDistinctToTheMicrosecond(t *testing.T) {
	for _, algo := range gate.Algorithms[1:] {
		_, err := gate.New(nil, gate.Options{Prefix: "x", Providers: map[string]gate.Provider{prov: {Algorithm: algo,
			Policies: []gate.Policy{pol(5, time.Second), pol(10, 999999999*time.Nanosecond)}}}})
		if err == nil || !strings.Contains(err.Error(), "a window may appear once, to the µs") {
			t.Errorf("%s: %v", algo, err)
		}
	}
}

// Finding 9: GCRA added T = (W + m) / L to its theoretical arrival time as a double, and drifted (-1/12 µs
// per unit at 3 per 1ms, 10ms or 100ms with no margin: after a dozen units, a 4th within the window). It
// keeps the fraction exactly now: in a backlog, every 3 units span exactly the window. (100ms: a backlog
// forms however slow the machine, one call per 33ms being enough.)
func TestGCRANoDrift(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		const window = 100 * time.Millisecond
		l := newAlgo(t, rdb, gate.GCRA, 0, pol(3, window))
		var slots []int64
		var ahead []bool // the slot was after now: set by the arrival time alone, which then grows by T exactly
		for i := range 1200 {
			v := mustReserve(t, l, id(i), 1, 2*time.Minute)
			if !v.Allowed {
				t.Fatalf("job %d: %+v", i, v)
			}
			slots = append(slots, v.Slot().UnixMicro())
			ahead = append(ahead, v.Delay > 0)
		}
		checked := 0
		for i := 0; i+3 < len(slots); i++ {
			if !ahead[i] || !ahead[i+1] || !ahead[i+2] || !ahead[i+3] {
				continue
			}
			checked++
			if d := slots[i+3] - slots[i]; d != window.Microseconds() {
				t.Fatalf("slots %d and %d are %dµs apart, want exactly %d (3 per window)", i, i+3, d, window.Microseconds())
			}
		}
		if checked < 100 {
			t.Fatalf("only %d spans in a backlog: too few to show a drift", checked)
		}
	})
}

// From a second review: a leaky bucket's arrival time was a double too, and a T whose fraction is below 1/8
// µs (9 per 10ms: T = 1111.11µs) was rounded away at today's clock: slots came 1111µs apart, 10 in 10ms.
func TestLeakyBucketExactSpacing(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		l := newAlgo(t, rdb, gate.LeakyBucket, 0, pol(9, 10*time.Millisecond))
		for i := range 200 {
			mustReserve(t, l, id(i), 1, time.Second)
		}
		if got := maxInWindow(readLog(t, rdb, l), 10*time.Millisecond); got > 9 {
			t.Fatalf("%d units in a window of 10ms, limit 9", got)
		}
	})
}

// From a second review: thousands of old buckets or windows piled up between two calls are deleted in
// split calls (one HDEL of them all passed Lua's unpack limit, and every call failed until the hash
// expired); and fixed_window's search for a window with room stops at the max wait.
func TestCounterEdges(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	for _, algo := range []gate.Algorithm{gate.SlidingWindow, gate.FixedWindow} {
		l := newAlgo(t, rdb, algo, 0, pol(10, 10*time.Millisecond))
		keys, _ := l.Keys(prov)
		width := int64(10000) // a window of 10ms, or a bucket of 1ms
		if algo == gate.SlidingWindow {
			width = 1000
		}
		now := redisTime(t, rdb)
		var args []any
		for j := range int64(9000) {
			args = append(args, strconv.FormatInt(now/width-20-j, 10), "1")
		}
		if err := rdb.HSet(ctx, keys[3], args...).Err(); err != nil {
			t.Fatal(err)
		}
		if v, err := l.Reserve(ctx, prov, "y", 1, 0); err != nil || !v.Allowed {
			t.Fatalf("%s after 9000 old counters: %+v %v", algo, v, err)
		}
		if n := rdb.HLen(ctx, keys[3]).Val(); n > 2 {
			t.Fatalf("%s: %d counters left, the old ones not deleted", algo, n)
		}
	}
	l := newAlgo(t, rdb, gate.FixedWindow, 0, pol(1, time.Millisecond))
	keys, _ := l.Keys(prov)
	now := redisTime(t, rdb) / 1000
	pipe := rdb.Pipeline()
	for j := int64(0); j < 100_010; j += 1000 {
		var args []any
		for k := j; k < j+1000; k++ {
			args = append(args, strconv.FormatInt(now+k, 10), "1")
		}
		pipe.HSet(ctx, keys[3], args...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	if v, err := l.Reserve(ctx, prov, "z", 1, time.Second); err != nil || v.Allowed {
		t.Fatalf("fixed_window behind 100000 full windows: %+v %v, want denied", v, err)
	}
}

// From a second review: a duplicate let go on a job marked Sent overwrote the mark, so that a later stale
// redelivery of a job the provider had accepted was moved, spending a unit for a replay.
func TestDuplicateKeepsSentMark(t *testing.T) {
	eachAlgorithm(t, family, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		ctx := context.Background()
		l := newAlgoOpts(t, rdb, gate.Options{StaleAfter: 100 * time.Millisecond}, gate.Provider{Algorithm: algo, Policies: []gate.Policy{pol(10, 10*time.Second)}})
		if v := mustReserve(t, l, "x", 1, 0); !v.Allowed {
			t.Fatalf("x: %+v", v)
		}
		if err := l.Sent(ctx, prov, "x"); err != nil {
			t.Fatal(err)
		}
		if d := mustReserve(t, l, "x", 1, 0); !d.Duplicate || !d.Allowed {
			t.Fatalf("x again: %+v", d)
		}
		time.Sleep(150 * time.Millisecond)
		if v := mustReserve(t, l, "x", 1, 0); v.Moved || !v.Duplicate {
			t.Fatalf("stale redelivery of a sent job: %+v, want a plain duplicate", v)
		}
	})
}
