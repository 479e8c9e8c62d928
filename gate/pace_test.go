package gate_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/internal/testenv"
)

func pacedLimiter(t *testing.T, rdb redis.Scripter, algo gate.Algorithm, burst int64, policies ...gate.Policy) *gate.Limiter {
	t.Helper()
	l, err := gate.New(rdb, gate.Options{
		Prefix:    uniquePrefix(t),
		Margin:    10 * time.Millisecond,
		Providers: map[string]gate.Provider{prov: {Policies: policies, Algorithm: algo, Burst: burst}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Paced slots: with burst 1, a backlog's slots come (shortest window + margin) / limit apart per unit of
// cost, never a window's worth at one instant; burst N lets N share a moment; a denial moves nothing;
// longer windows are counted, not paced. Under every algorithm (the exact log exactly, the others never
// closer than the pace).
func TestPacedSlots(t *testing.T) {
	const pace = 101 * time.Millisecond // (1s + 10ms) / 10
	for _, algo := range gate.Algorithms {
		t.Run(string(algo), func(t *testing.T) {
			eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
				policies := []gate.Policy{pol(1000, time.Hour), pol(10, time.Second)}
				if algo == gate.LeakyBucket {
					policies = policies[1:] // it leaks the hour's 1000 one per 3.6s: paced by nature
				}
				l := pacedLimiter(t, rdb, algo, 1, policies...)
				if every, burst, err := l.Pace(prov); err != nil || every != pace || burst != 1 {
					t.Fatalf("Pace() = %v, %d, %v; want %v, 1", every, burst, err, pace)
				}
				var slots []time.Time
				for i := range 8 {
					cost := int64(1)
					if i == 3 {
						cost = 3 // takes three paces
					}
					v := mustReserve(t, l, id(i), cost, 5*time.Second)
					if !v.Allowed {
						t.Fatalf("job %d denied: %+v", i, v)
					}
					slots = append(slots, v.Slot())
					if i == 4 {
						// Asked now (max wait 0), the next job is denied, and the denial moves nothing.
						if d := mustReserve(t, l, "eager", 1, 0); d.Allowed || d.RetryAfter <= 0 {
							t.Fatalf("a job asking for now behind a paced backlog: %+v", d)
						}
					}
				}
				for i := 1; i < len(slots); i++ {
					want := pace
					if i == 4 {
						want = 3 * pace
					}
					gap := slots[i].Sub(slots[i-1])
					if gap < want || (algo == gate.SlidingLog && gap != want) {
						t.Errorf("slot %d is %v after slot %d, want %v", i, gap, i-1, want)
					}
				}
			})
		})
	}
}

func TestPacedBurst(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		l := pacedLimiter(t, rdb, gate.SlidingLog, 3, pol(10, time.Second))
		if every, burst, err := l.Pace(prov); err != nil || every != 101*time.Millisecond || burst != 3 {
			t.Fatalf("Pace() = %v, %d, %v", every, burst, err)
		}
		var slots []time.Time
		for i := range 5 {
			v := mustReserve(t, l, id(i), 1, 5*time.Second)
			if i < 3 && v.Delay != 0 {
				t.Errorf("job %d of a burst of 3 waits %v", i, v.Delay)
			}
			slots = append(slots, v.Slot())
		}
		// Three go at once; the fourth one pace after the first, as if the first three had been paced.
		for i, want := range map[int]time.Duration{3: 101 * time.Millisecond, 4: 202 * time.Millisecond} {
			if gap := slots[i].Sub(slots[0]); gap != want {
				t.Errorf("slot %d is %v after slot 0, want %v", i, gap, want)
			}
		}
	})
}

// Quotas are not spread over their window: a provider whose shortest window is longer than
// MaxPacedWindow is not paced, and a burst above the shortest window's limit is refused.
func TestPaceLimits(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	t.Cleanup(func() { rdb.Close() })
	l := pacedLimiter(t, rdb, gate.SlidingLog, 1, pol(100000, 24*time.Hour))
	if every, _, err := l.Pace(prov); err != nil || every != 0 {
		t.Fatalf("a daily cap is paced every %v (%v)", every, err)
	}
	for i := range 5 {
		if v := mustReserve(t, l, id(i), 1, 0); !v.Allowed || v.Delay != 0 {
			t.Fatalf("job %d under a daily cap: %+v", i, v)
		}
	}
	_, err := gate.New(rdb, gate.Options{Prefix: "x", Providers: map[string]gate.Provider{prov: {Policies: []gate.Policy{pol(10, time.Second)}, Burst: 11}}})
	if err == nil || err.Error() != fmt.Sprintf("gate: provider %s: burst must be 0..10 (the limit of its shortest window, 10/1s), got 11", prov) {
		t.Fatalf("burst above the limit: %v", err)
	}
	_ = context.Background
}

// The margin in force follows the fleet: a worker's p99 lateness widens it to 4x at once (every decision
// and the pace follow), the highest fresh report counts, it stops at the ceiling, a throttle doubles it,
// and it narrows only after the hold, a quarter of the way a second. SlidingWindow's stays at the floor.
func TestMarginFollowsTheFleet(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		opts := gate.Options{Prefix: uniquePrefix(t), Margin: 10 * time.Millisecond, MarginMax: 100 * time.Millisecond,
			Providers: map[string]gate.Provider{prov: {Policies: []gate.Policy{pol(10, time.Second)}, Burst: 1},
				"other": {Policies: []gate.Policy{pol(10, time.Second)}},
				"sw":    {Algorithm: gate.SlidingWindow, Policies: []gate.Policy{pol(10, time.Second)}}}}
		l, err := gate.New(rdb, opts)
		if err != nil {
			t.Fatal(err)
		}
		peer, err := gate.New(rdb, opts) // another worker process
		if err != nil {
			t.Fatal(err)
		}
		gate.SetMarginTiming(l, time.Second, 10*time.Second)
		ms := time.Millisecond
		check := func(what string, st gate.MarginState, err error, m time.Duration, why string) {
			t.Helper()
			if err != nil || st.Margin != m || !strings.HasPrefix(st.Why, why) || st.Floor != 10*ms {
				t.Fatalf("%s: margin %+v %v, want %v (%s...)", what, st, err, m, why)
			}
		}
		st, err := l.ReadMargin(ctx, prov)
		check("at first", st, err, 10*ms, "floor")
		st, err = l.ReportLateness(ctx, prov, "w1", 5*ms)
		check("p99 5ms", st, err, 20*ms, "lateness")
		if v := mustReserve(t, l, "a", 1, 0); v.Margin != 20*ms {
			t.Fatalf("a decision after the widening: %+v, want it made with 20ms", v)
		}
		if every, _, err := l.Pace(prov); err != nil || every != 102*ms {
			t.Fatalf("pace %v %v, want (1s + 20ms)/10", every, err)
		}
		if m, _ := peer.Margin(prov); m != 10*ms {
			t.Fatalf("the peer took the margin up before it heard: %v", m)
		}
		st, err = peer.ReportLateness(ctx, prov, "w2", ms)
		check("another worker's smaller p99", st, err, 20*ms, "lateness")
		if m, _ := peer.Margin(prov); m != 20*ms {
			t.Fatalf("the peer's margin after its report: %v, want 20ms", m)
		}
		st, err = l.ReportLateness(ctx, prov, "w1", 50*ms)
		check("p99 50ms", st, err, 100*ms, "lateness")
		st, err = l.ReportLateness(ctx, prov, "w1", ms) // the fleet recovered: but held
		check("within the hold", st, err, 100*ms, "lateness")
		time.Sleep(1100 * time.Millisecond)
		st, err = l.ReportLateness(ctx, prov, "w1", ms)
		check("after the hold", st, err, 77500*time.Microsecond, "narrowing")
		st, err = l.ReportLateness(ctx, prov, "w1", ms)
		check("a step a second", st, err, 77500*time.Microsecond, "narrowing")

		for _, m := range []time.Duration{20 * ms, 40 * ms, 80 * ms, 100 * ms} {
			st, err = l.ReportThrottle(ctx, "other", "w1")
			check("throttled", st, err, m, "throttled")
		}
		st, err = l.ReportLateness(ctx, "sw", "w1", 50*ms)
		check("sliding_window", st, err, 10*ms, "fixed")
		if _, err := l.ReportLateness(ctx, prov, "_x", ms); !errors.Is(err, gate.ErrInvalid) {
			t.Fatalf("reporter _x: %v, want ErrInvalid", err)
		}
	})
}
