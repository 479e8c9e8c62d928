package consumers

import (
	"context"

	"github.com/paygate/paygate/job"
	"github.com/paygate/paygate/providers"
)

// send dispatches the job on its admission and returns the provider's answer (nil when none came) and its
// classification. A request written late is recorded where it went (watchDeparture), the admission's slot
// moved with it; the in-flight lease ends once the request has ended.
func (w *Worker) send(ctx context.Context, a *admission, j *job.Job) (*providers.Answer, error) {
	traced, departed := ctx, (*departure)(nil) // the request's context, with the watch on its write when there is one
	if a.verdict.Allowed && !a.verdict.Duplicate && !a.shadow && w.cfg.LateLimit > 0 {
		// A late write counts from the slot as the answer put it, as the margin's reports do: the round
		// trip to Redis is the lateness guard's (counted from the deciding call's asking, within the late
		// limit), and counted here too it would cost a Redis call for each request whenever Redis is slow,
		// loading the gate most when it is slowest.
		traced, departed = w.watchDeparture(ctx, a)
	}
	start := w.now()
	a.sent = start
	w.journal(a.provider, j.ID, start, "") // left: worker cancel tells it left from here on
	answer, err := w.dispatch[a.provider].Dispatch(traced, j)
	if departed != nil {
		a.slot = departed.wait(a.slot)
	}
	if providers.Answered(err) {
		w.land(ctx, a) // the request has ended: the next job held back by the cap may go
	} else {
		// No answer (a timeout, a cut connection, a shutdown): the provider may still be working on it.
		// Its lease is left to lapse (the provider's timeout plus a slack after the slot), so that the
		// place is not taken again while the request may still be in flight.
		a.lease = ""
	}
	w.metrics.dispatch.WithLabelValues(a.provider, string(providers.OutcomeOf(err))).Observe(w.now().Sub(start).Seconds())
	return answer, err
}
