package consumers

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"
)

// Cancels (`worker cancel`, gate.Limiter.Cancel). The gate holds a cancel where admissions are decided:
// a cancelled job's every later reserve is denied (gate.Verdict.Cancelled), and the job is settled as
// cancelled. What the gate cannot take back is a slot it handed out before the cancel: the holder is told
// (NoteCancel, from the gate's announcement) and gives the slot up rather than send the job. The cancel
// waits for that, up to the slot plus LossNotice; a holder that did not hear (its watch disconnected)
// gives up its slots anyway (NoteDisconnect), and the job's next reserve meets the cancel.

// cancelReasons is the part of the gate that keeps a cancel's reason (gate.Limiter), for the result.
type cancelReasons interface {
	CancelReason(ctx context.Context, provider, jobID string) (string, error)
}

// errCancelled is why a cancelled job is settled so.
var errCancelled = errors.New("cancelled (worker cancel)")

// cancelRemembered is how long a cancel told to this process is kept for a job that had not gone to
// sleep on its slot yet (between its admission and its sleep: a moment).
const cancelRemembered = time.Minute

// cancelNotes are the cancels this process was told of (NoteCancel), by provider and job id: the jobs
// sleeping on a slot wait on a channel that a cancel of theirs closes.
type cancelNotes struct {
	mu       sync.Mutex
	told     map[string]time.Time     // provider\x00id -> when told (the local clock)
	sleepers map[string]chan struct{} // provider\x00id -> closed by its cancel
}

func cancelKey(provider, jobID string) string { return provider + "\x00" + jobID }

// jobIDOf is the job's own id in its gate id (GateID: a retry's id carries "\x1f<attempt>").
func jobIDOf(gateID string) string {
	id, _, _ := strings.Cut(gateID, "\x1f")
	return id
}

// note records a cancel and wakes the job sleeping on its slot, if any.
func (c *cancelNotes) note(provider, jobID string, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.told == nil {
		c.told, c.sleepers = map[string]time.Time{}, map[string]chan struct{}{}
	}
	for k, at := range c.told {
		if now.Sub(at) > cancelRemembered {
			delete(c.told, k)
		}
	}
	k := cancelKey(provider, jobID)
	c.told[k] = now
	if ch, ok := c.sleepers[k]; ok {
		close(ch)
		delete(c.sleepers, k)
	}
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
		c.told, c.sleepers = map[string]time.Time{}, map[string]chan struct{}{}
	}
	c.sleepers[k] = ch
	return ch, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.sleepers[k] == ch {
			delete(c.sleepers, k)
		}
	}
}

// take reports whether a cancel of the job was told to this process, and forgets it: a job gives its slot
// up once per cancel told (a cancel that found the job had left is lifted, and its next slot stands).
func (c *cancelNotes) take(provider, jobID string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := cancelKey(provider, jobID)
	_, told := c.told[k]
	delete(c.told, k)
	return told
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
	if g, ok := s.w.gate.(cancelReasons); ok && s.w.cfg.Results != nil && s.job != nil {
		reason, _ = g.CancelReason(ctx, s.provider, s.job.ID) // the result goes without it when Redis fails
	}
	if !s.record(ctx, ResultCancelled, reason, s.attempt) {
		s.unrecorded(ctx, "")
		return
	}
	s.done(OutcomeCancelled, s.d.Ack(ctx), errCancelled)
}
