package gate_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
)

// The algorithm family: what every algorithm shares (the verdict, several limits at once, pause,
// duplicates, release, moves, status), then each algorithm's own semantics. Everything runs on the single
// node, on the Redis Cluster and on the demo's embedded Redis, with Redis TIME as the clock: expectations
// are computed from the verdicts' Now, never from the test's clock, and windows are long enough that a
// slow machine cannot cross them.

func newAlgo(t testing.TB, rdb redis.Scripter, algo gate.Algorithm, margin time.Duration, policies ...gate.Policy) *gate.Limiter {
	t.Helper()
	return newAlgoOpts(t, rdb, gate.Options{Margin: margin}, gate.Provider{Algorithm: algo, Policies: policies})
}

func newAlgoOpts(t testing.TB, rdb redis.Scripter, opts gate.Options, p gate.Provider) *gate.Limiter {
	t.Helper()
	opts.Prefix = uniquePrefix(t)
	opts.Providers = map[string]gate.Provider{prov: p}
	l, err := gate.New(rdb, opts)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// family is every algorithm: one driver (lua/family), one contract. gate_test.go covers sliding_log's own
// exactness besides.
var family = gate.Algorithms

// eachAlgorithm runs fn for every algorithm on the single node, the cluster and the embedded Redis (the
// demo's, whose gopher-lua must run every script alike), as parallel subtests.
func eachAlgorithm(t *testing.T, algos []gate.Algorithm, fn func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm)) {
	t.Helper()
	for _, b := range append(backends(t), embedded(t)) {
		for _, a := range algos {
			t.Run(b.name+"/"+string(a), func(t *testing.T) {
				t.Parallel()
				fn(t, b.rdb, a)
			})
		}
	}
}

// awayFromEdges waits, for fixed_window only, until each of the given calendar windows has at least need
// left on the Redis clock, so that a test's few calls cannot straddle a boundary and see a window reset.
func awayFromEdges(t testing.TB, rdb redis.UniversalClient, algo gate.Algorithm, need time.Duration, windows ...time.Duration) {
	t.Helper()
	if algo != gate.FixedWindow {
		return
	}
	for range 10 {
		now, wait := redisTime(t, rdb), time.Duration(0)
		for _, w := range windows {
			if left := w.Microseconds() - now%w.Microseconds(); left < need.Microseconds() {
				wait = max(wait, time.Duration(left)*time.Microsecond+20*time.Millisecond)
			}
		}
		if wait == 0 {
			return
		}
		time.Sleep(wait)
	}
}

func mustStatus(t testing.TB, l *gate.Limiter) gate.Status {
	t.Helper()
	st, err := l.Status(context.Background(), prov)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// Every algorithm admits its limit on a fresh key and denies the rest with a retry time naming the policy;
// a leaky bucket admits into its queue (a reservation), so only the first goes now.
func TestFamilyAdmitsTheLimit(t *testing.T) {
	eachAlgorithm(t, gate.Algorithms, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		l := newAlgo(t, rdb, algo, 0, pol(5, 3*time.Second), pol(100, time.Minute))
		awayFromEdges(t, rdb, algo, time.Second, 3*time.Second, time.Minute)
		maxWait := time.Duration(0)
		if algo == gate.LeakyBucket {
			maxWait = 3 * time.Second
		}
		admitted := 0
		for i := range 8 {
			v := mustReserve(t, l, id(i), 1, maxWait)
			if v.Allowed {
				admitted++
				if v.Duplicate || v.Remaining != int64(5-admitted) {
					t.Fatalf("job %d: %+v, want a fresh admission with %d remaining", i, v, 5-admitted)
				}
				continue
			}
			if v.RetryAfter <= 0 || v.Policy != 0 || v.Limit != pol(5, 3*time.Second) || v.Remaining != 0 {
				t.Fatalf("denial %d: %+v, want a retry time naming 5/3s", i, v)
			}
		}
		if admitted != 5 {
			t.Fatalf("%d admitted, want 5", admitted)
		}
		st := mustStatus(t, l)
		if p := st.Policies[0]; p.Used+p.Reserved != 5 || p.Remaining != 0 || p.ResetAfter <= 0 || p.ResetAfter > 3300*time.Millisecond {
			t.Fatalf("status of 5/3s: %+v", p)
		}
		if p := st.Policies[1]; p.Used+p.Reserved != 5 || p.Remaining != 95 {
			t.Fatalf("status of 100/1m: %+v", p)
		}
		if want := recordMembers(algo, 5); st.Units != want {
			t.Fatalf("id record holds %d members, want %d", st.Units, want)
		}
	})
}

// Several limits are checked in one step: a denial by either records nothing, and the verdict names the
// policy that blocks.
func TestFamilySeveralLimits(t *testing.T) {
	eachAlgorithm(t, gate.Algorithms, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		l := newAlgo(t, rdb, algo, 0, pol(2, 2*time.Second), pol(3, time.Minute))
		awayFromEdges(t, rdb, algo, 10*time.Second, time.Minute)
		// Reservations reach the third unit under every algorithm but the leaky bucket (the buckets refill
		// it, the windows pass); the fourth is beyond what 3/1m allows. The leaky bucket's second job would
		// wait 20s in the queue of 3/1m, which overflows the 2s queue of 2/2s.
		wait, admitted := 5*time.Second, 3
		if algo == gate.LeakyBucket {
			wait, admitted = time.Minute, 1
		}
		for i := range admitted {
			if v := mustReserve(t, l, id(i), 1, wait); !v.Allowed {
				t.Fatalf("job %d: %+v", i, v)
			}
		}
		before := mustStatus(t, l)
		v := mustReserve(t, l, "x", 1, wait)
		if v.Allowed || v.Policy != 1 || v.Limit != pol(3, time.Minute) || v.RetryAfter < 5*time.Second {
			t.Fatalf("fourth job: %+v, want denied by 3/1m for longer than 2/2s would", v)
		}
		after := mustStatus(t, l)
		for i := range before.Policies {
			b, a := before.Policies[i], after.Policies[i]
			if a.Used+a.Reserved != b.Used+b.Reserved || a.Remaining != b.Remaining {
				t.Fatalf("a denial changed policy %d: %+v -> %+v", i, b, a)
			}
		}
		if want := recordMembers(algo, int64(admitted)); after.Units != want {
			t.Fatalf("id record holds %d members after a denial, want %d", after.Units, want)
		}
	})
}

// A pause binds every algorithm: nothing goes before its end, and reservations land on it.
func TestFamilyPause(t *testing.T) {
	eachAlgorithm(t, family, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		ctx := context.Background()
		l := newAlgo(t, rdb, algo, 0, pol(100, time.Second))
		if err := l.Pause(ctx, prov, time.Now().Add(400*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		keys, _ := l.Keys(prov)
		until, err := rdb.Get(ctx, keys[1]).Int64()
		if err != nil {
			t.Fatal(err)
		}
		v := mustReserve(t, l, "a", 1, 0)
		if v.Allowed || !v.Paused || v.RetryAfter != ceilMs(until-v.Now.UnixMicro()) {
			t.Fatalf("during the pause: %+v, want denied until %d", v, until)
		}
		r := mustReserve(t, l, "b", 1, time.Second)
		if !r.Allowed || !r.Paused || r.Slot().UnixMicro() != until {
			t.Fatalf("reservation during the pause: %+v, want the slot %d", r, until)
		}
		if st := mustStatus(t, l); st.PausedUntil.UnixMicro() != until {
			t.Fatalf("status: paused until %v, want %d", st.PausedUntil, until)
		}
		if algo == gate.TokenBucket {
			if f, err := l.Force(ctx, prov, "f", 1); err != nil || f.Allowed || !f.Paused {
				t.Fatalf("force during the pause: %+v %v, want denied: a pause binds forced calls too", f, err)
			}
		}
	})
}

// A job id admitted before is a duplicate: it takes nothing more and goes at its own slot.
func TestFamilyDuplicates(t *testing.T) {
	eachAlgorithm(t, family, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		l := newAlgo(t, rdb, algo, 0, pol(2, 3*time.Second))
		awayFromEdges(t, rdb, algo, time.Second, 3*time.Second)
		first := mustReserve(t, l, "pay-1", 1, 0)
		again := mustReserve(t, l, "pay-1", 1, 0)
		if !again.Allowed || !again.Duplicate || !again.AdmittedAt.Equal(first.Slot()) || again.Remaining != first.Remaining {
			t.Fatalf("again: %+v, want an allowed duplicate of %+v taking nothing", again, first)
		}
		units := int64(2)
		if algo != gate.LeakyBucket { // the queue's second place is ahead already
			mustReserve(t, l, "fill", 1, 0)
			units = 3
		}
		r := mustReserve(t, l, "pay-2", 1, 5*time.Second)
		if !r.Allowed || r.Delay <= 0 {
			t.Fatalf("pay-2: %+v, want a reservation ahead", r)
		}
		dup := mustReserve(t, l, "pay-2", 1, 5*time.Second)
		if !dup.Duplicate || !dup.Slot().Equal(r.Slot()) {
			t.Fatalf("duplicate of %+v: %+v, want its own slot", r, dup)
		}
		st := mustStatus(t, l)
		if st.Units != recordMembers(algo, units) || st.Policies[0].Used+st.Policies[0].Reserved != units {
			t.Fatalf("status after duplicates: %+v, want %d units spent", st, units)
		}
	})
}

// Found in review: releasing the only admission on a fresh (or expired) state gives its unit back too,
// the usual case of a 429 on an idle provider: status shows the whole limit again.
func TestFamilyReleaseFirstAdmission(t *testing.T) {
	eachAlgorithm(t, family, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		ctx := context.Background()
		l := newAlgo(t, rdb, algo, 0, pol(2, 10*time.Second))
		awayFromEdges(t, rdb, algo, time.Second, 10*time.Second)
		a := mustReserve(t, l, "a", 1, 0)
		if !a.Allowed {
			t.Fatalf("a: %+v", a)
		}
		if _, err := l.Release(ctx, prov, "a", 1, a.Slot()); err != nil {
			t.Fatal(err)
		}
		st, err := l.Status(ctx, prov)
		if err != nil {
			t.Fatal(err)
		}
		if p := st.Policies[0]; p.Remaining != 2 || p.Used != 0 || p.Reserved != 0 {
			t.Fatalf("after releasing the only admission: %+v, want the whole limit back", p)
		}
	})
}

// Release gives units back where the algorithm can: the counters always (while the unit still counts), the
// buckets and the queue when the job is the newest admission. Either way the id is forgotten.
func TestFamilyRelease(t *testing.T) {
	eachAlgorithm(t, family, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		ctx := context.Background()
		l := newAlgo(t, rdb, algo, 0, pol(2, time.Hour))
		awayFromEdges(t, rdb, algo, time.Second, time.Hour)
		wait := time.Duration(0)
		if algo == gate.LeakyBucket {
			wait = 2 * time.Hour // the second job queues behind the first
		}
		a := mustReserve(t, l, "a", 1, wait)
		b := mustReserve(t, l, "b", 1, wait)
		if !a.Allowed || !b.Allowed {
			t.Fatalf("a %+v b %+v", a, b)
		}
		if v := mustReserve(t, l, "c", 1, wait); v.Allowed {
			t.Fatalf("c admitted past the limit: %+v", v)
		}
		// Releasing at another slot than the id's does nothing; releasing an unknown id neither.
		if n, err := l.Release(ctx, prov, "b", 1, b.Slot().Add(time.Microsecond)); err != nil || n != 0 {
			t.Fatalf("release at another slot: %d units, %v", n, err)
		}
		if n, err := l.Release(ctx, prov, "never", 1, time.Time{}); err != nil || n != 0 {
			t.Fatalf("release of an unknown id: %d units, %v", n, err)
		}
		if v := mustReserve(t, l, "c", 1, wait); v.Allowed {
			t.Fatalf("c admitted after releases that release nothing: %+v", v)
		}
		// The newest admission comes back under every algorithm.
		if n, err := l.Release(ctx, prov, "b", 1, b.Slot()); err != nil || n != 1 {
			t.Fatalf("release of b: %d units, %v", n, err)
		}
		c := mustReserve(t, l, "c", 1, wait)
		if !c.Allowed || c.Duplicate || !c.Slot().Equal(b.Slot()) && algo == gate.LeakyBucket {
			t.Fatalf("c after releasing b: %+v, want b's place (%v)", c, b.Slot())
		}
		// An older one comes back under the counters only.
		if _, err := l.Release(ctx, prov, "a", 1, time.Time{}); err != nil {
			t.Fatal(err)
		}
		d := mustReserve(t, l, "d", 1, wait)
		switch algo {
		case gate.SlidingLog, gate.SlidingWindow, gate.FixedWindow:
			if !d.Allowed {
				t.Fatalf("d after releasing a: %+v, want a's unit back", d)
			}
		default:
			if d.Allowed {
				t.Fatalf("d after releasing a (not the newest): %+v, want its unit still spent", d)
			}
		}
		// A released id is a new job when it comes again.
		if v := mustReserve(t, l, "b", 1, wait); v.Duplicate {
			t.Fatalf("b after its release: %+v, want a new job", v)
		}
	})
}

// A stale redelivery is moved: its old entry leaves the id record, its units go back where the algorithm can
// give them back, and it is admitted afresh in the same step; marked sent, it is a plain duplicate.
func TestFamilyStaleDuplicateIsMoved(t *testing.T) {
	eachAlgorithm(t, family, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		ctx := context.Background()
		l := newAlgoOpts(t, rdb, gate.Options{StaleAfter: 50 * time.Millisecond}, gate.Provider{Algorithm: algo, Policies: []gate.Policy{pol(3, time.Hour)}})
		awayFromEdges(t, rdb, algo, time.Second, time.Hour)
		a := mustReserve(t, l, "a", 2, 0)
		if dup := mustReserve(t, l, "a", 2, 0); !dup.Duplicate || dup.Moved {
			t.Fatalf("fresh duplicate: %+v", dup)
		}
		time.Sleep(100 * time.Millisecond)
		v := mustReserve(t, l, "a", 2, time.Hour)
		if !v.Allowed || v.Duplicate || !v.Moved || !v.AdmittedAt.Equal(a.Slot()) {
			t.Fatalf("stale duplicate: %+v, want moved from %v", v, a.Slot())
		}
		log := readLog(t, rdb, l)
		if len(log) != 1 || log[0].cost != 2 || log[0].slot != v.Slot().UnixMicro() {
			t.Fatalf("id record %+v, want a's 2 units at %d", log, v.Slot().UnixMicro())
		}
		// a was the newest admission (or sits in a counter still counting): its units came back, so the
		// move spent nothing and one unit is left.
		if v.Remaining != 1 {
			t.Fatalf("remaining %d after the move, want 1 (the old units given back)", v.Remaining)
		}
		s := mustReserve(t, l, "s", 1, time.Hour)
		if err := l.Sent(ctx, prov, "s"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		if d := mustReserve(t, l, "s", 1, time.Hour); !d.Duplicate || d.Moved || !d.AdmittedAt.Equal(s.Slot()) {
			t.Fatalf("stale redelivery of a job marked sent: %+v, want a plain duplicate", d)
		}
	})
}

// Force (token_bucket only) admits now from an empty bucket, draining it to zero and never into debt.
func TestTokenBucketForce(t *testing.T) {
	eachAlgorithm(t, []gate.Algorithm{gate.TokenBucket}, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		ctx := context.Background()
		const w = 10 * time.Second // one token per 5s
		l := newAlgo(t, rdb, algo, 0, pol(2, w))
		mustReserve(t, l, "a", 1, 0)
		mustReserve(t, l, "b", 1, 0)
		if v := mustReserve(t, l, "c", 1, 0); v.Allowed {
			t.Fatalf("empty bucket admitted c: %+v", v)
		}
		f, err := l.Force(ctx, prov, "c", 2)
		if err != nil || !f.Allowed || f.Delay != 0 || f.Remaining != 0 || f.Duplicate {
			t.Fatalf("force on an empty bucket: %+v %v, want admitted now", f, err)
		}
		// Drained to zero, not into debt: the next unit is one refill interval away, not three.
		v := mustReserve(t, l, "d", 1, time.Minute)
		if !v.Allowed || v.Delay > 5*time.Second || v.Delay < 4*time.Second {
			t.Fatalf("after the force: %+v, want the next token within one refill interval (5s)", v)
		}
		// With reservations queued, a forced call goes now and leaves their slots as they were.
		e := mustReserve(t, l, "e", 1, time.Minute)
		if _, err := l.Force(ctx, prov, "g", 1); err != nil {
			t.Fatal(err)
		}
		if h := mustReserve(t, l, "h", 1, time.Minute); h.Slot().Sub(e.Slot()) > 5*time.Second+time.Millisecond {
			t.Fatalf("reservation after a forced call: %v after the one before, want one interval (5s)", h.Slot().Sub(e.Slot()))
		}
		// A forced duplicate is a duplicate.
		if f2, err := l.Force(ctx, prov, "c", 2); err != nil || !f2.Duplicate {
			t.Fatalf("forced again: %+v %v", f2, err)
		}
	})
	l := newAlgo(t, backends(t)[0].rdb, gate.GCRA, 0, pol(2, time.Second))
	if _, err := l.Force(context.Background(), prov, "x", 1); !errors.Is(err, gate.ErrInvalid) ||
		err.Error() != "gate: force is only for token_bucket providers; acme uses gcra" {
		t.Fatalf("force on gcra: %v", err)
	}
}

// Token bucket and GCRA: a burst of the limit, then one unit per window/limit; RetryAfter tells when cost
// tokens will be there.
func TestBucketRefill(t *testing.T) {
	eachAlgorithm(t, []gate.Algorithm{gate.TokenBucket, gate.GCRA}, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		const w = 6 * time.Second // one unit per 2s
		l := newAlgo(t, rdb, algo, 0, pol(3, w))
		first := mustReserve(t, l, "a", 1, 0)
		mustReserve(t, l, "b", 1, 0)
		mustReserve(t, l, "c", 1, 0)
		// Empty: one token comes 2s after the burst began, two tokens 4s after.
		t0 := first.Now.UnixMicro()
		v1 := mustReserve(t, l, "d", 1, 0)
		if v1.Allowed || v1.RetryAfter != ceilMs(t0+2_000_000-v1.Now.UnixMicro()) {
			t.Fatalf("cost 1 on an empty bucket: %+v, want retry at t0+2s", v1)
		}
		v2 := mustReserve(t, l, "d", 2, 0)
		if v2.Allowed || v2.RetryAfter != ceilMs(t0+4_000_000-v2.Now.UnixMicro()) {
			t.Fatalf("cost 2 on an empty bucket: %+v, want retry at t0+4s", v2)
		}
		// Reservations go one interval apart, and the bucket is full again 2s after the last.
		r1 := mustReserve(t, l, "r1", 1, time.Minute)
		r2 := mustReserve(t, l, "r2", 1, time.Minute)
		if r1.Slot().UnixMicro() != t0+2_000_000 || r2.Slot().UnixMicro() != t0+4_000_000 {
			t.Fatalf("reservations at %d and %d, want t0+2s and t0+4s (t0 = %d)", r1.Slot().UnixMicro(), r2.Slot().UnixMicro(), t0)
		}
		if want := t0 + 10_000_000 - r2.Now.UnixMicro(); r2.ResetAfter.Microseconds() < want-1 || r2.ResetAfter.Microseconds() > want+1 {
			t.Fatalf("reset after %v, want the bucket full at t0+10s (%dµs)", r2.ResetAfter, want)
		}
	})
}

// Leaky bucket: jobs leave the queue one interval apart; the queue holds the limit; a full queue is a
// denial whatever the max wait, until a unit has leaked.
func TestLeakyBucketQueue(t *testing.T) {
	eachAlgorithm(t, []gate.Algorithm{gate.LeakyBucket}, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		const w = 3 * time.Second // one unit per 600ms
		l := newAlgo(t, rdb, algo, 0, pol(5, w))
		var slots []int64
		for i := range 5 {
			v := mustReserve(t, l, id(i), 1, time.Hour)
			if !v.Allowed {
				t.Fatalf("job %d: %+v", i, v)
			}
			slots = append(slots, v.Slot().UnixMicro())
		}
		for i := 1; i < len(slots); i++ {
			if slots[i]-slots[i-1] != 600_000 {
				t.Fatalf("slots %v: want one every 600ms", slots)
			}
		}
		full := mustReserve(t, l, "x", 1, time.Hour)
		if full.Allowed || full.RetryAfter != ceilMs(slots[0]+600_000-full.Now.UnixMicro()) {
			t.Fatalf("full queue: %+v, want denied until the head has leaked (%d)", full, slots[0]+600_000)
		}
		if now := mustReserve(t, l, "y", 1, 0); now.Allowed {
			t.Fatalf("allow into a queue: %+v", now)
		}
		time.Sleep(full.RetryAfter)
		v := mustReserve(t, l, "x", 1, time.Hour)
		if !v.Allowed || v.Slot().UnixMicro() != slots[4]+600_000 {
			t.Fatalf("after a unit leaked: %+v, want the tail's next place %d", v, slots[4]+600_000)
		}
		if st := mustStatus(t, l); st.Policies[0].Used < 4 || st.Policies[0].Remaining > 1 {
			t.Fatalf("status: %+v", st.Policies[0])
		}
	})
}

// Fixed window: calendar windows aligned to the epoch on the Redis clock; a full window denies until the
// next one starts, reservations land on its start, and 2x the limit can pass across a boundary.
func TestFixedWindowReset(t *testing.T) {
	eachAlgorithm(t, []gate.Algorithm{gate.FixedWindow}, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		const w = 2 * time.Second
		l := newAlgo(t, rdb, algo, 0, pol(3, w))
		// Start early in a window, so the three go in one.
		now := redisTime(t, rdb)
		time.Sleep(time.Duration(2_000_000-now%2_000_000)*time.Microsecond + 50*time.Millisecond)
		var last gate.Verdict
		for i := range 3 {
			if last = mustReserve(t, l, id(i), 1, 0); !last.Allowed {
				t.Fatalf("job %d: %+v", i, last)
			}
		}
		end := (last.Now.UnixMicro()/2_000_000 + 1) * 2_000_000
		d := mustReserve(t, l, "d", 1, 0)
		if d.Allowed || d.RetryAfter != ceilMs(end-d.Now.UnixMicro()) {
			t.Fatalf("full window: %+v, want denied until its end %d", d, end)
		}
		r := mustReserve(t, l, "r", 1, 5*time.Second)
		if !r.Allowed || r.Slot().UnixMicro() != end || r.Remaining != 2 {
			t.Fatalf("reservation: %+v, want the next window's start %d", r, end)
		}
		time.Sleep(time.Until(r.Slot()) + 10*time.Millisecond)
		// The new window: two more now, 3 within a moment of the three before: 2x across the boundary.
		for _, j := range []string{"e", "f"} {
			if v := mustReserve(t, l, j, 1, 0); !v.Allowed {
				t.Fatalf("%s in the new window: %+v", j, v)
			}
		}
		if v := mustReserve(t, l, "g", 1, 0); v.Allowed {
			t.Fatalf("a fourth in the new window: %+v", v)
		}
	})
}

// Fixed window with a margin: a slot is never in the last margin of a window, so a request landing late is
// counted by the provider in the window the gate counted it in.
func TestFixedWindowMargin(t *testing.T) {
	eachAlgorithm(t, []gate.Algorithm{gate.FixedWindow}, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		const margin = 200 * time.Millisecond
		l := newAlgo(t, rdb, algo, margin, pol(10, time.Second))
		now := redisTime(t, rdb)
		time.Sleep(time.Duration(1_000_000-now%1_000_000)*time.Microsecond - 120*time.Millisecond) // 120ms before a boundary
		v := mustReserve(t, l, "a", 1, 0)
		end := (v.Now.UnixMicro()/1_000_000 + 1) * 1_000_000
		if end-v.Now.UnixMicro() > 200_000 {
			t.Skipf("woke %dµs before the boundary, outside the margin: the machine is too slow for this check", end-v.Now.UnixMicro())
		}
		if v.Allowed || v.RetryAfter != ceilMs(end-v.Now.UnixMicro()) {
			t.Fatalf("in the last margin: %+v, want denied until the boundary %d", v, end)
		}
		if r := mustReserve(t, l, "b", 1, time.Second); !r.Allowed || r.Slot().UnixMicro() != end {
			t.Fatalf("reservation in the last margin: %+v, want the boundary %d", r, end)
		}
	})
}

// Sliding window against the exact log: never more, and at most one bucket of time later.
func TestSlidingWindowError(t *testing.T) {
	eachAlgorithm(t, []gate.Algorithm{gate.SlidingWindow}, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		const w, buckets = 2 * time.Second, 10 // buckets of 200ms
		l := newAlgoOpts(t, rdb, gate.Options{}, gate.Provider{Algorithm: algo, Buckets: buckets, Policies: []gate.Policy{pol(4, w)}})
		var first gate.Verdict
		for i := range 4 {
			v := mustReserve(t, l, id(i), 1, 0)
			if i == 0 {
				first = v
			}
		}
		// The exact log would admit the fifth unit when the first leaves its window, at first + W. The
		// sliding window admits it when the first's bucket leaves, at the start of bucket kf + B + 1: never
		// earlier, at most one bucket later. (Computed from the first slot on the Redis clock: comparing
		// with a second limiter asked a moment later could straddle a bucket.)
		v := mustReserve(t, l, "next", 1, 5*time.Second)
		g := int64(200_000)
		kf := first.Slot().UnixMicro() / g
		if got, want := v.Slot().UnixMicro(), (kf+buckets+1)*g; got != want {
			t.Fatalf("slot %d, want %d: the start of the bucket after the first unit's bucket left", got, want)
		}
		if d := v.Slot().Sub(first.Slot().Add(w)); d <= 0 || d > 200*time.Millisecond {
			t.Fatalf("sliding window slot %v after the exact log's: want 0..one bucket (200ms)", d)
		}
		if d := v.Slot().Sub(first.Slot()); d < w {
			t.Fatalf("the fifth unit %v after the first: within the window", d)
		}
	})
}

// A provider's keys all share its hash tag, whatever the algorithm: every decision is one script on one slot.
func TestFamilyClusterHashTags(t *testing.T) {
	ctx := context.Background()
	cluster := backends(t)[1].rdb
	ps := map[string]gate.Provider{}
	for _, a := range gate.Algorithms {
		ps[string(a)] = gate.Provider{Algorithm: a, Policies: []gate.Policy{pol(5, time.Second), pol(50, time.Minute)}}
	}
	l, err := gate.New(cluster, gate.Options{Prefix: uniquePrefix(t), Providers: ps})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range gate.Algorithms {
		name := string(a)
		if _, err := l.Reserve(ctx, name, "job", 1, time.Second); err != nil {
			t.Fatalf("%s: %v", a, err) // CROSSSLOT would surface here
		}
		keys, _ := l.Keys(name)
		var slot int64 = -1
		for _, k := range keys {
			s, err := cluster.ClusterKeySlot(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if slot >= 0 && s != slot {
				t.Fatalf("%s: keys %v in slots %d and %d", a, keys, slot, s)
			}
			slot = s
		}
		if got, _ := l.Algorithm(name); got != a {
			t.Fatalf("provider %s runs %s", name, got)
		}
	}
}

func TestFamilyOptions(t *testing.T) {
	rdb := backends(t)[0].rdb
	for _, tt := range []struct {
		name string
		p    gate.Provider
		want string
	}{
		{"unknown", gate.Provider{Algorithm: "leaky", Policies: []gate.Policy{pol(1, time.Second)}}, `gate: provider acme: unknown algorithm "leaky"`},
		{"buckets elsewhere", gate.Provider{Algorithm: gate.GCRA, Buckets: 4, Policies: []gate.Policy{pol(1, time.Second)}}, "gate: provider acme: buckets is only for sliding_window, not gcra"},
		{"buckets range", gate.Provider{Algorithm: gate.SlidingWindow, Buckets: 101, Policies: []gate.Policy{pol(1, time.Second)}}, "gate: provider acme: buckets must be 1..100, got 101"},
		{"window twice", gate.Provider{Algorithm: gate.TokenBucket, Policies: []gate.Policy{pol(1, time.Second), pol(2, time.Second)}}, "gate: provider acme policy 1 (2/1s): a window may appear once, to the µs (token_bucket keeps its state per window)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := gate.New(rdb, gate.Options{Prefix: "p", Providers: map[string]gate.Provider{prov: tt.p}})
			if err == nil || err.Error() != tt.want {
				t.Fatalf("err %v, want %q", err, tt.want)
			}
		})
	}
	_, err := gate.New(rdb, gate.Options{Prefix: "p", Margin: time.Second, Providers: map[string]gate.Provider{prov: {Algorithm: gate.FixedWindow, Policies: []gate.Policy{pol(1, time.Second)}}}})
	if err == nil {
		t.Fatal("fixed window no longer than the margin: accepted")
	}
}

// Each algorithm's guarantee, property-tested: 16 concurrent workers with random costs, random max waits and
// repeated ids (so duplicates and moves happen), then the id record (kept for the whole run) is read back and
// the slots checked against what the algorithm promises, and against what the workers were told. Half the
// workers share a gate that batches their reserves (Options.Batch), so batches and single calls interleave
// over one state.
func TestFamilyGuaranteesUnderConcurrency(t *testing.T) {
	eachAlgorithm(t, family, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		const margin = time.Millisecond
		policies := []gate.Policy{pol(6, 100*time.Millisecond), pol(15, 400*time.Millisecond), pol(400, 3*time.Second)}
		opts := gate.Options{Margin: margin, StaleAfter: 30 * time.Millisecond, DedupWindow: time.Minute, Prefix: uniquePrefix(t),
			Providers: map[string]gate.Provider{prov: {Algorithm: algo, Policies: policies}}}
		l, err := gate.New(rdb, opts)
		if err != nil {
			t.Fatal(err)
		}
		opts.Batch = 8
		var calls, batchedReserves atomic.Int64
		lb, err := gate.New(countCalls(t, rdb, &calls), opts)
		if err != nil {
			t.Fatal(err)
		}
		var (
			mu                  sync.Mutex
			told                = map[string]entry{} // the latest admission each id was told
			dups, moved, denied int
			released            int
			kept                int // releases refused: a duplicate was let go on the admission, or it moved
		)
		ctx := context.Background()
		keys, err := l.Keys(prov)
		if err != nil {
			t.Fatal(err)
		}
		// At least a second, and on until the run is strong enough to prove something (a loaded machine
		// decides less in a second), for at most six.
		deadline, last := time.Now().Add(time.Second), time.Now().Add(6*time.Second)
		weak := func() bool {
			mu.Lock()
			defer mu.Unlock()
			return dups == 0 || denied == 0 || moved == 0 || released == 0 || len(told) < 20
		}
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), 7))
				l, batched := l, w%2 == 1
				if batched {
					l = lb
				}
				for now := time.Now(); now.Before(deadline) || (now.Before(last) && weak()); now = time.Now() {
					jobID := fmt.Sprintf("j%d", rng.IntN(80))
					cost := []int64{1, 1, 1, 2, 3, 6}[rng.IntN(6)] // 6: more than a bucket holds with the margin (debt)
					v, err := l.Reserve(ctx, prov, jobID, cost, time.Duration(rng.IntN(300))*time.Millisecond)
					if batched {
						batchedReserves.Add(1)
					}
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					switch {
					case !v.Allowed:
						denied++
					case v.Duplicate:
						dups++
					default:
						if v.Moved {
							moved++
						} else if _, ok := told[jobID]; ok {
							t.Errorf("job %s admitted twice as new", jobID)
						}
						told[jobID] = entry{id: jobID, slot: v.Slot().UnixMicro(), cost: cost}
						// Now and then the job's own worker gives a fresh admission back, as a worker that
						// woke late or was throttled does (under the lock: a re-admission after it is
						// recorded after it). What stays in the record must still keep the guarantee.
						if !v.Moved && rng.IntN(6) == 0 {
							n, err := l.Release(ctx, prov, jobID, cost, v.Slot())
							switch {
							case err != nil:
								t.Error(err)
							case n == cost:
								delete(told, jobID)
								released++
							case n != 0:
								t.Errorf("release of %s (cost %d) gave back %d units", jobID, cost, n)
							default:
								// Refused only when a duplicate was let go on this admission (it may be
								// sending on it: the id is then marked in the marks set), or when another
								// worker's stale redelivery has just moved the id to another slot (that
								// worker records the new slot once it takes the lock).
								_, merr := rdb.ZScore(ctx, keys[2], jobID+"\x00d").Result()
								at, err := rdb.ZScore(ctx, keys[0], jobID).Result()
								if merr != nil && (err != nil || int64(at) == v.Slot().UnixMicro()) {
									t.Errorf("release of %s refused though no duplicate was let go on it nor was it moved (mark: %v, slot %v %v)", jobID, merr, at, err)
								}
								kept++
							}
						}
					}
					mu.Unlock()
					if v.Allowed && v.Delay > 0 && rng.IntN(4) == 0 {
						time.Sleep(v.Delay)
					}
					if !v.Allowed {
						time.Sleep(min(v.RetryAfter, time.Duration(rng.IntN(5))*time.Millisecond))
					}
				}
			})
		}
		wg.Wait()
		if r, c := batchedReserves.Load(), calls.Load(); c >= r {
			t.Errorf("the batching gate's %d reserves took %d calls: none went together", r, c)
		} else {
			t.Logf("the batching gate's %d reserves took %d calls", r, c)
		}
		log := readLog(t, rdb, l)
		if len(log) != len(told) {
			t.Fatalf("id record holds %d jobs, workers were told %d", len(log), len(told))
		}
		for _, e := range log {
			if told[e.id] != e {
				t.Fatalf("id record %+v, workers were told %+v", e, told[e.id])
			}
		}
		if dups == 0 || denied == 0 || moved == 0 || released == 0 || len(told) < 20 {
			t.Fatalf("weak run: %d admitted, %d duplicates, %d moved, %d denied, %d released", len(told), dups, moved, denied, released)
		}
		for _, p := range policies {
			if err := guarantee(algo, log, p, margin); err != nil {
				t.Errorf("policy %s: %v", p, err)
			}
		}
		t.Logf("%d admitted, %d duplicates, %d moved, %d denied, %d released, %d releases refused (a duplicate let go, or moved meanwhile)", len(told), dups, moved, denied, released, kept)
	})
}

// guarantee checks admitted slots (sorted) against what the algorithm promises for one policy (L per W,
// margin m); see each script's header.
func guarantee(algo gate.Algorithm, log []entry, p gate.Policy, margin time.Duration) error {
	L, W, m := float64(p.Limit), float64(p.Window.Microseconds()), float64(margin.Microseconds())
	switch algo {
	case gate.SlidingLog, gate.SlidingWindow: // the exact log, and never more than it: L in any window of W + m
		if got := maxInWindow(log, p.Window+margin); got > p.Limit {
			return fmt.Errorf("%d units in one window of W+m", got)
		}
	case gate.FixedWindow: // L per calendar window, no slot in a window's last margin
		per := map[int64]int64{}
		for _, e := range log {
			k := e.slot / p.Window.Microseconds()
			if per[k] += e.cost; per[k] > p.Limit {
				return fmt.Errorf("%d units in calendar window %d", per[k], k)
			}
			if (k+1)*p.Window.Microseconds()-e.slot <= margin.Microseconds() {
				return fmt.Errorf("slot %d in the last margin of its window", e.slot)
			}
		}
	case gate.LeakyBucket: // a job of cost n is followed by n*T of silence
		T := (W + m) / L
		for i := 1; i < len(log); i++ {
			if gap := float64(log[i].slot - log[i-1].slot); gap+1 < float64(log[i-1].cost)*T {
				return fmt.Errorf("slots %d and %d are %.0fµs apart, want >= %.0f", log[i-1].slot, log[i].slot, gap, float64(log[i-1].cost)*T)
			}
		}
	case gate.TokenBucket, gate.GCRA:
		// At most L*W/(W+m) + d*L/(W+m) units in any interval of length d; a job costing more than the
		// bucket's L*W/(W+m) goes on a full bucket and leaves it in debt, which is paid back before anything
		// else goes: its own cost (at most L) then stands for the bucket.
		for i := range log {
			var sum, biggest float64
			for j := i; j < len(log); j++ {
				sum += float64(log[j].cost)
				biggest = max(biggest, float64(log[j].cost))
				// Slots are whole µs while a unit's period (W+m)/L need not be: allow each slot its µs of rounding.
				d := float64(log[j].slot-log[i].slot) + 2
				if bound := max(L*W/(W+m), biggest) + d*L/(W+m); sum > bound+1e-6 {
					return fmt.Errorf("%.0f units in %.0fµs from %d, bound %.3f", sum, d, log[i].slot, bound)
				}
			}
		}
	}
	return nil
}

// Found in review: a stale redelivery whose move is denied gives its unit back and takes it again; when
// that emptied the counter hash, the hash came back without an expiry. It keeps one now.
func TestDeniedMoveKeepsExpiry(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		const window, margin = 2 * time.Second, 1500 * time.Millisecond // no slot in a window's last 1.5s
		l := newAlgoOpts(t, rdb, gate.Options{Margin: margin, StaleAfter: time.Millisecond},
			gate.Provider{Algorithm: gate.FixedWindow, Policies: []gate.Policy{pol(5, window)}})
		for redisTime(t, rdb)%window.Microseconds() > (100 * time.Millisecond).Microseconds() {
			time.Sleep(10 * time.Millisecond) // to the start of a window
		}
		if v := mustReserve(t, l, "a", 1, 0); !v.Allowed {
			t.Fatalf("a: %+v", v)
		}
		time.Sleep(700 * time.Millisecond) // into the window's last 1.5s: a move now needs the next window
		v := mustReserve(t, l, "a", 1, 0)
		if v.Allowed || v.Moved {
			t.Fatalf("the stale redelivery: %+v, want its move denied (no slot before the next window)", v)
		}
		keys, _ := l.Keys(prov)
		state := keys[3]
		if n, err := rdb.HLen(ctx, state).Result(); err != nil || n != 1 {
			t.Fatalf("%s holds %d fields (%v), want a's window restored", state, n, err)
		}
		if ttl := rdb.PTTL(ctx, state).Val(); ttl <= 0 {
			t.Fatalf("%s has no expiry (%v) after the denied move", state, ttl)
		}
	})
}

// Found in review: fixed_window hands slots out first come, first served too: a small job asking after a
// larger one was reserved in the next window does not go before it in the current one.
func TestFixedWindowFirstComeFirstServed(t *testing.T) {
	eachAlgorithm(t, []gate.Algorithm{gate.FixedWindow}, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		l := newAlgo(t, rdb, algo, 0, pol(5, time.Hour))
		awayFromEdges(t, rdb, algo, time.Minute, time.Hour)
		if a := mustReserve(t, l, "a", 4, 0); !a.Allowed {
			t.Fatalf("a: %+v", a)
		}
		b := mustReserve(t, l, "b", 2, 2*time.Hour)
		if !b.Allowed || b.Delay == 0 {
			t.Fatalf("b: %+v, want a slot in the next window", b)
		}
		if c := mustReserve(t, l, "c", 1, 2*time.Hour); !c.Allowed || c.Slot().Before(b.Slot()) {
			t.Fatalf("c %+v went before b (%v), which asked first", c, b.Slot())
		}
	})
}
