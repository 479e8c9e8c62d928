// Package consumers is the worker core: for each delivery it decodes the job, reserves a slot at the gate,
// sleeps until the slot, dispatches to the provider, and settles the delivery. It owns the small interfaces
// it needs and knows neither the broker behind them (consumers/rabbitmq, consumers/kafka, an in-memory
// one) nor Redis.
//
// What happens to a job:
//
//	invalid message                  -> dead letter (reason "invalid"); so is a job on another
//	                                    provider's or class's queue (Route)
//	waiting its turn                 -> taken high first, then normal, then low (priority.go); a low job
//	                                    asks within LowHorizon, one of its provider's at a time
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
//	transient failure                -> deferred by backoff; dead letter ("attempts-exhausted") at max_attempts;
//	                                    reported to the provider's breaker (breaker.go)
//	provider's breaker open          -> not sent: waits in-process, then deferred until the probe is due
//	                                    (not an attempt); one job goes as the probe, through the hold
//	permanent failure (4xx)          -> dead letter ("permanent")
//
// Where each step lives: Handle (handle.go) decodes the job, admits it (admit.go: the reservation, the
// waits after denials, the gate's answer read, shadow mode), holds its slot (slot.go: the sleep, the
// checks on waking, a postponement or a slot given back and another asked for, the pauses), sends it
// (send.go; departure.go for a request written late) and settles the delivery (settle.go: the provider's
// answer, the one line per settled job). What the fleet signals to the worker is in signals.go, its
// lateness reports in lateness.go, the decisions and outcomes its metrics and logs name in labels.go.
package consumers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/internal/throttle"
	"github.com/paygate/paygate/job"
	"github.com/paygate/paygate/providers"
)

// Broker is what the core needs from a queue: one stream of deliveries per route, a provider's class
// (Route: the provider's name for its normal jobs, <provider>.high and <provider>.low for the others).
// The stream ends (the channel closes) after ctx is done and the broker has stopped consuming;
// deliveries received after that are returned with Requeue. A delivery deferred comes back on its route.
type Broker interface {
	Consume(ctx context.Context, route string) (<-chan Delivery, error)
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
	HeaderStatus    = "x-paygate-status"     // dead letters: the provider's HTTP status, when it answered
	HeaderDeadAt    = "x-paygate-dead-at"    // dead letters (RabbitMQ): unix ms when it was dead-lettered
	HeaderReplays   = "x-paygate-replays"    // times `worker dead replay` put the job back
	HeaderPriority  = "x-paygate-priority"   // deferred and dead high or low jobs: the class they arrived in
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

// Dispatcher hands a job to one provider (providers.Client): the provider's answer when there is one, and
// its classification (providers.OutcomeOf).
type Dispatcher interface {
	Dispatch(ctx context.Context, j *job.Job) (*providers.Answer, error)
}

// Config tunes the core.
type Config struct {
	Concurrency     int           // in-flight jobs per provider
	MaxInlineWait   time.Duration // longest reservation slept in-process
	LowHorizon      time.Duration // longest reservation a low job asks for (0: as the others; priority.go)
	MaxAttempts     int
	MaxDeferralAge  time.Duration
	ShutdownTimeout time.Duration
	BackoffBase     time.Duration // first transient retry waits up to this (full jitter), doubling
	BackoffMax      time.Duration
	RedisRetry      time.Duration // deferral when the gate cannot answer
	// OutageTiers are the longer deferrals a gate outage walks up (the delay tiers): a job the gate cannot
	// answer is deferred for the longest tier the outage has outlasted (see gateOutage). Empty: RedisRetry.
	OutageTiers []time.Duration
	// Results, when set, gets every job's result before its delivery is acknowledged (results.enabled).
	Results ResultSink
	// LateLimit: a job that wakes more than this after its slot gives the slot back and reserves again
	// (0: never). Half the gate's margin (its floor) leaves the other half for the trip to the provider.
	// It does not follow the margin in force: slots other workers decide with a narrower margin, or after
	// the margin narrowed, are spaced for holders no later than this.
	LateLimit time.Duration
	// ReportEvery is how often the worker reports its lateness to the gate (0: 1s).
	ReportEvery time.Duration
	// Providers maps each provider to the largest cost a job may have there (its smallest limit).
	Providers map[string]int64
	// Endpoints are the providers' endpoints (providers.<name>.endpoints): a job's operation must name
	// one, whose cost is the job's unless it gives its own (job.DecodeFor).
	Endpoints job.Endpoints
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
	// now is the clock of every time the worker reads: first-seen ages, the moments a slot was asked for
	// and answered, lateness, the waits it accounts for, its own pauses, the duration of requests, the
	// throttling of its warnings. time.Now, unless a test sets another; time.Now's readings carry the
	// monotonic clock, so that differences between them are immune to steps of the wall clock. Sleeps
	// and timers run on the real clock. Moments on the Redis clock (gate.Verdict.Now, the watch's
	// announcements) are compared only with each other. Two local moments come from the gate's own
	// time.Now (gate.Verdict.Asked, NoteDisconnect's): a test's clock leaves those out or sets them itself.
	now       func() time.Time
	redisLog  *throttle.Log // warnings about the gate's Redis, at most one per 10s
	lateLog   *throttle.Log // warnings about jobs deferred for waking late, at most one per 10s
	outage    gateOutage    // how long the gate has not answered, for the deferrals' tiers
	resultLog *throttle.Log // warnings about results the broker did not take, at most one per 10s
	// settling counts the settlements running in the background (inBackground), settleSlots bounds them
	settling    sync.WaitGroup
	settleSlots chan struct{}
	signals     *signals             // what the fleet and this process's throttles signal: pauses, losses, limits, landings
	cancels     cancelNotes          // the cancels told to this process (NoteCancel)
	journalQ    journalQueue         // the job journal's entries still to write (journal.go)
	id          string               // this worker, to the gate's margin
	late        map[string]*lateness // each provider's recent wake-ups, for ReportLateness
	breakers    *breakers            // the providers' breakers, as this worker knows them (UseBreaker; nil: none)
	classes     map[string]*classes  // each provider's priority classes: its low lane (priority.go)
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
		redisLog: &throttle.Log{}, lateLog: &throttle.Log{}, resultLog: &throttle.Log{},
		settleSlots: make(chan struct{}, 2*cfg.Concurrency*len(cfg.Providers)),
		signals:     newSignals(), id: workerID(), late: newLateness(cfg.Providers), classes: newClasses(cfg.Providers, cfg.LowHorizon)}, nil
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
	journal, stopJournal := context.WithCancel(context.WithoutCancel(work)) // stopped after the last settlement
	defer stopJournal()
	journalDone := make(chan struct{})
	go func() { w.writeJournal(journal); close(journalDone) }()
	streams := map[string][]<-chan Delivery{} // by provider, highest class first (Routes)
	for _, p := range names {
		for _, route := range Routes(p) {
			deliveries, err := b.Consume(ctx, route)
			if err != nil {
				return fmt.Errorf("consumers: consume %s: %w", route, err)
			}
			streams[p] = append(streams[p], deliveries)
		}
	}
	for _, p := range names {
		// Waiting their turn, by class; fair shares inside each class for the providers that have them
		// (read ahead up to ReadAhead), else in the order they came (two per handler ahead, so that a
		// class's next is there when a handler comes back; RabbitMQ's prefetch holds them anyway).
		weights, fair := w.cfg.Fair[p]
		limit := max(2*w.cfg.Concurrency, 8)
		if fair {
			limit = w.cfg.ReadAhead
		}
		queue := w.classes[p].newClassQueues(w.now, streams[p], weights, fair, limit, wg.Go)
		stopQueue := context.AfterFunc(ctx, queue.stop)
		defer stopQueue()
		for range w.cfg.Concurrency {
			wg.Go(func() {
				for d, class, ok := queue.pop(); ok; d, class, ok = queue.pop() {
					if ctx.Err() != nil {
						_ = d.Requeue(work) // shutting down: back to the queue, untouched
						continue
					}
					w.handle(work, p, class, d)
				}
			})
		}
	}
	<-ctx.Done()
	stopReports()
	done := make(chan struct{})
	go func() { wg.Wait(); w.settling.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(w.cfg.ShutdownTimeout):
		w.log.Warn("shutdown timeout: abandoning in-flight jobs; the broker redelivers them", zap.Duration("timeout", w.cfg.ShutdownTimeout))
		cancelWork()
		<-done
	}
	stopJournal() // the entries of the jobs settled last are written as it stops
	<-journalDone
	return nil
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

// workerID names this process to the gate: host, pid and a random part (a pid is reused after a restart).
func workerID() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
