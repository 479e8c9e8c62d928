package consumers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/paygate/paygate/gate"
)

// GateID is a job's member in the gate's log for one attempt (transient failures so far). A retry after a
// failed request takes a unit of its own: the provider may have counted the failed request (a 5xx or a
// timeout says nothing certain), and the retry is a new request at a new time, which the entry of the
// failed one, at its old slot, would not cover. Redeliveries of the same attempt (a crash, a lost ack)
// share the id, so the gate admits them as duplicates. Job ids have no control characters, so the
// separator cannot collide with another job's id.
func GateID(jobID string, attempt int) string {
	if attempt == 0 {
		return jobID
	}
	return jobID + "\x1f" + strconv.Itoa(attempt)
}

// MaxLateTries bounds how many slots a job asks for in one handling: a slot it cannot use (it woke late,
// or the fleet voided it: lost, relimited) is given back and another asked for, up to this many; then
// the job is deferred, never sent late.
const MaxLateTries = 3

// admit brings the job to a slot it may be sent on, or settles the delivery (false). A provider this
// process paused is not asked. Otherwise the job reserves a slot (reserve), sleeps until it (sleepOnSlot)
// and checks it on waking (wake): a slot it woke too late for is moved to now where the gate finds room
// (postpone); one it cannot use is given back and another asked for, MaxLateTries times at most
// (giveUp). In shadow mode the gate is asked once and nothing waits: the job goes whatever the answer.
func (w *Worker) admit(ctx context.Context, s *settlement, a *admission) bool {
	if wait := w.pausedFor(a.provider); wait > 0 {
		s.deferFor(ctx, wait, OutcomePaused, errPaused)
		return false
	}
	if a.shadow {
		w.shadowProbe(ctx, a)
		return w.shadowDecide(ctx, s, a)
	}
	for try := 1; ; {
		if !w.breakerLets(ctx, s, a) || !w.reserve(ctx, s, a) {
			return false
		}
		if w.breakerHolds(ctx, a) {
			continue // its slot given back: it waits for the breaker (breaker.go), not a try
		}
		if !w.sleepOnSlot(ctx, a) {
			s.requeue(ctx) // shutting down: the slot is forfeited, the job goes back untouched
			return false
		}
		state := w.wake(a)
		if state == slotStands && w.breakerHolds(ctx, a) {
			continue
		}
		if state == slotStands {
			return true
		}
		if state == slotLate && a.verdict.Releasable() {
			moved, err := w.postpone(ctx, a)
			if errors.Is(err, gate.ErrUnacknowledged) {
				// Moved, but not on enough replicas to survive a failover: given back by the gate, not sent.
				w.unacknowledged(ctx, s, err)
				return false
			}
			if moved {
				return true
			}
		}
		if !w.giveUp(ctx, s, a, state, try) {
			return false
		}
		try++
	}
}

// reserve asks the gate for a slot within max wait and reads the answer (admitted): true when the job
// holds one, otherwise the delivery is settled.
//
// Denied, but the slot only just beyond max wait, the job waits here and asks again rather than go round
// a delay tier: a deferral costs a broker round trip, and frees the handler to take the next job only to
// be denied too, so that a backlog deeper than max wait would go round the tiers whole. These waits total
// at most MaxInlineWait in a handling. Held back by the in-flight cap, the job asks again as soon as a
// lease ends, or after RetryAfter (waitDenied).
func (w *Worker) reserve(ctx context.Context, s *settlement, a *admission) bool {
	if a.low { // one low job of the provider asks at a time (priority.go)
		leave, ok := w.enterLane(ctx, a)
		if !ok {
			s.requeue(ctx)
			return false
		}
		defer leave()
	}
	err := w.ask(ctx, a)
	for err == nil && !a.verdict.Allowed && !a.verdict.Cancelled && a.denied+a.verdict.RetryAfter <= w.cfg.MaxInlineWait {
		w.metrics.decided(a.provider, DecisionDenied)
		began := w.now()
		if !w.waitDenied(ctx, a.provider, a.verdict, a.low) {
			s.requeue(ctx) // shutting down: the job goes back untouched
			return false
		}
		waited := w.now().Sub(began)
		a.denied += waited
		a.waited += waited
		err = w.ask(ctx, a)
	}
	return w.admitted(ctx, s, a, err)
}

// ask makes one ReserveFor for the admission, and notes when it left and when its answer came.
func (w *Worker) ask(ctx context.Context, a *admission) error {
	a.asked = w.now()
	maxWait := w.cfg.MaxInlineWait
	if a.low {
		maxWait = w.cfg.LowHorizon
	}
	w.metrics.classCalls.WithLabelValues(a.provider, string(a.class)).Inc()
	v, err := w.gate.ReserveFor(ctx, a.provider, a.merchant, a.gateID, a.cost, maxWait)
	a.answered = w.now()
	a.verdict = v
	return err
}

// waitDenied waits out a denial: its RetryAfter, or for a job held back by the in-flight cap, until a
// lease of the provider ends if that comes first. False when ctx ended. (Its timers run on the real
// clock, not the worker's.)
func (w *Worker) waitDenied(ctx context.Context, provider string, v gate.Verdict, low bool) bool {
	if !v.InFlight && low {
		return Sleep(ctx, v.RetryAfter+w.laneStride()) // the lane's next jobs take what opened meanwhile
	}
	if !v.InFlight {
		return Sleep(ctx, v.RetryAfter)
	}
	landed, leave := w.signals.awaitLanding(provider)
	defer leave()
	t := time.NewTimer(v.RetryAfter)
	defer t.Stop()
	select {
	case <-landed:
	case <-t.C:
	case <-ctx.Done():
		return false
	}
	return true
}

// admitted reads the gate's answer (err, or a.verdict): true means the job holds a slot; otherwise the
// delivery is settled.
func (w *Worker) admitted(ctx context.Context, s *settlement, a *admission, err error) bool {
	v := a.verdict
	switch {
	case err != nil && errors.Is(err, gate.ErrInvalid):
		w.metrics.decided(a.provider, DecisionError)
		s.deadLetter(ctx, ReasonInvalid, OutcomeInvalid, err)
		return false
	case errors.Is(err, gate.ErrUnacknowledged):
		// Admitted, but not yet on enough replicas to survive a failover: given back, sent later.
		w.unacknowledged(ctx, s, err)
		return false
	case err != nil:
		// Fail closed: without the gate nothing is dispatched.
		w.metrics.decided(a.provider, DecisionError)
		w.gateUnreachable(ctx, s, err)
		return false
	case v.Cancelled:
		w.outage.answered()
		w.metrics.decided(a.provider, DecisionCancelled)
		s.cancelled(ctx)
		return false
	case !v.Allowed:
		w.outage.answered()
		w.metrics.decided(a.provider, DecisionDenied)
		s.deferFor(ctx, v.RetryAfter, OutcomeDeferred, fmt.Errorf("gate: no slot within %s (policy %s)", w.cfg.MaxInlineWait, v.Limit))
		return false
	case v.Duplicate:
		a.decision = DecisionDuplicate
	case v.Moved:
		a.decision = DecisionRedelivered
	case v.Delay > 0:
		a.decision = DecisionReserved
	default:
		a.decision = DecisionAllowed
	}
	w.outage.answered()
	w.metrics.decided(a.provider, a.decision)
	w.metrics.gateWait.WithLabelValues(a.provider).Observe(v.Delay.Seconds())
	a.waited += v.Delay
	a.lease, a.slot = v.Lease, v.Slot()
	return true
}

// gateUnreachable defers a job the gate could not answer, for longer as the outage lasts (gateOutage). Its
// settled line is a debug one: the warning, once per 10s, says how many it stands for.
func (w *Worker) gateUnreachable(ctx context.Context, s *settlement, err error) {
	now := w.now()
	w.redisLog.Warn(w.log, now, "gate unreachable: deferring jobs", zap.String("provider", s.provider), zap.Error(err))
	s.deferFor(ctx, w.outageRetry(now), OutcomeGateError, err)
}

// unacknowledged defers a job whose admission, or its move (Postpone), the replicas did not acknowledge
// (redis.min_replicas_acked): the gate gave it back, and the job goes later.
func (w *Worker) unacknowledged(ctx context.Context, s *settlement, err error) {
	w.metrics.decided(s.provider, DecisionUnacknowledged)
	w.redisLog.Warn(w.log, w.now(), "admissions not acknowledged by the replicas: deferring jobs", zap.String("provider", s.provider), zap.Error(err))
	s.deferFor(ctx, w.cfg.RedisRetry, OutcomeUnacknowledged, err)
}

// shadowDecide is shadow mode's decision: the gate is asked as in enforce mode (a slot within max wait)
// and its answer is counted (would_delay: an enforcing worker would have slept on the slot; would_deny: it
// would have deferred the job), but the job goes now whatever the answer, a gate error included. An
// admission stays in the gate's state, where it counts against the jobs after it, as it would have. The
// admission keeps the verdict (its lease, for the in-flight cap) only when the gate admitted the job. A
// job the gate denies as cancelled is settled so (false): an operator's cancel binds shadow mode too.
func (w *Worker) shadowDecide(ctx context.Context, s *settlement, a *admission) bool {
	v, err := w.gate.ReserveFor(ctx, a.provider, a.merchant, a.gateID, a.cost, w.cfg.MaxInlineWait)
	switch {
	case err == nil && v.Cancelled: // an operator's cancel binds shadow mode too
		w.metrics.decided(a.provider, DecisionCancelled)
		s.cancelled(ctx)
		return false
	case err != nil && errors.Is(err, gate.ErrInvalid):
		w.metrics.decided(a.provider, DecisionError)
		return true
	case err != nil:
		w.metrics.decided(a.provider, DecisionError)
		w.redisLog.Warn(w.log, w.now(), "gate unreachable; shadow mode sends jobs anyway", zap.String("provider", a.provider), zap.Error(err))
		return true
	case !v.Allowed:
		w.metrics.decided(a.provider, DecisionWouldDeny)
		return true
	case v.Delay > 0 && !v.Duplicate:
		w.metrics.decided(a.provider, DecisionWouldDelay)
	case v.Duplicate:
		w.metrics.decided(a.provider, DecisionDuplicate)
	default:
		w.metrics.decided(a.provider, DecisionAllowed)
	}
	a.verdict, a.lease, a.slot = v, v.Lease, v.Slot()
	return true
}
