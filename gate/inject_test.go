package gate_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
)

// A decision that fails writes nothing. For every algorithm and every kind of decision (a first decision that
// starts the warm-up, a new job, a duplicate, a release refused and one done, a stale job moved, a denial),
// the script is run again and again with an error injected at its 1st, 2nd, ... write (lua/family's
// inject_at), until it runs through; after each injected failure, every key of the provider must be as it was.
func TestFailedDecisionWritesNothing(t *testing.T) {
	for _, b := range backends(t) {
		for _, algo := range gate.Algorithms {
			t.Run(b.name+"/"+string(algo), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				rdb := b.rdb
				policies := []gate.Policy{pol(5, time.Second), pol(50, time.Minute)}
				if algo == gate.LeakyBucket {
					policies = policies[:1] // it leaks the minute's 50 one per 1.2s: b's place would overflow the second's queue
				}
				provider := gate.Provider{Algorithm: algo, Policies: policies, Burst: 2, MaxInFlight: 20, Lease: time.Minute} // leases too: their writes are in the queue
				warm := newAlgoOpts(t, rdb, gate.Options{Margin: time.Millisecond, WarmUp: true}, provider)
				l := newAlgoOpts(t, rdb, gate.Options{Margin: time.Millisecond, StaleAfter: time.Millisecond}, provider)

				// decide runs one decision, injecting a failure at each write in turn, and returns the reply
				// of the run that went through.
				decide := func(what string, lim *gate.Limiter, argv ...any) any {
					t.Helper()
					src, keys, own := gate.ScriptOf(lim, prov)
					if !strings.Contains(src, "\nlocal inject_at = 0\n") {
						t.Fatal("the family script has no inject_at line to rewrite")
					}
					argv = append(argv, own...)
					for k := 1; ; k++ {
						before, took := snapshot(t, rdb, keys), time.Now()
						s := redis.NewScript(strings.Replace(src, "\nlocal inject_at = 0\n", fmt.Sprintf("\nlocal inject_at = %d\n", k), 1))
						reply, err := s.Run(ctx, rdb, keys, argv...).Result()
						if err == nil || !strings.Contains(err.Error(), "injected failure") {
							if err != nil {
								t.Fatalf("%s: %v", what, err)
							}
							return reply
						}
						if after := snapshot(t, rdb, keys); !before.same(after, time.Since(took)) {
							t.Fatalf("%s: failed at write %d, yet the state changed:\nbefore %v\nafter  %v", what, k, before, after)
						}
					}
				}
				// stale: 1ms for the move below, else never (the injected runs take their time)
				reserve := func(lim *gate.Limiter, id string, cost, maxWait, stale int64) []any {
					return decide("reserve "+id, lim, "reserve", id, cost, maxWait, stale, 0).([]any)
				}
				release := func(id string, slot int64) int64 {
					return decide("release "+id, l, "release", id, 1, slot, 0, 0).(int64)
				}
				// A reserve's reply (lua/family/contract.lua): {now_us, flags, delay_us, ...}, flags = allowed + 2
				// duplicate + 4 paused + 8 moved + ...
				flag := func(r []any, bit int) bool { return r[1].(int64)>>bit&1 == 1 }
				const allowed, duplicate, paused, moved = 0, 1, 2, 3
				const wait = int64(10 * time.Second / time.Microsecond)
				// Held by the warm-up (1.001s). fixed_window gives no slot in the last margin of a window: when the
				// warm-up ends there (about 1 run in 1000), the slot is the next window's start, not flagged paused.
				if r := reserve(warm, "first", 1, wait, 0); !flag(r, paused) && !(algo == gate.FixedWindow && flag(r, allowed) && r[2].(int64) > 1_001_000) {
					t.Fatalf("first decision: %v, want held by the warm-up", r)
				}
				a := reserve(l, "a", 2, wait, 0)
				if d := reserve(l, "a", 2, wait, 0); !flag(a, allowed) || !flag(d, duplicate) {
					t.Fatalf("a, then its duplicate: %v %v", a, d)
				}
				if n := release("a", 0); n != 0 {
					t.Fatalf("release under a duplicate: %d", n)
				}
				bv := reserve(l, "b", 1, wait, 0)
				if n := release("b", bv[0].(int64)+bv[2].(int64)); !flag(bv, allowed) || n != 1 {
					t.Fatalf("b %v, released %d units", bv, n)
				}
				time.Sleep(time.Second) // past the pace the jobs above ran up
				// Within 2ms: fixed_window gives no slot in the last margin of a window, and c may land there.
				if c := reserve(l, "c", 1, 2000, 0); !flag(c, allowed) {
					t.Fatalf("c: %v", c)
				}
				time.Sleep(5 * time.Millisecond)
				if c := reserve(l, "c", 1, wait, 1000); !flag(c, allowed) || !flag(c, moved) {
					t.Fatalf("c, stale: %v, want moved", c)
				}
				for i := range 6 {
					reserve(l, id(i), 1, wait, 0)
				}
				if d := reserve(l, "late", 1, 0, 0); flag(d, allowed) {
					t.Fatalf("a job after the budget: %v, want denied", d)
				}
			})
		}
	}
}

// snapshot renders the provider's keys as they are: each key's serialized value, and whether it expires.
func snapshot(t *testing.T, rdb redis.UniversalClient, keys []string) state {
	t.Helper()
	ctx := context.Background()
	s := state{}
	for _, k := range keys {
		v, err := rdb.Dump(ctx, k).Result()
		if err == redis.Nil {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		s[k] = keyState{dump: v, ttl: rdb.PTTL(ctx, k).Val()}
	}
	return s
}

// state is each existing key's serialized value and its time to live (-1: none).
type state map[string]keyState

type keyState struct {
	dump string
	ttl  time.Duration
}

func (k keyState) String() string { return fmt.Sprintf("%q ttl=%v", k.dump, k.ttl) }

// same reports whether after holds what s held, within elapsed of it: every key with the same value and an
// expiry if it had one, but a key whose expiry fell within elapsed may have gone meanwhile (Redis expired
// it, no write did: under -race a decision's injected runs take seconds, and the test's keys live ~1s).
func (s state) same(after state, elapsed time.Duration) bool {
	for k, b := range s {
		a, ok := after[k]
		switch {
		case !ok && b.ttl > 0 && b.ttl <= elapsed+100*time.Millisecond:
		case !ok || a.dump != b.dump || (a.ttl > 0) != (b.ttl > 0):
			return false
		}
	}
	for k := range after {
		if _, ok := s[k]; !ok {
			return false
		}
	}
	return true
}
