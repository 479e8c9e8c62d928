package consumers_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/consumers/memory"
	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/job"
	"github.com/paygate/paygate/providers"
)

// The worker core's own decisions, without servers: the in-memory broker, a scripted gate and a scripted
// provider. One row per line of the package doc's "What happens to a job" table (some lines have a row
// for each of their cases). Whether the gate and the adapters keep their side of the contract is for
// their own tests and for the integration tests on real Redis (TestRedisOutcomes and the rest of
// consumers_test.go).

// answer is one scripted answer of the gate to Reserve.
type answer struct {
	v   gate.Verdict // Now is filled in from the fake Redis clock
	err error
	// block holds the answer back this long (a slow round trip to Redis).
	block time.Duration
	// during runs before the answer is returned, with the verdict as answered: what the watch tells the
	// worker while the job holds its slot (NotePause, NoteLoss, NoteDisconnect).
	during func(w *consumers.Worker, v gate.Verdict)
}

func allow(delay time.Duration) answer { return answer{v: gate.Verdict{Allowed: true, Delay: delay}} }
func leased(delay time.Duration, lease string) answer {
	return answer{v: gate.Verdict{Allowed: true, Delay: delay, Lease: lease}}
}
func full(retryAfter time.Duration) answer { // the in-flight cap is full
	return answer{v: gate.Verdict{RetryAfter: retryAfter, InFlight: true, Limit: gate.Policy{Limit: 1, Window: time.Minute}}}
}

// relimited is an admission a minute ahead whose slot the live limits void 20ms later (NoteLimits).
func relimited() answer {
	return answer{v: gate.Verdict{Allowed: true, Delay: time.Minute}, during: func(w *consumers.Worker, v gate.Verdict) {
		go func() { time.Sleep(20 * time.Millisecond); w.NoteLimits("acme", v.Now.Add(time.Millisecond)) }()
	}}
}

func deny(retryAfter time.Duration) answer {
	return answer{v: gate.Verdict{RetryAfter: retryAfter, Limit: gate.Policy{Limit: 1, Window: time.Minute}}}
}

type reservation struct {
	merchant string
	id       string
	cost     int64
	maxWait  time.Duration
	answered time.Time // local clock
	v        gate.Verdict
}

type release struct {
	merchant string
	id       string
	cost     int64
	slot     time.Time
}

// fakeGate answers Reserve from a script (the last answer repeats) and records every call.
type fakeGate struct {
	answers []answer
	w       *consumers.Worker

	mu          sync.Mutex
	clock       time.Time // the fake Redis clock: a second further at each decision
	reserved    []reservation
	released    []release
	paused      []time.Time // the pauses' ends
	sent        []string
	throttles   int
	events      []string // CountEvent: "<provider> <event>"
	landed      []string // the leases ended
	landedAt    []time.Time
	roomNow     bool        // Postpone finds room
	postponeErr error       // Postpone fails with it
	postponed   []time.Time // the slots Postpone was asked to move
	movedTo     []time.Time // and the slots it moved them to
	tooLate     bool        // AckCancel: the cancel was lifted (it found the job too late)
	acks        int         // AckCancel calls
}

func (g *fakeGate) AckCancel(context.Context, string, string) (bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.acks++
	return !g.tooLate, nil
}

func (g *fakeGate) CancelReason(context.Context, string, string) (string, error) { return "", nil }

func (g *fakeGate) ReserveFor(_ context.Context, provider, merchant, jobID string, cost int64, maxWait time.Duration) (gate.Verdict, error) {
	g.mu.Lock()
	a := g.answers[min(len(g.reserved), len(g.answers)-1)]
	g.clock = g.clock.Add(time.Second)
	v := a.v
	v.Now = g.clock
	g.reserved = append(g.reserved, reservation{merchant: merchant, id: jobID, cost: cost, maxWait: maxWait, v: v})
	n := len(g.reserved) - 1
	g.mu.Unlock()
	time.Sleep(a.block)
	if a.during != nil {
		a.during(g.w, v)
	}
	g.mu.Lock()
	g.reserved[n].answered = time.Now()
	g.mu.Unlock()
	if a.err != nil {
		return gate.Verdict{}, a.err
	}
	return v, nil
}

func (g *fakeGate) ReleaseFor(_ context.Context, provider, merchant, jobID string, cost int64, slot time.Time) (int64, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.released = append(g.released, release{merchant: merchant, id: jobID, cost: cost, slot: slot})
	return cost, nil
}

func (g *fakeGate) Pause(_ context.Context, provider string, until time.Time) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.paused = append(g.paused, until)
	return nil
}

func (g *fakeGate) Sent(_ context.Context, provider, jobID string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sent = append(g.sent, jobID)
	return nil
}

func (g *fakeGate) Departed(context.Context, string, string, string, time.Time, time.Duration) (time.Time, error) {
	return time.Time{}, nil // the outcomes' provider is no HTTP server: no request is written
}

// Postpone finds room when the gate is told so (roomNow): the new slot is the fake Redis clock's now.
// Otherwise there is none, and a late wake-up gives its slot back. (The gate's own answer is
// TestPostpone*'s, on real Redis, and TestLatenessGuardEdges'.)
func (g *fakeGate) Postpone(_ context.Context, provider, merchant, jobID string, slot time.Time) (time.Time, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.postponed = append(g.postponed, slot)
	if g.postponeErr != nil {
		return time.Time{}, g.postponeErr
	}
	if !g.roomNow {
		return time.Time{}, nil
	}
	g.clock = g.clock.Add(time.Second)
	g.movedTo = append(g.movedTo, g.clock)
	return g.clock, nil
}

func (g *fakeGate) Land(_ context.Context, provider, lease string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.landed, g.landedAt = append(g.landed, lease), append(g.landedAt, time.Now())
	return nil
}

func (g *fakeGate) ReportLateness(context.Context, string, string, time.Duration) (gate.MarginState, error) {
	return gate.MarginState{}, nil
}

func (g *fakeGate) CountEvent(_ context.Context, provider, event string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.events = append(g.events, provider+" "+event)
	return nil
}

func (g *fakeGate) ReportThrottle(context.Context, string, string) (gate.MarginState, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.throttles++
	return gate.MarginState{}, nil
}

// fakeProvider answers each dispatch from a script (the last answer repeats; none: 2xx).
type fakeProvider struct {
	answers []error

	mu   sync.Mutex
	jobs []string
	at   []time.Time
}

func (p *fakeProvider) Dispatch(_ context.Context, j *job.Job) (*providers.Answer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.jobs = append(p.jobs, j.ID)
	p.at = append(p.at, time.Now())
	if len(p.answers) == 0 {
		return &providers.Answer{Status: 200}, nil
	}
	return nil, p.answers[min(len(p.jobs), len(p.answers))-1]
}

// settled is what a row expects of one delivery.
type settled struct {
	kind    string // ack, defer, dead
	reason  consumers.Reason
	attempt int
	// after: a deferral's delay lies in [after-slack, after].
	after, slack time.Duration
	why          string // a part of the error it carries
}

// calls counts what the core asked of the gate and the provider.
type calls struct {
	reserve, release, pause, throttle, sent, dispatch, land, postpone int
}

func TestOutcomes(t *testing.T) {
	const (
		maxInlineWait = 25 * time.Millisecond
		maxAttempts   = 5
		maxAge        = time.Hour
		backoffBase   = 100 * time.Millisecond
		redisRetry    = 250 * time.Millisecond
	)
	valid := []byte(`{"id":"pay-1","provider":"acme","amount":1250,"currency":"EUR","cost":2}`)
	unreachable := errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
	throttled := &providers.Throttled{Provider: "acme", Status: 429, RetryAfter: 2 * time.Second}
	serverError := &providers.StatusError{Provider: "acme", Status: 503, Excerpt: "unavailable"}
	refused := &providers.StatusError{Provider: "acme", Status: 422, Excerpt: "bad iban", Permanent: true}

	tests := []struct {
		name     string
		body     []byte        // nil: valid, a job for acme of cost 2
		attempt  int           // transient failures before this delivery
		age      time.Duration // first seen this long ago
		jobs     int           // deliveries of the job, handled in turn (0: 1)
		late     time.Duration // Config.LateLimit (0: no limit)
		roomNow  bool          // the gate's Postpone finds room
		postpone error         // the gate's Postpone fails with it
		inline   time.Duration // Config.MaxInlineWait (0: maxInlineWait)
		shadow   bool          // the provider is in shadow mode (Config.Shadow)
		tooLate  bool          // the gate's AckCancel says a cancel no longer waits for the job
		gate     []answer      // nil: allowed now
		provider []error       // nil: 2xx
		want     []settled     // one per delivery
		calls    calls
		check    func(t *testing.T, g *fakeGate, p *fakeProvider)
	}{
		// invalid message -> dead letter (reason "invalid")
		{name: "invalid: not JSON", body: []byte("hello"),
			want: []settled{{kind: "dead", reason: consumers.ReasonInvalid, why: "not JSON"}}},
		{name: "invalid: a field", body: []byte(`{"id":"x","provider":"acme","amount":-1,"currency":"EUR"}`),
			want: []settled{{kind: "dead", reason: consumers.ReasonInvalid, why: "amount: must be > 0"}}},
		{name: "invalid: another provider's queue", body: []byte(`{"id":"x","provider":"other","amount":1,"currency":"EUR"}`),
			want: []settled{{kind: "dead", reason: consumers.ReasonInvalid, why: `"other"`}}},
		{name: "invalid: the gate refuses the request", gate: []answer{{err: fmt.Errorf("%w: cost 2 over the limit", gate.ErrInvalid)}},
			want:  []settled{{kind: "dead", reason: consumers.ReasonInvalid, why: "cost 2 over the limit"}},
			calls: calls{reserve: 1}},

		// older than max_deferral_age -> dead letter ("deferral-age")
		{name: "too old", age: maxAge + time.Minute, attempt: 2,
			want: []settled{{kind: "dead", reason: consumers.ReasonDeferralAge, attempt: 2, why: "max_deferral_age"}}},

		// gate denies (slot > max wait) -> waits RetryAfter in-process and asks again while those waits total
		// at most max wait; then deferred by RetryAfter (not an attempt)
		{name: "denied beyond max wait: deferred", attempt: 1, gate: []answer{deny(time.Second)},
			want:  []settled{{kind: "defer", attempt: 1, after: time.Second, why: "no slot within"}},
			calls: calls{reserve: 1}},
		{name: "denied just beyond max wait: waits, asks again, dispatched", gate: []answer{deny(10 * time.Millisecond), allow(0)},
			want:  []settled{{kind: "ack"}},
			calls: calls{reserve: 2, dispatch: 1}},
		{name: "denied until the waits pass max wait: deferred", gate: []answer{deny(40 * time.Millisecond)}, inline: 100 * time.Millisecond,
			want:  []settled{{kind: "defer", after: 40 * time.Millisecond, why: "no slot within"}},
			calls: calls{reserve: 3}, // waited 40ms twice; a third 40ms would pass 100ms (the second fits with 20ms of scheduling to spare)
		},

		// gate unreachable -> deferred (fail closed, never dispatched unguarded)
		{name: "gate unreachable: fail closed", attempt: 3, gate: []answer{{err: unreachable}},
			want:  []settled{{kind: "defer", attempt: 3, after: redisRetry, why: "connection refused"}},
			calls: calls{reserve: 1}},
		// admission not on enough replicas -> given back (by the gate), deferred
		{name: "admission not acknowledged by the replicas: deferred, not sent", attempt: 1,
			gate:  []answer{{err: fmt.Errorf("gate: reserve p/x: %w: 0 of 1 within 50ms", gate.ErrUnacknowledged)}},
			want:  []settled{{kind: "defer", attempt: 1, after: redisRetry, why: "not acknowledged"}},
			calls: calls{reserve: 1}},

		// slot inside a pause announced since it was reserved (NotePause) -> deferred past the pause, slot
		// released (not an attempt)
		{name: "slot inside a pause announced meanwhile", attempt: 1,
			gate: []answer{{v: gate.Verdict{Allowed: true, Delay: 10 * time.Millisecond}, during: func(w *consumers.Worker, v gate.Verdict) {
				w.NotePause("acme", v.Slot().Add(3*time.Second))
			}}},
			want:  []settled{{kind: "defer", attempt: 1, after: 3 * time.Second, why: "paused"}},
			calls: calls{reserve: 1, release: 1}},
		{name: "pause announced, ending before the slot: dispatched",
			gate: []answer{{v: gate.Verdict{Allowed: true, Delay: 10 * time.Millisecond}, during: func(w *consumers.Worker, v gate.Verdict) {
				w.NotePause("acme", v.Now)
			}}},
			want:  []settled{{kind: "ack"}},
			calls: calls{reserve: 1, dispatch: 1}},

		// woke late MaxLateTries times -> slot released, deferred (not an attempt): never sent late
		{name: "woke late every time, no room now: deferred, never sent", attempt: 2, late: time.Nanosecond, gate: []answer{allow(0)},
			want:  []settled{{kind: "defer", attempt: 2, after: redisRetry, why: "half of gate.margin"}},
			calls: calls{reserve: consumers.MaxLateTries, release: consumers.MaxLateTries, postpone: consumers.MaxLateTries}},
		{name: "woke late once, no room now: slot given back, asked again, sent", late: 100 * time.Millisecond,
			gate:  []answer{{v: gate.Verdict{Allowed: true}, block: 200 * time.Millisecond}, allow(0)},
			want:  []settled{{kind: "ack"}},
			calls: calls{reserve: 2, release: 1, dispatch: 1, postpone: 1}},
		// woke late -> sent now if the gate finds room there (Postpone), else slot released, asked again
		{name: "woke late, room now: postponed, sent, nothing given back", late: 100 * time.Millisecond, roomNow: true,
			gate:  []answer{{v: gate.Verdict{Allowed: true}, block: 200 * time.Millisecond}},
			want:  []settled{{kind: "ack"}},
			calls: calls{reserve: 1, dispatch: 1, postpone: 1}},
		// the move not acknowledged by the replicas -> given back by the gate, deferred (not an attempt): not sent
		{name: "woke late, the postponement not acknowledged: deferred, not sent", late: 100 * time.Millisecond, roomNow: true, attempt: 1,
			postpone: fmt.Errorf("gate: postpone acme/x: %w: 0 of 1 within 50ms", gate.ErrUnacknowledged),
			gate:     []answer{{v: gate.Verdict{Allowed: true}, block: 200 * time.Millisecond}},
			want:     []settled{{kind: "defer", attempt: 1, after: redisRetry, why: "not acknowledged"}},
			calls:    calls{reserve: 1, postpone: 1}},
		{name: "postponed into a pause announced meanwhile: released at the new slot", late: 100 * time.Millisecond, roomNow: true,
			gate: []answer{{v: gate.Verdict{Allowed: true}, block: 200 * time.Millisecond, during: func(w *consumers.Worker, v gate.Verdict) {
				w.NotePause("acme", v.Now.Add(90*time.Second)) // past the postponed slot (the fake clock's next second)
			}}},
			want:  []settled{{kind: "defer", after: 89 * time.Second, slack: 500 * time.Millisecond, why: "paused"}}, // from the new slot
			calls: calls{reserve: 1, release: 1, postpone: 1},
			check: func(t *testing.T, g *fakeGate, _ *fakeProvider) {
				if len(g.released) != 1 || !g.released[0].slot.Equal(g.clock) {
					t.Errorf("released %+v, want the postponed slot %v", g.released, g.clock)
				}
			}},
		{name: "a duplicate woke late: its entry is not released", late: time.Nanosecond,
			gate:  []answer{{v: gate.Verdict{Allowed: true, Duplicate: true}}},
			want:  []settled{{kind: "defer", after: redisRetry, why: "half of gate.margin"}},
			calls: calls{reserve: consumers.MaxLateTries}},

		// gate state lost under the slot -> slot given up, asked again (NoteLoss, NoteDisconnect)
		{name: "state lost under the slot (NoteLoss): asked again, sent",
			gate: []answer{{v: gate.Verdict{Allowed: true, Delay: 5 * time.Millisecond}, during: func(w *consumers.Worker, v gate.Verdict) {
				w.NoteLoss("acme", v.Now.Add(time.Millisecond))
			}}, allow(0)},
			want:  []settled{{kind: "ack"}},
			calls: calls{reserve: 2, release: 1, dispatch: 1}},
		{name: "watch disconnected under the slot (NoteDisconnect): asked again, sent",
			gate: []answer{{v: gate.Verdict{Allowed: true, Delay: 5 * time.Millisecond}, during: func(w *consumers.Worker, _ gate.Verdict) {
				w.NoteDisconnect(time.Now())
			}}, allow(0)},
			want:  []settled{{kind: "ack"}},
			calls: calls{reserve: 2, release: 1, dispatch: 1}},
		{name: "state lost under every slot: deferred, never sent",
			gate: []answer{{v: gate.Verdict{Allowed: true}, during: func(w *consumers.Worker, v gate.Verdict) {
				w.NoteLoss("acme", v.Now.Add(time.Millisecond))
			}}},
			want:  []settled{{kind: "defer", after: redisRetry, why: "lost under its reservation"}},
			calls: calls{reserve: consumers.MaxLateTries, release: consumers.MaxLateTries}},

		// live limits changed under the slot -> woken at once, slot given up, asked again (NoteLimits)
		{name: "live limits changed while it slept on its slot (NoteLimits): woken, given back, asked again, sent",
			gate:  []answer{relimited(), allow(0)},
			want:  []settled{{kind: "ack"}},
			calls: calls{reserve: 2, release: 1, dispatch: 1},
			check: func(t *testing.T, g *fakeGate, p *fakeProvider) {
				if g.released[0].slot != g.reserved[0].v.Slot() {
					t.Errorf("released slot %v, want the void one %v", g.released[0].slot, g.reserved[0].v.Slot())
				}
				if slept := p.at[0].Sub(g.reserved[0].answered); slept > 30*time.Second {
					t.Errorf("sent %v after the void slot's answer: it slept on the slot instead of waking", slept)
				}
			}},
		// cancelled -> acked, never sent (worker cancel)
		{name: "cancelled at the gate: acked as cancelled, never sent",
			gate:  []answer{{v: gate.Verdict{Cancelled: true}}},
			want:  []settled{{kind: "ack"}},
			calls: calls{reserve: 1, dispatch: 0}},
		{name: "cancelled while it slept on its slot (NoteCancel): woken, given back, asked again, acked as cancelled",
			gate: []answer{{v: gate.Verdict{Allowed: true, Delay: time.Minute}, during: func(w *consumers.Worker, _ gate.Verdict) {
				go func() { time.Sleep(20 * time.Millisecond); w.NoteCancel("acme", "pay-1") }()
			}}, {v: gate.Verdict{Cancelled: true}}},
			want:  []settled{{kind: "ack"}},
			calls: calls{reserve: 2, release: 1, dispatch: 0},
			check: func(t *testing.T, g *fakeGate, _ *fakeProvider) {
				if g.released[0].slot != g.reserved[0].v.Slot() {
					t.Errorf("released slot %v, want the cancelled one %v", g.released[0].slot, g.reserved[0].v.Slot())
				}
			}},
		{name: "told of a cancel too late (the gate lifted it): the slot stands, sent on it",
			tooLate: true,
			gate: []answer{{v: gate.Verdict{Allowed: true, Delay: 80 * time.Millisecond}, during: func(w *consumers.Worker, _ gate.Verdict) {
				go func() { time.Sleep(10 * time.Millisecond); w.NoteCancel("acme", "pay-1") }()
			}}},
			want:  []settled{{kind: "ack"}},
			calls: calls{reserve: 1, dispatch: 1},
			check: func(t *testing.T, g *fakeGate, p *fakeProvider) {
				if g.acks != 1 {
					t.Errorf("%d AckCancel calls, want 1", g.acks)
				}
				if sent := p.at[0].Sub(g.reserved[0].answered); sent < 70*time.Millisecond {
					t.Errorf("sent %v after its answer, before its slot 80ms ahead", sent)
				}
			}},
		{name: "cancelled while it slept on its slot, then redelivered: both settled as cancelled, neither sent",
			jobs: 2,
			gate: []answer{{v: gate.Verdict{Allowed: true, Delay: time.Minute}, during: func(w *consumers.Worker, _ gate.Verdict) {
				go func() { time.Sleep(20 * time.Millisecond); w.NoteCancel("acme", "pay-1") }()
			}}, {v: gate.Verdict{Cancelled: true}}},
			want:  []settled{{kind: "ack"}, {kind: "ack"}},
			calls: calls{dispatch: 0, reserve: 3, release: 1}},
		{name: "shadow mode: a cancelled job is settled as cancelled, never sent",
			shadow: true,
			gate:   []answer{{v: gate.Verdict{Cancelled: true}}},
			want:   []settled{{kind: "ack"}},
			calls:  calls{reserve: 1, dispatch: 0}},
		{name: "a cancel of another job leaves the slot standing",
			gate: []answer{{v: gate.Verdict{Allowed: true, Delay: 60 * time.Millisecond}, during: func(w *consumers.Worker, _ gate.Verdict) {
				go func() { time.Sleep(10 * time.Millisecond); w.NoteCancel("acme", "pay-2") }()
			}}},
			want:  []settled{{kind: "ack"}},
			calls: calls{reserve: 1, dispatch: 1}},
		{name: "a merchant's job: its merchant is asked for, and given back with a void slot",
			body:  []byte(`{"id":"pay-1","provider":"acme","amount":1,"currency":"EUR","cost":2,"merchant":"acct_1AbC"}`),
			gate:  []answer{relimited(), allow(0)},
			want:  []settled{{kind: "ack"}},
			calls: calls{reserve: 2, release: 1, dispatch: 1},
			check: func(t *testing.T, g *fakeGate, p *fakeProvider) {
				if g.reserved[0].merchant != "acct_1AbC" || g.reserved[1].merchant != "acct_1AbC" || g.released[0].merchant != "acct_1AbC" {
					t.Errorf("merchants asked for %q, %q, given back %q; want the job's", g.reserved[0].merchant, g.reserved[1].merchant, g.released[0].merchant)
				}
			}},
		{name: "live limits changed just before its decision, announced while it slept: the slot stands, sent at it",
			gate: []answer{{v: gate.Verdict{Allowed: true, Delay: 60 * time.Millisecond}, during: func(w *consumers.Worker, v gate.Verdict) {
				go func() { time.Sleep(10 * time.Millisecond); w.NoteLimits("acme", v.Now.Add(-time.Millisecond)) }()
			}}},
			want:  []settled{{kind: "ack"}},
			calls: calls{reserve: 1, dispatch: 1},
			check: func(t *testing.T, g *fakeGate, p *fakeProvider) {
				if early := g.reserved[0].answered.Add(60 * time.Millisecond).Sub(p.at[0]); early > 0 {
					t.Errorf("sent %v before its slot: the late announcement of an earlier change woke it", early)
				}
			}},
		{name: "live limits changed under every slot: deferred, never sent",
			gate: []answer{{v: gate.Verdict{Allowed: true, Delay: time.Millisecond}, during: func(w *consumers.Worker, v gate.Verdict) {
				w.NoteLimits("acme", v.Now.Add(time.Millisecond))
			}}},
			want:  []settled{{kind: "defer", after: redisRetry, why: "live limits changed"}},
			calls: calls{reserve: consumers.MaxLateTries, release: consumers.MaxLateTries}},

		// shadow mode -> the gate is asked and counted, the job goes at once whatever it says
		{name: "shadow: the gate would deny: sent at once", shadow: true, gate: []answer{deny(time.Minute)},
			want: []settled{{kind: "ack"}}, calls: calls{reserve: 1, dispatch: 1}},
		{name: "shadow: the gate would delay: sent at once, not at the slot", shadow: true, gate: []answer{allow(time.Minute)},
			want:  []settled{{kind: "ack"}},
			calls: calls{reserve: 1, dispatch: 1},
			check: func(t *testing.T, g *fakeGate, p *fakeProvider) {
				if waited := p.at[0].Sub(g.reserved[0].answered); waited > 30*time.Second {
					t.Errorf("sent %v after the answer: shadow mode slept on the slot", waited)
				}
			}},
		{name: "shadow: the gate is unreachable: sent anyway", shadow: true, gate: []answer{{err: errors.New("redis: connection refused")}},
			want: []settled{{kind: "ack"}}, calls: calls{reserve: 1, dispatch: 1}},
		{name: "shadow: 429: no pause, no margin report, unit released, deferred", shadow: true, provider: []error{throttled},
			want:  []settled{{kind: "defer", after: 2 * time.Second, why: "throttled"}},
			calls: calls{reserve: 1, dispatch: 1, release: 1}},

		// provider 2xx -> ack
		{name: "2xx: acked", want: []settled{{kind: "ack"}}, calls: calls{reserve: 1, dispatch: 1}},
		{name: "2xx on a slot ahead: sent at the slot, acked", gate: []answer{allow(20 * time.Millisecond)},
			want:  []settled{{kind: "ack"}},
			calls: calls{reserve: 1, dispatch: 1},
			check: func(t *testing.T, g *fakeGate, p *fakeProvider) {
				if early := g.reserved[0].answered.Add(20 * time.Millisecond).Sub(p.at[0]); early > 0 {
					t.Errorf("sent %v before its slot", early)
				}
			}},
		{name: "2xx for a duplicate (a redelivery): acked", attempt: 1, gate: []answer{{v: gate.Verdict{Allowed: true, Duplicate: true}}},
			want:  []settled{{kind: "ack"}}, // an ack carries no attempt
			calls: calls{reserve: 1, dispatch: 1}},

		// provider throttles (429) -> gate.Pause for the whole cluster, deferred (not an attempt)
		{name: "429: paused everywhere, unit released, deferred", attempt: 3, provider: []error{throttled},
			want:  []settled{{kind: "defer", attempt: 3, after: 2 * time.Second, why: "throttled"}},
			calls: calls{reserve: 1, dispatch: 1, pause: 1, release: 1, throttle: 1},
			check: func(t *testing.T, g *fakeGate, _ *fakeProvider) {
				if d := time.Until(g.paused[0]); d <= time.Second || d > 2*time.Second {
					t.Errorf("paused until %v from now, want about 2s", d)
				}
				if len(g.events) != 1 || !strings.HasSuffix(g.events[0], " "+gate.EventThrottled) {
					t.Errorf("events counted %q, want the 429", g.events)
				}
			}},
		{name: "429: the next job waits out the pause without asking the gate", jobs: 2, provider: []error{throttled},
			want: []settled{
				{kind: "defer", after: 2 * time.Second, why: "throttled"},
				{kind: "defer", after: 2 * time.Second, slack: time.Second, why: "paused"},
			},
			calls: calls{reserve: 1, dispatch: 1, pause: 1, release: 1, throttle: 1}},
		{name: "429 on a duplicate: paused, its entry not released", gate: []answer{{v: gate.Verdict{Allowed: true, Duplicate: true}}}, provider: []error{throttled},
			want:  []settled{{kind: "defer", after: 2 * time.Second, why: "throttled"}},
			calls: calls{reserve: 1, dispatch: 1, pause: 1}},

		// transient failure -> deferred by backoff; dead letter ("attempts-exhausted") at max_attempts
		{name: "transient: deferred by backoff, an attempt", provider: []error{serverError},
			want:  []settled{{kind: "defer", attempt: 1, after: backoffBase, slack: backoffBase, why: "503"}},
			calls: calls{reserve: 1, dispatch: 1}},
		{name: "transient, a retry: its own gate entry, a longer backoff", attempt: 2, provider: []error{serverError},
			want:  []settled{{kind: "defer", attempt: 3, after: 4 * backoffBase, slack: 4 * backoffBase, why: "503"}},
			calls: calls{reserve: 1, dispatch: 1},
			check: func(t *testing.T, g *fakeGate, _ *fakeProvider) {
				if id := g.reserved[0].id; id != consumers.GateID("pay-1", 2) {
					t.Errorf("reserved as %q, want the attempt's own id %q", id, consumers.GateID("pay-1", 2))
				}
			}},
		{name: "transient at max attempts: dead letter", attempt: maxAttempts - 1, provider: []error{serverError},
			want:  []settled{{kind: "dead", reason: consumers.ReasonExhausted, attempt: maxAttempts, why: "503"}},
			calls: calls{reserve: 1, dispatch: 1},
			check: func(t *testing.T, g *fakeGate, _ *fakeProvider) {
				if want := gate.EventDead + string(consumers.ReasonExhausted); len(g.events) != 1 || !strings.HasSuffix(g.events[0], " "+want) {
					t.Errorf("events counted %q, want %s", g.events, want)
				}
			}},

		// permanent failure (4xx) -> dead letter ("permanent")

		// in-flight cap (gate.Verdict.InFlight) -> waits for a lease to end (NoteLanded) or RetryAfter, within
		// max wait; the lease an admission holds is ended once the request ends, or when the job gives the
		// admission up
		{name: "in-flight cap full: waits, asks again, sent; its lease ended after the request",
			gate: []answer{full(10 * time.Millisecond), leased(0, "L")}, want: []settled{{kind: "ack"}},
			calls: calls{reserve: 2, dispatch: 1, land: 1},
			check: func(t *testing.T, g *fakeGate, p *fakeProvider) {
				if g.landed[0] != "L" || g.landedAt[0].Before(p.at[0]) {
					t.Errorf("landed %v at %v, dispatched at %v: want lease L ended after the request", g.landed, g.landedAt, p.at)
				}
			}},
		{name: "in-flight cap full beyond max wait: deferred, nothing held", gate: []answer{full(30 * time.Millisecond)},
			want:  []settled{{kind: "defer", after: 30 * time.Millisecond, why: "no slot within"}},
			calls: calls{reserve: 1}},
		{name: "a leased job woke late every time: deferred, each lease ended before asking again", late: time.Nanosecond, gate: []answer{leased(0, "L")},
			want:  []settled{{kind: "defer", after: redisRetry, why: "woke"}},
			calls: calls{reserve: 3, release: 3, land: 3, postpone: 3}},
		{name: "a leased job's request got no answer (a timeout): its lease is left to lapse, not ended",
			gate: []answer{leased(0, "L")}, provider: []error{fmt.Errorf("acme: %w", context.DeadlineExceeded)},
			want:  []settled{{kind: "defer", attempt: 1, after: backoffBase, slack: backoffBase, why: "deadline"}},
			calls: calls{reserve: 1, dispatch: 1}},
		{name: "a leased job answered 503: its lease ended", gate: []answer{leased(0, "L")}, provider: []error{serverError},
			want:  []settled{{kind: "defer", attempt: 1, after: backoffBase, slack: backoffBase, why: "503"}},
			calls: calls{reserve: 1, dispatch: 1, land: 1}},
		{name: "a leased job whose slot falls in a pause: deferred, its lease ended",
			gate: []answer{{v: gate.Verdict{Allowed: true, Delay: 20 * time.Millisecond, Lease: "L"},
				during: func(w *consumers.Worker, v gate.Verdict) { w.NotePause("acme", v.Slot().Add(time.Second)) }}},
			want:  []settled{{kind: "defer", after: time.Second, slack: 100 * time.Millisecond, why: "paused"}},
			calls: calls{reserve: 1, release: 1, land: 1}},
		{name: "permanent: dead letter", attempt: 1, provider: []error{refused},
			want:  []settled{{kind: "dead", reason: consumers.ReasonPermanent, attempt: 2, why: "422"}},
			calls: calls{reserve: 1, dispatch: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			answers := tt.gate
			if answers == nil {
				answers = []answer{allow(0)}
			}
			g := &fakeGate{answers: answers, clock: time.Unix(1_700_000_000, 0), roomNow: tt.roomNow, postponeErr: tt.postpone, tooLate: tt.tooLate}
			p := &fakeProvider{answers: tt.provider}
			inline := cmp.Or(tt.inline, maxInlineWait)
			w, err := consumers.New(consumers.Config{Concurrency: 1, MaxInlineWait: inline, MaxAttempts: maxAttempts,
				MaxDeferralAge: maxAge, ShutdownTimeout: time.Second, BackoffBase: backoffBase, BackoffMax: time.Minute,
				RedisRetry: redisRetry, LateLimit: tt.late, Providers: map[string]int64{"acme": 10}, Shadow: map[string]bool{"acme": tt.shadow}},
				g, map[string]consumers.Dispatcher{"acme": p}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			g.w = w
			b := memory.New(10, "acme")
			body := tt.body
			if body == nil {
				body = valid
			}
			jobs := max(tt.jobs, 1)
			for range jobs {
				if err := b.PublishAged("acme", body, tt.attempt, time.Now().Add(-tt.age)); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			deliveries, err := b.Consume(ctx, "acme")
			if err != nil {
				t.Fatal(err)
			}
			for range jobs {
				w.Handle(context.Background(), "acme", <-deliveries)
			}
			cancel()

			got := b.Settled()
			if len(got) != len(tt.want) {
				t.Fatalf("settled %+v, want %d settlements", got, len(tt.want))
			}
			for i, want := range tt.want {
				s := got[i]
				if s.Kind != want.kind || s.Reason != want.reason || s.Attempt != want.attempt {
					t.Errorf("delivery %d settled %s (reason %q, attempt %d), want %s (reason %q, attempt %d); why: %v",
						i, s.Kind, s.Reason, s.Attempt, want.kind, want.reason, want.attempt, s.Why)
				}
				if s.Kind == "defer" && (s.After > want.after || s.After < want.after-want.slack) {
					t.Errorf("delivery %d deferred by %v, want [%v, %v]", i, s.After, want.after-want.slack, want.after)
				}
				if want.why != "" && (s.Why == nil || !strings.Contains(s.Why.Error(), want.why)) {
					t.Errorf("delivery %d: why %v, want it to mention %q", i, s.Why, want.why)
				}
			}
			g.mu.Lock()
			defer g.mu.Unlock()
			p.mu.Lock()
			defer p.mu.Unlock()
			if c := (calls{reserve: len(g.reserved), release: len(g.released), pause: len(g.paused), throttle: g.throttles,
				sent: len(g.sent), dispatch: len(p.jobs), land: len(g.landed), postpone: len(g.postponed)}); c != tt.calls {
				t.Errorf("calls %+v, want %+v", c, tt.calls)
			}
			// Every reservation is the job's, for its attempt, at its cost and the max wait; every release
			// gives back a slot the gate handed out, at that cost.
			slots := map[time.Time]bool{}
			for _, r := range g.reserved {
				if r.id != consumers.GateID("pay-1", tt.attempt) || r.cost != 2 || r.maxWait != inline {
					t.Errorf("reserved %q cost %d max wait %v, want %q cost 2 max wait %v", r.id, r.cost, r.maxWait, consumers.GateID("pay-1", tt.attempt), inline)
				}
				slots[r.v.Slot()] = true
			}
			for _, at := range g.movedTo {
				slots[at] = true
			}
			for _, r := range g.released {
				if r.id != consumers.GateID("pay-1", tt.attempt) || r.cost != 2 || !slots[r.slot] {
					t.Errorf("released %q cost %d at %v: not a slot the gate handed out (%v)", r.id, r.cost, r.slot, slots)
				}
			}
			if tt.check != nil {
				tt.check(t, g, p)
			}
		})
	}
}

// A job held back by the in-flight cap asks again as soon as a lease ends (NoteLanded), not at its
// RetryAfter.
func TestInFlightWaitWakesOnLanding(t *testing.T) {
	g := &fakeGate{clock: time.Unix(1_700_000_000, 0)}
	stop, stopped := make(chan struct{}), make(chan struct{})
	defer func() { close(stop); <-stopped }()
	g.answers = []answer{{v: gate.Verdict{RetryAfter: 4 * time.Second, InFlight: true}, during: func(w *consumers.Worker, _ gate.Verdict) {
		go func() {
			defer close(stopped)
			for { // until the job waits (a landing before that wakes nobody) and is done
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
					w.NoteLanded("acme")
				}
			}
		}()
	}}, leased(0, "L")}
	p := &fakeProvider{}
	w, err := consumers.New(consumers.Config{Concurrency: 1, MaxInlineWait: 5 * time.Second, MaxAttempts: 5, MaxDeferralAge: time.Hour,
		ShutdownTimeout: time.Second, BackoffBase: time.Second, BackoffMax: time.Minute, RedisRetry: time.Second,
		Providers: map[string]int64{"acme": 10}}, g, map[string]consumers.Dispatcher{"acme": p}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	g.w = w
	b := memory.New(1, "acme")
	if err := b.PublishAged("acme", []byte(`{"id":"pay-1","provider":"acme","amount":1,"currency":"EUR"}`), 0, time.Now()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	deliveries, err := b.Consume(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	w.Handle(ctx, "acme", <-deliveries)
	// Not a timing benchmark: woken by the landing it asks again within tens of ms; without, after 4s.
	if took := time.Since(began); took >= 4*time.Second || len(p.jobs) != 1 || len(g.reserved) != 2 {
		t.Fatalf("took %v, %d dispatches, %d reservations: want woken by the landing, asked again, sent", took, len(p.jobs), len(g.reserved))
	}
}
