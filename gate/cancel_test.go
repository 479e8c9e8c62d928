package gate_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
)

var cancelOpts = gate.CancelOptions{Keep: time.Minute, Attempts: 3, Notice: 200 * time.Millisecond}

// A cancel of a job the gate has not admitted stands before every later reserve of it, alone or batched,
// of any of its attempts, under every algorithm; other jobs go on, and a second cancel says it stood.
func TestCancelQueued(t *testing.T) {
	eachAlgorithm(t, family, func(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) {
		ctx := context.Background()
		for _, batch := range []int{0, 4} {
			l := newAlgoOpts(t, rdb, gate.Options{Batch: batch}, gate.Provider{Algorithm: algo, Policies: []gate.Policy{pol(100, time.Second)}})
			opts := cancelOpts
			opts.Reason = "merchant asked: ticket 7"
			c, err := l.Cancel(ctx, prov, "pay 1", opts)
			if err != nil || c.State != gate.CancelQueued || !c.Slot.IsZero() {
				t.Fatalf("batch %d: cancel of a queued job: %+v %v", batch, c, err)
			}
			if why, err := l.CancelReason(ctx, prov, "pay 1\x1f2"); err != nil || why != opts.Reason {
				t.Errorf("batch %d: reason %q %v, want %q", batch, why, err, opts.Reason)
			}
			if why, err := l.CancelReason(ctx, prov, "pay 2"); err != nil || why != "" {
				t.Errorf("batch %d: reason of a job not cancelled: %q %v", batch, why, err)
			}
			for _, gid := range []string{"pay 1", "pay 1\x1f1", "pay 1\x1f7"} {
				v := mustReserve(t, l, gid, 1, time.Second)
				if v.Allowed || !v.Cancelled || v.Duplicate {
					t.Errorf("batch %d: reserve of %q after its cancel: %+v, want denied as cancelled", batch, gid, v)
				}
			}
			if v := mustReserve(t, l, "pay 2", 1, time.Second); !v.Allowed || v.Cancelled {
				t.Errorf("batch %d: another job: %+v, want admitted", batch, v)
			}
			if c, err := l.Cancel(ctx, prov, "pay 1", cancelOpts); err != nil || c.State != gate.CancelAlready {
				t.Errorf("batch %d: second cancel: %+v %v, want already cancelled", batch, c, err)
			}
		}
	})
}

// A job admitted for a slot now or past has left (or is leaving): the cancel says so, with the slot, and
// changes nothing: its redelivery is a duplicate as before.
func TestCancelLeft(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l := newLimiter(t, rdb, 0, pol(10, time.Second))
		v := mustReserve(t, l, "sent", 1, time.Second)
		if !v.Allowed || v.Delay != 0 {
			t.Fatalf("%+v", v)
		}
		c, err := l.Cancel(ctx, prov, "sent", cancelOpts)
		if err != nil || c.State != gate.CancelLeft || !c.Slot.Equal(v.Slot()) {
			t.Fatalf("cancel of a job sent at %s: %+v %v, want left at its slot", v.Slot(), c, err)
		}
		if again := mustReserve(t, l, "sent", 1, time.Second); !again.Allowed || !again.Duplicate || again.Cancelled {
			t.Errorf("redelivery after a cancel that found it left: %+v, want a duplicate", again)
		}
	})
}

// A job admitted for a slot ahead is announced. When its holder, told, says it will not send it
// (AckCancel), the cancel stands (given up) and the job's next reserve is denied. When nobody says so, the
// cancel waits until the slot plus the notice, lifts its mark and says the job left at its slot, even when
// the window is shorter than the notice (the record has let the admission go by then), and a second
// cancel meanwhile waits for that decision rather than report the first's mark as standing.
func TestCancelAhead(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		prefix := uniquePrefix(t)
		l, err := gate.New(rdb, gate.Options{Prefix: prefix, Providers: map[string]gate.Provider{prov: {Policies: []gate.Policy{pol(1, 150*time.Millisecond)}}}})
		if err != nil {
			t.Fatal(err)
		}
		w := &cancelHolder{l: l, holds: map[string]bool{}, heard: make(chan string, 8), acked: make(chan bool, 8)}
		go func() { _ = l.Watch(ctx, rdb, w) }()
		time.Sleep(100 * time.Millisecond) // subscribed
		opts := cancelOpts
		opts.Notice = 400 * time.Millisecond // longer than the window: the record lets the admission go first

		mustReserve(t, l, "first", 1, time.Second)
		ahead := mustReserve(t, l, "held", 1, time.Second)
		if !ahead.Allowed || ahead.Delay < 100*time.Millisecond {
			t.Fatalf("want a slot ahead: %+v", ahead)
		}
		w.hold("held")
		c, err := l.Cancel(ctx, prov, "held", opts)
		if err != nil || c.State != gate.CancelGivenUp || !c.Slot.Equal(ahead.Slot()) {
			t.Fatalf("cancel of a slot ahead whose holder gives it up: %+v %v", c, err)
		}
		if got, acked := <-w.heard, <-w.acked; got != "held" || !acked {
			t.Errorf("announced %q, acknowledged %v; want held, true", got, acked)
		}
		if v := mustReserve(t, l, "held", 1, 2*time.Second); v.Allowed || !v.Cancelled {
			t.Errorf("reserve after the slot was given up: %+v, want cancelled", v)
		}

		kept := mustReserve(t, l, "kept", 1, 2*time.Second) // its holder never hears
		if !kept.Allowed || kept.Delay <= 0 {
			t.Fatalf("want a slot ahead: %+v", kept)
		}
		second := make(chan gate.Cancellation, 1)
		go func() {
			time.Sleep(20 * time.Millisecond)
			c, _ := l.Cancel(ctx, prov, "kept", opts)
			second <- c
		}()
		began := time.Now()
		c, err = l.Cancel(ctx, prov, "kept", opts)
		if err != nil || c.State != gate.CancelLeft || !c.Slot.Equal(kept.Slot()) {
			t.Fatalf("cancel of a slot ahead nobody gives up: %+v %v, want left at %s", c, err, kept.Slot())
		}
		if waited := time.Since(began); waited < kept.Delay {
			t.Errorf("decided after %s, before the slot %s ahead had passed", waited, kept.Delay)
		}
		if c2 := <-second; c2.State != gate.CancelLeft {
			t.Errorf("a second cancel while the first waited: %+v, want left", c2)
		}
		if <-w.heard != "kept" {
			t.Error("the cancel of kept was not announced")
		}
		if acked, err := l.AckCancel(ctx, prov, "kept"); err != nil || acked {
			t.Errorf("a holder told too late: ack %v %v, want false (the slot stands)", acked, err)
		}
		if v := mustReserve(t, l, "kept", 1, 2*time.Second); !v.Allowed || v.Cancelled {
			t.Errorf("redelivery of a job that left: %+v, want admitted (the cancel lifted)", v)
		}
	})
}

// cancelHolder is a worker holding slots: told of a cancel of one it holds, it says it gives it up.
type cancelHolder struct {
	l     *gate.Limiter
	mu    sync.Mutex
	holds map[string]bool // the jobs whose slots it holds
	heard chan string
	acked chan bool
}

func (h *cancelHolder) hold(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.holds[id] = true
}
func (h *cancelHolder) NotePause(string, time.Time) {}
func (h *cancelHolder) NoteLoss(string, time.Time)  {}
func (h *cancelHolder) NoteDisconnect(time.Time)    {}
func (h *cancelHolder) NoteCancel(provider, id string) {
	h.mu.Lock()
	held := h.holds[id]
	h.mu.Unlock()
	h.heard <- id
	if held {
		go func() {
			ok, _ := h.l.AckCancel(context.Background(), provider, id)
			h.acked <- ok
		}()
	}
}

// Job reads what the gate holds of a job, each attempt apart: admissions, marks, leases and a cancel.
func TestJobShow(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l := newAlgoOpts(t, rdb, gate.Options{}, gate.Provider{Policies: []gate.Policy{pol(10, time.Second)}, MaxInFlight: 5, Lease: 5 * time.Second})
		if st, err := l.Job(ctx, prov, "pay-9", 3); err != nil || len(st.Attempts) != gate.MinCancelAttempts || !st.Attempts[0].Slot.IsZero() || len(st.Leases) != 0 || !st.Cancelled.IsZero() {
			t.Fatalf("a job never seen: %+v %v", st, err)
		}
		first := mustReserve(t, l, "pay-9", 1, time.Second)
		retry := mustReserve(t, l, "pay-9\x1f2", 1, time.Second)
		if err := l.Sent(ctx, prov, "pay-9"); err != nil {
			t.Fatal(err)
		}
		mustReserve(t, l, "pay-9", 1, time.Second) // a duplicate let go: marked
		st, err := l.Job(ctx, prov, "pay-9", 3)
		if err != nil {
			t.Fatal(err)
		}
		a := st.Attempts
		if !a[0].Slot.Equal(first.Slot()) || a[0].Sent.IsZero() || !a[1].Slot.IsZero() || !a[2].Slot.Equal(retry.Slot()) || !a[2].Sent.IsZero() {
			t.Errorf("attempts %+v, want the first admitted and marked sent, the retry 2 admitted", a)
		}
		if len(st.Leases) != 3 {
			t.Errorf("leases %+v, want the first's, its duplicate's and the retry's", st.Leases)
		}
		if c, err := l.Cancel(ctx, prov, "pay-10", gate.CancelOptions{Keep: time.Minute, Attempts: 1, Reason: "fraud flag"}); err != nil || c.State != gate.CancelQueued {
			t.Fatalf("%+v %v", c, err)
		}
		if st, err := l.Job(ctx, prov, "pay-10", 1); err != nil || st.Cancelled.Before(st.Now.Add(59*time.Second)) || st.Reason != "fraud flag" {
			t.Errorf("a cancelled job: %+v %v", st, err)
		}
	})
}

// The job journal tells a cancel that a job left after the id record has let it go: a request in flight
// (no outcome yet), answered, or failed (the provider may have it) left; one the provider throttled (it
// did not take it) is queued again, and cancelled. An older handling's end never overwrites a newer
// request's departure.
func TestCancelJournal(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l := newAlgoOpts(t, rdb, gate.Options{Journal: time.Hour}, gate.Provider{Policies: []gate.Policy{pol(10, time.Second)}})
		now := time.Now().Truncate(time.Microsecond)
		entries := []gate.JournalEntry{
			{ID: "done", Left: now.Add(-40 * time.Minute), Outcome: "succeeded"},
			{ID: "retry", Left: now.Add(-30 * time.Second), Outcome: "throttled"},
			{ID: "flying", Left: now.Add(-10 * time.Second)},
			{ID: "failed", Left: now.Add(-20 * time.Second), Outcome: "transient"},
		}
		if err := l.Journal(ctx, prov, entries); err != nil {
			t.Fatal(err)
		}
		// the end of an older handling of flying, written late
		if err := l.Journal(ctx, prov, []gate.JournalEntry{{ID: "flying", Left: now.Add(-50 * time.Second), Outcome: "transient"}}); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			id   string
			want gate.CancelState
			left time.Time
		}{{"done", gate.CancelLeft, entries[0].Left}, {"retry", gate.CancelQueued, time.Time{}}, {"flying", gate.CancelLeft, entries[2].Left},
			{"failed", gate.CancelLeft, entries[3].Left}} {
			got, err := l.Cancel(ctx, prov, c.id, cancelOpts)
			if err != nil || got.State != c.want || !got.Slot.Equal(c.left) {
				t.Errorf("cancel %s: %+v %v, want %s at %s", c.id, got, err, c.want, c.left)
			}
		}
		st, err := l.Job(ctx, prov, "done", 1)
		if err != nil || !st.Left.Equal(entries[0].Left) || st.Outcome != "succeeded" {
			t.Errorf("job show of a job the journal holds: %+v %v", st, err)
		}
		if v := mustReserve(t, l, "retry\x1f1", 1, time.Second); v.Allowed || !v.Cancelled {
			t.Errorf("the retry of a job cancelled after its throttled request: %+v, want cancelled", v)
		}
		if st, err := l.Job(ctx, prov, "flying", 1); err != nil || !st.Left.Equal(entries[2].Left) || st.Outcome != "" {
			t.Errorf("an older handling's end overwrote a newer departure: %+v %v", st, err)
		}
	})
}
