package consumers

import (
	"context"
	"fmt"
	"time"

	"github.com/paygate/paygate/job"
)

// errNotYet is why a job is deferred before its not_before.
var errNotYet = fmt.Errorf("not before its not_before")

// untilNotBefore holds a job until its not_before (job.Job.NotBefore): in-process when that is at most
// max_inline_wait away, else deferred for the longest delay tier that does not pass it (so that it
// comes back early, never late, and is held again), asking the gate nothing and spending no attempt. A
// not_before further out than max_deferral_age is dead-lettered as invalid. False when the delivery was
// settled (deferred, dead-lettered, or the worker stopping).
func (w *Worker) untilNotBefore(ctx context.Context, s *settlement, j *job.Job) bool {
	wait := j.NotBefore.Sub(w.now())
	switch {
	case j.NotBefore.IsZero() || wait <= 0:
		return true
	case wait > w.cfg.MaxDeferralAge:
		s.deadLetter(ctx, ReasonInvalid, OutcomeInvalid, &job.InvalidError{Field: "not_before",
			Msg: fmt.Sprintf("%s is %s ahead, more than max_deferral_age %s", j.NotBefore.Format(time.RFC3339), wait.Round(time.Second), w.cfg.MaxDeferralAge)})
		return false
	case wait <= w.cfg.MaxInlineWait:
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-ctx.Done():
			s.requeue(ctx)
			return false
		}
	}
	s.deferFor(ctx, w.tierWithin(wait), OutcomeScheduled, errNotYet)
	return false
}

// tierWithin is the longest delay tier at most d (the first when none is).
func (w *Worker) tierWithin(d time.Duration) time.Duration {
	best := w.cfg.RedisRetry // the first tier
	for _, t := range w.cfg.OutageTiers {
		if t <= d {
			best = max(best, t)
		}
	}
	return best
}
