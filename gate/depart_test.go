package gate_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
)

// A request that left late (a worker stalled between its wake-up and the write) is recorded where it
// went: the log's entry moves to slot + late, and the request one window on is spaced from there. Without
// the move, b would go at a's slot + window + margin, within a window of when a reached the provider.
func TestDepartedMovesTheEntry(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		const window, margin, late = time.Second, 10 * time.Millisecond, 40 * time.Millisecond
		l := newLimiter(t, rdb, margin, pol(1, window))
		a := mustReserve(t, l, "a", 1, 0)
		if !a.Allowed {
			t.Fatalf("a: %+v", a)
		}
		time.Sleep(late + 10*time.Millisecond) // sent late: the request leaves after now
		for _, c := range []struct {
			name string
			id   string
			slot time.Time
			late time.Duration
		}{
			{"another slot", "a", a.Slot().Add(time.Microsecond), late},
			{"not in the log", "z", a.Slot(), late},
			{"on time", "a", a.Slot(), 0},
		} {
			if at, err := l.Departed(ctx, prov, "", c.id, c.slot, c.late); err != nil || !at.IsZero() {
				t.Fatalf("%s: departed %v, %v; want nothing moved", c.name, at, err)
			}
		}
		at, err := l.Departed(ctx, prov, "", "a", a.Slot(), late)
		if err != nil || !at.Equal(a.Slot().Add(late)) {
			t.Fatalf("departed: %v, %v; want a's slot + %s (%v)", at, err, late, a.Slot().Add(late))
		}
		if log := readLog(t, rdb, l); len(log) != 1 || log[0].slot != at.UnixMicro() {
			t.Fatalf("log after the departure: %+v, want a at %d", log, at.UnixMicro())
		}
		keys, _ := l.Keys(prov)
		if ttl := rdb.PTTL(ctx, keys[0]).Val(); ttl < time.Until(at.Add(window+margin))-100*time.Millisecond {
			t.Fatalf("log kept %v, want at least until the new slot + window + margin", ttl)
		}
		b := mustReserve(t, l, "b", 1, 5*time.Second)
		if want := at.Add(window + margin); !b.Allowed || !b.Slot().Equal(want) {
			t.Fatalf("b: %+v at %v, want admitted at the departure + window + margin, %v", b, b.Slot(), want)
		}
		// Release follows the entry: the old slot no longer names it, the new one does.
		if n, err := l.Release(ctx, prov, "a", 1, a.Slot()); err != nil || n != 0 {
			t.Fatalf("release at the old slot: %d, %v; want 0", n, err)
		}
		if n, err := l.Release(ctx, prov, "a", 1, at); err != nil || n != 1 {
			t.Fatalf("release at the new slot: %d, %v; want 1", n, err)
		}
	})
}

// A departure is never recorded in the future: an estimate past the Redis clock's now is cut to now. Every
// unit of a job moves, in the merchant's log too.
func TestDepartedCostAndMerchant(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l := newAlgoOpts(t, rdb, gate.Options{}, merchantProvider(gate.SlidingLog))
		v, err := l.ReserveFor(ctx, prov, "big", "a", 3, 0)
		if err != nil || !v.Allowed {
			t.Fatalf("a: %+v, %v", v, err)
		}
		keys, _ := l.Keys(prov)
		mlog := strings.TrimSuffix(keys[0], ":log") + ":m:big:log"
		if s, err := rdb.ZScore(ctx, mlog, "a").Result(); err != nil || int64(s) != v.Slot().UnixMicro() {
			t.Fatalf("a in the merchant's log %s: %v, %v", mlog, s, err)
		}
		before := redisTime(t, rdb)
		at, err := l.Departed(ctx, prov, "big", "a", v.Slot(), time.Hour)
		after := redisTime(t, rdb)
		if err != nil || at.UnixMicro() < before || at.UnixMicro() > after {
			t.Fatalf("departed an hour late: %v, %v; want the Redis clock's now, in [%d, %d]", at, err, before, after)
		}
		for _, log := range []string{keys[0], mlog} {
			got, err := rdb.ZRangeWithScores(ctx, log, 0, -1).Result()
			if err != nil || len(got) != 3 {
				t.Fatalf("%s: %v, %v; want a's 3 units", log, got, err)
			}
			for _, z := range got {
				if int64(z.Score) != at.UnixMicro() {
					t.Fatalf("%s: %v at %d, want every unit at %d", log, z.Member, int64(z.Score), at.UnixMicro())
				}
			}
		}
	})
}

// The other algorithms keep no time per unit: a departure changes nothing there (on real Redis: the
// snapshot DUMPs every key).
func TestDepartedKeepsCounters(t *testing.T) {
	for _, b := range backends(t) {
		for _, algo := range gate.Algorithms {
			if algo != gate.SlidingLog {
				t.Run(b.name+"/"+string(algo), func(t *testing.T) {
					t.Parallel()
					departKeepsCounters(t, b.rdb, algo)
				})
			}
		}
	}
}

func departKeepsCounters(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
	ctx := context.Background()
	l := newAlgo(t, rdb, algo, 0, pol(5, time.Hour))
	awayFromEdges(t, rdb, algo, time.Minute, time.Hour)
	v := mustReserve(t, l, "a", 2, 0)
	if !v.Allowed {
		t.Fatalf("a: %+v", v)
	}
	keys, _ := l.Keys(prov)
	was := snapshot(t, rdb, keys)
	began := time.Now()
	at, err := l.Departed(ctx, prov, "", "a", v.Slot(), time.Second)
	if err != nil || !at.IsZero() {
		t.Fatalf("departed: %v, %v; want nothing moved", at, err)
	}
	if now := snapshot(t, rdb, keys); !was.same(now, time.Since(began)) {
		t.Fatalf("state changed:\nbefore %v\nafter  %v", was, now)
	}
}

// A holder that woke too late to use its slot goes now instead where the move keeps every window within
// its limit: the log then counts it at now, and the slot one window on is spaced from there.
func TestPostponeWhereItFits(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		const window, margin = time.Second, 10 * time.Millisecond
		l := newLimiter(t, rdb, margin, pol(2, window))
		a := mustReserve(t, l, "a", 1, 0)
		time.Sleep(30 * time.Millisecond) // woke late
		before := redisTime(t, rdb)
		at, err := l.Postpone(ctx, prov, "", "a", a.Slot())
		after := redisTime(t, rdb)
		if err != nil || at.UnixMicro() < before || at.UnixMicro() > after {
			t.Fatalf("postpone a: %v, %v; want the Redis clock's now, in [%d, %d]", at, err, before, after)
		}
		if b := mustReserve(t, l, "b", 1, 0); !b.Allowed {
			t.Fatalf("b: %+v, want the window's second unit", b)
		}
		c := mustReserve(t, l, "c", 1, 5*time.Second)
		if want := at.Add(window + margin); !c.Allowed || !c.Slot().Equal(want) {
			t.Fatalf("c: %+v at %v, want a's new slot + window + margin, %v", c, c.Slot(), want)
		}
		if at, err := l.Postpone(ctx, prov, "", "c", c.Slot()); err != nil || !at.IsZero() {
			t.Fatalf("postpone c before its slot: %v, %v; want nothing moved", at, err)
		}
	})
}

// Where slots after the late one already fill a window the move would reach, nothing moves: a at now
// would share c's window with b and c, one unit over the limit (for a of cost 2, room for one unit would
// have let it go: the count is of the job's units).
func TestPostponeRefusedWithoutRoom(t *testing.T) {
	for _, c := range []struct {
		name        string
		cost, limit int64
	}{{"cost 1", 1, 2}, {"cost 2", 2, 3}} {
		t.Run(c.name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
				ctx := context.Background()
				const window, margin = time.Second, 10 * time.Millisecond
				l := newLimiter(t, rdb, margin, pol(c.limit, window))
				a := mustReserve(t, l, "a", c.cost, 0)
				time.Sleep(2 * time.Millisecond)
				if b := mustReserve(t, l, "b", 1, 0); !b.Allowed || !b.Slot().After(a.Slot()) {
					t.Fatalf("b: %+v, want admitted after a", b)
				}
				if v := mustReserve(t, l, "c", 1, 5*time.Second); !v.Allowed || !v.Slot().Equal(a.Slot().Add(window+margin)) {
					t.Fatalf("c: %+v, want a's slot + window + margin", v)
				}
				time.Sleep(30 * time.Millisecond)
				if at, err := l.Postpone(ctx, prov, "", "a", a.Slot()); err != nil || !at.IsZero() {
					t.Fatalf("postpone a: %v, %v; want refused", at, err)
				}
				if log := readLog(t, rdb, l); len(log) != 3 || log[0].id != "a" || log[0].slot != a.Slot().UnixMicro() {
					t.Fatalf("log after the refusal: %+v, want a still at its slot", log)
				}
			})
		})
	}
}

// A pause binds a late holder too: it does not go now.
func TestPostponeRefusedWhilePaused(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l := newLimiter(t, rdb, 10*time.Millisecond, pol(2, time.Second))
		a := mustReserve(t, l, "a", 1, 0)
		if err := l.Pause(ctx, prov, time.Now().Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Millisecond)
		if at, err := l.Postpone(ctx, prov, "", "a", a.Slot()); err != nil || !at.IsZero() {
			t.Fatalf("postpone a while paused: %v, %v; want refused", at, err)
		}
	})
}

// A job admitted before its merchant had limits of its own is not in the merchant's log, which those
// limits count: it is not postponed under them (re-reserved, it is counted there). Without them it is.
func TestPostponeMerchantLimits(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		prefix := uniquePrefix(t)
		limiter := func(p gate.Provider) *gate.Limiter {
			l, err := gate.New(rdb, gate.Options{Prefix: prefix, Margin: 10 * time.Millisecond, Providers: map[string]gate.Provider{prov: p}})
			if err != nil {
				t.Fatal(err)
			}
			return l
		}
		before := limiter(gate.Provider{Policies: []gate.Policy{pol(10, time.Second)}})
		after := limiter(gate.Provider{Policies: []gate.Policy{pol(10, time.Second)},
			Merchants: map[string]gate.Merchant{"m": {Policies: []gate.Policy{pol(2, time.Second)}}}})
		a, err := before.ReserveFor(ctx, prov, "m", "a", 1, 0)
		if err != nil || !a.Allowed {
			t.Fatalf("a: %+v, %v", a, err)
		}
		time.Sleep(30 * time.Millisecond)
		if at, err := after.Postpone(ctx, prov, "m", "a", a.Slot()); err != nil || !at.IsZero() {
			t.Fatalf("postpone a under its merchant's new limits: %v, %v; want refused", at, err)
		}
		if at, err := before.Postpone(ctx, prov, "m", "a", a.Slot()); err != nil || at.IsZero() {
			t.Fatalf("postpone a as admitted: %v, %v; want moved", at, err)
		}
	})
}

// A capped job's lease moves with it; one that lapsed meanwhile (its place may have gone to another job)
// keeps the job from going now.
func TestPostponeAndTheLease(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		const lease = time.Second // far beyond the test's own steps, on a loaded machine too
		l := newAlgoOpts(t, rdb, gate.Options{Margin: 10 * time.Millisecond}, gate.Provider{Policies: []gate.Policy{pol(10, time.Second)}, MaxInFlight: 2, Lease: lease})
		a := mustReserve(t, l, "a", 1, 0)
		b := mustReserve(t, l, "b", 1, 0)
		time.Sleep(30 * time.Millisecond)
		at, err := l.Postpone(ctx, prov, "", "a", a.Slot())
		if err != nil || at.IsZero() {
			t.Fatalf("postpone a: %v, %v; want moved", at, err)
		}
		keys, _ := l.Keys(prov)
		flight := strings.TrimSuffix(keys[0], ":log") + ":flight"
		got, err := rdb.ZRangeWithScores(ctx, flight, 0, -1).Result()
		if err != nil || len(got) != 2 {
			t.Fatalf("leases %v, %v; want a's and b's", got, err)
		}
		for _, z := range got {
			m := z.Member.(string)
			if strings.HasPrefix(m, "a\x00") && int64(z.Score) != at.Add(lease).UnixMicro() {
				t.Fatalf("a's lease lapses at %d, want its new slot + lease, %d", int64(z.Score), at.Add(lease).UnixMicro())
			}
			if strings.HasPrefix(m, "b\x00") && int64(z.Score) != b.Slot().Add(lease).UnixMicro() {
				t.Fatalf("b's lease moved to %d", int64(z.Score))
			}
		}
		time.Sleep(lease + 50*time.Millisecond) // b's lease lapsed
		if at, err := l.Postpone(ctx, prov, "", "b", b.Slot()); err != nil || !at.IsZero() {
			t.Fatalf("postpone b after its lease lapsed: %v, %v; want refused", at, err)
		}
	})
}

// A state lost (no epoch: a restart without persistence) holds a postponement as it would a reserve, which
// then begins the warm-up.
func TestPostponeRefusedWhenStateLost(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l := newAlgoOpts(t, rdb, gate.Options{Margin: 10 * time.Millisecond, WarmUp: true}, gate.Provider{Policies: []gate.Policy{pol(10, time.Second)}})
		a := mustReserve(t, l, "a", 1, 0) // the first decision begins a warm-up
		if !a.Allowed {
			a = mustReserve(t, l, "a", 1, 10*time.Second)
		}
		if !a.Allowed {
			t.Fatalf("a: %+v", a)
		}
		time.Sleep(time.Until(a.Slot()) + 30*time.Millisecond)
		keys, _ := l.Keys(prov)
		if n, err := rdb.Del(ctx, keys[len(keys)-1]).Result(); err != nil || n != 1 {
			t.Fatalf("deleting the epoch %s: %d, %v", keys[len(keys)-1], n, err)
		}
		if at, err := l.Postpone(ctx, prov, "", "a", a.Slot()); err != nil || !at.IsZero() {
			t.Fatalf("postpone a with the state lost: %v, %v; want refused", at, err)
		}
	})
}
