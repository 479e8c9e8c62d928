package gate_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paygate/paygate/gate"
)

// The in-flight cap: at most MaxInFlight admissions hold a lease at once, under every algorithm; a lease
// is taken with the admission, ended by Land, kept by the job that holds it, and a full cap spends nothing.
func TestInFlightCap(t *testing.T) {
	for _, b := range backends(t) {
		for _, algo := range gate.Algorithms {
			t.Run(b.name+"/"+string(algo), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				l := newAlgoOpts(t, b.rdb, gate.Options{}, gate.Provider{Algorithm: algo, Policies: []gate.Policy{pol(100, time.Minute)},
					MaxInFlight: 2, Lease: time.Minute})
				a, bv := mustReserve(t, l, "a", 1, time.Minute), mustReserve(t, l, "b", 1, time.Minute) // leaky_bucket spaces them
				if !a.Allowed || !strings.HasPrefix(a.Lease, "a\x00") || !bv.Allowed || !strings.HasPrefix(bv.Lease, "b\x00") {
					t.Fatalf("a %+v, b %+v: want both admitted, each with its lease", a, bv)
				}
				before, err := l.Status(ctx, prov)
				if err != nil {
					t.Fatal(err)
				}
				c := mustReserve(t, l, "c", 1, time.Minute)
				if c.Allowed || !c.InFlight || c.RetryAfter <= 0 || c.RetryAfter > gate.FlightPoll || c.Lease != "" {
					t.Fatalf("c with two leases standing: %+v, want denied by the cap, asked to retry within %s", c, gate.FlightPoll)
				}
				after, err := l.Status(ctx, prov)
				if err != nil {
					t.Fatal(err)
				}
				if after.InFlight != 2 || after.MaxInFlight != 2 || after.Units != before.Units || after.Policies[0].Remaining != before.Policies[0].Remaining {
					t.Fatalf("status after c's denial %+v, before %+v: want 2 of 2 leases and nothing spent", after, before)
				}
				// a asks again (its earlier delivery may still be in flight): it needs a place of its own.
				if again := mustReserve(t, l, "a", 1, time.Minute); again.Allowed || !again.InFlight {
					t.Fatalf("a again, its lease standing: %+v, want denied by the cap", again)
				}
				if err := l.Land(ctx, prov, bv.Lease); err != nil {
					t.Fatal(err)
				}
				if c := mustReserve(t, l, "c", 1, time.Minute); !c.Allowed || !strings.HasPrefix(c.Lease, "c\x00") {
					t.Fatalf("c after b landed: %+v, want admitted", c)
				}
				if err := l.Land(ctx, prov, bv.Lease); err != nil { // ended twice: no error, and no second place
					t.Fatal(err)
				}
				if d := mustReserve(t, l, "d", 1, time.Minute); d.Allowed || !d.InFlight {
					t.Fatalf("d with a and c in flight: %+v, want denied", d)
				}
			})
		}
	}
}

// A duplicate let go is a request of its own: it needs a lease of its own.
func TestInFlightDuplicate(t *testing.T) {
	ctx := context.Background()
	l := newAlgoOpts(t, backends(t)[0].rdb, gate.Options{}, gate.Provider{Policies: []gate.Policy{pol(100, time.Minute)}, MaxInFlight: 1, Lease: time.Minute})
	a := mustReserve(t, l, "a", 1, 0)
	if !a.Allowed || a.Lease == "" {
		t.Fatalf("a: %+v", a)
	}
	if d := mustReserve(t, l, "a", 1, time.Minute); d.Allowed || !d.Duplicate || !d.InFlight {
		t.Fatalf("a's duplicate while a is in flight at a cap of 1: %+v, want denied by the cap", d)
	}
	if err := l.Land(ctx, prov, a.Lease); err != nil {
		t.Fatal(err)
	}
	d := mustReserve(t, l, "a", 1, time.Minute)
	if !d.Allowed || !d.Duplicate || !strings.HasPrefix(d.Lease, "a\x00d") {
		t.Fatalf("a's duplicate after a landed: %+v, want let go on a lease of its own", d)
	}
	if n := mustReserve(t, l, "n", 1, time.Minute); n.Allowed || !n.InFlight {
		t.Fatalf("n while the duplicate is in flight: %+v, want denied", n)
	}
	if err := l.Land(ctx, prov, d.Lease); err != nil {
		t.Fatal(err)
	}
	if n := mustReserve(t, l, "n", 1, time.Minute); !n.Allowed {
		t.Fatalf("n after the duplicate landed: %+v", n)
	}
}

// A worker that dies holding a lease (kill -9) gives it back by itself: the lease lapses at its slot plus
// Lease.
func TestInFlightLeaseLapses(t *testing.T) {
	l := newAlgoOpts(t, backends(t)[0].rdb, gate.Options{}, gate.Provider{Policies: []gate.Policy{pol(100, time.Minute)}, MaxInFlight: 1, Lease: 200 * time.Millisecond})
	if a := mustReserve(t, l, "a", 1, 0); !a.Allowed {
		t.Fatalf("a: %+v", a)
	}
	b := mustReserve(t, l, "b", 1, time.Minute)
	if b.Allowed || !b.InFlight || b.RetryAfter > 200*time.Millisecond {
		t.Fatalf("b: %+v, want denied until a's lease lapses, within 200ms", b)
	}
	time.Sleep(b.RetryAfter)
	if b := mustReserve(t, l, "b", 1, time.Minute); !b.Allowed {
		t.Fatalf("b after a's lease lapsed: %+v", b)
	}
}

// Watch announces every lease that ends to a LandWatcher.
func TestWatchAnnouncesLandings(t *testing.T) {
	rdb := backends(t)[0].rdb
	l := newAlgoOpts(t, rdb, gate.Options{}, gate.Provider{Policies: []gate.Policy{pol(100, time.Minute)}, MaxInFlight: 1, Lease: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	w := &landings{heard: make(chan string, 4)}
	done := make(chan error, 1)
	go func() { done <- l.Watch(ctx, rdb, w) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch after cancel: %v", err)
		}
	}()
	a := mustReserve(t, l, "a", 1, 0)
	for w.subscribed() == 0 { // the first subscription is announced as a disconnect
		time.Sleep(5 * time.Millisecond)
	}
	if err := l.Land(context.Background(), prov, a.Lease); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-w.heard:
		if p != prov {
			t.Fatalf("landed %q, want %q", p, prov)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no landing heard")
	}
}

type landings struct {
	heard chan string
	mu    sync.Mutex
	subs  int
}

func (w *landings) NotePause(string, time.Time) {}
func (w *landings) NoteLoss(string, time.Time)  {}
func (w *landings) NoteDisconnect(time.Time) {
	w.mu.Lock()
	w.subs++
	w.mu.Unlock()
}
func (w *landings) NoteLanded(provider string) { w.heard <- provider }
func (w *landings) subscribed() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.subs
}

func TestInFlightNeedsALease(t *testing.T) {
	rdb := backends(t)[0].rdb
	_, err := gate.New(rdb, gate.Options{Prefix: uniquePrefix(t), Providers: map[string]gate.Provider{prov: {Policies: []gate.Policy{pol(1, time.Second)}, MaxInFlight: 2}}})
	if err == nil {
		t.Fatal("a cap without a lease accepted")
	}
	l := newLimiter(t, rdb, 0, pol(1, time.Second))
	for _, bad := range []string{"a", "a\x00", "a\x00x1", "\x001"} {
		if err := l.Land(context.Background(), prov, bad); !errors.Is(err, gate.ErrInvalid) {
			t.Errorf("Land(%q) = %v, want an invalid lease", bad, err)
		}
	}
}

// A lost state lost its leases: the warm-up lasts at least a lease, so that nothing is admitted while the
// requests they stood for may still be in flight.
func TestInFlightWarmUpCoversALease(t *testing.T) {
	l := newAlgoOpts(t, backends(t)[0].rdb, gate.Options{WarmUp: true}, gate.Provider{Policies: []gate.Policy{pol(100, time.Second)}, MaxInFlight: 2, Lease: 5 * time.Second})
	if v := mustReserve(t, l, "a", 1, 0); v.Allowed || v.RetryAfter < 5*time.Second {
		t.Fatalf("the first decision on a fresh state: %+v, want held for at least the 5s lease", v)
	}
}
