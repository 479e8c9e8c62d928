package gate_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
)

// twoProcesses is one provider's gate as two processes hold it: same prefix, separate Limiters, the
// warm-up on, and its state begun already (the epoch written: no first-use warm-up).
func twoProcesses(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm, policies ...gate.Policy) (a, b *gate.Limiter) {
	t.Helper()
	return twoProcessesOf(t, rdb, gate.Provider{Algorithm: algo, Policies: policies})
}

func twoProcessesOf(t *testing.T, rdb redis.UniversalClient, spec gate.Provider) (a, b *gate.Limiter) {
	t.Helper()
	prefix := uniquePrefix(t)
	return processAt(t, rdb, prefix, spec), processAt(t, rdb, prefix, spec)
}

// processAt is one process's gate on a prefix, its state begun already (the epoch written).
func processAt(t *testing.T, rdb redis.UniversalClient, prefix string, spec gate.Provider) *gate.Limiter {
	t.Helper()
	l, err := gate.New(rdb, gate.Options{Prefix: prefix, Margin: 5 * time.Millisecond, WarmUp: true, Providers: map[string]gate.Provider{prov: spec}})
	if err != nil {
		t.Fatal(err)
	}
	keys, _ := l.Keys(prov)
	if err := rdb.Set(context.Background(), keys[len(keys)-1], "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	return l
}

// admitted counts the Allows (no wait) admitted out of n, each a new job.
func admitted(t *testing.T, l *gate.Limiter, tag string, n int) int {
	t.Helper()
	got := 0
	for i := range n {
		v, err := l.Allow(context.Background(), prov, tag+id(i), 1)
		if err != nil {
			t.Fatal(err)
		}
		if v.Allowed {
			got++
		}
	}
	return got
}

// Live limits set by one process hold for another from its very next decision, counted with what was
// admitted before them; reset brings the configured limits back. Every algorithm, every backend. The
// buckets (token_bucket, gcra, leaky_bucket) keep a level, not a history: under new limits they start
// afresh and warm up, so nothing more goes within the window.
func TestLiveLimits(t *testing.T) {
	eachAlgorithm(t, gate.Algorithms, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		ctx := context.Background()
		a, b := twoProcesses(t, rdb, algo, pol(10, time.Hour))
		first := 3
		if algo == gate.LeakyBucket {
			first = 1 // a leaky bucket's Allow admits one at a time: its queue is what reservations fill
		}
		if got := admitted(t, a, "before-", first); got != first {
			t.Fatalf("admitted %d of %d under 10/1h", got, first)
		}
		live, err := b.SetLimits(ctx, prov, []gate.Policy{pol(4, time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if live.Source != gate.SourceOverride || live.Version != 1 || gate.FormatPolicies(live.Policies) != "4/1h" || live.At.IsZero() {
			t.Fatalf("set: %+v", live)
		}
		// a decided under 10/1h until now: its next decision is refused by the script, re-read, and decided
		// under 4/1h, counting the 3 (or 1) before.
		want := 4 - first
		if algo == gate.TokenBucket || algo == gate.GCRA || algo == gate.LeakyBucket {
			want = 0 // the warm-up: paused for the window
		}
		if got := admitted(t, a, "after-", 10); got != want {
			t.Fatalf("admitted %d after the set, want %d (4/1h less the %d before)", got, want, first)
		}
		st := mustStatus(t, a)
		if st.LimitsSource != gate.SourceOverride || st.LimitsVersion != 1 || st.Policies[0].Policy != pol(4, time.Hour) {
			t.Fatalf("status after set: %+v", st)
		}
		if _, err := b.ResetLimits(ctx, prov); err != nil {
			t.Fatal(err)
		}
		st = mustStatus(t, a)
		if st.LimitsSource != gate.SourceConfig || st.LimitsVersion != 2 || st.Policies[0].Policy != pol(10, time.Hour) {
			t.Fatalf("status after reset: %+v", st)
		}
		// Back at 10/1h, counting the 4 admitted: 6 more. The buckets start afresh again (the state they
		// had under 10/1h knows nothing of what went under 4/1h) and warm up: none.
		want = 10 - 4
		if algo == gate.TokenBucket || algo == gate.GCRA || algo == gate.LeakyBucket {
			want = 0
		}
		if got := admitted(t, a, "reset-", 10); got != want {
			t.Fatalf("admitted %d after the reset, want %d", got, want)
		}
		shown, err := a.Limits(ctx, prov)
		if err != nil || shown.Source != gate.SourceConfig || shown.Version != 2 || gate.FormatPolicies(shown.Configured) != "10/1h" {
			t.Fatalf("limits after reset: %+v, %v", shown, err)
		}
		// Set again: the version keeps growing, so a process still on version 1 cannot take the third
		// change for the first.
		if live, err = b.SetLimits(ctx, prov, []gate.Policy{pol(5, time.Hour)}); err != nil || live.Version != 3 {
			t.Fatalf("second set: %+v, %v", live, err)
		}
	})
}

// The counters are named by window, so after a change of windows the counters in force are others than
// those a job admitted before went into: releasing or moving that job gives nothing back to them (an
// adversarial review found that it freed another job's unit: 4 admitted within one window of 3/2s). A job
// admitted under the new limits still gives its unit back.
func TestWindowChangeGivesBackOnlyWhereCounted(t *testing.T) {
	for _, how := range []string{"release", "move"} {
		t.Run(how, func(t *testing.T) {
			eachAlgorithm(t, []gate.Algorithm{gate.FixedWindow, gate.SlidingWindow}, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
				ctx := context.Background()
				l := newAlgoOpts(t, rdb, gate.Options{StaleAfter: time.Millisecond}, gate.Provider{Algorithm: algo, Policies: []gate.Policy{pol(10, time.Minute)}})
				waitWindowStart(t, rdb, 2*time.Second) // B1..B4 within one calendar window of 2s
				a := mustReserve(t, l, "A", 1, 0)
				if _, err := l.SetLimits(ctx, prov, []gate.Policy{pol(3, 2*time.Second)}); err != nil || !a.Allowed {
					t.Fatalf("A %+v, set: %v", a, err)
				}
				var b3 gate.Verdict
				for _, j := range []string{"B1", "B2", "B3"} {
					if b3 = mustReserve(t, l, j, 1, 0); !b3.Allowed {
						t.Fatalf("%s: %+v", j, b3)
					}
				}
				if v := mustReserve(t, l, "B4", 1, 0); v.Allowed {
					t.Fatalf("B4 admitted into a full window: %+v", v)
				}
				if how == "move" {
					time.Sleep(5 * time.Millisecond) // A is stale: its redelivery is moved, or stays as it was
					if v := mustReserve(t, l, "A", 1, 0); v.Allowed {
						t.Fatalf("A moved into the full window of 3/2s: %+v", v)
					}
					return
				}
				if n, err := l.Release(ctx, prov, "A", 1, a.Slot()); err != nil || n != 1 {
					t.Fatalf("release A: %d, %v", n, err)
				}
				if v := mustReserve(t, l, "B4", 1, 0); v.Allowed {
					t.Fatalf("B4 admitted after A's release: 4 within one window of 3/2s (%+v)", v)
				}
				if n, err := l.Release(ctx, prov, "B3", 1, b3.Slot()); err != nil || n != 1 {
					t.Fatalf("release B3: %d, %v", n, err)
				}
				if v := mustReserve(t, l, "B4", 1, 0); !v.Allowed {
					t.Fatalf("B4 denied after B3's release, which gave its unit back: %+v", v)
				}
			})
		})
	}
}

// sliding_log's log is its whole state. Live limits whose longest window is shorter than the configured
// one keep it for the configured one, so that a reset counts what went before and under them (an
// adversarial review found the log trimmed to the live window: after the reset, 5/1h admitted 4 more
// within the hour). What they admit within that window beyond twice the largest limit is not kept: a
// second review found the log growing without bound under them.
func TestSlidingLogKeepsItsHistoryUnderLiveLimits(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		a, b := twoProcesses(t, rdb, gate.SlidingLog, pol(5, time.Hour))
		if got := admitted(t, a, "before-", 6); got != 5 {
			t.Fatalf("admitted %d of 6 under 5/1h", got)
		}
		if _, err := b.SetLimits(ctx, prov, []gate.Policy{pol(3, 100*time.Millisecond)}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // the 5 are out of the live window (and of its trim's reach, were it the live one)
		live := 0
		for deadline := time.Now().Add(10 * time.Second); live < 15 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			live += admitted(t, a, fmt.Sprintf("live-%d-", live), 1)
		}
		if live < 15 {
			t.Fatalf("admitted %d under 3/100ms in 10s", live)
		}
		keys, _ := a.Keys(prov)
		if n := rdb.ZCard(ctx, keys[0]).Val(); n != 10 {
			t.Fatalf("the log holds %d members after %d admissions, want the cap: 10, twice the largest limit", n, 5+live)
		}
		if _, err := b.ResetLimits(ctx, prov); err != nil {
			t.Fatal(err)
		}
		if got := admitted(t, a, "after-", 5); got != 0 {
			t.Fatalf("admitted %d more under 5/1h, in the hour it admitted %d (5, then the live limits')", got, 5+live)
		}
	})
}

// A job whose cost the configured limits allow but the live ones do not is denied while they stand (not
// an error, not dead-lettered: the worker defers it); above the configured limits it is invalid.
func TestLiveLimitsBelowACost(t *testing.T) {
	ctx := context.Background()
	a, b := twoProcesses(t, backends(t)[0].rdb, gate.SlidingLog, pol(10, time.Minute))
	if _, err := b.SetLimits(ctx, prov, []gate.Policy{pol(3, time.Minute)}); err != nil {
		t.Fatal(err)
	}
	v, err := a.Reserve(ctx, prov, "big", 5, time.Second)
	if err != nil || v.Allowed || v.RetryAfter < time.Second || v.Limit != pol(3, time.Minute) {
		t.Fatalf("cost 5 under a live 3/1m: %+v, %v; want denied, retry >= 1s, policy 3/1m", v, err)
	}
	if _, err := a.Reserve(ctx, prov, "huge", 11, time.Second); !errors.Is(err, gate.ErrInvalid) {
		t.Fatalf("cost 11 over the configured 10/1m: %v, want ErrInvalid", err)
	}
	// Another process resets them: a, which makes no decision that would tell it, admits the job at once.
	if _, err := b.ResetLimits(ctx, prov); err != nil {
		t.Fatal(err)
	}
	if v, err := a.Reserve(ctx, prov, "big", 5, time.Second); err != nil || !v.Allowed {
		t.Fatalf("cost 5 after another process reset the live limits: %+v, %v; want admitted", v, err)
	}
}

// Redis losing the live limits (a restart without persistence, a FLUSHALL: here the key alone) puts the
// configured limits back in force, in every process: their version goes back to 0, which is adopted.
func TestLiveLimitsLost(t *testing.T) {
	ctx := context.Background()
	rdb := backends(t)[0].rdb
	a, b := twoProcesses(t, rdb, gate.SlidingLog, pol(10, time.Minute))
	if _, err := b.SetLimits(ctx, prov, []gate.Policy{pol(2, time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if got := admitted(t, a, "set-", 5); got != 2 {
		t.Fatalf("admitted %d under a live 2/1m, want 2", got)
	}
	keys, _ := a.Keys(prov)
	if err := rdb.Del(ctx, keys[len(keys)-4]).Err(); err != nil { // <prefix>:{acme}:limits
		t.Fatal(err)
	}
	if got := admitted(t, a, "lost-", 10); got != 8 {
		t.Fatalf("admitted %d after the live limits were lost, want 8 (10/1m less the 2)", got)
	}
	if st := mustStatus(t, a); st.LimitsSource != gate.SourceConfig || st.LimitsVersion != 0 {
		t.Fatalf("status after the loss: %+v", st)
	}
}

// Live limits the provider's configuration could not have are refused, naming the problem, and nothing
// changes in Redis.
func TestLiveLimitsRefused(t *testing.T) {
	ctx := context.Background()
	rdb := backends(t)[0].rdb
	for _, tt := range []struct {
		algo     gate.Algorithm
		policies []gate.Policy
		want     string
	}{
		{gate.SlidingWindow, []gate.Policy{pol(5, time.Second), pol(9, time.Second)}, "a window may appear once"},
		{gate.FixedWindow, []gate.Policy{pol(5, time.Millisecond)}, "longer than the margin"},
		{gate.SlidingLog, []gate.Policy{pol(gate.MaxSlidingLogLimit+1, time.Hour)}, "takes limits up to"},
		{gate.SlidingLog, []gate.Policy{pol(0, time.Second)}, "limit must be >= 1"},
		{gate.SlidingLog, []gate.Policy{pol(10, time.Second), pol(100, time.Minute)}, "longer than the configured ones (1m > 1s)"},
	} {
		a, _ := twoProcesses(t, rdb, tt.algo, pol(10, time.Second))
		_, err := a.SetLimits(ctx, prov, tt.policies)
		if !errors.Is(err, gate.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s %v: %v, want ErrInvalid saying %q", tt.algo, tt.policies, err, tt.want)
			continue
		}
		if live, err := a.Limits(ctx, prov); err != nil || live.Version != 0 || live.Source != gate.SourceConfig {
			t.Errorf("%s: after a refused set: %+v, %v; want version 0, config", tt.algo, live, err)
		}
	}
}

// A change of live limits is announced to every watching process, with its moment on the Redis clock: a
// worker gives up the slots decided before it.
func TestLiveLimitsAnnounced(t *testing.T) {
	rdb := backends(t)[0].rdb
	a, b := twoProcesses(t, rdb, gate.SlidingLog, pol(10, time.Second))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := watchLog{notes: make(chan string, 64)}
	go func() { _ = a.Watch(ctx, rdb.(*redis.Client), w) }()
	var set gate.LiveLimits
	limit := int64(1)
	n := w.next(t, "limits", func() {
		var err error
		limit++ // a change each time: setting the limits in force again announces nothing
		if set, err = b.SetLimits(ctx, prov, []gate.Policy{pol(limit, time.Second)}); err != nil {
			t.Fatal(err)
		}
	})
	if want := "limits " + prov + " " + strconv.FormatInt(set.At.UnixMicro(), 10); n != want {
		t.Fatalf("notice %q, want %q", n, want)
	}
}

// ParsePolicies reads what FormatPolicies writes, and refuses what is not N/duration.
func TestParsePolicies(t *testing.T) {
	ps, err := gate.ParsePolicies(" 200/1s, 5000/1m ,100000/24h")
	if err != nil || gate.FormatPolicies(ps) != "200/1s,5000/1m,100000/24h" {
		t.Fatalf("%v, %v", ps, err)
	}
	for _, bad := range []string{"", "100", "0/1s", "x/1s", "100/", "100/0s", "100/-1s", "100/1s,"} {
		if _, err := gate.ParsePolicies(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The limits a provider announces (limits_from_headers) lower the configured ones for the fleet, by
// window, never above them; an announcement at or above the configuration takes them back; an operator's
// live limits stand over announcements; Redis is asked only for a change.
func TestFollowAnnounced(t *testing.T) {
	ctx := context.Background()
	a, b := twoProcessesOf(t, backends(t)[0].rdb, gate.Provider{Policies: []gate.Policy{pol(10, time.Second), pol(100, time.Minute)}, FromHeaders: true})
	follow := func(l *gate.Limiter, announced ...gate.Policy) bool {
		t.Helper()
		changed, err := l.FollowAnnounced(ctx, prov, announced)
		if err != nil {
			t.Fatal(err)
		}
		return changed
	}
	inForce := func(l *gate.Limiter) string {
		t.Helper()
		live, err := l.Limits(ctx, prov)
		if err != nil {
			t.Fatal(err)
		}
		return live.Source + " " + gate.FormatPolicies(live.Policies)
	}
	if !follow(a, pol(5, time.Second)) || inForce(b) != "headers 5/1s,100/1m" {
		t.Fatalf("5/1s announced: %s", inForce(b))
	}
	if follow(a, pol(5, time.Second)) || follow(b, pol(5, time.Second)) {
		t.Fatal("the same announcement again changed the live limits")
	}
	if got := admitted(t, a, "h-", 8); got != 5 {
		t.Fatalf("admitted %d under an announced 5/1s, want 5", got)
	}
	if !follow(b, pol(500, time.Second)) || inForce(a) != "config 10/1s,100/1m" {
		t.Fatalf("500/1s announced (above the configuration): %s", inForce(a))
	}
	if !follow(a, pol(7, 0)) || inForce(b) != "headers 7/1s,100/1m" { // no window stated: the shortest
		t.Fatalf("7 announced without a window: %s", inForce(b))
	}
	// An announcement of a window the configuration lacks says nothing of the configured ones: what the
	// earlier announcement set is taken back.
	if !follow(a, pol(1, time.Hour)) || inForce(b) != "config 10/1s,100/1m" {
		t.Fatalf("a window the configuration lacks: %s", inForce(b))
	}
	if _, err := b.SetLimits(ctx, prov, []gate.Policy{pol(8, time.Second), pol(100, time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if follow(a, pol(2, time.Second)) || inForce(a) != "override 8/1s,100/1m" {
		t.Fatalf("an announcement over an operator's live limits: %s", inForce(a))
	}
}

// Learn (providers.<name>.adaptive) moves the learned limit one step per window for the fleet: up by a
// quarter until the first cut, then by 2 % (at least 1); down to 95 % on a 429 (85 % right after another cut); within min..max; never over
// an operator's live limits.
func TestLearn(t *testing.T) {
	ctx := context.Background()
	const w = 400 * time.Millisecond // a step per window: the checks within one take a few ms
	lo, hi := pol(10, w), pol(20, w)
	rdb, prefix := backends(t)[0].rdb, uniquePrefix(t)
	a := processAt(t, rdb, prefix, gate.Provider{Policies: []gate.Policy{lo}, LearnMin: lo, LearnMax: hi})
	b := processAt(t, rdb, prefix, gate.Provider{Policies: []gate.Policy{lo}, LearnMin: lo, LearnMax: hi})
	limit := func() string {
		t.Helper()
		live, err := b.Limits(ctx, prov)
		if err != nil {
			t.Fatal(err)
		}
		return live.Source + " " + gate.FormatPolicies(live.Policies)
	}
	step := func(l *gate.Limiter, up bool) bool {
		t.Helper()
		changed, err := l.Learn(ctx, prov, up, lo, hi)
		if err != nil {
			t.Fatal(err)
		}
		return changed
	}
	if !step(a, true) || limit() != "learned 13/400ms" { // ceil(10 * 1.25)
		t.Fatalf("first raise: %s", limit())
	}
	if step(b, true) || limit() != "learned 13/400ms" {
		t.Fatalf("a second raise within the window: %s", limit())
	}
	time.Sleep(w)
	if !step(b, true) || limit() != "learned 17/400ms" {
		t.Fatalf("second raise: %s", limit())
	}
	// A cut does not wait for a raise's window (a 429 says the raise went too far), but only one per window.
	if !step(a, false) || step(b, false) || limit() != "learned 16/400ms" { // floor(17 * 0.95)
		t.Fatalf("cut: %s", limit())
	}
	if got := admitted(t, a, "l-", 20); got != 16 {
		t.Fatalf("admitted %d under a learned 16/400ms, want 16", got)
	}
	time.Sleep(w)
	if !step(a, true) || limit() != "learned 17/400ms" { // after a cut: +2 %, at least 1
		t.Fatalf("raise after the cut: %s", limit())
	}
	for range 8 {
		time.Sleep(w)
		step(a, true)
	}
	if limit() != "learned 20/400ms" {
		t.Fatalf("raised past the max: %s", limit())
	}
	time.Sleep(w)
	if !step(b, false) || limit() != "learned 19/400ms" { // floor(20 * 0.95): the window before had no cut
		t.Fatalf("a cut after raises: %s", limit())
	}
	time.Sleep(w)
	if !step(b, false) || limit() != "learned 16/400ms" { // floor(19 * 0.85): a cut in the window after a cut
		t.Fatalf("a cut right after a cut: %s", limit())
	}
	for range 8 {
		time.Sleep(w)
		step(b, false)
	}
	if limit() != "learned 10/400ms" {
		t.Fatalf("cut below the min: %s", limit())
	}
	if _, err := b.SetLimits(ctx, prov, []gate.Policy{pol(12, w)}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(w)
	if step(a, true) || limit() != "override 12/400ms" {
		t.Fatalf("learning over an operator's live limits: %s", limit())
	}
	// A reset forgets what was learned: learning starts again from the configured min, never from a
	// learned limit that is no longer in force.
	time.Sleep(w)
	for range 3 {
		step(a, true)
		time.Sleep(w)
	}
	if _, err := b.ResetLimits(ctx, prov); err != nil {
		t.Fatal(err)
	}
	time.Sleep(w)
	if step(a, false) || limit() != "config 10/400ms" { // at min: nothing moves
		t.Fatalf("a cut after a reset: %s", limit())
	}
	time.Sleep(w)
	if !step(a, true) || limit() != "learned 11/400ms" { // from min, carefully: the provider refused once
		t.Fatalf("a raise after a reset: %s", limit())
	}
	// A process configured without learning (its configuration changed) does not follow a learned limit.
	c := processAt(t, rdb, prefix, gate.Provider{Policies: []gate.Policy{lo}})
	if live, err := c.Limits(ctx, prov); err != nil || live.Source != gate.SourceConfig || gate.FormatPolicies(live.Policies) != "10/400ms" {
		t.Fatalf("a process not learning: %+v, %v", live, err)
	}
}
