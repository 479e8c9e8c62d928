package gate_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
)

// merchantProvider: 10/1s for the provider, 3/1s per merchant, and "big" with 6/1s of its own.
func merchantProvider(algo gate.Algorithm) gate.Provider {
	return gate.Provider{Algorithm: algo, Policies: []gate.Policy{pol(10, time.Second)},
		PerMerchant: []gate.Policy{pol(3, time.Second)},
		Merchants:   map[string]gate.Merchant{"big": {Policies: []gate.Policy{pol(6, time.Second)}}, "plain": {}}}
}

// Admission now (max wait 0): each merchant stops at its own limit, "big" at its own, and the provider at
// its own whoever asks; a job without a merchant counts against the provider only.
func TestMerchantLimits(t *testing.T) {
	eachAlgorithm(t, gate.MerchantAlgorithms, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		ctx := context.Background()
		l := newAlgoOpts(t, rdb, gate.Options{}, merchantProvider(algo))
		if algo == gate.FixedWindow {
			waitWindowStart(t, rdb, time.Second)
		}
		admit := func(merchant, id string) gate.Verdict {
			t.Helper()
			v, err := l.ReserveFor(ctx, prov, merchant, id, 1, 0)
			if err != nil {
				t.Fatalf("%s/%s: %v", merchant, id, err)
			}
			return v
		}
		for i := range 3 {
			if v := admit("a", fmt.Sprint("a", i)); !v.Allowed {
				t.Fatalf("a's job %d: %+v, want admitted", i, v)
			}
		}
		v := admit("a", "a3")
		if v.Allowed || !v.ByMerchant || v.Limit != pol(3, time.Second) || v.RetryAfter <= 0 {
			t.Fatalf("a's 4th job: %+v, want denied by a's own 3/1s", v)
		}
		if v := admit("plain", "p0"); !v.Allowed { // named without limits: per_merchant's apply
			t.Fatalf("plain's job: %+v, want admitted", v)
		}
		for i := range 5 {
			if v := admit("big", fmt.Sprint("big", i)); !v.Allowed {
				t.Fatalf("big's job %d: %+v, want admitted (its own 6/1s)", i, v)
			}
		}
		// 9 admitted: one more for anyone, then the provider's 10/1s stops everybody.
		if v := admit("", "none0"); !v.Allowed {
			t.Fatalf("a job without a merchant: %+v, want admitted", v)
		}
		for _, m := range []string{"", "big", "c"} {
			if v := admit(m, "late-"+m); v.Allowed || v.ByMerchant {
				t.Fatalf("merchant %q with the provider full: %+v, want denied by the provider's limit", m, v)
			}
		}
		// A duplicate takes nothing more, from the merchant either.
		if v := admit("a", "a0"); !v.Allowed || !v.Duplicate {
			t.Fatalf("a0 again: %+v, want a duplicate", v)
		}
		seen, ms, err := l.Merchants(ctx, prov, 10)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int64{}
		for _, m := range ms {
			if len(m.Policies) != 1 {
				t.Fatalf("merchant %s: policies %+v, want its one limit", m.Merchant, m.Policies)
			}
			got[m.Merchant] = m.Policies[0].Used + m.Policies[0].Reserved
		}
		if want := map[string]int64{"a": 3, "plain": 1, "big": 5}; seen != 3 || !maps3Equal(got, want) {
			t.Fatalf("Merchants: %d seen, use %v; want 3, %v", seen, got, want)
		}
	})
}

func maps3Equal(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// waitWindowStart sleeps until just after a boundary of window w on the Redis clock, so that a fixed
// window's test falls in one calendar window.
func waitWindowStart(t *testing.T, rdb redis.UniversalClient, w time.Duration) {
	t.Helper()
	now := redisTime(t, rdb)
	wµs := w.Microseconds()
	time.Sleep(time.Duration(wµs-now%wµs+2000) * time.Microsecond)
}

// A model check: many merchants (a few named, with limits of their own), jobs without one, random costs,
// reservations ahead, releases and duplicates, from concurrent callers. Every slot handed out keeps the
// provider and every merchant within its limits, over every window the algorithm promises (sliding_log
// and sliding_window: any W + margin; fixed_window: each calendar window), and the merchants' limits are
// what holds the busiest back (their slots are spread, not piled up behind the provider's).
func TestMerchantModel(t *testing.T) {
	eachAlgorithm(t, gate.MerchantAlgorithms, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		ctx := context.Background()
		const margin = 5 * time.Millisecond
		spec := gate.Provider{Algorithm: algo, Policies: []gate.Policy{pol(20, 400*time.Millisecond), pol(45, time.Second)},
			PerMerchant: []gate.Policy{pol(4, 400*time.Millisecond)},
			Merchants:   map[string]gate.Merchant{"m0": {Policies: []gate.Policy{pol(8, 300*time.Millisecond), pol(12, time.Second)}}}}
		l := newAlgoOpts(t, rdb, gate.Options{Margin: margin}, spec)
		type admitted struct {
			merchant string
			slot     int64
			cost     int64
		}
		results := make(chan []admitted)
		const callers = 4
		for c := range callers {
			go func() {
				rng := rand.New(rand.NewPCG(uint64(c), 7))
				var out []admitted
				for i := range 40 {
					m := fmt.Sprintf("m%d", rng.IntN(4))
					if rng.IntN(5) == 0 {
						m = ""
					}
					id, cost := fmt.Sprintf("c%d-%d", c, i), int64(1+rng.IntN(3))
					v, err := l.ReserveFor(ctx, prov, m, id, cost, 2*time.Second)
					if err != nil {
						t.Error(err)
						break
					}
					if !v.Allowed {
						continue
					}
					if rng.IntN(6) == 0 { // given back: it never went
						if n, err := l.ReleaseFor(ctx, prov, m, id, cost, v.Slot()); err != nil || n == 0 {
							t.Errorf("release %s: %d, %v", id, n, err)
						}
						continue
					}
					if d, err := l.ReserveFor(ctx, prov, m, id, cost, 2*time.Second); err != nil || !d.Duplicate {
						t.Errorf("%s again: %+v, %v; want a duplicate", id, d, err)
					}
					out = append(out, admitted{m, v.Slot().UnixMicro(), cost})
				}
				results <- out
			}()
		}
		var all []admitted
		for range callers {
			all = append(all, <-results...)
		}
		if t.Failed() {
			return
		}
		check := func(who string, policies []gate.Policy, filter func(admitted) bool) int64 {
			var slots, costs []int64
			var total int64
			for _, a := range all {
				if filter(a) {
					slots, costs = append(slots, a.slot), append(costs, a.cost)
					total += a.cost
				}
			}
			for _, p := range policies {
				if over := overLimit(algo, slots, costs, p, margin); over != "" {
					t.Errorf("%s, %s: %s", who, p, over)
				}
			}
			return total
		}
		sent := check("provider", spec.Policies, func(admitted) bool { return true })
		check("m0", spec.Merchants["m0"].Policies, func(a admitted) bool { return a.merchant == "m0" })
		for _, m := range []string{"m1", "m2", "m3"} {
			check(m, spec.PerMerchant, func(a admitted) bool { return a.merchant == m })
		}
		if sent == 0 {
			t.Fatal("nothing admitted")
		}
	})
}

// overLimit reports a window of p holding more than its limit among the slots (µs) with their costs, as
// the algorithm counts: a calendar window for fixed_window, any W + margin for the others.
func overLimit(algo gate.Algorithm, slots, costs []int64, p gate.Policy, margin time.Duration) string {
	w := p.Window.Microseconds()
	if algo == gate.FixedWindow {
		per := map[int64]int64{}
		for i, s := range slots {
			per[s/w] += costs[i]
			if per[s/w] > p.Limit {
				return fmt.Sprintf("calendar window %d holds %d", s/w, per[s/w])
			}
		}
		return ""
	}
	w += margin.Microseconds()
	for _, end := range slots {
		var n int64
		for i, s := range slots {
			if s > end-w && s <= end {
				n += costs[i]
			}
		}
		if n > p.Limit {
			return fmt.Sprintf("(%d, %d] holds %d", end-w, end, n)
		}
	}
	return ""
}

// The buckets keep one level for all of a provider's policies: merchants' limits are refused at New, and a
// hand-made call with merchant policies is refused by the script itself.
func TestMerchantLimitsRefused(t *testing.T) {
	rdb := backends(t)[0].rdb
	for _, algo := range gate.Algorithms {
		_, err := gate.New(rdb, gate.Options{Prefix: uniquePrefix(t), Providers: map[string]gate.Provider{prov: merchantProvider(algo)}})
		if supported := slices.Contains(gate.MerchantAlgorithms, algo); supported != (err == nil) {
			t.Errorf("%s with merchants' limits: %v; supported: %v", algo, err, supported)
		} else if err != nil && !strings.Contains(err.Error(), "does not count merchants' limits") {
			t.Errorf("%s: %v, want it to say the algorithm does not count them", algo, err)
		}
	}
	// A cost above the merchant's limit is invalid (the job could never go), not a denial.
	l := newAlgoOpts(t, rdb, gate.Options{}, merchantProvider(gate.SlidingLog))
	if _, err := l.ReserveFor(context.Background(), prov, "a", "j", 4, 0); !errors.Is(err, gate.ErrInvalid) || !strings.Contains(err.Error(), `merchant "a"`) {
		t.Fatalf("cost 4 for a merchant of 3/1s: %v, want ErrInvalid naming the merchant", err)
	}
	if v, err := l.ReserveFor(context.Background(), prov, "big", "j", 4, 0); err != nil || !v.Allowed {
		t.Fatalf("cost 4 for big (6/1s): %+v, %v; want admitted", v, err)
	}
}

// A released job's units go back to its merchant: the merchant's 4th job fits after one of three is
// released; and a stale redelivery moved to a new slot takes its merchant's unit with it (one unit, not two).
func TestMerchantReleaseAndMove(t *testing.T) {
	eachAlgorithm(t, gate.MerchantAlgorithms, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		ctx := context.Background()
		spec := gate.Provider{Algorithm: algo, Policies: []gate.Policy{pol(100, 10*time.Second)}, PerMerchant: []gate.Policy{pol(3, 10*time.Second)}}
		l := newAlgoOpts(t, rdb, gate.Options{StaleAfter: 50 * time.Millisecond}, spec)
		if algo == gate.FixedWindow {
			waitWindowStart(t, rdb, 10*time.Second)
		}
		var first gate.Verdict
		for i := range 3 {
			v, err := l.ReserveFor(ctx, prov, "a", id(i), 1, 0)
			if err != nil || !v.Allowed {
				t.Fatalf("a's job %d: %+v, %v", i, v, err)
			}
			if i == 0 {
				first = v
			}
		}
		if n, err := l.ReleaseFor(ctx, prov, "a", id(2), 1, time.Time{}); err != nil || n != 1 {
			t.Fatalf("release: %d, %v", n, err)
		}
		if v, err := l.ReserveFor(ctx, prov, "a", id(3), 1, 0); err != nil || !v.Allowed {
			t.Fatalf("a's job after a release: %+v, %v; want admitted", v, err)
		}
		time.Sleep(100 * time.Millisecond)
		moved, err := l.ReserveFor(ctx, prov, "a", id(0), 1, 0)
		if err != nil || !moved.Allowed || !moved.Moved || !moved.AdmittedAt.Equal(first.Slot()) {
			t.Fatalf("job 0 redelivered after the stale limit: %+v, %v; want moved", moved, err)
		}
		if v, err := l.ReserveFor(ctx, prov, "a", id(4), 1, 0); err != nil || v.Allowed || !v.ByMerchant {
			t.Fatalf("a's 4th unit after the move: %+v, %v; want denied by a's 3/10s", v, err)
		}
	})
}

// A merchant at its own limit is never given a slot ahead that only its limits set: held there, it would
// move the first-come-first-served floor (and the pace) past every other merchant's jobs. It is denied
// until its merchant has room, and the others go now.
func TestMerchantBlocksNobodyElse(t *testing.T) {
	eachAlgorithm(t, gate.MerchantAlgorithms, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		for _, burst := range []int64{0, 5} {
			ctx := context.Background()
			spec := gate.Provider{Algorithm: algo, Policies: []gate.Policy{pol(100, 10*time.Second)}, PerMerchant: []gate.Policy{pol(2, 10*time.Second)}, Burst: burst}
			l := newAlgoOpts(t, rdb, gate.Options{}, spec)
			if algo == gate.FixedWindow {
				waitWindowStart(t, rdb, 10*time.Second)
			}
			for i := range 2 {
				if v, err := l.ReserveFor(ctx, prov, "a", fmt.Sprint("a", i), 1, 30*time.Second); err != nil || !v.Allowed {
					t.Fatalf("burst %d: a's job %d: %+v, %v", burst, i, v, err)
				}
			}
			v, err := l.ReserveFor(ctx, prov, "a", "a2", 1, 30*time.Second)
			if err != nil || v.Allowed || !v.ByMerchant || v.RetryAfter < 4*time.Second {
				t.Fatalf("burst %d: a's third job with 30s to wait: %+v, %v; want denied by a's 2/10s until it has room, nothing reserved", burst, v, err)
			}
			for _, m := range []string{"b", ""} {
				v, err := l.ReserveFor(ctx, prov, m, "x-"+m, 1, 0)
				if err != nil || !v.Allowed {
					t.Fatalf("burst %d: merchant %q after a's denial: %+v, %v; want admitted now", burst, m, v, err)
				}
			}
		}
	})
}

// After a change of a merchant's limits (here: merchants' limits added to a provider that had none), a
// release or a move of a job admitted before gives back nothing to counters it never went into.
func TestMerchantLimitsAddedUnderJobs(t *testing.T) {
	eachAlgorithm(t, gate.MerchantAlgorithms, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		ctx := context.Background()
		opts := gate.Options{Prefix: uniquePrefix(t), StaleAfter: 50 * time.Millisecond}
		build := func(per []gate.Policy) *gate.Limiter {
			o := opts
			o.Providers = map[string]gate.Provider{prov: {Algorithm: algo, Policies: []gate.Policy{pol(100, 10*time.Second)}, PerMerchant: per}}
			l, err := gate.New(rdb, o)
			if err != nil {
				t.Fatal(err)
			}
			return l
		}
		if algo == gate.FixedWindow {
			waitWindowStart(t, rdb, 10*time.Second)
		}
		before, after := build(nil), build([]gate.Policy{pol(2, 10*time.Second)})
		for _, j := range []string{"old-1", "old-2"} {
			if v, err := before.ReserveFor(ctx, prov, "a", j, 1, 0); err != nil || !v.Allowed {
				t.Fatalf("%s: %+v, %v", j, v, err)
			}
		}
		for _, j := range []string{"new-1", "new-2"} {
			if v, err := after.ReserveFor(ctx, prov, "a", j, 1, 0); err != nil || !v.Allowed {
				t.Fatalf("%s: %+v, %v", j, v, err)
			}
		}
		if n, err := after.ReleaseFor(ctx, prov, "a", "old-1", 1, time.Time{}); err != nil || n != 1 {
			t.Fatalf("release old-1: %d, %v", n, err)
		}
		// a's counters hold new-1 and new-2 only: the release of old-1 freed nothing of them, and old-2,
		// redelivered past the stale limit, cannot move (its units were never a's to give back).
		time.Sleep(100 * time.Millisecond)
		if v, err := after.ReserveFor(ctx, prov, "a", "old-2", 1, 0); err != nil || v.Allowed || !v.ByMerchant {
			t.Fatalf("old-2 redelivered: %+v, %v; want denied by a's 2/10s", v, err)
		}
		if v, err := after.ReserveFor(ctx, prov, "a", "new-3", 1, 0); err != nil || v.Allowed || !v.ByMerchant {
			t.Fatalf("new-3: %+v, %v; want denied by a's 2/10s", v, err)
		}
	})
}

// The registry: a provider that tracks merchants without limits of their own still records them; and a
// change of the merchants' windows is a change of the state's shape for the counters (the epoch records
// another: a warm-up), while sliding_log, whose merchant log keeps no window, keeps its shape.
func TestMerchantRegistryAndShape(t *testing.T) {
	rdb := backends(t)[0].rdb
	ctx := context.Background()
	l := newAlgoOpts(t, rdb, gate.Options{}, gate.Provider{Policies: []gate.Policy{pol(10, time.Second)}, TrackMerchants: true})
	if v, err := l.ReserveFor(ctx, prov, "a", "j", 1, 0); err != nil || !v.Allowed {
		t.Fatal(v, err)
	}
	if seen, ms, err := l.Merchants(ctx, prov, 10); err != nil || seen != 1 || len(ms) != 1 || ms[0].Merchant != "a" || len(ms[0].Policies) != 0 {
		t.Fatalf("Merchants: %d %+v %v; want a, without limits", seen, ms, err)
	}
	shape := func(algo gate.Algorithm, per time.Duration) int64 {
		l := newAlgoOpts(t, rdb, gate.Options{}, gate.Provider{Algorithm: algo, Policies: []gate.Policy{pol(10, time.Second)}, PerMerchant: []gate.Policy{pol(2, per)}})
		return gate.ShapeOf(l, prov)
	}
	for _, algo := range gate.MerchantAlgorithms {
		changed := shape(algo, time.Second) != shape(algo, 2*time.Second)
		if changed != (algo != gate.SlidingLog) {
			t.Errorf("%s: a merchant window changed the state's shape: %v", algo, changed)
		}
	}
}
