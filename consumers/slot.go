package consumers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/paygate/paygate/gate"
)

// slotState is what a job finds of its slot as it wakes on it (wake).
type slotState int

const (
	// slotStands: not voided, and woken within the late limit: the job is sent on it.
	slotStands slotState = iota
	// slotLate: woken more than LateLimit after it. Sent now, the job could land within a window of a job
	// sent on time one window later.
	slotLate
	// slotLost: the gate's state was lost (a Redis restart) while the job slept on its slot, or the watch
	// lost its connection and may have missed the announcement. The state in force does not know the slot
	// and may give it to another job. Not sent: asked again, the job meets the warm-up, which waits for
	// this moment (Limiter.Watch, LossNotice).
	slotLost
	// slotRelimited: the provider's live limits changed while the job slept on a slot decided under the
	// old ones. Sent, it could put the provider over the new limits.
	slotRelimited
	// slotCancelled: the job was cancelled while it held the slot, and the cancel waits for it (NoteCancel,
	// givesUp). Not sent: given up and asked again, it is denied as cancelled.
	slotCancelled
)

// sleepOnSlot sleeps until the admission's slot, or until the provider's live limits change to ones the
// slot was not decided under (NoteLimits; at once if that happened already): the slot is void then
// (wake). A change it was decided after (its announcement came late) does not cut the sleep short: the
// slot stands. Told that the job was cancelled (NoteCancel), it asks the gate whether the cancel waits for
// it (givesUp): yes, and the sleep ends, the slot to be given up (a.cancelled); no, and it sleeps on.
// False when ctx ended.
//
// Redis chose the slot at its "now", somewhere between asking and the answer: sleeping Delay from the
// answer is never early. (The timer runs on the real clock, not the worker's.)
func (w *Worker) sleepOnSlot(ctx context.Context, a *admission) bool {
	v := a.verdict
	if v.Delay <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(v.Delay)
	defer t.Stop()
	told, leave := w.cancels.sleep(a.provider, gate.OwnID(a.gateID))
	defer leave()
	for {
		changed, next := w.signals.nextLimits(a.provider, v.Now)
		if changed {
			return ctx.Err() == nil // void: given up and asked again
		}
		select {
		case <-t.C:
			return true
		case <-next: // a change: void for this slot only if it was decided before it (asked above)
		case <-told:
			if a.cancelled = w.givesUp(ctx, a); a.cancelled {
				return ctx.Err() == nil // given up (wake)
			}
			told = nil // too late: the cancel was lifted, the slot stands
		case <-ctx.Done():
			return false
		}
	}
}

// wake reads the slot as the job wakes on it: whether the fleet voided it meanwhile (lost, relimited:
// signals), else whether the job woke too late to use it. It records the lateness of a slot the limits
// did not void (a void one was never to be used).
func (w *Worker) wake(a *admission) slotState {
	v := a.verdict
	lost, relimited := w.signals.void(a.provider, v.Now, a.asked)
	a.answeredDue = a.answered.Add(v.Delay)
	if a.cancelled {
		return slotCancelled // woken before its slot: no lateness to record
	}
	if !relimited {
		now := w.now()
		// Lateness counts from the earliest the slot can be (asking + Delay), so that a slow round trip to
		// Redis counts in full. Asking is when the call that decided the slot left (gate.Verdict.Asked),
		// where the gate says: a job that waited for a call to carry it (a batch) was not late while it
		// waited, since its slot was not decided yet.
		decided := a.asked // the latest moment known before Redis decided the slot
		if v.Asked.After(decided) {
			decided = v.Asked
		}
		a.late = now.Sub(decided.Add(v.Delay))
		w.metrics.lateness.WithLabelValues(a.provider).Observe(a.late.Seconds())
		if v.Delay > 0 {
			// The fleet's margin follows how late processes wake, which is what a wider margin absorbs:
			// the lateness counted from the answer, without the round trip to Redis (a slow Redis is a
			// matter for the late limit, not for the margin).
			w.late[a.provider].add(now.Sub(a.answeredDue), now)
		}
	}
	switch {
	case lost:
		return slotLost
	case relimited:
		return slotRelimited
	case w.cfg.LateLimit > 0 && a.late > w.cfg.LateLimit:
		return slotLate
	default:
		return slotStands
	}
}

// postpone moves the admission of a job that woke too late to use its slot to now, if the gate finds
// room for the unit there (every window the move reaches): true when moved, and the job goes now. Given
// back instead, the unit would be lost to the window whenever later slots were handed out meanwhile, as
// they usually are.
func (w *Worker) postpone(ctx context.Context, a *admission) (bool, error) {
	at, err := w.gate.Postpone(ctx, a.provider, a.merchant, a.gateID, a.slot)
	if err != nil || at.IsZero() {
		return false, err
	}
	w.metrics.decided(a.provider, DecisionPostponed)
	a.slot, a.answeredDue = at, w.now()
	return true, nil
}

// giveUp gives back a slot the job cannot use (state), so that the log records what the provider sees,
// and ends its lease: true when the job is to ask again; false when the delivery was settled (the gate
// could not take the slot back, or this was the last of MaxLateTries slots).
//
// A duplicate's or a moved job's entry is not the job's to release: a duplicate's may stand for a request
// the first delivery sent, a moved one's for whichever of its requests the provider counts. Asking again
// moves it to a new slot in one step (it is stale now: the gate's StaleAfter is margin/2).
func (w *Worker) giveUp(ctx context.Context, s *settlement, a *admission, state slotState, try int) bool {
	a.cancelled = false
	switch state {
	case slotLost:
		w.metrics.decided(a.provider, DecisionLost)
	case slotRelimited:
		w.metrics.decided(a.provider, DecisionRelimited)
	case slotCancelled:
		w.metrics.decided(a.provider, DecisionCancelled)
	default:
		w.metrics.decided(a.provider, DecisionLate)
	}
	if a.verdict.Releasable() {
		if _, err := w.gate.ReleaseFor(ctx, a.provider, a.merchant, a.gateID, a.cost, a.slot); err != nil {
			w.gateUnreachable(ctx, s, err)
			return false
		}
	}
	w.land(ctx, a)                                    // given up: asking again takes a lease of its own
	if try < MaxLateTries || state == slotCancelled { // a cancel's next reserve is its end
		return true
	}
	switch state {
	case slotLost:
		s.deferFor(ctx, w.cfg.RedisRetry, OutcomeLost, errors.New("the gate's state was lost under its reservation repeatedly"))
	case slotRelimited:
		s.deferFor(ctx, w.cfg.RedisRetry, OutcomeRelimited, errors.New("the provider's live limits changed under its reservation repeatedly"))
	default:
		// Still late after re-reserving: this process cannot keep within the margin now (a starved CPU, a
		// slow Redis). Sending late could exceed the provider's limit, which is never done: the job goes
		// back to the broker for a while (not an attempt), and the log says why.
		w.lateLog.Warn(w.log, w.now(), "woke later than gate.margin/2 after repeated re-reservations: job deferred; raise gate.margin or give the worker more CPU",
			zap.String("provider", a.provider), zap.Duration("late", a.late), zap.Duration("limit", w.cfg.LateLimit))
		s.deferFor(ctx, w.cfg.RedisRetry, OutcomeLate, fmt.Errorf("woke %s after its slot %d times, more than half of gate.margin (%s)", a.late.Round(time.Microsecond), try, w.cfg.LateLimit))
	}
	return false
}

// clearOfPauses holds back a job that may not go on its slot: this process paused the provider after a
// throttle while the job slept, or another worker was throttled after this slot was handed out and the
// slot lies inside its pause (NotePause: the pause's end and the slot both on the Redis clock; shadow mode
// holds nothing back for it). The unused slot is given back (best effort), and the job deferred past the
// pause (not an attempt). True when the job may go.
func (w *Worker) clearOfPauses(ctx context.Context, s *settlement, a *admission) bool {
	wait := w.pausedFor(a.provider)
	if held := w.signals.announcedUntil(a.provider).Sub(a.slot); held > wait && !a.shadow {
		wait = held
	}
	if wait <= 0 {
		return true
	}
	if a.verdict.Releasable() {
		_, _ = w.gate.ReleaseFor(ctx, a.provider, a.merchant, a.gateID, a.cost, a.slot)
	}
	s.deferFor(ctx, wait, OutcomePaused, errPaused)
	return false
}
