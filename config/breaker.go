package config

import "time"

// Breaker is providers.<name>.breaker: the provider's circuit breaker, one for the whole fleet, kept in
// Redis (gate.Breaker). After Failures transient failures in a row across the fleet (5xx, timeouts,
// refused or reset connections, retry_on statuses; any other answer ends the run) the provider opens:
// nothing is sent to it, and its jobs wait without spending attempts. After OpenFor one request goes as a
// probe: its success closes the breaker, its failure reopens it for twice as long, up to OpenMax.
type Breaker struct {
	// Failures is how many transient failures in a row open the breaker (default DefaultBreakerFailures);
	// 0 turns it off. A pointer, so that a breaker given only open_for keeps the default.
	Failures *int `mapstructure:"failures"`
	// OpenFor is how long the breaker stays open before its first probe (default 1s); each reopening
	// doubles it, up to OpenMax (default 5m).
	OpenFor time.Duration `mapstructure:"open_for"`
	OpenMax time.Duration `mapstructure:"open_max"`
}

// The breaker's defaults and bounds.
const (
	DefaultBreakerFailures = 5
	DefaultBreakerOpenFor  = time.Second
	DefaultBreakerOpenMax  = 5 * time.Minute
	MaxBreakerFailures     = 1000
	MaxBreakerOpen         = 24 * time.Hour // open_max at most: a provider is probed at least once a day
)

// Threshold is how many transient failures in a row open the breaker: 0 when it is off.
func (b Breaker) Threshold() int {
	if b.Failures == nil {
		return DefaultBreakerFailures
	}
	return *b.Failures
}

// withDefaults fills the keys the configuration leaves out.
func (b Breaker) withDefaults() Breaker {
	if b.Failures == nil {
		n := DefaultBreakerFailures
		b.Failures = &n
	}
	if b.OpenFor == 0 {
		b.OpenFor = DefaultBreakerOpenFor
	}
	if b.OpenMax == 0 {
		b.OpenMax = max(DefaultBreakerOpenMax, b.OpenFor)
	}
	return b
}

// validateBreaker checks providers.<name>.breaker.
func (pr Provider) validateBreaker(p *problems, path string) {
	b, path := pr.Breaker, path+".breaker"
	n := b.Threshold()
	p.check(n >= 0 && n <= MaxBreakerFailures, path+".failures", "must be 0 (off)..%d, got %d", MaxBreakerFailures, n)
	if n == 0 {
		return
	}
	p.check(b.OpenFor >= time.Millisecond, path+".open_for", "must be >= 1ms, got %s", b.OpenFor)
	switch {
	case b.OpenMax < b.OpenFor:
		p.add(path+".open_max", "must be >= open_for (%s), got %s", b.OpenFor, b.OpenMax)
	case b.OpenMax > MaxBreakerOpen:
		p.add(path+".open_max", "must be <= %s (a provider is probed at least once a day), got %s", MaxBreakerOpen, b.OpenMax)
	}
}
