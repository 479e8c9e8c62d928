package gate_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
)

// A batch of reserves (lua/family's op 'batch') answers each job as its own reserve would have, in order:
// the same sequence (new jobs, a duplicate within the batch, costs above 1, denials, stale jobs moved, a bad
// cost) decided in one call on one gate and one call per job on another, side by side, under every
// algorithm, with and without an in-flight cap, on the single node and the cluster. The batch reads the
// state once and writes it once, so what each job sees of the ones before it is the script's own doing.
func TestBatchAnswersAsAlone(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		for _, algo := range gate.Algorithms {
			for _, capped := range []int64{0, 4} {
				t.Run(fmt.Sprintf("%s/max_in_flight=%d", algo, capped), func(t *testing.T) {
					batchAgrees(t, rdb, algo, capped)
				})
			}
		}
	})
}

func batchAgrees(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm, capped int64) {
	ctx := context.Background()
	const stale = 80 * time.Millisecond
	mk := func() *gate.Limiter {
		// Windows so long that the milliseconds between the two gates' decisions move nothing (a
		// token refills every 4h), and waits far from every slot: the two must agree exactly.
		return newAlgoOpts(t, rdb, gate.Options{StaleAfter: stale},
			gate.Provider{Algorithm: algo, Policies: []gate.Policy{pol(6, 24*time.Hour), pol(20, 7*24*time.Hour)},
				MaxInFlight: capped, Lease: time.Hour})
	}
	batched, alone := mk(), mk()
	ahead, moved, full, let := 0, 0, 0, int64(0) // reservations compared (admitted with a slot ahead), moves, denied by the cap, let go
	ids := []string{"a", "b", "c", "b", "d", "e", "f", "g", "h", "i", "j"}
	costs := []int64{1, 2, 1, 1, 3, 1, 1, 1, 1, 1, 1}
	// The third round asks the first round's jobs again once they are stale: those admitted are moved
	// (or denied, staying where they were), within the batch as alone.
	var widest time.Duration
	for round, wait := range []time.Duration{0, 10 * time.Hour, 10 * time.Hour} {
		tag := fmt.Sprintf("wait %v: ", wait)
		if round == 2 {
			tag = "wait 0s: "
			time.Sleep(stale + 20*time.Millisecond)
		}
		vs, errs := gate.DecideBatch(ctx, batched, prov, prefixed(tag, ids), costs, wait)
		for i := range ids {
			want, werr := alone.Reserve(ctx, prov, tag+ids[i], costs[i], wait)
			got, gerr := vs[i], errs[i]
			if (werr != nil) != (gerr != nil) {
				t.Fatalf("round %d, job %d (%s): batch error %v, alone %v", round, i, ids[i], gerr, werr)
			}
			// The batch decided each round's jobs at one Redis "now", before the lone gate decided any: the
			// lone gate's "now" and the times it recorded in every round so far are later by at most the
			// widest gap yet (under -race tens of milliseconds), and a wait is one time less another.
			widest = max(widest, want.Now.Sub(got.Now).Abs())
			gap := 2*widest + time.Millisecond
			if got.Allowed != want.Allowed || got.Duplicate != want.Duplicate || got.Policy != want.Policy ||
				got.Remaining != want.Remaining || got.Paused != want.Paused || got.Moved != want.Moved ||
				got.InFlight != want.InFlight || (got.Lease == "") != (want.Lease == "") ||
				(got.Delay-want.Delay).Abs() > gap || (got.RetryAfter-want.RetryAfter).Abs() > gap {
				t.Fatalf("round %d, job %d (%s, cost %d): batch %+v\nalone %+v", round, i, ids[i], costs[i], got, want)
			}
			if got.Allowed && got.Delay > 0 {
				ahead++
			}
			if got.Moved {
				moved++
			}
			if got.Allowed {
				let++
			}
			if got.InFlight {
				full++
			}
		}
	}
	if refills := algo == gate.TokenBucket || algo == gate.GCRA || algo == gate.LeakyBucket; refills && capped == 0 && ahead == 0 {
		t.Errorf("no reservation ahead compared (a token every 4h, waits up to 10h)")
	}
	t.Logf("%d reservations ahead, %d moved, %d denied by the cap", ahead, moved, full)
	if gives := algo == gate.SlidingLog || algo == gate.SlidingWindow; gives && capped == 0 && moved == 0 {
		// (The buckets give a move's units back only from their newest admission; fixed_window's reservations ahead put a move past its wait; the cap of 4 is full.)
		t.Errorf("no stale job moved in the third round")
	}
	if capped > 0 && (let > capped || (let == capped && full == 0)) {
		// No lease ends here: the cap lets exactly that many go, then denies.
		t.Errorf("%d let go and %d denied by an in-flight cap of %d that no lease left", let, full, capped)
	}
	// A job the script refuses (cost above a limit) is its own error; the others go on.
	vs, errs := gate.DecideBatch(ctx, batched, prov, []string{"x1", "x2", "x3"}, []int64{1, 7, 1}, 0)
	if errs[1] == nil || errs[0] != nil || errs[2] != nil || vs[0].Now.IsZero() || vs[2].Now.IsZero() {
		t.Fatalf("a bad cost in a batch: %v %+v", errs, vs)
	}
}

func prefixed(tag string, ids []string) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = tag + id
	}
	return out
}

// With Options.Batch, reserves asked while one is on its way go together: 64 callers at once on one
// provider take far fewer calls than jobs, and the log shows the limit kept in every window.
func TestConcurrentReservesBatched(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		var calls atomic.Int64
		counted := countCalls(t, rdb, &calls)
		// A lease names its job: each admitted caller checks that the verdict it got is its own.
		l := newAlgoOpts(t, counted, gate.Options{Margin: 5 * time.Millisecond, Batch: 32},
			gate.Provider{Policies: []gate.Policy{pol(50, time.Second)}, MaxInFlight: 1000, Lease: time.Minute})
		mustReserve(t, l, "warm", 1, 0) // functions loaded
		calls.Store(0)
		var wg sync.WaitGroup
		var admitted atomic.Int64
		for i := range 64 {
			wg.Go(func() {
				for k := range 4 {
					id := fmt.Sprintf("w%d-%d", i, k)
					v, err := l.Reserve(ctx, prov, id, 1, 3*time.Second)
					if err != nil {
						t.Error(err)
						return
					}
					if v.Allowed {
						admitted.Add(1)
						if !strings.HasPrefix(v.Lease, id+"\x00") {
							t.Errorf("%s got the verdict of another job: lease %q", id, v.Lease)
						}
					}
				}
			})
		}
		wg.Wait()
		n := calls.Load()
		t.Logf("%d reserves, %d admitted, in %d calls", 256, admitted.Load(), n)
		if n >= 256/2 {
			t.Errorf("%d calls for 256 reserves asked 64 at a time: not batched", n)
		}
		if got := maxInWindow(readLog(t, rdb, l), time.Second); got > 50 {
			t.Errorf("%d units in one window of 1s, limit 50", got)
		}
	})
}

// countCalls returns a client over rdb's servers that counts the scripts it sends.
func countCalls(t *testing.T, rdb redis.UniversalClient, n *atomic.Int64) redis.UniversalClient {
	t.Helper()
	var c redis.UniversalClient
	switch r := rdb.(type) {
	case *redis.ClusterClient:
		c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: r.Options().Addrs})
	case *redis.Client:
		c = redis.NewClient(&redis.Options{Addr: r.Options().Addr})
	}
	t.Cleanup(func() { c.Close() })
	c.AddHook(scriptCounter{n})
	return c
}

type scriptCounter struct{ n *atomic.Int64 }

func (s scriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s scriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "fcall" || name == "evalsha" || name == "eval" {
			s.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (s scriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A caller that gives up while its job is still queued behind a call on its way takes nothing: the job
// is never sent, and asked again later it is a new job, not a duplicate.
func TestBatchedCallerGivesUp(t *testing.T) {
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: backends(t)[0].rdb.(*redis.Client).Options().Addr})
	defer c.Close()
	var slow atomic.Bool
	c.AddHook(slowScripts{&slow})
	l := newAlgoOpts(t, c, gate.Options{Batch: 8, BatchCalls: 1}, gate.Provider{Policies: []gate.Policy{pol(10, time.Hour)}})
	mustReserve(t, l, "warm", 1, 0) // loaded
	slow.Store(true)
	lead := make(chan error, 1)
	go func() {
		_, err := l.Reserve(ctx, prov, "lead", 1, 0) // held on its way for 300ms
		lead <- err
	}()
	time.Sleep(50 * time.Millisecond)
	slow.Store(false)
	quit, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if _, err := l.Reserve(quit, prov, "quitter", 1, 0); err == nil {
		t.Fatal("a reserve queued past its caller's deadline: no error")
	}
	if err := <-lead; err != nil {
		t.Fatal(err)
	}
	askedAgain(t, l, mustReserve(t, l, "quitter", 1, 0), 3, "warm, lead, quitter once")
}

// A reserve asked while a call of its provider is on its way goes beside it (Options.BatchCalls), not
// after it: with the first call held on its way, the second is decided and answered meanwhile; with
// BatchCalls 1 it waits for the first.
func TestBatchCallsBesideTheOneOnItsWay(t *testing.T) {
	for _, calls := range []int{1, 2} {
		t.Run(fmt.Sprintf("calls=%d", calls), func(t *testing.T) {
			ctx := context.Background()
			c := redis.NewClient(&redis.Options{Addr: backends(t)[0].rdb.(*redis.Client).Options().Addr})
			defer c.Close()
			hold := &holdFirst{release: make(chan struct{}), held: make(chan struct{})}
			c.AddHook(hold)
			l := newAlgoOpts(t, c, gate.Options{Batch: 8, BatchCalls: calls}, gate.Provider{Policies: []gate.Policy{pol(10, time.Hour)}})
			mustReserve(t, l, "warm", 1, 0) // loaded
			hold.armed.Store(true)
			first := make(chan error, 1)
			go func() {
				_, err := l.Reserve(ctx, prov, "first", 1, 0)
				first <- err
			}()
			<-hold.held // the first call is on its way, and stays there
			second := make(chan gate.Verdict, 1)
			go func() { second <- mustReserve(t, l, "second", 1, 0) }()
			if calls == 1 {
				if !gate.BatchRunning(l, prov) {
					t.Fatal("the first call on its way: the batcher is not running")
				}
				close(hold.release)
				if err := <-first; err != nil {
					t.Fatal(err)
				}
				<-second
				return
			}
			<-second // answered while the first is held
			select {
			case err := <-first:
				t.Fatalf("the first call came back before it was released: %v", err)
			default:
			}
			close(hold.release)
			if err := <-first; err != nil {
				t.Fatal(err)
			}
			askedAgain(t, l, mustReserve(t, l, "third", 1, 0), 4, "warm, first, second, third")
		})
	}
}

// holdFirst holds the first script call made once armed until release is closed (held is closed as it
// begins to wait); every other call goes at once.
type holdFirst struct {
	armed, taken  atomic.Bool
	release, held chan struct{}
}

func (h *holdFirst) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdFirst) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.armed.Load() && (cmd.Name() == "fcall" || cmd.Name() == "evalsha") && h.taken.CompareAndSwap(false, true) {
			close(h.held)
			<-h.release
		}
		return next(ctx, cmd)
	}
}
func (h *holdFirst) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// slowScripts holds every script call for 300ms while on is set.
type slowScripts struct{ on *atomic.Bool }

func (s slowScripts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s slowScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if s.on.Load() && (cmd.Name() == "fcall" || cmd.Name() == "evalsha") {
			time.Sleep(300 * time.Millisecond)
		}
		return next(ctx, cmd)
	}
}
func (s slowScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Deliveries of one job queued together go in consecutive calls, not one: in one call they would be decided
// against the same reading of the state, and two duplicates let go at one instant shared one lease (the
// review's finding: a fourth request in flight under a cap of 3). Each gets its own lease, and the cap
// holds: the fourth job is denied.
func TestBatchRepeatedIdKeepsTheCap(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l := newAlgoOpts(t, rdb, gate.Options{}, gate.Provider{Policies: []gate.Policy{pol(100, time.Minute)}, MaxInFlight: 3, Lease: time.Hour})
		vs, errs := gate.DecideBatch(ctx, l, prov, []string{"x", "x", "x"}, []int64{1, 1, 1}, time.Minute)
		leases := map[string]bool{}
		for i, v := range vs {
			if errs[i] != nil || !v.Allowed || v.Lease == "" || leases[v.Lease] {
				t.Fatalf("delivery %d of x: %+v %v; leases so far %v: want let go, each with a lease of its own", i, v, errs[i], leases)
			}
			leases[v.Lease] = true
		}
		if !vs[1].Duplicate || !vs[2].Duplicate {
			t.Fatalf("the second and third deliveries of x: %+v, want duplicates of the first", vs[1:])
		}
		st, err := l.Status(ctx, prov)
		if err != nil {
			t.Fatal(err)
		}
		if st.InFlight != 3 {
			t.Fatalf("%d leases standing after three deliveries let go, want 3", st.InFlight)
		}
		if y := mustReserve(t, l, "y", 1, time.Minute); y.Allowed || !y.InFlight {
			t.Fatalf("y with 3 of 3 in flight: %+v, want denied by the cap", y)
		}
	})
}

// The in-flight set keeps an expiry: a call that removes its last lapsed lease (deleting the key) and takes
// a new one sets the expiry anew, though the key's old expiry, read before the removal, was long enough.
// Without it the set lived on without one, and a later, shorter lease's expiry could cut a standing lease
// short (the review's finding).
func TestLeaseSetKeepsAnExpiry(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		const lease = 300 * time.Millisecond
		l := newAlgoOpts(t, rdb, gate.Options{}, gate.Provider{Policies: []gate.Policy{pol(1, 10*time.Second)}, MaxInFlight: 5, Lease: lease})
		keys, err := l.Keys(prov)
		if err != nil {
			t.Fatal(err)
		}
		flight := keys[len(keys)-3]
		if !strings.HasSuffix(flight, ":flight") {
			t.Fatalf("keys %q: the in-flight set is not third from the end", keys)
		}
		now := mustReserve(t, l, "now", 1, time.Minute)     // lapses in 300ms
		ahead := mustReserve(t, l, "ahead", 1, time.Minute) // 10s ahead: the set's expiry goes past 10s
		if !now.Allowed || !ahead.Allowed || ahead.Delay < 9*time.Second {
			t.Fatalf("now %+v, ahead %+v: want both admitted, ahead about 10s on", now, ahead)
		}
		if err := l.Land(ctx, prov, ahead.Lease); err != nil { // its expiry stays on the key
			t.Fatal(err)
		}
		time.Sleep(lease + 100*time.Millisecond) // now's lease lapses: the only one left
		again := mustReserve(t, l, "now", 1, time.Minute)
		if !again.Allowed || !again.Duplicate || again.Lease == "" {
			t.Fatalf("now again: %+v, want a duplicate let go with a lease", again)
		}
		ttl, err := rdb.PTTL(ctx, flight).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl < lease {
			t.Fatalf("the in-flight set's expiry %v with a lease of %v standing (-1ns: none)", ttl, lease)
		}
	})
}

// With Options.BatchLinger a reserve that finds no call on its way waits for company: reserves asked while
// it lingers go in its call, and a full queue (Options.Batch) ends the linger at once. The linger runs on
// the test's clock (gate.LingerClock), so no scheduling delay of this machine changes what is checked.
func TestBatchLinger(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l, calls, fire, waitQueued := lingering(t, rdb)
		reserve := func(id string) chan error {
			done := make(chan error, 1)
			go func() {
				v, err := l.Reserve(ctx, prov, id, 1, time.Second)
				if err == nil && !v.Allowed {
					err = fmt.Errorf("%s denied: %+v", id, v)
				}
				done <- err
			}()
			return done
		}

		calls.Store(0)
		a := reserve("a")
		waitQueued(1)
		b := reserve("b")
		waitQueued(2)
		if n := calls.Load(); n != 0 {
			t.Fatalf("%d calls while the first reserve lingers, want none", n)
		}
		fire()
		if err := errors.Join(<-a, <-b); err != nil {
			t.Fatal(err)
		}
		if n := calls.Load(); n != 1 {
			t.Fatalf("two reserves asked within one linger took %d calls, want 1", n)
		}

		calls.Store(0) // Batch (3) reserves queued end the linger without the clock
		c := reserve("c")
		waitQueued(1)
		d := reserve("d")
		waitQueued(2)
		if err := errors.Join(<-reserve("e"), <-c, <-d); err != nil {
			t.Fatal(err)
		}
		if n := calls.Load(); n != 1 {
			t.Fatalf("a full queue of 3 took %d calls, want 1", n)
		}
	})
}

// Every caller gives up while its reserve lingers: nothing is decided (no call, nothing spent), and the
// provider's next reserve lingers and goes as before.
func TestBatchLingerAllGiveUp(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l, calls, fire, waitQueued := lingering(t, rdb)

		calls.Store(0)
		quit, cancel := context.WithCancel(ctx)
		gaveUp := make(chan error, 2)
		for _, id := range []string{"q1", "q2"} {
			go func() {
				_, err := l.Reserve(quit, prov, id, 1, time.Second)
				gaveUp <- err
			}()
		}
		waitQueued(2)
		cancel()
		for range 2 {
			if err := <-gaveUp; !errors.Is(err, context.Canceled) {
				t.Fatalf("a reserve whose caller gave up while it lingered: %v, want context.Canceled", err)
			}
		}
		waitQueued(0)
		fire() // the linger ends on an empty queue, and the batcher stops
		waitUntil(t, "the batcher to stop, every reserve given up", func() bool { return !gate.BatchRunning(l, prov) })
		if n := calls.Load(); n != 0 {
			t.Fatalf("%d calls for reserves whose callers all gave up, want none", n)
		}

		again := make(chan gate.Verdict, 1)
		go func() { again <- mustReserve(t, l, "q1", 1, time.Second) }()
		waitQueued(1)
		fire()
		askedAgain(t, l, <-again, 2, "warm, q1 once")
	})
}

// askedAgain checks the verdict of a job asked again after its caller gave up on it: a new admission, not a
// duplicate (the first ask was never decided), with units used in all.
func askedAgain(t *testing.T, l *gate.Limiter, v gate.Verdict, units int, which string) {
	t.Helper()
	if !v.Allowed || v.Duplicate {
		t.Fatalf("the job whose caller gave up, asked again: %+v; want a new admission, not a duplicate", v)
	}
	st, err := l.Status(context.Background(), prov)
	if err != nil {
		t.Fatal(err)
	}
	if int(st.Units) != units {
		t.Fatalf("%d units used, want %d (%s)", st.Units, units, which)
	}
}

// lingering is a gate with batches of 3 and the longest linger, on the test's clock (gate.LingerClock:
// fire ends a linger, waitQueued waits for n reserves queued), counting its script calls, with "warm"
// admitted (functions loaded, the epoch written: that first reserve lingered on the real clock).
func lingering(t *testing.T, rdb redis.UniversalClient) (l *gate.Limiter, calls *atomic.Int64, fire func(), waitQueued func(n int)) {
	calls = new(atomic.Int64)
	l = newAlgoOpts(t, countCalls(t, rdb, calls), gate.Options{Batch: 3, BatchLinger: gate.MaxBatchLinger},
		gate.Provider{Policies: []gate.Policy{pol(100, time.Second)}})
	mustReserve(t, l, "warm", 1, 0)
	fire, queued := gate.LingerClock(l, prov)
	return l, calls, fire, func(n int) {
		t.Helper()
		waitUntil(t, fmt.Sprintf("%d reserves queued", n), func() bool { return queued() == n })
	}
}

// A batch's reply packs each job's flags and policy into one number, and names now once (lua/family's
// op 'batch'): every field comes back as the job's own reserve gives it. The first job bad, a paused
// provider (admitting, then denying), duplicates let go on leases of their own, the second policy the
// tightest, and a batch of bad jobs only, against the same calls one job at a time on a twin gate.
func TestBatchReplyCarriesEveryField(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		mk := func() *gate.Limiter {
			return newAlgoOpts(t, rdb, gate.Options{}, gate.Provider{Policies: []gate.Policy{pol(100, time.Hour), pol(5, 24*time.Hour)},
				MaxInFlight: 10, Lease: time.Hour})
		}
		batched, alone := mk(), mk()
		type want struct{ allowed, dup, paused bool }
		for round, c := range []struct {
			ids   []string
			costs []int64
			pause bool
			wait  time.Duration
			want  []want // nil: a bad job
		}{
			{[]string{"bad", "a", "b"}, []int64{99, 1, 2}, false, time.Hour, []want{{}, {allowed: true}, {allowed: true}}},
			{[]string{"a", "c", "b"}, []int64{1, 1, 2}, true, time.Hour, []want{{allowed: true, dup: true, paused: true}, {allowed: true, paused: true}, {allowed: true, dup: true, paused: true}}},
			{[]string{"d", "e"}, []int64{1, 1}, false, time.Millisecond, []want{{paused: true}, {paused: true}}}, // denied: the pause outlasts the wait
			{[]string{"x", "y"}, []int64{0, 6}, false, time.Hour, []want{{}, {}}},
		} {
			if c.pause {
				until := time.Now().Add(time.Minute)
				for _, l := range []*gate.Limiter{batched, alone} {
					if err := l.Pause(ctx, prov, until); err != nil {
						t.Fatal(err)
					}
				}
			}
			vs, errs := gate.DecideBatch(ctx, batched, prov, c.ids, c.costs, c.wait)
			for i, id := range c.ids {
				w, werr := alone.Reserve(ctx, prov, id, c.costs[i], c.wait)
				got, gerr := vs[i], errs[i]
				if (werr != nil) != (gerr != nil) || (gerr != nil) != (c.costs[i] < 1 || c.costs[i] > 5) {
					t.Fatalf("round %d, %s (cost %d): batch error %v, alone %v", round, id, c.costs[i], gerr, werr)
				}
				if gerr != nil {
					continue
				}
				if got.Allowed != c.want[i].allowed || got.Duplicate != c.want[i].dup || got.Paused != c.want[i].paused {
					t.Fatalf("round %d, %s: %+v, want %+v", round, id, got, c.want[i])
				}
				if got.Allowed != w.Allowed || got.Duplicate != w.Duplicate || got.Paused != w.Paused || got.Moved != w.Moved ||
					got.InFlight != w.InFlight || got.Policy != w.Policy || got.Remaining != w.Remaining || got.Now.IsZero() ||
					(got.Lease == "") != (w.Lease == "") || strings.HasPrefix(got.Lease, id+"\x00d") != strings.HasPrefix(w.Lease, id+"\x00d") ||
					got.AdmittedAt.IsZero() != w.AdmittedAt.IsZero() || (got.ResetAfter == 0) != (w.ResetAfter == 0) ||
					(got.Delay-w.Delay).Abs() > time.Second || (got.RetryAfter-w.RetryAfter).Abs() > time.Second {
					t.Fatalf("round %d, %s: batch %+v\nalone %+v", round, id, got, w)
				}
				if got.Policy != 1 {
					t.Fatalf("round %d, %s: policy %d, want the second (5 a day), the tightest", round, id, got.Policy)
				}
				if got.Duplicate && !strings.HasPrefix(got.Lease, id+"\x00d") {
					t.Fatalf("round %d, %s: a duplicate let go on lease %q, want its own", round, id, got.Lease)
				}
			}
		}
	})
}

// A batch job whose way through reserve left no reply of its own would shift every later job's numbers:
// the call fails instead, and, failed, writes nothing for any job. Injected by a copy of the script in
// which the second job appends 5 numbers instead of being decided; the script as it is answers the same
// call with its 3 replies.
func TestBatchJobWithoutReplyWritesNothing(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			l := newAlgoOpts(t, b.rdb, gate.Options{}, gate.Provider{Policies: []gate.Policy{pol(10, time.Minute)}})
			mustReserve(t, l, "before", 1, time.Second) // some state to keep
			src, keys, own := gate.ScriptOf(l, prov)
			const line = "      reserve() -- its reply goes into out\n"
			if !strings.Contains(src, line) {
				t.Fatal("the family script has no batch line to rewrite")
			}
			bad := strings.Replace(src, line, "      if i == 2 then C.nout = C.nout + 5 else reserve() end\n", 1)
			argv := []any{"batch", 3}
			for _, id := range []string{"x", "y", "z"} {
				argv = append(argv, id, 1, int64(time.Second/time.Microsecond), 0, "")
			}
			argv = append(argv, 0, own[len(own)-1]) // stale, the settings
			before, took := snapshot(t, b.rdb, keys), time.Now()
			_, err := redis.NewScript(bad).Run(ctx, b.rdb, keys, argv...).Result()
			if err == nil || !strings.Contains(err.Error(), "batch job 2 left 5 numbers") {
				t.Fatalf("a batch job without its reply: %v, want the call to fail", err)
			}
			if after := snapshot(t, b.rdb, keys); !before.same(after, time.Since(took)) {
				t.Fatalf("the failed batch changed the state:\nbefore %v\nafter  %v", before, after)
			}
			reply, err := redis.NewScript(src).Run(ctx, b.rdb, keys, argv...).Slice()
			if err != nil || len(reply) != 1+3*6 {
				t.Fatalf("the script as it is: %v %v, want now and 3 jobs' 6 numbers", reply, err)
			}
		})
	}
}

// Verdict.Asked is when the call that decided the job left, not when the job asked: a reserve that
// lingered (or queued behind a call on its way) was not late while it waited, since nothing was decided
// yet. Reserves linger on the test's clock for a while, two together (the batch op) and one alone (a
// single reserve from the batcher); each verdict names the moment its call left, after the wait, and Redis
// decided after it (same host, one clock). A reserve of a gate without batching names its own call too.
func TestVerdictAskedIsWhenTheCallLeft(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l, _, fire, waitQueued := lingering(t, rdb)
		check := func(v gate.Verdict, err error, from time.Time) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
			if !v.Allowed || v.Asked.Before(from) {
				t.Fatalf("Asked %s, its call sent after %s (%+v); want the call's moment, not the job's",
					v.Asked.Format(time.StampMicro), from.Format(time.StampMicro), v)
			}
			if v.Now.Add(time.Microsecond).Before(v.Asked) { // Now is in whole µs
				t.Fatalf("Redis decided at %s, before the call left at %s", v.Now.Format(time.StampMicro), v.Asked.Format(time.StampMicro))
			}
		}
		type answer struct {
			v   gate.Verdict
			err error
		}
		for _, ids := range [][]string{{"a", "b"}, {"c"}} {
			answers := make(chan answer, len(ids))
			for _, id := range ids {
				go func() {
					v, err := l.Reserve(ctx, prov, id, 1, time.Second)
					answers <- answer{v, err}
				}()
			}
			waitQueued(len(ids))
			time.Sleep(20 * time.Millisecond) // the wait in the queue: not the slot's lateness
			fired := time.Now()
			fire()
			for range ids {
				a := <-answers
				check(a.v, a.err, fired)
			}
		}
		before := time.Now()
		v, err := newLimiter(t, rdb, 10*time.Millisecond, pol(5, time.Second)).Reserve(ctx, prov, "alone", 1, 0)
		check(v, err, before)
	})
}
