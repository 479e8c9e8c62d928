package gate

import (
	"context"
	"time"
)

// ScriptOf exposes a provider's script source, keys and own arguments (ARGV[7..]) to the black-box tests,
// which run altered copies of the script (TestFailedDecisionWritesNothing).
func ScriptOf(l *Limiter, name string) (src string, keys []string, args []any) {
	p := *l.providers[name].cur.Load()
	return families[p.algo].src, p.keys.all, p.appendArgv(nil, p.inForce.Load(), nil)
}

// ShapeOf is the shape of a provider's state (stateShape) that its epoch records.
func ShapeOf(l *Limiter, name string) int64 { return l.providers[name].cur.Load().shape }

// SetMarginTiming shortens how long a widened margin holds and a lateness report counts, for tests.
func SetMarginTiming(l *Limiter, hold, fresh time.Duration) { l.hold, l.fresh = hold, fresh }

// UsesFunctions tells whether l runs the family as a Redis Function (else with EVALSHA).
func UsesFunctions(l *Limiter) bool {
	return l.fn != nil && time.Now().UnixNano() >= l.evalUntil.Load()
}

// ForceEval makes l run the family with EVALSHA, as on a server without functions.
func ForceEval(l *Limiter) { l.evalUntil.Store(time.Now().Add(time.Hour).UnixNano()) }

// DecideBatch decides the jobs (ids and costs, one max wait) in one call, as a batcher sends them.
func DecideBatch(ctx context.Context, l *Limiter, providerName string, ids []string, costs []int64, maxWait time.Duration) ([]Verdict, []error) {
	p, err := l.provider(providerName)
	if err != nil {
		panic(err)
	}
	jobs := make([]*pending, len(ids))
	for i := range ids {
		c := call{op: opReserve, jobID: ids[i], cost: costs[i], arg4: microsFloor(maxWait), arg5: l.stale, margin: p.inForce.Load()}
		jobs[i] = &pending{call: c, done: make(chan struct{})}
	}
	l.decideAll(ctx, p, providerName, jobs[0].margin, jobs)
	vs, errs := make([]Verdict, len(jobs)), make([]error, len(jobs))
	for i, j := range jobs {
		vs[i], errs[i] = j.v, j.err
	}
	return vs, errs
}

// LingerClock puts a provider's batcher on the test's clock: a linger ends when fire is called (or the
// queue fills); queued tells how many reserves wait. Call it while no reserve of the provider is under way.
func LingerClock(l *Limiter, providerName string) (fire func(), queued func() int) {
	p, err := l.provider(providerName)
	if err != nil {
		panic(err)
	}
	b, ch := p.batch, make(chan time.Time)
	b.after = func(time.Duration) <-chan time.Time { return ch }
	return func() { ch <- time.Now() }, func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue)
	}
}

// BatchRunning tells whether a provider's batcher has a call on its way, or a drain gathering its queue.
func BatchRunning(l *Limiter, providerName string) bool {
	p, err := l.provider(providerName)
	if err != nil {
		panic(err)
	}
	p.batch.mu.Lock()
	defer p.batch.mu.Unlock()
	return p.batch.gather || p.batch.calling > 0
}
