package consumers

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/providers"
)

// Breaker is the fleet's circuit breakers, one per provider that has one, kept in Redis (gate.Limiter;
// providers.<name>.breaker). The worker reports its requests' transient failures, and the answers that
// end a run of them while one is known to be in progress (so that a healthy provider costs no Redis call
// per job); while a provider's breaker is open its jobs wait, in-process up to max_inline_wait and then
// in the delay tiers, without spending attempts, and once the probe is due one job takes it.
type Breaker interface {
	HasBreaker(provider string) bool
	ReadBreaker(ctx context.Context, provider string) (gate.BreakerState, error)
	TakeProbe(ctx context.Context, provider, jobID string) (gate.BreakerState, error)
	ReportFailure(ctx context.Context, provider, jobID string, sent time.Time) (gate.BreakerState, error)
	ReportAnswer(ctx context.Context, provider, jobID string) (gate.BreakerState, error)
}

// UseBreaker makes the worker obey b's breakers, for the providers b has one for. Call it before Run.
func (w *Worker) UseBreaker(b Breaker) {
	views := map[string]*breakerView{}
	for p := range w.cfg.Providers {
		if b.HasBreaker(p) {
			views[p] = &breakerView{changed: make(chan struct{})}
			w.metrics.breaker.WithLabelValues(p).Set(0)
			w.metrics.breakerOpened.WithLabelValues(p)
		}
	}
	if len(views) > 0 {
		w.breakers = &breakers{b: b, views: views}
	}
}

// breakers is what this worker knows of its providers' breakers: the latest state it learned of each,
// from the gate's replies and announcements (NoteBreaker), newest by the state's version.
type breakers struct {
	b     Breaker
	mu    sync.Mutex
	views map[string]*breakerView // the providers with a breaker; never changes after UseBreaker
}

// breakerView is one provider's breaker as this worker knows it.
type breakerView struct {
	// known: learned since the worker started, or since its watch last lost its connection (an
	// announcement may have gone unheard: NoteDisconnect). Unknown, the worker reports its answers, and
	// asks again on a paused verdict.
	known bool
	st    gate.BreakerState
	// due is when st.Until comes on the worker's clock: open, the probe is due; probing, its holder's
	// time lapses
	due time.Time
	// read is when the worker last read the breaker after a paused verdict (breakerHolds)
	read time.Time
	// changed is closed at the next change learned, waking the jobs waiting on the breaker
	changed chan struct{}
}

// breakerTimeout bounds a breaker call on a job's way: it holds the job, not the fleet.
const breakerTimeout = 2 * time.Second

// breakerReread is how often a worker reads a breaker it believes closed after paused verdicts (a pause
// it does not know to be the breaker's): a 429 storm's denials cost at most one read per provider each.
const breakerReread = 250 * time.Millisecond

var (
	errBreakerOpen = errors.New("provider's breaker is open: waiting for its probe")
	errProbeFailed = errors.New("the breaker's probe failed: the breaker reopened")
)

// view is provider's breaker as this worker knows it, and whether the provider has one.
func (bs *breakers) view(provider string) (breakerView, bool) {
	if bs == nil {
		return breakerView{}, false
	}
	bs.mu.Lock()
	defer bs.mu.Unlock()
	v, ok := bs.views[provider]
	if !ok {
		return breakerView{}, false
	}
	return *v, true
}

// learn takes st (a reply, or an announcement), seen at `at` on the worker's clock, unless this worker
// knows a newer state (a higher version); a breaker that never changed (version 0: its key is new, or
// was lost) is always taken. It reports whether it took it.
func (bs *breakers) learn(provider string, st gate.BreakerState, at time.Time) bool {
	if bs == nil {
		return false
	}
	bs.mu.Lock()
	defer bs.mu.Unlock()
	v, ok := bs.views[provider]
	if !ok || (v.known && st.Seq < v.st.Seq && st.Seq != 0) {
		return false
	}
	same := v.known && st.Seq == v.st.Seq && st.Phase == v.st.Phase && st.Until.Equal(v.st.Until)
	v.known, v.st = true, st
	if same {
		return true // nothing the waiting jobs act on changed: they sleep on
	}
	v.due = time.Time{}
	if !st.Until.IsZero() {
		v.due = at.Add(st.Until.Sub(st.Now))
	}
	close(v.changed)
	v.changed = make(chan struct{})
	return true
}

// forget marks every provider's breaker unknown (provider "") or one's, and wakes the jobs waiting on it.
func (bs *breakers) forget(provider string) {
	if bs == nil {
		return
	}
	bs.mu.Lock()
	defer bs.mu.Unlock()
	for p, v := range bs.views {
		if provider == "" || p == provider {
			v.known, v.read = false, time.Time{}
			close(v.changed)
			v.changed = make(chan struct{})
		}
	}
}

// changes is a channel the next change of provider's breaker closes.
func (bs *breakers) changes(provider string) <-chan struct{} {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	return bs.views[provider].changed
}

// reread reports whether provider's breaker may be read now (not read within breakerReread), and notes
// that it is.
func (bs *breakers) reread(provider string, now time.Time) bool {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	v := bs.views[provider]
	if !v.read.IsZero() && now.Sub(v.read) < breakerReread {
		return false
	}
	v.read = now
	return true
}

// readBreaker reads the provider's breaker, unless it was read within breakerReread (a paused verdict, a
// breaker not known: many handlers at once read it once). A failure leaves the worker's view as it was:
// the hold in Redis still binds its reserves.
func (w *Worker) readBreaker(ctx context.Context, a *admission) {
	if !w.breakers.reread(a.provider, w.now()) {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, breakerTimeout)
	defer cancel()
	if st, err := w.breakers.b.ReadBreaker(rctx, a.provider); err == nil {
		w.breakerLearned(a, st)
	}
}

// NoteBreaker is told of every change of a provider's breaker (gate.Limiter.Watch): a change of phase,
// a run of failures beginning or ending. The jobs waiting on the breaker look again.
func (w *Worker) NoteBreaker(provider string, st gate.BreakerState) {
	if w.breakers.learn(provider, st, w.now()) {
		w.metrics.breaker.WithLabelValues(provider).Set(float64(st.Phase))
	}
}

// held reads the breaker as this worker knows it: whether it holds the provider's jobs, the phase, and
// when it is due (the probe, or its holder's lapse) on the worker's clock.
func (w *Worker) held(provider string) (bool, gate.BreakerPhase, time.Time) {
	v, on := w.breakers.view(provider)
	if !on || !v.known || v.st.Phase == gate.BreakerClosed {
		return false, gate.BreakerClosed, time.Time{}
	}
	return true, v.st.Phase, v.due
}

// breakerLets holds a job back while its provider's breaker is open or probing, as far as this worker
// knows: a breaker it does not know (since it started, or its watch reconnected) it reads first, once
// for its handlers. Once the probe is due the job asks for it: granted, it goes as the probe (a.probe),
// through the hold. Otherwise it waits, in-process while the waits of its handling total at most
// max_inline_wait (woken by any change), or is deferred to the delay tier at most as long as the wait
// (it comes back by the time the probe is due). Not an attempt. True when the job may ask the gate.
func (w *Worker) breakerLets(ctx context.Context, s *settlement, a *admission) bool {
	for !a.probe {
		if v, on := w.breakers.view(a.provider); on && !v.known {
			w.readBreaker(ctx, a) // at most every breakerReread: unknown meanwhile, the job goes on to the gate
		}
		holds, phase, due := w.held(a.provider)
		if !holds {
			return true
		}
		if !w.now().Before(due) {
			st, err := w.takeProbe(ctx, a)
			switch {
			case err != nil:
				w.gateUnreachable(ctx, s, err) // fail closed
				return false
			case st.Granted || st.Phase == gate.BreakerClosed:
				return true
			}
			phase, due = st.Phase, w.now().Add(max(st.Until.Sub(st.Now), time.Millisecond))
		}
		if !w.waitBreaker(ctx, s, a, phase, due) {
			return false
		}
	}
	return true
}

// takeProbe asks for the probe for the job: granted, it is the probe (a.probe).
func (w *Worker) takeProbe(ctx context.Context, a *admission) (gate.BreakerState, error) {
	st, err := w.breakers.b.TakeProbe(ctx, a.provider, a.gateID)
	if err != nil {
		return st, err
	}
	w.breakerLearned(a, st)
	if st.Granted {
		a.probe = true
		w.metrics.decided(a.provider, DecisionProbe)
		if st.Changed {
			w.log.Info("breaker probing: one request let through", zap.String("provider", a.provider), zap.String("job", a.gateID),
				zap.Duration("open_for", st.OpenFor), zap.Time("answer_by", st.Until))
		}
	}
	return st, nil
}

// waitBreaker waits for the breaker, until due or its next change: in-process while the handling's waits
// stay within max_inline_wait (an open breaker's whole wait must fit; a probe's answer usually comes
// sooner than its holder's time, so a job waits for it what is left), else the job is deferred. False
// when the delivery was settled.
func (w *Worker) waitBreaker(ctx context.Context, s *settlement, a *admission, phase gate.BreakerPhase, due time.Time) bool {
	w.metrics.decided(a.provider, DecisionBreakerOpen)
	wait, left := due.Sub(w.now()), w.cfg.MaxInlineWait-a.denied
	if left <= 0 || (phase == gate.BreakerOpen && wait > left) {
		s.deferFor(ctx, w.breakerTier(wait), OutcomeBreakerOpen, errBreakerOpen)
		return false
	}
	began := w.now()
	t := time.NewTimer(min(wait, left))
	defer t.Stop()
	select {
	case <-t.C:
	case <-w.breakers.changes(a.provider):
	case <-ctx.Done():
		s.requeue(ctx) // shutting down: the job goes back untouched
		return false
	}
	waited := w.now().Sub(began)
	a.denied += waited
	a.waited += waited
	return true
}

// breakerTier is the deferral for a job the breaker holds for d: the longest delay tier no longer than d
// (the job comes back by the time the probe is due, or the probe's answer), at least the first.
func (w *Worker) breakerTier(d time.Duration) time.Duration {
	if len(w.cfg.OutageTiers) == 0 {
		return w.cfg.RedisRetry
	}
	tier := w.cfg.OutageTiers[0]
	for _, t := range w.cfg.OutageTiers {
		if t <= d {
			tier = max(tier, t)
		}
	}
	return tier
}

// breakerHolds gives back a slot the job may not go on: its provider's breaker is open or probing and the
// job is not the probe (it opened while the job slept on its slot, or this worker had not heard of it
// when it asked). A paused verdict on a breaker this worker believes closed, or does not know, reads it
// first (at most every breakerReread). The slot is released, the lease ended, and its wait counts
// against max_inline_wait; the job then waits for the breaker (breakerLets). True when held.
func (w *Worker) breakerHolds(ctx context.Context, a *admission) bool {
	v, on := w.breakers.view(a.provider)
	if !on || a.probe || a.shadow {
		return false
	}
	if a.verdict.Paused && (!v.known || v.st.Phase == gate.BreakerClosed) {
		w.readBreaker(ctx, a)
	}
	if holds, _, _ := w.held(a.provider); !holds {
		return false
	}
	if a.verdict.Releasable() {
		_, _ = w.gate.ReleaseFor(ctx, a.provider, a.merchant, a.gateID, a.cost, a.slot)
	}
	w.land(ctx, a)
	a.denied += max(a.verdict.Delay, 0)
	w.metrics.decided(a.provider, DecisionBreakerOpen)
	return true
}

// shadowProbe takes the probe for a job in shadow mode once it is due, so that the breaker follows the
// provider (shadow mode holds nothing back: the job goes whatever the breaker says).
func (w *Worker) shadowProbe(ctx context.Context, a *admission) {
	if holds, _, due := w.held(a.provider); holds && !w.now().Before(due) {
		_, _ = w.takeProbe(ctx, a)
	}
}

// breakerAnswered tells the provider's breaker what its request came to, before the delivery is settled:
// a transient failure always (it counts toward opening; the probe's reopens it); an answer that is no
// transient failure when it may end something (a run of failures this worker knows of, or does not know
// the breaker at all; the probe's closes it). A request cut short by the shutdown says nothing. The
// probe's failure is settled here (true): deferred until the next probe is due, not an attempt; every
// other answer is settled as usual.
func (w *Worker) breakerAnswered(ctx context.Context, s *settlement, a *admission, err error) bool {
	v, on := w.breakers.view(a.provider)
	failed := providers.OutcomeOf(err) == providers.Transient
	if !on || (failed && ctx.Err() != nil) {
		return false
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), breakerTimeout)
	defer cancel()
	if !failed {
		if a.probe || !v.known || v.st.Failures > 0 {
			st, rerr := w.breakers.b.ReportAnswer(rctx, a.provider, a.gateID)
			w.breakerReported(a, st, rerr)
		}
		return false
	}
	st, rerr := w.breakers.b.ReportFailure(rctx, a.provider, a.gateID, a.slot)
	w.breakerReported(a, st, rerr)
	if !a.probe {
		return false
	}
	retry := w.breakerTier(0)
	if rerr == nil && st.Phase != gate.BreakerClosed {
		retry = w.breakerTier(st.Until.Sub(st.Now))
	}
	s.deferFor(ctx, retry, OutcomeProbeFailed, errors.Join(errProbeFailed, err))
	return true
}

// breakerReported takes the reply of a report of the job's answer.
func (w *Worker) breakerReported(a *admission, st gate.BreakerState, err error) {
	if err != nil {
		w.redisLog.Warn(w.log, w.now(), "could not tell the provider's breaker of an answer", zap.String("provider", a.provider), zap.Error(err))
		return
	}
	w.breakerLearned(a, st)
}

// breakerLearned takes a state a call of this worker's for the job returned, and logs the change the
// call made (the worker whose call changed the breaker logs it, once for the fleet): opened, reopened,
// closed. (Taking the probe logs itself: takeProbe.)
func (w *Worker) breakerLearned(a *admission, st gate.BreakerState) {
	if w.breakers.learn(a.provider, st, w.now()) {
		w.metrics.breaker.WithLabelValues(a.provider).Set(float64(st.Phase))
	}
	if !st.Changed {
		return
	}
	fields := []zap.Field{zap.String("provider", a.provider), zap.String("job", a.gateID), zap.Duration("open_for", st.OpenFor),
		zap.Int64("opened", st.Opened)}
	switch {
	case st.Phase == gate.BreakerOpen && a.probe:
		w.metrics.breakerOpened.WithLabelValues(a.provider).Inc()
		w.log.Warn("breaker reopened: its probe failed; nothing is sent to the provider until the next probe", append(fields, zap.Time("probe_at", st.Until))...)
	case st.Phase == gate.BreakerOpen:
		w.metrics.breakerOpened.WithLabelValues(a.provider).Inc()
		w.log.Warn("breaker opened: transient failures in a row; nothing is sent to the provider until its probe", append(fields, zap.Time("probe_at", st.Until))...)
	case st.Phase == gate.BreakerClosed:
		w.log.Info("breaker closed: its probe was answered", fields...)
	}
}

// forgetBreakers marks every provider's breaker unknown: the watch lost its connection, and a change
// announced meanwhile went unheard (NoteDisconnect).
func (w *Worker) forgetBreakers() { w.breakers.forget("") }
