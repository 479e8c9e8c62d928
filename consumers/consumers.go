// Package consumers is the worker core: for each delivery it decodes the job, reserves a slot at the gate,
// sleeps until the slot, dispatches to the provider, and settles the delivery. It owns the small interfaces
// it needs and knows neither the broker behind them (consumers/rabbitmq, consumers/kafka, an in-memory
// one) nor Redis.
//
// What happens to a job:
//
//	invalid message                  -> dead letter (reason "invalid")
//	older than max_deferral_age      -> dead letter ("deferral-age")
//	gate denies (slot > max wait)    -> waits RetryAfter in-process and asks again while those waits
//	                                    total at most max wait; then deferred by RetryAfter (not an attempt)
//	in-flight cap full (InFlight)    -> as a denial, but asks again as soon as a lease ends (NoteLanded);
//	                                    the lease an admission takes is ended (Land) once its request ends
//	                                    or the job gives the admission up
//	gate unreachable                 -> deferred (fail closed, never dispatched unguarded)
//	admission not on enough replicas -> given back, deferred (redis.min_replicas_acked; ErrUnacknowledged)
//	slot inside a pause announced    -> deferred past the pause, slot released (not an attempt)
//	  since it was reserved (NotePause)
//	woke late                        -> sent now if the gate finds room there (Postpone), else slot
//	                                    released, asked again
//	woke late MaxLateTries times     -> slot released, deferred (not an attempt): never sent late
//	written past DepartLimit         -> sent; its slot moved to when it left (gate.Departed), as it is
//	  (stalled after the wake-up)         written (TestLateWriteIsRecordedWhereItWent)
//	gate state lost under the slot   -> slot given up, asked again (NoteLoss, NoteDisconnect)
//	live limits changed under it     -> woken at once, slot given up, asked again under the new limits
//	                                    (NoteLimits)
//	provider 2xx                     -> ack
//	provider throttles (429)         -> gate.Pause for the whole cluster, deferred (not an attempt)
//	transient failure                -> deferred by backoff; dead letter ("attempts-exhausted") at max_attempts
//	permanent failure (4xx)          -> dead letter ("permanent")
package consumers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/job"
	"github.com/paygate/paygate/providers"
)

// Broker is what the core needs from a queue: one stream of deliveries per provider. The stream ends
// (the channel closes) after ctx is done and the broker has stopped consuming; deliveries received after
// that are returned with Requeue.
type Broker interface {
	Consume(ctx context.Context, provider string) (<-chan Delivery, error)
}

// Delivery is one message. Settling it (Ack, Defer, DeadLetter, Requeue) exactly once is the core's job;
// a delivery whose settlement fails is redelivered by the broker, and the gate's duplicate admission and
// the provider's idempotency key absorb the repeat.
type Delivery interface {
	Body() []byte
	// Attempt counts the transient failures so far (0 on a first delivery).
	Attempt() int
	// FirstSeen is when paygate first received the job.
	FirstSeen() time.Time
	Ack(ctx context.Context) error
	// Defer publishes the job to come back after at least `after` (a delay tier or retry topic), carrying
	// attempt and why, and acknowledges the original only once the copy is confirmed.
	Defer(ctx context.Context, after time.Duration, attempt int, why error) error
	// DeadLetter publishes the job to the dead letters with a reason, then acknowledges the original.
	DeadLetter(ctx context.Context, reason Reason, attempt int, why error) error
	// Requeue hands an unfinished delivery back to its queue (shutdown).
	Requeue(ctx context.Context) error
}

// Unconfirmed is implemented by deliveries whose acknowledgement can still be lost after Ack returned
// nil: Kafka commits an offset only once every earlier one of its partition is settled, and a generation
// that ends first commits nothing more, so the record is read again.
type Unconfirmed interface {
	// OnLostAck registers fn, called at most once if the acknowledgement is lost after Ack returned.
	OnLostAck(fn func())
}

// Reason is why a job was dead-lettered; it travels in the dead letter's headers.
type Reason string

// The reasons.
const (
	ReasonInvalid     Reason = "invalid"            // the message is not a valid job
	ReasonPermanent   Reason = "permanent"          // the provider refused it (4xx)
	ReasonExhausted   Reason = "attempts-exhausted" // transient failures reached max_attempts
	ReasonDeferralAge Reason = "deferral-age"       // first seen longer ago than max_deferral_age
)

// Headers the adapters set on deferred and dead-lettered jobs: one contract for every broker.
const (
	HeaderAttempt   = "x-paygate-attempt"    // transient failures so far
	HeaderFirstSeen = "x-paygate-first-seen" // unix ms when paygate first received the job
	HeaderReason    = "x-paygate-reason"     // dead letters: a Reason
	HeaderError     = "x-paygate-error"      // the last error, ErrorText
	HeaderNotBefore = "x-paygate-not-before" // unix ms before which a deferred job is not dispatched
	HeaderProvider  = "x-paygate-provider"   // the provider a deferred or dead job belongs to
)

// ErrorText is an error as a header carries it: at most 1 KiB, valid UTF-8.
func ErrorText(err error) string {
	const limit = 1024
	msg := err.Error()
	if len(msg) > limit {
		msg = strings.ToValidUTF8(msg[:limit], "")
	}
	return msg
}

// Gate is the budget, shared by every worker (gate.Limiter).
type Gate interface {
	// ReserveFor asks for a slot for a job of a merchant ("" for none) within max wait (gate.Limiter).
	ReserveFor(ctx context.Context, provider, merchant, jobID string, cost int64, maxWait time.Duration) (gate.Verdict, error)
	// ReleaseFor gives an unused admission back and returns its units (0: not released: gone, moved, or a
	// duplicate of it was let go and may be sending on it).
	ReleaseFor(ctx context.Context, provider, merchant, jobID string, cost int64, slot time.Time) (int64, error)
	Pause(ctx context.Context, provider string, until time.Time) error
	// Sent records that an admitted job's request was accepted though its delivery was not settled.
	Sent(ctx context.Context, provider, jobID string) error
	// Departed records that an admission's request left late after its slot; it returns the new slot
	// (zero: nothing moved; gate.Limiter.Departed).
	Departed(ctx context.Context, provider, merchant, jobID string, slot time.Time, late time.Duration) (time.Time, error)
	// Postpone moves an admission whose holder woke too late to now, where there is room; it returns
	// the new slot (zero: no room; gate.Limiter.Postpone).
	Postpone(ctx context.Context, provider, merchant, jobID string, slot time.Time) (time.Time, error)
	// ReportLateness tells the gate this worker's p99 lateness on its slots; the margin in force follows
	// the fleet's (gate.Limiter.ReportLateness).
	ReportLateness(ctx context.Context, provider, reporter string, p99 time.Duration) (gate.MarginState, error)
	// ReportThrottle tells the gate the provider throttled a request admitted on time.
	ReportThrottle(ctx context.Context, provider, reporter string) (gate.MarginState, error)
	// Land ends an in-flight lease (gate.Verdict.Lease; "" is nothing to end) once the request ended or
	// the admission was given up.
	Land(ctx context.Context, provider, lease string) error
	// CountEvent counts a provider's 429 (gate.EventThrottled) or dead letter (gate.EventDead + reason)
	// for the operator's view (worker dashboard).
	CountEvent(ctx context.Context, provider, event string) error
}

// countEvent counts event for provider at the gate; a failure is only logged at debug (the count is for
// the dashboard, never in a job's way).
func (w *Worker) countEvent(ctx context.Context, provider, event string) {
	if err := w.gate.CountEvent(ctx, provider, event); err != nil {
		w.log.Debug("event not counted", zap.String("provider", provider), zap.String("event", event), zap.Error(err))
	}
}

// Dispatcher hands a job to one provider (providers.Client).
type Dispatcher interface {
	Dispatch(ctx context.Context, j *job.Job) error
}

// Config tunes the core.
type Config struct {
	Concurrency     int           // in-flight jobs per provider
	MaxInlineWait   time.Duration // longest reservation slept in-process
	MaxAttempts     int
	MaxDeferralAge  time.Duration
	ShutdownTimeout time.Duration
	BackoffBase     time.Duration // first transient retry waits up to this (full jitter), doubling
	BackoffMax      time.Duration
	RedisRetry      time.Duration // deferral when the gate cannot answer
	// LateLimit: a job that wakes more than this after its slot gives the slot back and reserves again
	// (0: never). Half the gate's margin (its floor) leaves the other half for the trip to the provider.
	// It does not follow the margin in force: slots other workers decide with a narrower margin, or after
	// the margin narrowed, are spaced for holders no later than this.
	LateLimit time.Duration
	// ReportEvery is how often the worker reports its lateness to the gate (0: 1s).
	ReportEvery time.Duration
	// Providers maps each provider to the largest cost a job may have there (its smallest limit).
	Providers map[string]int64
	// Shadow lists the providers in shadow mode: the gate decides and counts, every job goes at once.
	Shadow map[string]bool
	// Fair lists the providers whose deliveries are shared out between merchants (see fairQueue), each
	// with the merchants' weights (a merchant not listed weighs 1); ReadAhead is how many deliveries of
	// each such provider a worker holds waiting their turn at most (the broker may bound it lower:
	// RabbitMQ's prefetch).
	Fair      map[string]map[string]int
	ReadAhead int
	// Adaptive lists the providers whose limit is learned (providers.<name>.adaptive): a 429 cuts the
	// limit for the fleet instead of pausing it, and widens no margin.
	Adaptive map[string]bool
}

// Worker runs the core over a broker.
type Worker struct {
	cfg      Config
	gate     Gate
	dispatch map[string]Dispatcher
	log      *zap.Logger
	metrics  *Metrics
	now      func() time.Time
	redisLog *throttledLog
	lateLog  *throttledLog
	signals  *signals             // what the fleet and this process's throttles signal: pauses, losses, limits, landings
	id       string               // this worker, to the gate's margin
	late     map[string]*lateness // each provider's recent wake-ups, for ReportLateness
}

// New returns a worker. metrics may be nil.
func New(cfg Config, g Gate, dispatch map[string]Dispatcher, log *zap.Logger, metrics *Metrics) (*Worker, error) {
	if cfg.Concurrency < 1 || cfg.MaxAttempts < 1 || len(cfg.Providers) == 0 {
		return nil, errors.New("consumers: concurrency, max attempts and providers are required")
	}
	for p := range cfg.Providers {
		if dispatch[p] == nil {
			return nil, fmt.Errorf("consumers: no dispatcher for provider %s", p)
		}
	}
	// No defaults here: wire.Core derives these from worker.delay_tiers, in one place.
	if cfg.BackoffBase <= 0 || cfg.BackoffMax < cfg.BackoffBase || cfg.RedisRetry <= 0 {
		return nil, fmt.Errorf("consumers: want BackoffBase > 0, BackoffMax >= BackoffBase and RedisRetry > 0; got %s, %s, %s",
			cfg.BackoffBase, cfg.BackoffMax, cfg.RedisRetry)
	}
	if log == nil {
		log = zap.NewNop()
	}
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	return &Worker{cfg: cfg, gate: g, dispatch: dispatch, log: log, metrics: metrics, now: time.Now,
		redisLog: &throttledLog{every: 10 * time.Second}, lateLog: &throttledLog{every: 10 * time.Second},
		signals: newSignals(), id: workerID(), late: newLateness(cfg.Providers)}, nil
}

// streamOf takes deliveries from a stream in its order; false once it has closed.
func streamOf(deliveries <-chan Delivery) func() (Delivery, bool) {
	return func() (Delivery, bool) {
		d, ok := <-deliveries
		return d, ok
	}
}

// Run consumes every provider's stream with Concurrency handlers each, until ctx is done. Then it stops
// taking deliveries, gives in-flight jobs ShutdownTimeout to settle, and returns.
func (w *Worker) Run(ctx context.Context, b Broker) error {
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	var wg sync.WaitGroup
	names := make([]string, 0, len(w.cfg.Providers))
	for p := range w.cfg.Providers {
		names = append(names, p)
	}
	slices.Sort(names)
	reports, stopReports := context.WithCancel(work)
	defer stopReports()
	wg.Go(func() { w.reportLateness(reports) })
	streams := map[string]<-chan Delivery{}
	for _, p := range names {
		deliveries, err := b.Consume(ctx, p)
		if err != nil {
			return fmt.Errorf("consumers: consume %s: %w", p, err)
		}
		streams[p] = deliveries
	}
	for _, p := range names {
		next := streamOf(streams[p])
		if weights, fair := w.cfg.Fair[p]; fair {
			q := newFairQueue(weights, w.cfg.ReadAhead)
			wg.Go(func() { q.feed(streams[p]) })
			next = q.pop
		}
		for range w.cfg.Concurrency {
			wg.Go(func() {
				for d, ok := next(); ok; d, ok = next() {
					if ctx.Err() != nil {
						_ = d.Requeue(work) // shutting down: back to the queue, untouched
						continue
					}
					w.Handle(work, p, d)
				}
			})
		}
	}
	<-ctx.Done()
	stopReports()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(w.cfg.ShutdownTimeout):
		w.log.Warn("shutdown timeout: abandoning in-flight jobs; the broker redelivers them", zap.Duration("timeout", w.cfg.ShutdownTimeout))
		cancelWork()
		<-done
	}
	return nil
}

// Handle takes one delivery of provider's stream from decoding to settlement.
func (w *Worker) Handle(ctx context.Context, provider string, d Delivery) {
	w.metrics.inflight.WithLabelValues(provider).Inc()
	defer w.metrics.inflight.WithLabelValues(provider).Dec()
	s := settlement{w: w, d: d, provider: provider, attempt: d.Attempt()}
	j, err := job.Decode(d.Body(), w.cfg.Providers)
	if err == nil && j.Provider != provider {
		err = &job.InvalidError{Field: "provider", Msg: fmt.Sprintf("%q arrived on the queue of %s", j.Provider, provider)}
	}
	if err != nil {
		s.deadLetter(ctx, ReasonInvalid, OutcomeInvalid, err)
		return
	}
	s.job = j
	if age := w.now().Sub(d.FirstSeen()); age > w.cfg.MaxDeferralAge {
		s.deadLetter(ctx, ReasonDeferralAge, OutcomeTooOld, fmt.Errorf("first seen %s ago, more than max_deferral_age %s", age.Round(time.Second), w.cfg.MaxDeferralAge))
		return
	}
	if wait := w.pausedFor(provider); wait > 0 {
		s.deferFor(ctx, wait, OutcomePaused, errors.New("provider paused after a throttle"))
		return
	}
	var v gate.Verdict
	gid := GateID(j.ID, s.attempt)
	// The in-flight lease the admission holds (gate.Verdict.Lease), ended when the request ends or when
	// the job gives its admission up (woken late, paused, lost, shutting down).
	var lease string
	defer func() { w.land(ctx, provider, &lease) }()
	var denials time.Duration // waited in-process after denials, at most MaxInlineWait per handling
	var due time.Time         // the earliest the slot can be, local clock (the deciding call's asking + Delay)
	var answeredDue time.Time // the slot as the answer put it (answered + Delay): what a late write counts from
	var slot time.Time        // the admission's slot, once postponed (Postpone)
	shadow := w.cfg.Shadow[provider]
	if shadow {
		v = w.shadowDecide(ctx, provider, j.Merchant, gid, j.Cost, &lease)
	}
	for try := 1; !shadow; try++ { // in shadow mode nothing waits: the job goes below
		var err error
		asked := time.Now()
		v, err = w.gate.ReserveFor(ctx, provider, j.Merchant, gid, j.Cost, w.cfg.MaxInlineWait)
		answered := time.Now()
		// Denied, but the slot is only just beyond max wait: wait here and ask again rather than send the
		// job round a delay tier. A deferral costs a broker round trip, and frees the handler to take the
		// next job only to be denied too: a backlog deeper than max wait went round the tiers whole. Held
		// back by the in-flight cap, the job asks again as soon as a lease ends (or after RetryAfter).
		for err == nil && !v.Allowed && denials+v.RetryAfter <= w.cfg.MaxInlineWait {
			w.metrics.decided(provider, DecisionDenied)
			began := time.Now()
			if !w.waitDenied(ctx, provider, v) {
				s.requeue(ctx) // shutting down: the job goes back untouched
				return
			}
			denials += time.Since(began)
			s.waited += time.Since(began)
			asked = time.Now()
			v, err = w.gate.ReserveFor(ctx, provider, j.Merchant, gid, j.Cost, w.cfg.MaxInlineWait)
			answered = time.Now()
		}
		if err == nil && v.Allowed {
			lease = v.Lease
		}
		if !w.admitted(ctx, &s, v, err) {
			return
		}
		// Redis chose the slot at its "now", somewhere between asking and the answer. Sleeping Delay from
		// the answer is never early; lateness counts from the earliest the slot can be (asking + Delay), so
		// a slow round trip to Redis counts in full. Asking is when the call that decided the slot left
		// (gate.Verdict.Asked), where the gate says: a job that waited for a call to carry it (a batch) was
		// not late while it waited, since its slot was not decided yet.
		// A change of the provider's live limits ends the sleep early: the slot is void (below).
		if !w.sleepOnSlot(ctx, provider, v) {
			s.requeue(ctx) // shutting down: the slot is forfeited, the job goes back untouched
			return
		}
		lost, relimited := w.signals.void(provider, v.Now, asked)
		decided := asked // the latest moment known before Redis decided the slot
		if v.Asked.After(decided) {
			decided = v.Asked
		}
		due, answeredDue = decided.Add(v.Delay), answered.Add(v.Delay)
		if !relimited {
			s.late = time.Since(due)
			w.metrics.lateness.WithLabelValues(provider).Observe(s.late.Seconds())
			if v.Delay > 0 {
				// The fleet's margin follows how late processes wake, which is what a wider margin absorbs:
				// the lateness counted from the answer, without the round trip to Redis (a slow Redis is a
				// matter for the late limit above, not for the margin).
				w.late[provider].add(time.Since(answeredDue))
			}
		}
		if !lost && !relimited && (w.cfg.LateLimit <= 0 || s.late <= w.cfg.LateLimit) {
			break
		}
		if !lost && !relimited && v.Releasable() {
			// Woke too late to use the slot: go now instead, if the gate finds room for the unit there
			// (every window the move reaches). Given back, the unit would be lost to the window whenever
			// later slots were handed out meanwhile, as they usually are.
			at, err := w.gate.Postpone(ctx, provider, j.Merchant, gid, v.Slot())
			if errors.Is(err, gate.ErrUnacknowledged) {
				// Moved, but not on enough replicas to survive a failover: given back by the gate, not sent.
				w.unacknowledged(ctx, &s, err)
				return
			}
			if err == nil && !at.IsZero() {
				w.metrics.decided(provider, DecisionPostponed)
				slot, answeredDue = at, time.Now()
				break
			}
		}
		switch {
		case lost:
			// The gate's state was lost (a Redis restart) while the job slept on its slot: the state in
			// force does not know the slot and may give it to another job. Not sent: asked again, the job
			// meets the warm-up, which waits for this moment (Limiter.Watch, LossNotice).
			w.metrics.decided(provider, DecisionLost)
		case relimited:
			// The provider's live limits changed while the job slept on a slot decided under the old
			// ones: sent, it could put the provider over the new limits. Given back and asked again.
			w.metrics.decided(provider, DecisionRelimited)
		default:
			w.metrics.decided(provider, DecisionLate)
		}
		// Woken too late to use the slot: sent now, it could land within a window of a job sent on time
		// one window later. Give the slot back and ask again, so the log records what the provider sees.
		// Not a duplicate's or a moved job's to release: a duplicate's entry may stand for a request the
		// first delivery sent, a moved one for whichever of its requests the provider counts. Asking
		// again moves it to a new slot in one step (it is stale now: the gate's StaleAfter is margin/2).
		if v.Releasable() {
			if _, err := w.gate.ReleaseFor(ctx, provider, j.Merchant, gid, j.Cost, v.Slot()); err != nil {
				s.deferFor(ctx, w.cfg.RedisRetry, OutcomeGateError, err)
				return
			}
		}
		w.land(ctx, provider, &lease) // given up: asking again takes a lease of its own
		if try == MaxLateTries && lost {
			s.deferFor(ctx, w.cfg.RedisRetry, OutcomeLost, errors.New("the gate's state was lost under its reservation repeatedly"))
			return
		}
		if try == MaxLateTries && relimited {
			s.deferFor(ctx, w.cfg.RedisRetry, OutcomeRelimited, errors.New("the provider's live limits changed under its reservation repeatedly"))
			return
		}
		if try == MaxLateTries {
			// Still late after re-reserving: this process cannot keep within the margin now (a starved
			// CPU, a slow Redis). Sending late could exceed the provider's limit, which is never done:
			// the job goes back to the broker for a while (not an attempt), and the log says why.
			w.lateLog.warn(w.log, "woke later than gate.margin/2 after repeated re-reservations: job deferred; raise gate.margin or give the worker more CPU",
				zap.String("provider", provider), zap.Duration("late", s.late), zap.Duration("limit", w.cfg.LateLimit))
			s.deferFor(ctx, w.cfg.RedisRetry, OutcomeLate, fmt.Errorf("woke %s after its slot %d times, more than half of gate.margin (%s)", s.late.Round(time.Microsecond), try, w.cfg.LateLimit))
			return
		}
	}
	if slot.IsZero() {
		slot = v.Slot()
	}
	wait := w.pausedFor(provider)
	if held := w.signals.announcedUntil(provider).Sub(slot); held > wait && !shadow {
		// Another worker was throttled after this slot was handed out, and the slot lies inside its pause
		// (both times on the Redis clock).
		wait = held
	}
	if wait > 0 {
		if v.Releasable() {
			_, _ = w.gate.ReleaseFor(ctx, provider, j.Merchant, gid, j.Cost, slot) // unused: give it back (best effort)
		}
		s.deferFor(ctx, wait, OutcomePaused, errors.New("provider paused after a throttle"))
		return
	}
	dctx, departed := ctx, (*departure)(nil)
	if v.Allowed && !v.Duplicate && !shadow && w.cfg.LateLimit > 0 {
		// A late write counts from the slot as the answer put it, as the margin's reports do: the round
		// trip to Redis is the lateness guard's (counted from the deciding call's asking, within the late
		// limit), and counted here too it would cost a Redis call for each request whenever Redis is slow,
		// loading the gate most when it is slowest.
		dctx, departed = w.watchDeparture(ctx, provider, j.Merchant, gid, slot, answeredDue)
	}
	start := time.Now()
	err = w.dispatch[provider].Dispatch(dctx, j)
	if departed != nil {
		slot = departed.wait(slot)
	}
	if providers.Answered(err) {
		w.land(ctx, provider, &lease) // the request has ended: the next job held back by the cap may go
	} else {
		// No answer (a timeout, a cut connection, a shutdown): the provider may still be working on it.
		// Its lease is left to lapse (the provider's timeout plus a slack after the slot), so that the
		// place is not taken again while the request may still be in flight.
		lease = ""
	}
	outcome := providers.OutcomeOf(err)
	w.metrics.dispatch.WithLabelValues(provider, string(outcome)).Observe(time.Since(start).Seconds())
	var thr *providers.Throttled
	switch {
	case err == nil:
		s.ack(ctx, gid)
	case ctx.Err() != nil:
		// The shutdown timeout cut the request short: the provider may or may not have it. Not a failed
		// attempt; the job goes back, and its idempotency key makes the retry safe.
		s.requeue(ctx)
	case errors.As(err, &thr):
		// The provider refused the request without counting it: once every worker is paused, its unit
		// goes back, so the retry's new request gets a new slot (a duplicate's entry may stand for an
		// earlier request the provider did count). Releasing before the pause could hand the unit to
		// another worker that sends into the throttle.
		if !shadow && !w.cfg.Adaptive[provider] { // shadow mode holds nothing back; a learned limit is cut instead
			w.pause(ctx, provider, thr.RetryAfter)
		}
		if v.Allowed && v.Releasable() {
			_, _ = w.gate.ReleaseFor(ctx, provider, j.Merchant, gid, j.Cost, slot)
		}
		if v.Allowed && v.Releasable() && !shadow && !w.cfg.Adaptive[provider] {
			// Sent on its slot, in time, and still too many for the provider: it counted the window with
			// requests arriving later than the margin allows for. The fleet widens it. (Not in shadow mode:
			// there the requests go whenever they come.)
			if st, err := w.gate.ReportThrottle(ctx, provider, w.id); err == nil {
				w.metrics.margin.WithLabelValues(provider).Set(st.Margin.Seconds())
			}
		}
		w.countEvent(ctx, provider, gate.EventThrottled)
		s.deferFor(ctx, thr.RetryAfter, OutcomeThrottled, err) // not a failed attempt
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

// shadowDecide is shadow mode's decision: the gate is asked as in enforce mode (a slot within max wait)
// and its answer is counted (would_delay: an enforcing worker would have slept on the slot; would_deny: it
// would have deferred the job), but the job goes now whatever the answer, a gate error included. An
// admission stays in the gate's state, where it counts against the jobs after it, as it would have. The
// verdict returned is the admission (its lease, for the in-flight cap), or a zero one.
func (w *Worker) shadowDecide(ctx context.Context, provider, merchant, gid string, cost int64, lease *string) gate.Verdict {
	v, err := w.gate.ReserveFor(ctx, provider, merchant, gid, cost, w.cfg.MaxInlineWait)
	switch {
	case err != nil && errors.Is(err, gate.ErrInvalid):
		w.metrics.decided(provider, DecisionError)
		return gate.Verdict{}
	case err != nil:
		w.metrics.decided(provider, DecisionError)
		w.redisLog.warn(w.log, "gate unreachable; shadow mode sends jobs anyway", zap.String("provider", provider), zap.Error(err))
		return gate.Verdict{}
	case !v.Allowed:
		w.metrics.decided(provider, DecisionWouldDeny)
		return gate.Verdict{}
	case v.Delay > 0 && !v.Duplicate:
		w.metrics.decided(provider, DecisionWouldDelay)
	case v.Duplicate:
		w.metrics.decided(provider, DecisionDuplicate)
	default:
		w.metrics.decided(provider, DecisionAllowed)
	}
	*lease = v.Lease
	return v
}

// MaxLateTries bounds how often a job that keeps waking late re-reserves before it is sent anyway.
const MaxLateTries = 3

// admitted reads the gate's answer: true means the job holds a slot; otherwise the delivery is settled.
func (w *Worker) admitted(ctx context.Context, s *settlement, v gate.Verdict, err error) bool {
	provider := s.provider
	switch {
	case err != nil && errors.Is(err, gate.ErrInvalid):
		w.metrics.decided(provider, DecisionError)
		s.deadLetter(ctx, ReasonInvalid, OutcomeInvalid, err)
		return false
	case errors.Is(err, gate.ErrUnacknowledged):
		// Admitted, but not yet on enough replicas to survive a failover: given back, sent later.
		w.unacknowledged(ctx, s, err)
		return false
	case err != nil:
		// Fail closed: without the gate nothing is dispatched.
		w.metrics.decided(provider, DecisionError)
		w.redisLog.warn(w.log, "gate unreachable: deferring jobs", zap.String("provider", provider), zap.Error(err))
		s.deferFor(ctx, w.cfg.RedisRetry, OutcomeGateError, err)
		return false
	case !v.Allowed:
		w.metrics.decided(provider, DecisionDenied)
		s.deferFor(ctx, v.RetryAfter, OutcomeDeferred, fmt.Errorf("gate: no slot within %s (policy %s)", w.cfg.MaxInlineWait, v.Limit))
		return false
	case v.Duplicate:
		s.admission = DecisionDuplicate
	case v.Moved:
		s.admission = DecisionRedelivered
	case v.Delay > 0:
		s.admission = DecisionReserved
	default:
		s.admission = DecisionAllowed
	}
	w.metrics.decided(provider, s.admission)
	w.metrics.gateWait.WithLabelValues(provider).Observe(v.Delay.Seconds())
	s.waited += v.Delay
	return true
}

// unacknowledged defers a job whose admission, or its move (Postpone), the replicas did not acknowledge
// (redis.min_replicas_acked): the gate gave it back, and the job goes later.
func (w *Worker) unacknowledged(ctx context.Context, s *settlement, err error) {
	w.metrics.decided(s.provider, DecisionUnacknowledged)
	w.redisLog.warn(w.log, "admissions not acknowledged by the replicas: deferring jobs", zap.String("provider", s.provider), zap.Error(err))
	s.deferFor(ctx, w.cfg.RedisRetry, OutcomeUnacknowledged, err)
}

// reportLateness tells the gate, every ReportEvery, each provider's p99 lateness over this worker's
// wake-ups on reserved slots in the last 10s (0 when it had none), until ctx ends: the margin in force
// follows the fleet's, and this process learns it each time.
func (w *Worker) reportLateness(ctx context.Context) {
	every := w.cfg.ReportEvery
	if every <= 0 {
		every = time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for provider, l := range w.late {
			st, err := w.gate.ReportLateness(ctx, provider, w.id, l.p99(10*time.Second))
			if err != nil {
				continue // Redis unreachable: the decisions say so; the next report tries again
			}
			w.metrics.margin.WithLabelValues(provider).Set(st.Margin.Seconds())
		}
	}
}

// sleepOnSlot sleeps until v's slot, or until the provider's live limits change to ones v was not decided
// under (NoteLimits; at once if that happened already). A change v was decided after (its announcement
// came late) does not cut the sleep short: the slot stands. False when ctx ended.
func (w *Worker) sleepOnSlot(ctx context.Context, provider string, v gate.Verdict) bool {
	if v.Delay <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(v.Delay)
	defer t.Stop()
	for {
		changed, next := w.signals.nextLimits(provider, v.Now)
		if changed {
			return ctx.Err() == nil // void: given up and asked again
		}
		select {
		case <-t.C:
			return true
		case <-next: // a change: void for v only if v was decided before it (asked above)
		case <-ctx.Done():
			return false
		}
	}
}

// waitDenied waits out a denial: its RetryAfter, or for a job held back by the in-flight cap, until a
// lease of the provider ends if that comes first. False when ctx ended.
func (w *Worker) waitDenied(ctx context.Context, provider string, v gate.Verdict) bool {
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

// landTimeout bounds Land on the way to settling a job: best effort, since a lease lapses by itself.
const landTimeout = 2 * time.Second

// land ends the in-flight lease *lease, if any (best effort: a lease not ended lapses by itself after the
// provider's timeout plus a slack, holding one of the cap's places meanwhile).
func (w *Worker) land(ctx context.Context, provider string, lease *string) {
	if *lease == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), landTimeout)
	defer cancel()
	if err := w.gate.Land(ctx, provider, *lease); err != nil {
		w.redisLog.warn(w.log, "could not end an in-flight lease: it lapses by itself", zap.String("provider", provider), zap.Error(err))
	}
	*lease = ""
}

// settlement settles one delivery and logs the one line per settled job.
type settlement struct {
	w        *Worker
	d        Delivery
	provider string
	job      *job.Job
	attempt  int
	waited   time.Duration
	// admission is the gate's last answer: allowed, reserved, duplicate, redelivered
	admission Decision
	late      time.Duration // dispatch start after the slot
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
// and one MaxInlineWait of waits after denials whose slot was just beyond it.
const InlineWaits = MaxLateTries + 1

// settleCtx outlives a shutdown's cancellation briefly, so that a finished job is still settled.
func settleCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), SettleTimeout)
}

// ack settles a job the provider accepted; gid is its entry at the gate.
func (s *settlement) ack(ctx context.Context, gid string) {
	ctx, cancel := settleCtx(ctx)
	defer cancel()
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
	s.done(OutcomeSucceeded, err, nil)
}

func (s *settlement) deferFor(ctx context.Context, after time.Duration, outcome Outcome, why error) {
	ctx, cancel := settleCtx(ctx)
	defer cancel()
	s.done(outcome, s.d.Defer(ctx, after, s.attempt, why), why, zap.Duration("retry_after", after))
}

func (s *settlement) deadLetter(ctx context.Context, reason Reason, outcome Outcome, why error) {
	ctx, cancel := settleCtx(ctx)
	defer cancel()
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

func (s *settlement) done(outcome Outcome, settleErr, why error, extra ...zap.Field) {
	s.w.metrics.jobs.WithLabelValues(s.provider, string(outcome)).Inc()
	if named, fair := s.w.cfg.Fair[s.provider]; fair {
		s.w.metrics.merchantJobs.WithLabelValues(s.provider, merchantLabel(named, s.job), string(outcome)).Inc()
	}
	fields := append([]zap.Field{
		zap.String("provider", s.provider),
		zap.String("outcome", string(outcome)),
		zap.Duration("waited", s.waited),
		zap.String("admission", string(s.admission)),
		zap.Duration("late", s.late),
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
	s.w.log.Info("job settled", fields...)
}

// merchantLabel is a job's merchant as paygate_merchant_jobs_total names it: a merchant named in the
// configuration (named), merchantOther, or merchantNone (no merchant, or no job).
func merchantLabel(named map[string]int, j *job.Job) string {
	if j == nil || j.Merchant == "" {
		return job.MerchantNone
	}
	if _, ok := named[j.Merchant]; ok {
		return j.Merchant
	}
	return job.MerchantOther
}

// Sleep waits d or until ctx is done; it reports whether the full wait passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// throttledLog writes a repeated warning at most once per interval, with how many it swallowed.
type throttledLog struct {
	every  time.Duration
	mu     sync.Mutex
	last   time.Time
	missed int
}

func (t *throttledLog) warn(log *zap.Logger, msg string, fields ...zap.Field) {
	t.mu.Lock()
	now := time.Now()
	if now.Sub(t.last) < t.every {
		t.missed++
		t.mu.Unlock()
		return
	}
	missed := t.missed
	t.last, t.missed = now, 0
	t.mu.Unlock()
	log.Warn(msg, append(fields, zap.Int("suppressed_since_last", missed))...)
}

// lateness keeps a provider's recent wake-ups on reserved slots.
type lateness struct {
	mu   sync.Mutex
	ring [256]struct {
		late time.Duration
		at   time.Time
	}
	n, next int // samples in ring (up to its length), where the next goes
}

func newLateness(providers map[string]int64) map[string]*lateness {
	m := make(map[string]*lateness, len(providers))
	for p := range providers {
		m[p] = &lateness{}
	}
	return m
}

func (l *lateness) add(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ring[l.next].late, l.ring[l.next].at = d, time.Now()
	l.next = (l.next + 1) % len(l.ring)
	l.n = min(l.n+1, len(l.ring))
}

// p99 is the 99th percentile of the samples of the last `within`, never their single largest (one
// wake-up is an accident, not a fleet's tail); 0 with fewer than two.
func (l *lateness) p99(within time.Duration) time.Duration {
	l.mu.Lock()
	var s []time.Duration
	for _, x := range l.ring[:l.n] {
		if time.Since(x.at) <= within {
			s = append(s, x.late)
		}
	}
	l.mu.Unlock()
	if len(s) < 2 {
		return 0
	}
	slices.Sort(s)
	return s[min((len(s)*99+99)/100, len(s)-1)-1]
}

// workerID names this process to the gate: host, pid and a random part (a pid is reused after a restart).
func workerID() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
