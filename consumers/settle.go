package consumers

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/job"
	"github.com/paygate/paygate/providers"
)

// settle settles the delivery by the provider's answer to its request, in one switch: accepted, acked;
// cut short by the shutdown, requeued; throttled, deferred past the pause (not an attempt); refused,
// dead-lettered; failed otherwise, deferred by backoff until the attempts run out.
func (w *Worker) settle(ctx context.Context, s *settlement, a *admission, answer *providers.Answer, err error) {
	s.answer = answer
	var (
		thr *providers.Throttled
		dec *providers.Declined
	)
	switch {
	case err == nil:
		s.ack(ctx, a.gateID)
	case errors.As(err, &dec):
		// An answer, final: the payment is declined. Not retried, not an operator's problem.
		s.declined(ctx, a.gateID, err)
	case ctx.Err() != nil:
		// The shutdown timeout cut the request short: the provider may or may not have it. Not a failed
		// attempt; the job goes back, and its idempotency key makes the retry safe.
		s.requeue(ctx)
	case errors.As(err, &thr):
		w.throttled(ctx, s, a, thr, err)
	case errors.Is(err, providers.ErrPermanent):
		s.attempt++
		s.deadLetter(ctx, ReasonPermanent, OutcomePermanent, err)
	default:
		s.attempt++
		if s.attempt >= w.cfg.MaxAttempts {
			s.deadLetter(ctx, ReasonExhausted, OutcomeExhausted, err)
			return
		}
		s.deferFor(ctx, Backoff(s.attempt, w.cfg.BackoffBase, w.cfg.BackoffMax), OutcomeTransient, err)
	}
}

// throttled settles a job the provider throttled (thr, within err): the provider refused the request
// without counting it, so it is not a failed attempt, and the job is deferred by the provider's
// Retry-After. Once every worker is paused, its unit goes back, so the retry's new request gets a new slot
// (a duplicate's entry may stand for an earlier request the provider did count). Releasing before the
// pause could hand the unit to another worker that sends into the throttle.
func (w *Worker) throttled(ctx context.Context, s *settlement, a *admission, thr *providers.Throttled, err error) {
	holds := !a.shadow && !w.cfg.Adaptive[a.provider] // shadow mode holds nothing back; a learned limit is cut instead
	if holds {
		w.pause(ctx, a.provider, thr.RetryAfter)
	}
	releasable := a.verdict.Allowed && a.verdict.Releasable()
	if releasable {
		_, _ = w.gate.ReleaseFor(ctx, a.provider, a.merchant, a.gateID, a.cost, a.slot)
	}
	if releasable && holds {
		// Sent on its slot, in time, and still too many for the provider: it counted the window with
		// requests arriving later than the margin allows for. The fleet widens it. (Not in shadow mode:
		// there the requests go whenever they come.)
		if st, err := w.gate.ReportThrottle(ctx, a.provider, w.id); err == nil {
			w.metrics.margin.WithLabelValues(a.provider).Set(st.Margin.Seconds())
		}
	}
	w.countEvent(ctx, a.provider, gate.EventThrottled)
	s.deferFor(ctx, thr.RetryAfter, OutcomeThrottled, err)
}

// countEvent counts event for provider at the gate; a failure is only logged at debug (the count is for
// the dashboard, never in a job's way).
func (w *Worker) countEvent(ctx context.Context, provider, event string) {
	if err := w.gate.CountEvent(ctx, provider, event); err != nil {
		w.log.Debug("event not counted", zap.String("provider", provider), zap.String("event", event), zap.Error(err))
	}
}

// settlement settles one delivery, exactly once, and writes the one line per settled job.
type settlement struct {
	w         *Worker
	d         Delivery
	provider  string
	class     job.Priority      // the class of the stream it arrived on (Route)
	job       *job.Job          // nil until decoded
	attempt   int               // transient failures so far; one more once this delivery's request failed
	admission *admission        // nil until decoded: the line's waited, admission and late
	answer    *providers.Answer // the provider's, when it answered: its result's response
}

// SettleTimeout bounds one settlement (an ack, or a copy published with confirms and then an ack).
const SettleTimeout = 10 * time.Second

// HoldBound is the longest a delivery can stay unacknowledged in a worker: it waits in the prefetch
// buffer behind ceil(prefetch/concurrency)-1 others, and each handling takes at most InlineWaits x
// MaxInlineWait in-process (MaxLateTries reservations and the waits after denials), the request (the
// provider's timeout) and a settlement. A broker that cancels consumers holding a delivery longer
// (RabbitMQ's consumer_timeout) must allow more.
func HoldBound(cfg Config, prefetch int, providerTimeout time.Duration) time.Duration {
	rounds := (max(prefetch, 1) + max(cfg.Concurrency, 1) - 1) / max(cfg.Concurrency, 1)
	return time.Duration(rounds) * (InlineWaits*cfg.MaxInlineWait + providerTimeout + SettleTimeout)
}

// InlineWaits bounds a handling's time in-process in units of MaxInlineWait: MaxLateTries reservations,
// one MaxInlineWait of waits after denials whose slot was just beyond it, and one of a not_before held
// in-process (untilNotBefore).
const InlineWaits = MaxLateTries + 2

// settleCtx outlives a shutdown's cancellation briefly, so that a finished job is still settled.
func settleCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), SettleTimeout)
}

// ack settles a job the provider accepted; gid is its entry at the gate.
func (s *settlement) ack(ctx context.Context, gid string) {
	s.acknowledge(ctx, gid, OutcomeSucceeded, ResultSucceeded, nil)
}

// declined settles a job the provider declined (why): an answer, acknowledged like an acceptance.
func (s *settlement) declined(ctx context.Context, gid string, why error) {
	s.acknowledge(ctx, gid, OutcomeDeclined, ResultDeclined, why)
}

// acknowledge settles a job the provider answered for good, once its result is published. With results
// on, that runs in the background (Worker.inBackground): the handler takes its next delivery while the
// broker confirms the result, and the delivery is acknowledged after it all the same.
func (s *settlement) acknowledge(ctx context.Context, gid string, outcome Outcome, result string, why error) {
	if s.w.cfg.Results != nil {
		s.w.inBackground(func() { s.acknowledgeNow(ctx, gid, outcome, result, why) })
		return
	}
	s.acknowledgeNow(ctx, gid, outcome, result, why)
}

func (s *settlement) acknowledgeNow(ctx context.Context, gid string, outcome Outcome, result string, why error) {
	ctx, cancel := settleCtx(ctx)
	defer cancel()
	if !s.record(ctx, result, "", s.attempt+1) {
		s.unrecorded(ctx, gid)
		return
	}
	// Accepted but not settled, the job comes again. Telling the gate makes that redelivery a plain
	// duplicate of a request the provider counted, rather than one moved to spend a new unit.
	sent := func(ctx context.Context) { _ = s.w.gate.Sent(ctx, s.provider, gid) }
	if u, ok := s.d.(Unconfirmed); ok {
		u.OnLostAck(func() {
			go func() { // the broker's goroutine must not wait on Redis
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				sent(ctx)
			}()
		})
	}
	err := s.d.Ack(ctx)
	if err != nil {
		sent(ctx)
	}
	s.done(outcome, err, why)
}

func (s *settlement) deferFor(ctx context.Context, after time.Duration, outcome Outcome, why error) {
	ctx, cancel := settleCtx(ctx)
	defer cancel()
	s.done(outcome, s.d.Defer(ctx, after, s.attempt, why), why, zap.Duration("retry_after", after))
}

func (s *settlement) deadLetter(ctx context.Context, reason Reason, outcome Outcome, why error) {
	ctx, cancel := settleCtx(ctx)
	defer cancel()
	if !s.record(ctx, ResultDead, string(reason), s.attempt) {
		s.unrecorded(ctx, "")
		return
	}
	err := s.d.DeadLetter(ctx, reason, s.attempt, why)
	if err == nil {
		s.w.countEvent(ctx, s.provider, gate.EventDead+string(reason))
	}
	s.done(outcome, err, why, zap.String("reason", string(reason)))
}

func (s *settlement) requeue(ctx context.Context) {
	ctx, cancel := settleCtx(ctx)
	defer cancel()
	s.done(OutcomeRequeued, s.d.Requeue(ctx), nil)
}

// done counts the settlement and writes its line.
func (s *settlement) done(outcome Outcome, settleErr, why error, extra ...zap.Field) {
	if a := s.admission; a != nil && !a.sent.IsZero() && s.job != nil {
		s.w.journal(s.provider, s.job.ID, a.sent, outcome) // how the handling of its request ended
	}
	s.w.metrics.jobs.WithLabelValues(s.provider, string(outcome)).Inc()
	s.w.metrics.classJobs.WithLabelValues(s.provider, string(s.class), string(outcome)).Inc()
	if named, fair := s.w.cfg.Fair[s.provider]; fair {
		s.w.metrics.merchantJobs.WithLabelValues(s.provider, merchantLabel(named, s.job), string(outcome)).Inc()
	}
	var waited, late time.Duration // before the job is decoded: nothing waited, no admission, not late
	var decision Decision
	if a := s.admission; a != nil {
		waited, decision, late = a.waited, a.decision, a.late
	}
	fields := append([]zap.Field{
		zap.String("provider", s.provider),
		zap.String("outcome", string(outcome)),
		zap.Duration("waited", waited),
		zap.String("admission", string(decision)),
		zap.Duration("late", late),
		zap.Int("attempt", s.attempt),
	}, extra...)
	if s.job != nil {
		fields = append(fields, zap.String("job", s.job.ID))
	}
	if why != nil {
		fields = append(fields, zap.String("error", truncate(why.Error(), 300)))
	}
	if settleErr != nil {
		// The broker redelivers it; duplicate admission and the idempotency key absorb the repeat.
		s.w.log.Warn("job not settled; the broker will redeliver it", append(fields, zap.NamedError("settle_error", settleErr))...)
		return
	}
	if outcome == OutcomeGateError { // counted by gateUnreachable's warning, once per 10s
		s.w.log.Debug("job settled", fields...)
		return
	}
	s.w.log.Info("job settled", fields...)
}

// merchantLabel is a job's merchant as paygate_merchant_jobs_total names it: a merchant named in the
// configuration (named), job.MerchantOther, or job.MerchantNone (no merchant, or no job).
func merchantLabel(named map[string]int, j *job.Job) string {
	if j == nil || j.Merchant == "" {
		return job.MerchantNone
	}
	if _, ok := named[j.Merchant]; ok {
		return j.Merchant
	}
	return job.MerchantOther
}
