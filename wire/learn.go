package wire

import (
	"context"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/gate"
)

// learner learns one adaptive provider's limit (providers.<name>.adaptive) from what this process sees:
// a 429 asks the gate to cut the limit; a success while the limit binds (a job of this process waited
// for its slot or was denied within the last window) asks it to raise it. The gate takes at most one
// step per window for the whole fleet (gate.Limiter.Learn).
type learner struct {
	g       *gate.Limiter
	name    string
	lo, hi  gate.Policy
	log     *zap.Logger
	bound   atomic.Int64 // unix ns: the last time the limit held a job of this process back
	lastUp  atomic.Int64 // unix ns: the last time this process asked for a raise
	lastCut atomic.Int64 // unix ns: the last 429 this process saw
	lastErr atomic.Int64
}

func newLearners(c *config.Config, g *gate.Limiter, log *zap.Logger) map[string]*learner {
	out := map[string]*learner{}
	for name, p := range c.Providers {
		if p.Adaptive == nil {
			continue
		}
		lo, hi, err := p.Adaptive.Range() // valid: config.Validate checked it
		if err != nil {
			continue
		}
		out[name] = &learner{g: g, name: name, lo: lo, hi: hi, log: log}
	}
	return out
}

// reserved notes a verdict: the limit binds when a job is denied by it, or is admitted at a slot where
// the window is (almost) full: less than 5 % of the limit left (Verdict.Remaining). Light traffic leaves
// room at its slots, however it bunches; a pause or the in-flight cap is not the limit binding.
func (l *learner) reserved(v gate.Verdict) {
	if (!v.Allowed && !v.InFlight && !v.Paused) || (v.Allowed && v.Remaining < max(1, v.Limit.Limit/20)) {
		l.bound.Store(time.Now().UnixNano())
	}
}

// answered takes a provider's answer (providers.Options.OnAnswer): throttled is a 429, or a 503 with
// Retry-After.
func (l *learner) answered(status int, throttled bool) {
	now := time.Now().UnixNano()
	window := int64(l.lo.Window)
	var up bool
	switch {
	case throttled:
		l.lastCut.Store(now)
	case status >= 200 && status < 300 && now-l.bound.Load() < window && now-l.lastUp.Load() >= window &&
		now-l.lastCut.Load() >= window: // no raise while the provider still refuses

		l.lastUp.Store(now)
		up = true
	default:
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	changed, err := l.g.Learn(ctx, l.name, up, l.lo, l.hi)
	switch {
	case err != nil:
		if now-l.lastErr.Load() > int64(10*time.Second) {
			l.lastErr.Store(now)
			l.log.Warn("could not learn the provider's limit; the limit in force stays", zap.String("provider", l.name), zap.Error(err))
		}
	case changed:
		if live, err := l.g.Limits(ctx, l.name); err == nil {
			l.log.Info("learned limit", zap.String("provider", l.name), zap.Bool("raised", up), zap.String("limits", gate.FormatPolicies(live.Policies)))
		}
	}
}

// learningGate tells the learners what the gate answers, on the way to the worker core.
type learningGate struct {
	consumers.Gate
	learners map[string]*learner
}

func (g learningGate) ReserveFor(ctx context.Context, provider, merchant, jobID string, cost int64, maxWait time.Duration) (gate.Verdict, error) {
	v, err := g.Gate.ReserveFor(ctx, provider, merchant, jobID, cost, maxWait)
	if l := g.learners[provider]; l != nil && err == nil {
		l.reserved(v)
	}
	return v, err
}
