package consumers

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/paygate/paygate/gate"
)

// Cancels (`worker cancel`, gate.Limiter.Cancel). The gate holds a cancel where admissions are decided:
// a cancelled job's every later reserve is denied (gate.Verdict.Cancelled), and the job is settled as
// cancelled. A slot the gate handed out before the cancel is the holder's: told (NoteCancel, from the
// gate's announcement), a job sleeping on it asks the gate whether the cancel still waits for it
// (gate.Limiter.AckCancel): yes, and it gives the slot up and asks again (denied: settled as cancelled);
// no (the cancel found it too late and was lifted), and it goes on its slot. A holder that never hears
// sends on its slot, and the cancel, which waits at most until the slot plus LossNotice, says it left.

// canceller is the part of the gate that keeps cancels (gate.Limiter): the holder's answer, and a cancel's
// reason for the result.
type canceller interface {
	AckCancel(ctx context.Context, provider, jobID string) (bool, error)
	CancelReason(ctx context.Context, provider, jobID string) (string, error)
}

// errCancelled is why a cancelled job is settled so.
var errCancelled = errors.New("cancelled (worker cancel)")

// cancelRemembered is how long a cancel told to this process is kept for a job that had not gone to
// sleep on its slot yet (between its admission and its sleep: a moment).
const cancelRemembered = time.Minute

// cancelNotes are the cancels this process was told of (NoteCancel), by provider and job id: the jobs
// sleeping on a slot (every delivery of it) wait on channels that a cancel of theirs closes.
type cancelNotes struct {
	mu       sync.Mutex
	told     map[string]time.Time       // provider\x00id -> when told (the local clock)
	sleepers map[string][]chan struct{} // provider\x00id -> closed by its cancel
}

func cancelKey(provider, jobID string) string { return provider + "\x00" + jobID }

// note records a cancel and wakes the jobs sleeping on its slot, if any.
func (c *cancelNotes) note(provider, jobID string, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.told == nil {
		c.told, c.sleepers = map[string]time.Time{}, map[string][]chan struct{}{}
	}
	for k, at := range c.told {
		if now.Sub(at) > cancelRemembered {
			delete(c.told, k)
		}
	}
	k := cancelKey(provider, jobID)
	c.told[k] = now
	for _, ch := range c.sleepers[k] {
		close(ch)
	}
	delete(c.sleepers, k)
}

// sleep registers a job going to sleep on its slot: cancelled is closed by a cancel of it (at once when
// one was told already), and leave takes it out.
func (c *cancelNotes) sleep(provider, jobID string) (cancelled <-chan struct{}, leave func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan struct{})
	k := cancelKey(provider, jobID)
	if _, told := c.told[k]; told {
		close(ch)
		return ch, func() {}
	}
	if c.sleepers == nil {
		c.told, c.sleepers = map[string]time.Time{}, map[string][]chan struct{}{}
	}
	c.sleepers[k] = append(c.sleepers[k], ch)
	return ch, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.sleepers[k] = slices.DeleteFunc(c.sleepers[k], func(x chan struct{}) bool { return x == ch })
		if len(c.sleepers[k]) == 0 {
			delete(c.sleepers, k)
		}
	}
}

// givesUp asks the gate whether a cancel waits for the job sleeping on its slot (told: NoteCancel): true
// when it does, and the job must not be sent. A gate that cannot answer leaves the slot standing: the
// cancel, unanswered, takes the job as sent.
func (w *Worker) givesUp(ctx context.Context, a *admission) bool {
	g, ok := w.gate.(canceller)
	if !ok {
		return true
	}
	yes, err := g.AckCancel(ctx, a.provider, gate.OwnID(a.gateID))
	if err != nil {
		w.redisLog.Warn(w.log, w.now(), "gate unreachable: a cancelled job's slot stands, the job goes on it", zap.String("provider", a.provider), zap.Error(err))
	}
	return yes
}

// NoteCancel is told of every job cancelled while admitted for a slot still ahead (gate.Limiter.Watch): a
// job of this process holding that slot gives it up and asks again, and its next reserve is denied as
// cancelled.
func (w *Worker) NoteCancel(provider, jobID string) {
	w.cancels.note(provider, jobID, time.Now())
}

// cancelled settles a job the gate denied as cancelled: its result published (outcome cancelled) where
// results are on, then acknowledged. It never reached the provider.
func (s *settlement) cancelled(ctx context.Context) {
	ctx, cancel := settleCtx(ctx)
	defer cancel()
	reason := ""
	if g, ok := s.w.gate.(canceller); ok && s.w.cfg.Results != nil && s.job != nil {
		reason, _ = g.CancelReason(ctx, s.provider, s.job.ID) // the result goes without it when Redis fails
	}
	if !s.record(ctx, ResultCancelled, reason, s.attempt) {
		s.unrecorded(ctx, "")
		return
	}
	s.done(OutcomeCancelled, s.d.Ack(ctx), errCancelled)
}
