package gate_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/internal/testenv"
)

// 1. The decision and the recorded slot use the Redis clock.
func TestServerClock(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		l := newLimiter(t, rdb, 0, pol(10, time.Second))
		before := redisTime(t, rdb)
		v := mustReserve(t, l, "a", 1, 0)
		after := redisTime(t, rdb)
		if !v.Allowed || v.Delay != 0 {
			t.Fatalf("verdict %+v, want allowed now", v)
		}
		if now := v.Now.UnixMicro(); now < before || now > after {
			t.Fatalf("verdict clock %d outside Redis TIME [%d, %d]", now, before, after)
		}
		log := readLog(t, rdb, l)
		if len(log) != 1 || log[0].slot != v.Now.UnixMicro() {
			t.Fatalf("log %v, want one entry at the verdict's Redis time %d", log, v.Now.UnixMicro())
		}
	})
}

// 2. Jobs given the same microsecond keep one entry each: the member is the job id, never the time.
func TestSameSlotKeepsEveryJob(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		l := newLimiter(t, rdb, 0, pol(50, time.Second))
		// Behind a pause every reservation lands on the same slot: the end of the pause.
		if err := l.Pause(context.Background(), prov, time.Now().Add(200*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		const n = 20
		for i := range n {
			if v := mustReserve(t, l, id(i), 1, time.Second); !v.Allowed || !v.Paused {
				t.Fatalf("job %d: %+v, want allowed behind the pause", i, v)
			}
		}
		log := readLog(t, rdb, l)
		if len(log) != n {
			t.Fatalf("log holds %d entries, want %d", len(log), n)
		}
		for _, e := range log {
			if e.slot != log[0].slot {
				t.Fatalf("slots differ (%d, %d): the test did not exercise one microsecond", e.slot, log[0].slot)
			}
		}
	})
}

// 3. A job id admitted inside the window is admitted again, at its own slot, without consuming budget.
func TestDuplicateAdmission(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		l := newLimiter(t, rdb, 0, pol(2, 10*time.Second))
		first := mustReserve(t, l, "pay-1", 1, 0)
		if !first.Allowed || first.Duplicate || first.Remaining != 1 {
			t.Fatalf("first: %+v", first)
		}
		again := mustReserve(t, l, "pay-1", 1, 0)
		if !again.Allowed || !again.Duplicate || again.Remaining != 1 {
			t.Fatalf("again: %+v, want allowed duplicate with remaining 1", again)
		}
		if !again.AdmittedAt.Equal(first.Slot()) || !first.AdmittedAt.IsZero() {
			t.Fatalf("duplicate admitted at %v, want the first's slot %v (and none on the first)", again.AdmittedAt, first.Slot())
		}
		if v := mustReserve(t, l, "pay-2", 1, 0); !v.Allowed || v.Duplicate || v.Remaining != 0 {
			t.Fatalf("second job: %+v", v)
		}
		if v := mustReserve(t, l, "pay-3", 1, 0); v.Allowed {
			t.Fatalf("third job: %+v, want denied", v)
		}
		// A duplicate of a full window is still admitted: the redelivered job already holds its permit.
		if v := mustReserve(t, l, "pay-1", 1, 0); !v.Allowed || !v.Duplicate {
			t.Fatalf("redelivery into a full window: %+v", v)
		}
		// A duplicate of a reservation gets the reserved slot back, not a new one.
		l2 := newLimiter(t, rdb, 0, pol(1, 300*time.Millisecond))
		mustReserve(t, l2, "x", 1, 0)
		r := mustReserve(t, l2, "y", 1, time.Second)
		dup := mustReserve(t, l2, "y", 1, time.Second)
		if !dup.Duplicate || !dup.Slot().Equal(r.Slot()) || !dup.AdmittedAt.Equal(r.Slot()) {
			t.Fatalf("duplicate of a reservation: slot %v, want %v", dup.Slot(), r.Slot())
		}
		if n := len(readLog(t, rdb, l)); n != 2 {
			t.Fatalf("log holds %d entries, want 2", n)
		}
	})
}

// 4. All of a provider's policies are checked before anything is recorded; the verdict names the blocker.
func TestPoliciesCheckedTogether(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		l := newLimiter(t, rdb, 0, pol(2, 200*time.Millisecond), pol(3, 10*time.Second))
		mustReserve(t, l, "a", 1, 0)
		mustReserve(t, l, "b", 1, 0)
		v := mustReserve(t, l, "c", 1, 0)
		if v.Allowed || v.Policy != 0 || v.Limit != pol(2, 200*time.Millisecond) {
			t.Fatalf("third within 200ms: %+v, want denied by policy 0", v)
		}
		time.Sleep(v.RetryAfter)
		if v := mustReserve(t, l, "c", 1, 0); !v.Allowed {
			t.Fatalf("after the short window: %+v", v)
		}
		time.Sleep(250 * time.Millisecond) // policy 0 has room again; policy 1 (3 per 10s) is full
		v = mustReserve(t, l, "d", 1, 0)
		if v.Allowed || v.Policy != 1 || v.Remaining != 0 {
			t.Fatalf("fourth: %+v, want denied by policy 1", v)
		}
		if n := len(readLog(t, rdb, l)); n != 3 {
			t.Fatalf("a denial recorded something: log holds %d entries, want 3", n)
		}
	})
}

// 5. A job costing n is admitted only where every policy has room for n; the retry time is computed for n.
func TestCost(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		const w = 400 * time.Millisecond
		l := newLimiter(t, rdb, 0, pol(5, w))
		if v := mustReserve(t, l, "x", 1, 0); !v.Allowed || v.Remaining != 4 {
			t.Fatalf("x: %+v", v)
		}
		time.Sleep(20 * time.Millisecond)
		if v := mustReserve(t, l, "y", 3, 0); !v.Allowed || v.Remaining != 1 {
			t.Fatalf("y: %+v", v)
		}
		v := mustReserve(t, l, "z", 2, 0)
		if v.Allowed || v.Remaining != 1 {
			t.Fatalf("z (cost 2, room 1): %+v, want denied with remaining 1", v)
		}
		log := readLog(t, rdb, l)
		slotX, slotY := log[0].slot, log[1].slot
		now := v.Now.UnixMicro()
		// Cost 2 needs x (cost 1) gone; cost 5 needs y gone too.
		if want := ceilMs(slotX + w.Microseconds() - now); v.RetryAfter != want {
			t.Fatalf("retry for cost 2: %v, want %v", v.RetryAfter, want)
		}
		v5 := mustReserve(t, l, "z", 5, 0)
		if want := ceilMs(slotY + w.Microseconds() - v5.Now.UnixMicro()); v5.Allowed || v5.RetryAfter != want {
			t.Fatalf("retry for cost 5: %+v, want denied with %v", v5, want)
		}
		if v := mustReserve(t, l, "w", 1, 0); !v.Allowed || v.Remaining != 0 {
			t.Fatalf("w (cost 1, room 1): %+v", v)
		}
		if _, err := l.Reserve(context.Background(), prov, "big", 6, time.Hour); err == nil {
			t.Fatal("cost above the limit: want an error, it can never be admitted")
		}
	})
}

// 6. RetryAfter is whole milliseconds, never zero when denied, and asking again after it succeeds.
func TestRetryAfterIsEnough(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		l := newLimiter(t, rdb, 3*time.Millisecond, pol(2, 150*time.Millisecond))
		for round := range 3 {
			var denied gate.Verdict
			for i := 0; ; i++ {
				v := mustReserve(t, l, fmt.Sprintf("r%d-%d", round, i), 1, 0)
				if !v.Allowed {
					denied = v
					break
				}
			}
			if denied.RetryAfter <= 0 || denied.RetryAfter%time.Millisecond != 0 {
				t.Fatalf("round %d: RetryAfter %v, want a positive whole number of ms", round, denied.RetryAfter)
			}
			time.Sleep(denied.RetryAfter)
			if v := mustReserve(t, l, fmt.Sprintf("r%d-retry", round), 1, 0); !v.Allowed {
				t.Fatalf("round %d: denied again after RetryAfter %v: %+v", round, denied.RetryAfter, v)
			}
		}
	})
}

// 7. Reservations: each slot is the earliest that keeps the limit, handed out first come first served; a
// slot beyond maxWait is a denial that records nothing.
func TestReservationSlots(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		const w = 200 * time.Millisecond
		l := newLimiter(t, rdb, 0, pol(2, w))
		var slots []int64
		for i := range 6 {
			v := mustReserve(t, l, id(i), 1, time.Second)
			if !v.Allowed || v.Duplicate {
				t.Fatalf("job %d: %+v", i, v)
			}
			slots = append(slots, v.Slot().UnixMicro())
		}
		for i := 2; i < len(slots); i++ {
			if slots[i] != slots[i-2]+w.Microseconds() {
				t.Fatalf("slot %d = %d, want exactly one window after slot %d (%d)", i, slots[i], i-2, slots[i-2])
			}
		}
		v := mustReserve(t, l, "late", 1, 300*time.Millisecond)
		want := slots[4] + w.Microseconds() // the next free slot
		if v.Allowed || v.RetryAfter != ceilMs(want-v.Now.UnixMicro()-(300*time.Millisecond).Microseconds()) {
			t.Fatalf("beyond max wait: %+v, want denied with RetryAfter to reach slot %d", v, want)
		}
		if n := len(readLog(t, rdb, l)); n != 6 {
			t.Fatalf("denial recorded: %d entries", n)
		}
		// Under overload a worker needs one call per job: every call within maxWait is admitted.
		if got := maxInWindow(readLog(t, rdb, l), w); got != 2 {
			t.Fatalf("max in window %d, want 2", got)
		}
	})
}

// 8. The invariant, property-tested: for every policy (L per W) and every instant t, the cost of entries in
// (t-W, t] is <= L. Concurrent workers, random costs, random max waits, repeated ids; then the raw log is
// read back and every window checked, and compared with what the workers were told.
func TestInvariantUnderConcurrency(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		const margin = time.Millisecond
		policies := []gate.Policy{pol(6, 50*time.Millisecond), pol(15, 200*time.Millisecond), pol(400, 3*time.Second)}
		l, err := gate.New(rdb, gate.Options{Prefix: uniquePrefix(t), Margin: margin, StaleAfter: 30 * time.Millisecond,
			Providers: map[string]gate.Provider{prov: {Policies: policies}}})
		if err != nil {
			t.Fatal(err)
		}

		type admitted struct {
			slot int64
			cost int64
		}
		var (
			mu     sync.Mutex
			first  = map[string]admitted{}
			dups   []string
			denied int
			moved  int
			// ids moved at least once
			everMoved            = map[string]bool{}
			suspects, suspectIDs []string
		)
		ctx := context.Background()
		deadline := time.Now().Add(1200 * time.Millisecond) // shorter than the longest window: nothing trimmed
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), 42))
				last := "" // this worker's latest admission
				for time.Now().Before(deadline) {
					jobID := fmt.Sprintf("j%d", rng.IntN(300))
					if last != "" && rng.IntN(4) == 0 {
						// Redelivered soon after its admission, as after a lost ack: a duplicate however slowly
						// the server answers (a random id comes back too late for that on a loaded machine, and
						// is moved).
						jobID = last
					}
					cost := 1 + rng.Int64N(3)
					maxWait := time.Duration(rng.IntN(150)) * time.Millisecond
					v, err := l.Reserve(ctx, prov, jobID, cost, maxWait)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					switch {
					case !v.Allowed:
						denied++
					case v.Duplicate:
						dups = append(dups, jobID)
						// The original slot, or now when that has passed; checked after the run, skipping jobs
						// another worker moved (its bookkeeping may land after this answer).
						if a, ok := first[jobID]; ok && max(a.slot, v.Now.UnixMicro()) != v.Slot().UnixMicro() {
							suspects = append(suspects, fmt.Sprintf("%s told slot %d, admitted at %d", jobID, v.Slot().UnixMicro(), a.slot))
							suspectIDs = append(suspectIDs, jobID)
						}
						if v.Slot().Before(v.Now) {
							t.Errorf("duplicate %s told a slot before now", jobID)
						}
					case v.Moved:
						if a, ok := first[jobID]; !ok || a.slot != v.AdmittedAt.UnixMicro() {
							t.Errorf("job %s moved from %v, admitted at %+v", jobID, v.AdmittedAt, a)
						}
						moved++
						everMoved[jobID] = true
						first[jobID] = admitted{slot: v.Slot().UnixMicro(), cost: cost} // its old units are gone
					default:
						if _, ok := first[jobID]; ok {
							t.Errorf("job %s admitted twice as new", jobID)
						}
						first[jobID] = admitted{slot: v.Slot().UnixMicro(), cost: cost}
					}
					mu.Unlock()
					if v.Allowed && !v.Duplicate {
						last = jobID
					}
					if v.Allowed && v.Delay > 0 && rng.IntN(4) == 0 {
						time.Sleep(v.Delay) // some workers wait for their slot, as the worker does
					}
				}
			})
		}
		wg.Wait()
		for i, id := range suspectIDs {
			if !everMoved[id] {
				t.Errorf("duplicate %s", suspects[i])
			}
		}

		log := readLog(t, rdb, l)
		if len(log) != len(first) {
			t.Fatalf("raw log holds %d jobs, workers were told %d were admitted", len(log), len(first))
		}
		for _, e := range log {
			a, ok := first[e.id]
			if !ok || a.slot != e.slot || a.cost != e.cost {
				t.Fatalf("log entry %+v, workers were told %+v (found %v)", e, a, ok)
			}
		}
		for _, p := range policies {
			if got := maxInWindow(log, p.Window+margin); got > p.Limit {
				t.Errorf("policy %s: %d units in one window (with margin)", p, got)
			}
		}
		if len(dups) == 0 || denied == 0 || moved == 0 || len(first) < 10 {
			t.Fatalf("weak run: %d admitted, %d duplicates, %d moved, %d denied", len(first), len(dups), moved, denied)
		}
		t.Logf("%d admitted, %d duplicates, %d moved, %d denied", len(first), len(dups), moved, denied)
	})
}

// 9. The safety margin widens every window: slots a limit apart are window+margin apart.
func TestMargin(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		const w, margin = 100 * time.Millisecond, 20 * time.Millisecond
		l := newLimiter(t, rdb, margin, pol(1, w))
		var prev int64
		for i := range 3 {
			v := mustReserve(t, l, id(i), 1, time.Second)
			if i > 0 && v.Slot().UnixMicro()-prev != (w+margin).Microseconds() {
				t.Fatalf("slot gap %dµs, want %dµs", v.Slot().UnixMicro()-prev, (w + margin).Microseconds())
			}
			prev = v.Slot().UnixMicro()
		}
	})
}

// 10. Pause holds every decision until its end; a shorter pause never shortens it.
func TestPause(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l := newLimiter(t, rdb, 0, pol(100, time.Second))
		if err := l.Pause(ctx, prov, time.Now().Add(300*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		if err := l.Pause(ctx, prov, time.Now().Add(50*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		keys, _ := l.Keys(prov)
		until, err := rdb.Get(ctx, keys[1]).Int64()
		if err != nil {
			t.Fatal(err)
		}
		v := mustReserve(t, l, "a", 1, 0)
		if v.Allowed || !v.Paused || v.RetryAfter != ceilMs(until-v.Now.UnixMicro()) {
			t.Fatalf("during pause: %+v, want denied until %d", v, until)
		}
		if v.RetryAfter < 200*time.Millisecond {
			t.Fatalf("the 50ms pause cut the 300ms one short: retry after %v", v.RetryAfter)
		}
		r := mustReserve(t, l, "b", 1, time.Second)
		if !r.Allowed || r.Slot().UnixMicro() != until {
			t.Fatalf("reservation during pause: %+v, want the slot %d", r, until)
		}
		st, err := l.Status(ctx, prov)
		if err != nil {
			t.Fatal(err)
		}
		if st.PausedUntil.UnixMicro() != until || st.Policies[0].Reserved != 1 || st.Policies[0].Used != 0 {
			t.Fatalf("status during pause: %+v", st)
		}
	})
}

// 11. Entries older than the longest window are trimmed on every call; keys expire after the window plus
// the reservation horizon.
func TestTrimAndExpiry(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		const w = 100 * time.Millisecond
		l := newLimiter(t, rdb, 0, pol(2, w))
		mustReserve(t, l, "a", 1, 0)
		mustReserve(t, l, "b", 1, 0)
		time.Sleep(w + 20*time.Millisecond)
		v := mustReserve(t, l, "c", 1, 500*time.Millisecond)
		log := readLog(t, rdb, l)
		if len(log) != 1 || log[0].id != "c" || v.Remaining != 1 {
			t.Fatalf("after the window: log %v, verdict %+v", log, v)
		}
		// The old ids are forgotten: "a" is a new job now, not a duplicate.
		if v := mustReserve(t, l, "a", 1, 0); !v.Allowed || v.Duplicate {
			t.Fatalf("a after trim: %+v", v)
		}
		// Reserve a slot ahead, then check the keys outlive it by a window.
		r := mustReserve(t, l, "d", 1, time.Second)
		if r.Delay < 50*time.Millisecond {
			t.Fatalf("d: want a reservation ahead, got %+v", r)
		}
		keys, _ := l.Keys(prov)
		for _, k := range keys[:1] {
			ttl, err := rdb.PTTL(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if min := r.Delay + w - 20*time.Millisecond; ttl < min {
				t.Fatalf("%s: PTTL %v, want >= %v (horizon + window)", k, ttl, min)
			}
		}
	})
}

// 12. Redis Cluster: all keys of one provider hash to one slot; providers spread over slots.
func TestClusterHashTags(t *testing.T) {
	ctx := context.Background()
	cluster := backends(t)[1].rdb
	names := []string{"acme", "globex", "initech", "umbrella", "hooli", "stark"}
	ps := map[string]gate.Provider{}
	for _, n := range names {
		ps[n] = gate.Provider{Policies: []gate.Policy{pol(5, time.Second)}}
	}
	l, err := gate.New(cluster, gate.Options{Prefix: uniquePrefix(t), Providers: ps})
	if err != nil {
		t.Fatal(err)
	}
	slots := map[int64]bool{}
	for _, n := range names {
		if _, err := l.Allow(ctx, n, "job", 1); err != nil {
			t.Fatalf("%s: %v", n, err) // CROSSSLOT would surface here
		}
		keys, _ := l.Keys(n)
		var slot int64 = -1
		for _, k := range keys {
			s, err := cluster.ClusterKeySlot(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if slot >= 0 && s != slot {
				t.Fatalf("%s: keys in slots %d and %d", n, slot, s)
			}
			slot = s
		}
		slots[slot] = true
	}
	if len(slots) < 3 {
		t.Fatalf("%d providers share %d slots, want them spread", len(names), len(slots))
	}
}

// 13. A Redis failure is an error, never an allow; a flushed script cache is reloaded transparently.
func TestRedisFailures(t *testing.T) {
	ctx := context.Background()
	t.Run("unreachable", func(t *testing.T) {
		dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
		defer dead.Close()
		l := newLimiter(t, dead, 0, pol(10, time.Second))
		v, err := l.Reserve(ctx, prov, "a", 1, 0)
		if err == nil || v.Allowed || errors.Is(err, gate.ErrInvalid) {
			t.Fatalf("verdict %+v err %v, want a Redis error and no allow", v, err)
		}
		if _, err := l.Status(ctx, prov); err == nil {
			t.Fatal("status: want an error")
		}
		if err := l.Pause(ctx, prov, time.Now().Add(time.Second)); err == nil {
			t.Fatal("pause: want an error")
		}
	})
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		l := newLimiter(t, rdb, 0, pol(10, time.Second))
		mustReserve(t, l, "a", 1, 0)
		flush := func(ctx context.Context, c *redis.Client) error {
			if err := c.FunctionFlush(ctx).Err(); err != nil && !strings.Contains(err.Error(), "unknown command") { // miniredis has none
				return err
			}
			return c.ScriptFlush(ctx).Err()
		}
		var err error
		if cc, ok := rdb.(*redis.ClusterClient); ok {
			err = cc.ForEachMaster(ctx, flush)
		} else {
			err = flush(ctx, rdb.(*redis.Client))
		}
		if err != nil {
			t.Fatal(err)
		}
		if v := mustReserve(t, l, "b", 1, 0); !v.Allowed || v.Remaining != 8 {
			t.Fatalf("after FUNCTION FLUSH and SCRIPT FLUSH: %+v", v)
		}
	})
}

func TestInputValidation(t *testing.T) {
	rdb := backends(t)[0].rdb
	l := newLimiter(t, rdb, 0, pol(3, time.Second), pol(10, time.Minute))
	ctx := context.Background()
	tests := []struct {
		name     string
		provider string
		id       string
		cost     int64
		maxWait  time.Duration
		want     string
	}{
		{"unknown provider", "nope", "a", 1, 0, `gate: unknown provider "nope"`},
		{"empty id", prov, "", 1, 0, "gate: job id must be 1..600 bytes, got 0"},
		{"long id", prov, strings.Repeat("x", 601), 1, 0, "gate: job id must be 1..600 bytes, got 601"},
		{"NUL in id", prov, "a\x00b", 1, 0, "gate: job id must not contain NUL"},
		{"zero cost", prov, "a", 0, 0, "gate: cost must be 1..3 for provider acme, got 0"},
		{"cost above smallest limit", prov, "a", 4, 0, "gate: cost must be 1..3 for provider acme, got 4"},
		{"negative wait", prov, "a", 1, -time.Second, "gate: max wait must be >= 0, got -1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := l.Reserve(ctx, tt.provider, tt.id, tt.cost, tt.maxWait)
			if err == nil || err.Error() != tt.want || !errors.Is(err, gate.ErrInvalid) {
				t.Fatalf("err %v, want %q matching ErrInvalid", err, tt.want)
			}
		})
	}
	if _, err := l.Allow(ctx, "nope", "a", 1); !errors.Is(err, gate.ErrUnknownProvider) {
		t.Fatalf("want ErrUnknownProvider, got %v", err)
	}
	for _, name := range []string{"a{b", "a:b", "a b", "*", "Acme", "", "a}"} {
		_, err := gate.New(rdb, gate.Options{Prefix: "p", Providers: map[string]gate.Provider{name: {Policies: []gate.Policy{pol(1, time.Second)}}}})
		if err == nil {
			t.Errorf("provider name %q accepted; it would reach a Redis key", name)
		}
	}
}

func TestStatus(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l := newLimiter(t, rdb, 0, pol(2, 300*time.Millisecond), pol(10, time.Minute))
		mustReserve(t, l, "a", 1, 0)
		mustReserve(t, l, "b", 1, 0)
		mustReserve(t, l, "c", 1, time.Second) // reserved one window later
		st, err := l.Status(ctx, prov)
		if err != nil {
			t.Fatal(err)
		}
		p0, p1 := st.Policies[0], st.Policies[1]
		if st.Units != 3 || p0.Used != 2 || p0.Reserved != 1 || p0.Remaining != 0 {
			t.Fatalf("policy 0: %+v (units %d)", p0, st.Units)
		}
		if p1.Used != 2 || p1.Reserved != 1 || p1.Remaining != 7 {
			t.Fatalf("policy 1: %+v", p1)
		}
		// Everything leaves policy 0's window one window after the reservation at ~+300ms.
		if p0.ResetAfter < 500*time.Millisecond || p0.ResetAfter > 600*time.Millisecond {
			t.Fatalf("policy 0 reset after %v, want ~600ms", p0.ResetAfter)
		}
		if !st.PausedUntil.IsZero() {
			t.Fatalf("paused until %v without a pause", st.PausedUntil)
		}
	})
}

func TestPolicyString(t *testing.T) {
	for _, tt := range []struct {
		p    gate.Policy
		want string
	}{
		{pol(100, time.Second), "100/1s"},
		{pol(3000, time.Minute), "3000/1m"},
		{pol(100000, 24*time.Hour), "100000/24h"},
		{pol(5, 1500*time.Millisecond), "5/1.5s"},
		{pol(7, 90*time.Minute), "7/1h30m"},
	} {
		if got := tt.p.String(); got != tt.want {
			t.Errorf("%v: got %q, want %q", tt.p, got, tt.want)
		}
	}
}

// seedReservation writes a reservation straight into the raw log, at an exact microsecond: the tests below
// need entries one microsecond apart, which Redis TIME cannot be made to produce.
func seedReservation(t *testing.T, rdb redis.UniversalClient, l *gate.Limiter, id string, slot int64) {
	t.Helper()
	keys, _ := l.Keys(prov)
	if err := rdb.ZAdd(context.Background(), keys[0], redis.Z{Score: float64(slot), Member: id}).Err(); err != nil {
		t.Fatal(err)
	}
}

// The window is (t-W, t] to the microsecond: an entry at t-W is out, one at t-W+1µs is in.
func TestWindowBoundaryExact(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		const w = time.Second
		l := newLimiter(t, rdb, 0, pol(2, w))
		f := redisTime(t, rdb) + 500_000 // half a second ahead: reservations of other workers
		seedReservation(t, rdb, l, "x", f)
		seedReservation(t, rdb, l, "y", f+1)
		z := mustReserve(t, l, "z", 1, 3*time.Second)
		if got := z.Slot().UnixMicro(); got != f+w.Microseconds() {
			t.Fatalf("z at %d, want f+W = %d (x leaves exactly then)", got, f+w.Microseconds())
		}
		v := mustReserve(t, l, "v", 1, 3*time.Second)
		if got := v.Slot().UnixMicro(); got != f+1+w.Microseconds() {
			t.Fatalf("v at %d, want f+1µs+W = %d (y is still in the window at f+W)", got, f+1+w.Microseconds())
		}
		if got := maxInWindow(readLog(t, rdb, l), w); got != 2 {
			t.Fatalf("max in window %d, want 2", got)
		}
	})
}

// First come, first served: a job asked for later never gets a slot before one already handed out, even
// when the window before that slot has room.
func TestFirstComeFirstServed(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		l := newLimiter(t, rdb, 0, pol(10, time.Second))
		f := redisTime(t, rdb) + 300_000
		seedReservation(t, rdb, l, "early", f)
		v := mustReserve(t, l, "later", 1, time.Second)
		if !v.Allowed || v.Slot().UnixMicro() != f {
			t.Fatalf("later job at %d, want the queue's tail %d", v.Slot().UnixMicro(), f)
		}
		if v := mustReserve(t, l, "now", 1, 0); v.Allowed || v.RetryAfter != ceilMs(f-v.Now.UnixMicro()) {
			t.Fatalf("allow with reservations queued: %+v, want denied until the tail", v)
		}
	})
}

// Found in review: durations beyond int64 microseconds must not wrap around.
func TestHugeDurations(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l := newLimiter(t, rdb, 0, pol(1, time.Second))
		v := mustReserve(t, l, "a", 1, time.Duration(math.MaxInt64))
		if !v.Allowed {
			t.Fatalf("max wait MaxInt64: %+v", v)
		}
		if v := mustReserve(t, l, "b", 1, time.Duration(math.MaxInt64)); !v.Allowed || v.Delay < 900*time.Millisecond {
			t.Fatalf("second job, max wait MaxInt64: %+v, want a reservation about a window ahead", v)
		}
		if err := l.Pause(ctx, prov, time.Now().AddDate(300, 0, 0)); err != nil {
			t.Fatal(err)
		}
		v = mustReserve(t, l, "c", 1, 0)
		if v.Allowed || !v.Paused || v.RetryAfter < 9*365*24*time.Hour {
			t.Fatalf("after a 300-year pause: %+v, want paused for about MaxHorizon", v)
		}
	})
}

// Found in review: a redelivered job waits out a pause like any other, and respects its max wait.
func TestDuplicateRespectsPauseAndMaxWait(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l := newLimiter(t, rdb, 0, pol(1, 500*time.Millisecond))
		mustReserve(t, l, "a", 1, 0)
		r := mustReserve(t, l, "b", 1, time.Second) // reserved ~500ms ahead
		if v := mustReserve(t, l, "b", 1, 0); v.Allowed || !v.Duplicate || v.RetryAfter != ceilMs(r.Slot().UnixMicro()-v.Now.UnixMicro()) {
			t.Fatalf("duplicate of a reservation beyond max wait 0: %+v, want denied until its slot", v)
		}
		if err := l.Pause(ctx, prov, time.Now().Add(2*time.Second)); err != nil {
			t.Fatal(err)
		}
		keys, _ := l.Keys(prov)
		until, _ := rdb.Get(ctx, keys[1]).Int64()
		v := mustReserve(t, l, "a", 1, 5*time.Second)
		if !v.Allowed || !v.Duplicate || !v.Paused || v.Slot().UnixMicro() != until {
			t.Fatalf("duplicate during a pause: %+v, want allowed at the pause's end %d", v, until)
		}
		if v := mustReserve(t, l, "a", 1, 0); v.Allowed || !v.Duplicate || !v.Paused {
			t.Fatalf("duplicate during a pause, max wait 0: %+v, want denied", v)
		}
		if n := len(readLog(t, rdb, l)); n != 2 {
			t.Fatalf("duplicates recorded: %d entries", n)
		}
	})
}

// Release gives a job's units back: the next decision sees the room, and a release of an unknown job is a
// no-op.
func TestRelease(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l := newLimiter(t, rdb, 0, pol(3, time.Hour))
		mustReserve(t, l, "a", 2, 0)
		mustReserve(t, l, "b", 1, 0)
		if v := mustReserve(t, l, "c", 1, 0); v.Allowed {
			t.Fatalf("full window admitted c: %+v", v)
		}
		if _, err := l.Release(ctx, prov, "a", 2, time.Time{}); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Release(ctx, prov, "never-admitted", 1, time.Time{}); err != nil {
			t.Fatal(err)
		}
		log := readLog(t, rdb, l)
		if len(log) != 1 || log[0].id != "b" {
			t.Fatalf("log after release %v", log)
		}
		if v := mustReserve(t, l, "c", 2, 0); !v.Allowed || v.Remaining != 0 {
			t.Fatalf("after release: %+v", v)
		}

		// Found in review: a worker releasing the slot it held must not remove the entry a redelivery
		// has since been moved to; releasing at the slot it holds does.
		l2, err := gate.New(rdb, gate.Options{Prefix: uniquePrefix(t), StaleAfter: 20 * time.Millisecond,
			Providers: map[string]gate.Provider{prov: {Policies: []gate.Policy{pol(5, time.Hour)}}}})
		if err != nil {
			t.Fatal(err)
		}
		held := mustReserve(t, l2, "d", 1, 0)
		time.Sleep(50 * time.Millisecond)
		moved := mustReserve(t, l2, "d", 1, 0)
		if !moved.Moved {
			t.Fatalf("redelivery: %+v, want moved", moved)
		}
		if _, err := l2.Release(ctx, prov, "d", 1, held.Slot()); err != nil {
			t.Fatal(err)
		}
		if log := readLog(t, rdb, l2); len(log) != 1 || log[0].slot != moved.Slot().UnixMicro() {
			t.Fatalf("log %+v: the old holder's release removed the moved entry", log)
		}
		if _, err := l2.Release(ctx, prov, "d", 1, moved.Slot()); err != nil {
			t.Fatal(err)
		}
		if log := readLog(t, rdb, l2); len(log) != 0 {
			t.Fatalf("log %+v after releasing the slot held, want empty", log)
		}
	})
}

// The demo's embedded Redis must give the real gate's answers: one seeded sequence of reservations,
// duplicates, releases and pauses, each made on real Redis and on the embedded one in turn, must get the
// same verdicts (delays within the few milliseconds between the two calls).
func TestEmbeddedAgreesWithRedis(t *testing.T) {
	real := backends(t)[0].rdb
	emb := embedded(t).rdb
	policies := []gate.Policy{{Limit: 4, Window: 10 * time.Second}, {Limit: 7, Window: time.Minute}}
	lr, le := newLimiter(t, real, 5*time.Millisecond, policies...), newLimiter(t, emb, 5*time.Millisecond, policies...)
	rng := rand.New(rand.NewPCG(7, 11))
	ctx := context.Background()
	const slack = 50 * time.Millisecond
	near := func(a, b time.Duration) bool { return a-b < slack && b-a < slack }
	for i := range 300 {
		id := fmt.Sprint("job-", rng.IntN(40))
		cost := int64(1 + rng.IntN(2))
		switch op := rng.IntN(10); {
		case op == 0:
			if _, err := lr.Release(ctx, prov, id, cost, time.Time{}); err != nil {
				t.Fatal(err)
			}
			if _, err := le.Release(ctx, prov, id, cost, time.Time{}); err != nil {
				t.Fatal(err)
			}
		case op == 1 && i%50 == 1:
			until := time.Now().Add(time.Duration(rng.IntN(3000)) * time.Millisecond)
			if err := lr.Pause(ctx, prov, until); err != nil {
				t.Fatal(err)
			}
			if err := le.Pause(ctx, prov, until); err != nil {
				t.Fatal(err)
			}
		default:
			// Slots fall ~0, ~3s (pauses), ~10s, ~60s or ~70s out: no max wait is within a second of one.
			wait := []time.Duration{0, 5 * time.Second, 30 * time.Second, 65 * time.Second}[rng.IntN(4)]
			vr, err := lr.Reserve(ctx, prov, id, cost, wait)
			if err != nil {
				t.Fatal(err)
			}
			ve, err := le.Reserve(ctx, prov, id, cost, wait)
			if err != nil {
				t.Fatal(err)
			}
			if vr.Allowed != ve.Allowed || vr.Duplicate != ve.Duplicate || vr.Paused != ve.Paused ||
				vr.Remaining != ve.Remaining || vr.Policy != ve.Policy || !near(vr.Delay, ve.Delay) || !near(vr.RetryAfter, ve.RetryAfter) {
				t.Fatalf("call %d (%s cost %d wait %s): real Redis %+v, embedded %+v", i, id, cost, wait, vr, ve)
			}
		}
	}
	sr, err := lr.Status(ctx, prov)
	if err != nil {
		t.Fatal(err)
	}
	se, err := le.Status(ctx, prov)
	if err != nil {
		t.Fatal(err)
	}
	for i := range sr.Policies {
		if a, b := sr.Policies[i], se.Policies[i]; a.Used+a.Reserved != b.Used+b.Reserved || a.Remaining != b.Remaining {
			t.Fatalf("status of policy %d: real Redis %+v, embedded %+v", i, a, b)
		}
	}
}

// A duplicate whose slot passed more than StaleAfter ago is moved: its entry leaves the log and it is
// admitted afresh, first come first served, in one step; it spends no second unit. When the fresh
// admission is denied, the entry stays where it was.
func TestStaleDuplicateIsMoved(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		l, err := gate.New(rdb, gate.Options{Prefix: uniquePrefix(t), StaleAfter: 50 * time.Millisecond,
			Providers: map[string]gate.Provider{prov: {Policies: []gate.Policy{pol(2, 10*time.Second)}}}})
		if err != nil {
			t.Fatal(err)
		}
		a := mustReserve(t, l, "a", 2, 0) // cost 2: both units move
		if dup := mustReserve(t, l, "a", 2, 0); !dup.Duplicate || dup.Moved {
			t.Fatalf("fresh duplicate: %+v, want a plain duplicate", dup)
		}
		time.Sleep(100 * time.Millisecond)
		v := mustReserve(t, l, "a", 2, 0)
		if !v.Allowed || v.Duplicate || !v.Moved || !v.AdmittedAt.Equal(a.Slot()) || v.Remaining != 0 {
			t.Fatalf("stale duplicate: %+v, want moved from %v, allowed now, window full", v, a.Slot())
		}
		log := readLog(t, rdb, l)
		if len(log) != 1 || log[0].cost != 2 || log[0].slot != v.Slot().UnixMicro() {
			t.Fatalf("log %+v, want a's 2 units at the new slot %d", log, v.Slot().UnixMicro())
		}

		// Denied afresh: the entry stays at its old slot.
		l2, err := gate.New(rdb, gate.Options{Prefix: uniquePrefix(t), StaleAfter: 50 * time.Millisecond,
			Providers: map[string]gate.Provider{prov: {Policies: []gate.Policy{pol(1, 10*time.Second)}}}})
		if err != nil {
			t.Fatal(err)
		}
		x := mustReserve(t, l2, "x", 1, 0)
		mustReserve(t, l2, "y", 1, time.Minute) // reserved one window later
		time.Sleep(100 * time.Millisecond)
		d := mustReserve(t, l2, "x", 1, time.Second)
		if d.Allowed || d.Moved || d.RetryAfter <= 0 || !d.AdmittedAt.Equal(x.Slot()) {
			t.Fatalf("stale duplicate with no room: %+v, want denied, not moved", d)
		}
		for _, e := range readLog(t, rdb, l2) {
			if e.id == "x" && e.slot != x.Slot().UnixMicro() {
				t.Fatalf("x left at %d, want its old slot %d", e.slot, x.Slot().UnixMicro())
			}
		}
		if n := len(readLog(t, rdb, l2)); n != 2 {
			t.Fatalf("log holds %d jobs, want x and y", n)
		}

		// Marked sent (accepted, not settled): a stale redelivery is a plain duplicate, not moved.
		l3, err := gate.New(rdb, gate.Options{Prefix: uniquePrefix(t), StaleAfter: 50 * time.Millisecond,
			Providers: map[string]gate.Provider{prov: {Policies: []gate.Policy{pol(5, 10*time.Second)}}}})
		if err != nil {
			t.Fatal(err)
		}
		sent := mustReserve(t, l3, "s", 1, 0)
		if err := l3.Sent(context.Background(), prov, "s"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		if v := mustReserve(t, l3, "s", 1, 0); !v.Duplicate || v.Moved || !v.AdmittedAt.Equal(sent.Slot()) {
			t.Fatalf("stale redelivery of a job marked sent: %+v, want a plain duplicate", v)
		}

		// Found in review: a redelivery that would go at the end of a pause, long after its own slot, is
		// stale too, however soon after that slot it asks.
		p := mustReserve(t, l3, "p", 1, 0)
		if err := l3.Pause(context.Background(), prov, time.Now().Add(2*time.Second)); err != nil {
			t.Fatal(err)
		}
		if v := mustReserve(t, l3, "p", 1, 5*time.Second); !v.Moved || !v.Paused || v.Delay < time.Second || !v.AdmittedAt.Equal(p.Slot()) {
			t.Fatalf("redelivery into a pause: %+v, want moved to the pause's end", v)
		}
	})
}

// watchLog records what Watch tells a worker.
type watchLog struct{ notes chan string }

func (w watchLog) note(format string, args ...any) {
	select {
	case w.notes <- fmt.Sprintf(format, args...):
	default: // the test reads what it needs
	}
}
func (w watchLog) NotePause(p string, until time.Time) { w.note("pause %s %d", p, until.UnixMicro()) }
func (w watchLog) NoteLoss(p string, at time.Time)     { w.note("loss %s %d", p, at.UnixMicro()) }
func (w watchLog) NoteDisconnect(time.Time)            { w.note("disconnect") }
func (w watchLog) NoteLimits(p string, at time.Time)   { w.note("limits %s %d", p, at.UnixMicro()) }

// next returns the first note that starts with prefix, repeating poke every 100ms until one comes (a
// subscription is asynchronous).
func (w watchLog) next(t *testing.T, prefix string, poke func()) string {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		poke()
		tick := time.After(100 * time.Millisecond)
		for wait := true; wait; {
			select {
			case n := <-w.notes:
				if strings.HasPrefix(n, prefix) {
					return n
				}
			case <-tick:
				wait = false
			case <-deadline:
				t.Fatalf("no %q notice within 5s", prefix)
			}
		}
	}
}

// Watch tells a worker of a pause set by another as it is set, so that reservations it made before are
// held too; of a warm-up a decision began on a lost state, with the decision's moment, so that
// reservations decided before it are dropped; and of its own connection to Redis broken (the restart
// that loses the state breaks it). Announcements for providers this gate does not know are ignored.
func TestWatch(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		prefix := uniquePrefix(t)
		mk := func(warm bool, names ...string) *gate.Limiter {
			ps := map[string]gate.Provider{}
			for _, n := range names {
				ps[n] = gate.Provider{Policies: []gate.Policy{pol(10, time.Second)}}
			}
			l, err := gate.New(rdb, gate.Options{Prefix: prefix, Providers: ps, WarmUp: warm})
			if err != nil {
				t.Fatal(err)
			}
			return l
		}
		watcher, other := mk(false, prov), mk(true, prov, "globex")
		w := watchLog{notes: make(chan string, 64)}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- watcher.Watch(ctx, rdb, w) }()

		n := w.next(t, "pause", func() {
			if err := other.Pause(context.Background(), "globex", time.Now().Add(time.Minute)); err != nil {
				t.Fatal(err)
			}
			if err := other.Pause(context.Background(), prov, time.Now().Add(3*time.Second)); err != nil {
				t.Fatal(err)
			}
		})
		keys, _ := other.Keys(prov)
		until, err := rdb.Get(context.Background(), keys[1]).Int64()
		if err != nil {
			t.Fatal(err)
		}
		if n != fmt.Sprintf("pause %s %d", prov, until) {
			t.Fatalf("notice %q, want %s until the pause in force (%d µs, Redis clock); globex is not this gate's", n, prov, until)
		}

		// The first decision on a state without its epoch (here: never had one) begins the warm-up and
		// announces when.
		var first gate.Verdict
		n = w.next(t, "loss", func() {
			if err := rdb.Del(context.Background(), keys[len(keys)-1]).Err(); err != nil {
				t.Fatal(err)
			}
			first = mustReserve(t, other, "w", 1, 0)
		})
		if want := fmt.Sprintf("loss %s %d", prov, first.Now.UnixMicro()); n != want || first.Allowed {
			t.Fatalf("notice %q after the decision %+v, want %q", n, first, want)
		}

		if c, ok := rdb.(*redis.Client); ok && c.Options().Addr == testenv.RedisAddr() { // its pub/sub client is the watcher's
			w.next(t, "disconnect", func() {
				if err := c.Do(context.Background(), "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
					t.Fatal(err)
				}
			})
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Watch after cancel: %v", err)
		}
	})
}

// Warm-up: a provider whose state is missing (first decision, or the log lost in a Redis restart) is
// held for its shortest window + margin + horizon; once the state exists, decisions are plain; losing it
// again warms up again. Off, nothing is held.
func TestWarmUpAfterLoss(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		for _, algo := range gate.Algorithms {
			t.Run(string(algo), func(t *testing.T) { warmUpAfterLoss(t, rdb, algo) })
		}
	})
}

func warmUpAfterLoss(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
	ctx := context.Background()
	// fixed_window keeps slots out of a window's last margin, which could move a slot past the warm-up's
	// end: with no margin, the warm-up alone sets the slots.
	margin := 10 * time.Millisecond
	if algo == gate.FixedWindow {
		margin = 0
	}
	mk := func(warm bool, policies ...gate.Policy) *gate.Limiter {
		l, err := gate.New(rdb, gate.Options{Prefix: uniquePrefix(t), Margin: margin, WarmUp: warm, WarmUpCap: 2 * time.Second,
			Horizon: 500 * time.Millisecond, Providers: map[string]gate.Provider{prov: {Algorithm: algo, Policies: policies}}})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	hold := time.Second + margin + 500*time.Millisecond // shortest window + margin + horizon
	l := mk(true, pol(10, 3*time.Second), pol(5, time.Second))
	v := mustReserve(t, l, "a", 1, 0)
	if v.Allowed || !v.Paused || v.RetryAfter < hold-5*time.Millisecond || v.RetryAfter > hold+time.Millisecond {
		t.Fatalf("first decision: %+v, want paused for %v", v, hold)
	}
	r := mustReserve(t, l, "b", 1, 2*time.Second)
	switch {
	case algo == gate.LeakyBucket && !r.Allowed && r.Paused && r.RetryAfter > 0:
		// A leaky queue only reaches a window ahead: a slot 1.5s out does not fit a 5/1s queue yet.
	case !r.Allowed || !r.Paused || !r.Slot().Equal(v.Now.Add(hold)):
		t.Fatalf("reservation in the warm-up: %+v, want its slot at the end of it", r)
	}
	keys, _ := l.Keys(prov)
	epoch := keys[len(keys)-1]
	if !strings.HasSuffix(epoch, ":epoch") {
		t.Fatalf("keys %v: the epoch is not last", keys)
	}
	// Everything but the epoch is gone: the state did not start afresh, so no warm-up.
	for _, k := range keys[:len(keys)-1] {
		if err := rdb.Del(ctx, k).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if v := mustReserve(t, l, "c", 1, 0); !v.Allowed {
		t.Fatalf("the epoch still stands, so no warm-up: %+v", v)
	}
	// The Redis restart: everything this provider had is gone.
	for _, k := range keys {
		if err := rdb.Del(ctx, k).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if v := mustReserve(t, l, "d", 1, 0); v.Allowed || !v.Paused || v.RetryAfter < hold-5*time.Millisecond {
		t.Fatalf("after the state was lost: %+v, want a warm-up", v)
	}
	if v := mustReserve(t, mk(false, pol(10, 3*time.Second), pol(5, time.Second)), "e", 1, 0); !v.Allowed || v.Paused {
		t.Fatalf("warm-up off: %+v, want admitted now", v)
	}
	// A daily cap only: the warm-up is bounded by WarmUpCap, not a day.
	capped := 2*time.Second + margin + 500*time.Millisecond
	if v := mustReserve(t, mk(true, pol(10000, 24*time.Hour)), "f", 1, 0); v.Allowed || !v.Paused || v.RetryAfter < capped-5*time.Millisecond || v.RetryAfter > capped+time.Millisecond {
		t.Fatalf("warm-up of a daily cap: %+v, want %v (the cap + margin + horizon)", v, capped)
	}
}

// Found in review: a change of algorithm (or of the windows a bucket's state is named by) starts the
// state afresh under new names while the provider still counts what it was sent: it warms up like a
// loss. A sliding log keeps its log whatever its limits, so new limits do not.
func TestWarmUpAfterStateChange(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		prefix := uniquePrefix(t)
		mk := func(algo gate.Algorithm, policies ...gate.Policy) *gate.Limiter {
			l, err := gate.New(rdb, gate.Options{Prefix: prefix, WarmUp: true, Horizon: 100 * time.Millisecond,
				Providers: map[string]gate.Provider{prov: {Algorithm: algo, Policies: policies}}})
			if err != nil {
				t.Fatal(err)
			}
			return l
		}
		steps := []struct {
			name string
			l    *gate.Limiter
			warm bool
		}{
			{"first use", mk(gate.SlidingLog, pol(5, time.Second)), true},
			{"same again", mk(gate.SlidingLog, pol(5, time.Second)), false},
			{"sliding log, new limits", mk(gate.SlidingLog, pol(7, 2*time.Second)), false},
			{"now a token bucket", mk(gate.TokenBucket, pol(5, time.Second)), true},
			{"token bucket, new window", mk(gate.TokenBucket, pol(5, 2*time.Second)), true},
		}
		for i, st := range steps {
			if _, err := rdb.Del(context.Background(), prefix+":{"+prov+"}:pause").Result(); err != nil {
				t.Fatal(err)
			}
			v := mustReserve(t, st.l, fmt.Sprint("j", i), 1, 0)
			if warm := !v.Allowed && v.Paused; warm != st.warm {
				t.Fatalf("%s: %+v, want a warm-up: %v", st.name, v, st.warm)
			}
		}
	})
}
