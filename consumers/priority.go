package consumers

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paygate/paygate/job"
)

// Priority classes (job.Priority). Each class of a provider arrives on a stream of its own (Route: the
// queue X.<provider>.high, the topic T.<provider>.low, …), so that a high job never waits in the broker
// behind a low backlog. In the worker:
//
//   - its handlers take the deliveries waiting their turn high first, then normal, then low (classQueues);
//     fair shares between merchants keep working inside each class (one fairQueue per class);
//   - a low job asks the gate for a slot within Config.LowHorizon only, not MaxInlineWait, so that the
//     low jobs of the fleet hold at most that much of the budget ahead of a higher job that arrives;
//   - the low jobs of a provider ask the gate one at a time in a process (its lane), and a low job denied
//     waits out the gate's RetryAfter plus half the horizon before it asks again: the slots that opened
//     meanwhile go to the lane's next jobs one call each, so that a backlog of low jobs alone still fills
//     the budget with few calls beyond one per job;
//   - the lane does not ask while higher-class deliveries of the provider were found waiting for a
//     handler in this process within the last LowHorizon, nor, with UseWaiting, in any process of the
//     fleet (on Kafka a member may have run out of high jobs while another still holds some): the slots
//     go to them.

// Route is where a job of provider and class arrives: the provider's name for normal jobs (its queue
// X.<provider>, its topic T.<provider>), <provider>.high and <provider>.low for the others (the queues
// X.<provider>.high and X.<provider>.low, bound by those routing keys; the topics T.<provider>.high and
// T.<provider>.low). A provider's name has no '.', so a route names one provider and one class.
func Route(provider string, class job.Priority) string {
	if class == job.Normal || class == "" {
		return provider
	}
	return provider + "." + string(class)
}

// SplitRoute is Route's inverse: the provider and the class of a route.
func SplitRoute(route string) (string, job.Priority) {
	if p, c, ok := strings.Cut(route, "."); ok {
		return p, job.Priority(c)
	}
	return route, job.Normal
}

// Routes are every route of a provider, highest class first.
func Routes(provider string) []string {
	out := make([]string, 0, len(job.Priorities))
	for _, c := range job.Priorities {
		out = append(out, Route(provider, c))
	}
	return out
}

// classes is what the worker knows of one provider's classes: its low lane and when a higher-class
// delivery was last found waiting for a handler, here and in the fleet.
type classes struct {
	provider string
	lane     chan struct{} // held by the low job asking the gate
	stopping chan struct{} // closed when Run's context ends: a low job waiting for the lane goes back
	waiting  atomic.Int64  // unix ns when a high or normal delivery was last taken without waiting for it
	// The fleet's (UseWaiting; nil: this process's alone): when this process last told it, and until
	// when the fleet's lanes yield as last read (unix ns).
	shared     Waiting
	horizon    time.Duration // Config.LowHorizon
	told       atomic.Int64
	fleetUntil atomic.Int64
	read       atomic.Int64 // when a read was last begun
	fresh      atomic.Int64 // when the read that set fleetUntil was begun
}

// Waiting shares across the fleet that a provider's high or normal deliveries wait for handlers, so that
// every process's low lane yields to them (wire: a key in Redis beside the gate's, kept LowHorizon).
type Waiting interface {
	// NoteWaiting says that higher-class deliveries of the provider were waiting: the fleet's lanes yield
	// for d.
	NoteWaiting(ctx context.Context, provider string, d time.Duration) error
	// Waiting is how much longer the fleet's lanes of the provider yield (0: they need not).
	Waiting(ctx context.Context, provider string) (time.Duration, error)
}

// UseWaiting shares the classes' waiting deliveries with the fleet through s. Call it before Run.
func (w *Worker) UseWaiting(s Waiting) {
	for _, c := range w.classes {
		c.shared = s
	}
}

// sharedTimeout bounds a call of Waiting: the lane asks the gate anyway when it does not answer.
const sharedTimeout = time.Second

// noteWaiting records that a higher-class delivery was waiting (under the queues' lock: the fleet is
// told in the background, at most every quarter horizon).
func (c *classes) noteWaiting(now time.Time) {
	c.waiting.Store(now.UnixNano())
	if c.shared == nil || c.horizon <= 0 || now.UnixNano()-c.told.Load() < int64(c.horizon/4) {
		return
	}
	c.told.Store(now.UnixNano())
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), sharedTimeout)
		defer cancel()
		_ = c.shared.NoteWaiting(ctx, c.provider, c.horizon) // best effort: the lane yields less, nothing more
	}()
}

// fleetYield is how much longer the fleet's higher-class deliveries hold the lane, as last read (read
// again at most every quarter horizon).
func (c *classes) fleetYield(ctx context.Context, now time.Time) time.Duration {
	if c.shared == nil {
		return 0
	}
	if now.UnixNano()-c.fresh.Load() >= int64(c.horizon/4) { // the lane waits for a word this fresh
		c.read.Store(now.UnixNano())
		c.readFleet(ctx, now)
	}
	return time.Duration(c.fleetUntil.Load() - now.UnixNano())
}

// readFleet reads the fleet's word (the gate is asked as without it when Redis does not answer).
func (c *classes) readFleet(ctx context.Context, now time.Time) {
	ctx, cancel := context.WithTimeout(ctx, sharedTimeout)
	defer cancel()
	d, err := c.shared.Waiting(ctx, c.provider)
	if err != nil {
		d = 0
	}
	c.fleetUntil.Store(now.Add(d).UnixNano())
	c.fresh.Store(now.UnixNano())
}

// yieldFor is how much longer low jobs yield to higher-class deliveries found waiting, here or (as last
// read; a read that is due is made in the background) in the fleet: handlers take no low delivery
// meanwhile.
func (c *classes) yieldFor(now time.Time) time.Duration {
	yield := time.Duration(c.waiting.Load()) + c.horizon - time.Duration(now.UnixNano())
	if c.horizon <= 0 {
		return 0
	}
	if c.shared != nil {
		if last := c.read.Load(); now.UnixNano()-last >= int64(c.horizon/4) && c.read.CompareAndSwap(last, now.UnixNano()) {
			go c.readFleet(context.Background(), now)
		}
		yield = max(yield, time.Duration(c.fleetUntil.Load()-now.UnixNano()))
	}
	return yield
}

func newClasses(providers map[string]int64, horizon time.Duration) map[string]*classes {
	out := make(map[string]*classes, len(providers))
	for p := range providers {
		out[p] = &classes{provider: p, lane: make(chan struct{}, 1), horizon: horizon, stopping: make(chan struct{})}
	}
	return out
}

// classQueues are a provider's deliveries waiting their turn, one queue per class (job.Priorities order)
// under one lock: fair shares between merchants inside each class (Config.Fair), or the order they came.
// Each class's stream is read ahead into its queue, up to its limit.
type classQueues struct {
	c      *classes
	now    func() time.Time
	mu     sync.Mutex
	queued *sync.Cond
	qs     []*fairQueue
	timer  bool // a wake-up is set for when the low deliveries held back may go
	// stopping: the worker is shutting down; nothing is held back (every delivery goes back to its queue,
	// and the streams' feeds must find room to drain)
	stopping bool
}

// stop holds nothing back any more: the worker is shutting down (a low job waiting for the lane goes
// back to its queue too).
func (cq *classQueues) stop() {
	cq.mu.Lock()
	cq.stopping = true
	cq.mu.Unlock()
	cq.queued.Broadcast()
	close(cq.c.stopping)
}

// newClassQueues reads the provider's class streams (job.Priorities order) into their queues until they
// close; run starts each feed.
func (c *classes) newClassQueues(now func() time.Time, streams []<-chan Delivery, weights map[string]int, fair bool, limit int, run func(func())) *classQueues {
	cq := &classQueues{c: c, now: now}
	c.stopping = make(chan struct{}) // this run's (before its handlers start)
	cq.queued = sync.NewCond(&cq.mu)
	for _, s := range streams {
		q := newFairQueueOn(&cq.mu, cq.queued, weights, limit)
		q.fifo = !fair
		cq.qs = append(cq.qs, q)
		run(func() { q.feed(s) })
	}
	return cq
}

// pop takes the next delivery: the highest class's that has one waiting, else the first to come; with its
// class. Low deliveries are not taken while low jobs yield to higher classes (yieldFor; not once the
// worker stops): a handler stays free for those, rather than hold a low job that may not ask. False
// once every stream has closed and every queue is empty.
func (cq *classQueues) pop() (Delivery, job.Priority, bool) {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	for waited := false; ; waited = true {
		closed := 0
		for i, q := range cq.qs {
			if len(q.turn) > 0 && job.Priorities[i] == job.Low && !q.closed && !cq.stopping {
				if y := cq.c.yieldFor(cq.now()); y > 0 {
					cq.wakeAfter(y)
					continue
				}
			}
			if len(q.turn) > 0 {
				d := q.take()
				if class := job.Priorities[i]; class != job.Low && !waited { // it waited for a handler: the lane yields
					cq.c.noteWaiting(cq.now())
				}
				return d, job.Priorities[i], true
			}
			if q.closed {
				closed++
			}
		}
		if closed == len(cq.qs) {
			return nil, "", false
		}
		cq.queued.Wait()
	}
}

// wakeAfter wakes the handlers after d, for the low deliveries held back (under cq.mu; one wake-up at a
// time).
func (cq *classQueues) wakeAfter(d time.Duration) {
	if cq.timer {
		return
	}
	cq.timer = true
	time.AfterFunc(d, func() {
		cq.mu.Lock()
		cq.timer = false
		cq.mu.Unlock()
		cq.queued.Broadcast()
	})
}

// laneStride is how much more than the gate's RetryAfter a denied low job waits: half the horizon, so that
// on asking again half the horizon's slots are open for the lane's next jobs.
func (w *Worker) laneStride() time.Duration { return w.cfg.LowHorizon / 2 }

// enterLane takes the provider's low lane for a low job, waiting while another low job holds it or while
// higher-class deliveries were found waiting; the wait counts into the handling's denied waits, and once
// those reach MaxInlineWait the job asks without the lane (and is deferred if denied). leave gives the
// lane back; false when ctx ended or the worker stops (the job goes back to its queue).
func (w *Worker) enterLane(ctx context.Context, a *admission) (leave func(), ok bool) {
	c := w.classes[a.provider]
	began := w.now()
	defer func() {
		waited := w.now().Sub(began)
		a.denied += waited
		a.waited += waited
	}()
	budget := w.cfg.MaxInlineWait - a.denied
	if budget <= 0 {
		return func() {}, ctx.Err() == nil
	}
	t := time.NewTimer(budget)
	defer t.Stop()
	select {
	case c.lane <- struct{}{}:
	case <-t.C:
		return func() {}, true
	case <-ctx.Done():
		return nil, false
	case <-c.stopping: // shutting down: it holds nothing at the gate yet, so it goes back at once
		return nil, false
	}
	leave = func() { <-c.lane }
	for {
		now := w.now()
		yield := time.Duration(c.waiting.Load()) + w.cfg.LowHorizon - time.Duration(now.UnixNano())
		if yield <= 0 {
			yield = c.fleetYield(ctx, now)
		}
		if yield <= 0 {
			return leave, true
		}
		select {
		case <-time.After(yield):
		case <-t.C:
			return leave, true
		case <-ctx.Done():
			leave()
			return nil, false
		case <-c.stopping:
			leave()
			return nil, false
		}
	}
}
