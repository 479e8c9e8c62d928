package consumers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/job"
)

// Handle takes one delivery of provider's stream from decoding to settlement, in steps that each have a
// method: decode the job (handle.go); admit it, a slot at the gate it wakes on in time (admit.go, and
// slot.go for the sleep and the wake-up); hold the slot clear of any pause; send it (send.go); settle the
// delivery by the provider's answer (settle.go). A step that settles the delivery itself returns false,
// and the handling ends there.
func (w *Worker) Handle(ctx context.Context, provider string, d Delivery) {
	w.handle(ctx, provider, job.Normal, d)
}

// handle is Handle for a delivery of the provider's class's stream (Route).
func (w *Worker) handle(ctx context.Context, provider string, class job.Priority, d Delivery) {
	w.metrics.inflight.WithLabelValues(provider).Inc()
	defer w.metrics.inflight.WithLabelValues(provider).Dec()
	s := &settlement{w: w, d: d, provider: provider, class: class, attempt: d.Attempt()}
	j, ok := w.decode(ctx, s)
	if !ok || !w.untilNotBefore(ctx, s, j) {
		return
	}
	a := w.newAdmission(provider, j, s.attempt)
	s.admission = a
	defer w.land(ctx, a) // a lease still held as the handling ends belongs to an admission given up
	if !w.admit(ctx, s, a) || !w.clearOfPauses(ctx, s, a) {
		return
	}
	answer, err := w.send(ctx, a, j)
	if w.breakerAnswered(ctx, s, a, err) {
		return // the breaker's probe failed: deferred until the next probe, not an attempt
	}
	w.settle(ctx, s, a, answer, err)
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// decode reads the job of the delivery. A message that is no valid job, or a job on another provider's
// queue, is dead-lettered; so is a job first seen longer ago than max_deferral_age. False when the
// delivery was settled.
func (w *Worker) decode(ctx context.Context, s *settlement) (*job.Job, bool) {
	j, err := job.DecodeFor(s.d.Body(), w.cfg.Providers, w.cfg.Endpoints)
	if err == nil && j.Provider != s.provider {
		err = &job.InvalidError{Field: "provider", Msg: fmt.Sprintf("%q arrived on the queue of %s", j.Provider, s.provider)}
	}
	if err == nil && j.Class() != s.class {
		err = &job.InvalidError{Field: "priority", Msg: fmt.Sprintf("%q arrived on the queue of %s (%s)", j.Class(), Route(s.provider, s.class), s.class)}
	}
	if err != nil {
		s.deadLetter(ctx, ReasonInvalid, OutcomeInvalid, err)
		return nil, false
	}
	s.job = j
	// A job's life counts from when it may go: first seen, or its not_before when that is later.
	if age := w.now().Sub(latest(s.d.FirstSeen(), j.NotBefore)); age > w.cfg.MaxDeferralAge {
		s.deadLetter(ctx, ReasonDeferralAge, OutcomeTooOld, fmt.Errorf("first seen (or not before) %s ago, more than max_deferral_age %s", age.Round(time.Second), w.cfg.MaxDeferralAge))
		return nil, false
	}
	return j, true
}

// errPaused is why a job is deferred past a pause of its provider.
var errPaused = errors.New("provider paused after a throttle")

// admission is one job's standing at the gate, from its first ReserveFor to its request: what it asks
// for, the gate's latest answer, and what the worker has learned of that answer's slot. One per
// handling; Handle's steps read and update it.
type admission struct {
	// What the job asks for.
	provider string
	merchant string // "" for none
	gateID   string // the job's member in the gate's log for this attempt (GateID)
	cost     int64
	shadow   bool // the provider is in shadow mode: the gate is asked and counted, nothing waits
	class    job.Priority
	low      bool // a low job: it asks within LowHorizon, through its provider's lane (priority.go)
	probe    bool // the job holds its provider's breaker's probe (breaker.go): it goes through the hold
	// cancelled: told of a cancel while it slept on its slot, the job said it will not send (givesUp)
	cancelled bool

	// The gate's answer.
	verdict  gate.Verdict // the latest (zero in shadow mode when the gate denied or failed)
	asked    time.Time    // when the call that brought it left (the worker's clock)
	answered time.Time    // when it came back (the worker's clock)
	// slot is where the admission stands on the Redis clock: the verdict's slot, or where the gate moved
	// it (Postpone, Departed).
	slot time.Time
	// answeredDue is the slot as the answer put it, on the worker's clock (answered + Delay, or the
	// moment of a Postpone): what a late write counts from.
	answeredDue time.Time
	// lease is the in-flight lease the admission holds (gate.Verdict.Lease; "" for none), ended when the
	// request ends or when the job gives its admission up (woken late, paused, lost, shutting down), and
	// left to lapse when the request got no answer.
	lease string

	// What the job's settled line says of it.
	decision Decision      // the gate's last answer: allowed, reserved, duplicate, redelivered ("" in shadow mode)
	waited   time.Duration // in-process, on slots and after denials
	denied   time.Duration // the part of waited after denials: at most MaxInlineWait per handling
	late     time.Duration // how long after its slot the job woke (its request started)
	sent     time.Time     // when its request started (the worker's clock), for its result
}

// newAdmission is the admission a job of provider asks for on this attempt.
func (w *Worker) newAdmission(provider string, j *job.Job, attempt int) *admission {
	return &admission{provider: provider, merchant: j.Merchant, gateID: GateID(j.ID, attempt), cost: j.Cost,
		shadow: w.cfg.Shadow[provider], class: j.Class(), low: j.Class() == job.Low && w.cfg.LowHorizon > 0}
}

// landTimeout bounds Land on the way to settling a job: best effort, since a lease lapses by itself.
const landTimeout = 2 * time.Second

// land ends the admission's in-flight lease, if it holds one (best effort: a lease not ended lapses by
// itself after the provider's timeout plus a slack, holding one of the cap's places meanwhile).
func (w *Worker) land(ctx context.Context, a *admission) {
	if a.lease == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), landTimeout)
	defer cancel()
	if err := w.gate.Land(ctx, a.provider, a.lease); err != nil {
		w.redisLog.Warn(w.log, w.now(), "could not end an in-flight lease: it lapses by itself", zap.String("provider", a.provider), zap.Error(err))
	}
	a.lease = ""
}
