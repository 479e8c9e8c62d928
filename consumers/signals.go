package consumers

import (
	"context"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
)

// signals are what this worker has been told that can void a job's slot or hold the job back: the
// pauses it set itself after a throttle, and what the fleet announces through the gate (gate.Limiter.Watch
// calls the Worker's Note* methods): pauses, losses of the gate's state, changes of the live limits,
// in-flight leases ended, and the watch's lost connection. They are moments, kept per provider and
// only ever moved forward; the steps of Handle ask them. Their lock is theirs alone, held for a map's read
// or write, never across a wait or a call to Redis.
type signals struct {
	mu         sync.Mutex
	pausedTill map[string]time.Time       // the end of the pauses this process set (the worker's clock), checked before every dispatch
	announced  map[string]time.Time       // the end of the latest pause any worker set (Redis clock; NotePause)
	lostAt     map[string]time.Time       // the latest loss of a provider's gate state (Redis clock; NoteLoss)
	limitsAt   map[string]time.Time       // the latest change of a provider's live limits (Redis clock; NoteLimits)
	relimit    map[string]chan struct{}   // closed by the next change of limits: wakes the jobs sleeping on slots
	brokeAt    time.Time                  // the latest loss of the watch's connection (local clock; NoteDisconnect)
	landed     map[string][]chan struct{} // the jobs waiting for a provider's in-flight lease to end, oldest first
}

func newSignals() *signals {
	return &signals{pausedTill: map[string]time.Time{}, announced: map[string]time.Time{}, lostAt: map[string]time.Time{},
		limitsAt: map[string]time.Time{}, relimit: map[string]chan struct{}{}, landed: map[string][]chan struct{}{}}
}

// forward moves m[provider] forward to t, never back. The caller holds the lock.
func forward(m map[string]time.Time, provider string, t time.Time) {
	if t.After(m[provider]) {
		m[provider] = t
	}
}

// at reads m[provider] under the lock.
func (s *signals) at(m map[string]time.Time, provider string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return m[provider]
}

// raise moves m[provider] forward to t, never back, under the lock.
func (s *signals) raise(m map[string]time.Time, provider string, t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	forward(m, provider, t)
}

// paused records a pause this process set for provider, until `until` on the worker's clock.
func (s *signals) paused(provider string, until time.Time) { s.raise(s.pausedTill, provider, until) }

// pausedUntil is the end of the latest pause this process set for provider (the worker's clock).
func (s *signals) pausedUntil(provider string) time.Time { return s.at(s.pausedTill, provider) }

// announcedUntil is the end of the latest pause any worker set for provider (Redis clock).
func (s *signals) announcedUntil(provider string) time.Time { return s.at(s.announced, provider) }

// void reports whether a slot decided at decided (Redis clock), asked for at asked (the worker's clock),
// may belong to a gate state lost since (NoteLoss, or a disconnection after the asking: NoteDisconnect),
// and whether it was decided under live limits that changed since (NoteLimits).
func (s *signals) void(provider string, decided, asked time.Time) (lost, relimited bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return decided.Before(s.lostAt[provider]) || asked.Before(s.brokeAt), decided.Before(s.limitsAt[provider])
}

// nextLimits reports whether provider's live limits changed after decided (Redis clock); if not, it
// returns a channel that the next change closes.
func (s *signals) nextLimits(provider string, decided time.Time) (changed bool, next <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if decided.Before(s.limitsAt[provider]) {
		return true, nil
	}
	ch := s.relimit[provider]
	if ch == nil {
		ch = make(chan struct{})
		s.relimit[provider] = ch
	}
	return false, ch
}

// awaitLanding queues a job waiting for one of provider's in-flight leases to end: landed is closed when
// it is this job's turn (NoteLanded), and leave takes the job out of the queue, woken or not.
func (s *signals) awaitLanding(provider string) (landed <-chan struct{}, leave func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	s.landed[provider] = append(s.landed[provider], ch)
	s.mu.Unlock()
	return ch, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.landed[provider] = slices.DeleteFunc(s.landed[provider], func(c chan struct{}) bool { return c == ch })
	}
}

// pause tells the whole cluster (through the gate) and this process to hold the provider for d.
func (w *Worker) pause(ctx context.Context, provider string, d time.Duration) {
	until := w.now().Add(d)
	w.signals.paused(provider, until)
	if err := w.gate.Pause(ctx, provider, until); err != nil {
		w.redisLog.Warn(w.log, w.now(), "gate unreachable: pause not shared", zap.String("provider", provider), zap.Error(err))
	}
}

// pausedFor is how long this process still holds provider after a throttle of its own (<= 0: not held).
func (w *Worker) pausedFor(provider string) time.Duration {
	return w.signals.pausedUntil(provider).Sub(w.now())
}

// NotePause is told of every pause any worker sets (gate.Limiter.Watch): until is its end on the
// Redis clock. A pause binds the gate's later decisions by itself; NotePause makes this process hold
// the jobs whose slots were handed out before it and fall inside it: they are deferred, their units
// released, rather than sent into the throttle.
func (w *Worker) NotePause(provider string, until time.Time) {
	w.signals.raise(w.signals.announced, provider, until)
}

// LossNotice bounds how long after a loss of the gate's state a worker may still dispatch on a
// reservation it held: the trip of the warm-up's announcement, or the watch noticing its broken
// connection, and the handler waking to check. The warm-up must last this long past the provider's
// window (gate.Options.Horizon) instead of a whole max_inline_wait.
const LossNotice = 500 * time.Millisecond

// NoteLoss is told when a gate decision found a provider's state lost and began the warm-up
// (gate.Limiter.Watch): at is that decision's moment on the Redis clock. A job still holding a slot
// decided before it gives the slot up and asks again.
func (w *Worker) NoteLoss(provider string, at time.Time) {
	w.signals.raise(w.signals.lostAt, provider, at)
	w.breakers.forget(provider) // its breaker went with the state
}

// NoteLimits is told when any process set or reset a provider's live limits (`worker limits`,
// gate.Limiter.Watch): at is the change's moment on the Redis clock. A job still holding a slot decided
// before it, under the old limits, gives the slot up and asks again under the new ones.
func (w *Worker) NoteLimits(provider string, at time.Time) {
	s := w.signals
	s.mu.Lock()
	defer s.mu.Unlock()
	forward(s.limitsAt, provider, at)
	if ch := s.relimit[provider]; ch != nil {
		close(ch) // wakes every job sleeping on a slot of this provider
		delete(s.relimit, provider)
	}
}

// NoteDisconnect is told when the watch lost its connection to Redis, at `at` on the local clock (the
// watch's time.Now, compared with the moments the worker's clock gave its jobs' askings): Redis may have
// restarted, and a loss announced meanwhile went unheard. A job holding a slot it asked for before that
// gives the slot up and asks again.
func (w *Worker) NoteDisconnect(at time.Time) {
	w.forgetBreakers() // a change of a breaker announced meanwhile went unheard too
	s := w.signals
	s.mu.Lock()
	defer s.mu.Unlock()
	if at.After(s.brokeAt) {
		s.brokeAt = at
	}
}

// NoteLanded is told when any worker ended an in-flight lease of provider (gate.Limiter.Watch): the job
// of this process that has waited longest for one asks again at once (one place freed: waking every
// waiter of the fleet would only have them all ask for it).
func (w *Worker) NoteLanded(provider string) {
	s := w.signals
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := s.landed[provider]; len(q) > 0 {
		close(q[0])
		s.landed[provider] = q[1:]
	}
}
