package consumers

import (
	"context"
	"errors"
	"net/http/httptrace"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/paygate/paygate/gate"
)

// departure is one request's watch on when it was written (httptrace's WroteRequest). The lateness guard
// runs as the job wakes; a process stalled after it (a starved CPU, a GC pause, a slow connection pool)
// can still write the request later than the margin allows for. Written more than DepartLimit after its
// slot (as the gate's answer put it: the round trip to Redis is the lateness guard's), the request's
// entry in the gate moves to when it left (gate.Limiter.Departed), at once: the slots decided from then on
// are spaced from when the provider got it, not from when it should have. Slots already handed out cannot
// be recalled; the sooner the move, the fewer of those there are.
//
// The margin absorbs what no worker records: a write up to DepartLimit late, and the trip to the
// provider. The lower the limit, the more of the margin is left for the trip, at a Redis call for each
// request written past it: a quarter of the late limit (an eighth of gate.margin) leaves seven eighths.
type departure struct {
	once sync.Once
	done chan struct{}
	at   time.Time // the admission's new slot; zero: not moved
}

// watchDeparture returns ctx with the watch of the request for the admission a, at its slot, due on the
// worker's clock as the answer put it (admission.answeredDue).
func (w *Worker) watchDeparture(ctx context.Context, a *admission) (context.Context, *departure) {
	d := &departure{}
	provider, merchant, gid, slot, due := a.provider, a.merchant, a.gateID, a.slot, a.answeredDue
	trace := &httptrace.ClientTrace{WroteRequest: func(info httptrace.WroteRequestInfo) {
		late := w.now().Sub(due)
		if info.Err != nil || late <= DepartLimit(w.cfg.LateLimit) {
			return // a write that failed never reached the provider (the transport may write again)
		}
		// The first whole write moves the entry. The transport writes a request again after a whole
		// write only when the connection broke before any answer; the provider then has the first.
		d.once.Do(func() {
			d.done = make(chan struct{})
			go func() {
				defer close(d.done)
				// Not cut short by the request's end or a shutdown (the provider has the request), but
				// bounded: the handler waits for it.
				ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), departTimeout)
				defer cancel()
				at, err := w.gate.Departed(ctx, provider, merchant, gid, slot, late)
				if errors.Is(err, gate.ErrUnacknowledged) {
					// The request left; its move stands on the primary, but the replicas may still hold it
					// at its slot: a failover now would count it there.
					d.at = at
					w.metrics.decided(provider, DecisionUnacknowledged)
					w.redisLog.Warn(w.log, w.now(), "a request written late was recorded where it went, but the replicas did not acknowledge it", zap.String("provider", provider), zap.Duration("late", late), zap.Error(err))
					return
				}
				if err != nil {
					w.redisLog.Warn(w.log, w.now(), "a request written late could not be recorded where it went", zap.String("provider", provider), zap.Duration("late", late), zap.Error(err))
					return
				}
				if !at.IsZero() {
					d.at = at
					w.metrics.decided(provider, DecisionDeparted)
				}
			}()
		})
	}}
	return httptrace.WithClientTrace(ctx, trace), d
}

// DepartLimit is how late after its slot a request may be written before its entry moves to when it
// left: a quarter of the late limit.
func DepartLimit(lateLimit time.Duration) time.Duration { return lateLimit / 4 }

// departTimeout bounds the move of a late request's entry (a Redis call; the handler waits for it).
const departTimeout = 5 * time.Second

// wait waits for the move the request's write began, if any, and returns the admission's slot: moved, or
// slot as it was.
func (d *departure) wait(slot time.Time) time.Time {
	d.once.Do(func() {}) // a write after Dispatch returned (the answer came first) moves nothing
	if d.done == nil {
		return slot
	}
	<-d.done
	if d.at.IsZero() {
		return slot
	}
	return d.at
}
