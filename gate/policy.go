package gate

import (
	"fmt"
	"time"
)

// Policy is one rate limit: at most Limit units of cost in any window of length Window.
type Policy struct {
	Limit  int64
	Window time.Duration
}

// String renders the policy as config and the CLI write it: "100/1s", "3000/1m0s" as "3000/1m".
func (p Policy) String() string { return fmt.Sprintf("%d/%s", p.Limit, FormatDuration(p.Window)) }

// FormatDuration is time.Duration.String without the zero units ("1m" rather than "1m0s").
func FormatDuration(d time.Duration) string {
	s := d.String()
	for _, z := range []struct{ suffix, unit string }{{"m0s", "m"}, {"h0m", "h"}} {
		if len(s) > len(z.suffix) && s[len(s)-len(z.suffix):] == z.suffix {
			s = s[:len(s)-len(z.suffix)] + z.unit
		}
	}
	return s
}

// checkPolicies checks one set of policies (a provider's, or a merchant's within it; who names it) for algo.
func checkPolicies(who string, algo Algorithm, policies []Policy, margin time.Duration) error {
	windows := map[int64]bool{} // in µs, as the scripts see them
	for i, pol := range policies {
		if pol.Limit < 1 || pol.Window < time.Millisecond || pol.Window > MaxWindow {
			return fmt.Errorf("gate: %s policy %d (%s): limit must be >= 1 and window 1ms..%s", who, i, pol, MaxWindow)
		}
		if algo == SlidingLog && pol.Limit > MaxSlidingLogLimit {
			return fmt.Errorf("gate: %s policy %d (%s): %s keeps one entry per unit of cost and takes limits up to %d; use %s or %s for larger budgets",
				who, i, pol, algo, MaxSlidingLogLimit, SlidingWindow, GCRA)
		}
		if algo != SlidingLog && windows[micros(pol.Window)] {
			return fmt.Errorf("gate: %s policy %d (%s): a window may appear once, to the µs (%s keeps its state per window)", who, i, pol, algo)
		}
		if algo == FixedWindow && pol.Window <= margin {
			return fmt.Errorf("gate: %s policy %d (%s): %s needs windows longer than the margin (%s)", who, i, pol, algo, margin)
		}
		windows[micros(pol.Window)] = true
	}
	return nil
}

// MaxPacedWindow is the longest window a provider is paced by: a longer one (an hourly or daily cap) is a
// quota, counted exactly but never spread out over its window.
const MaxPacedWindow = time.Minute

// PaceOf is how far apart a provider with these policies has its slots handed out per unit of cost, when
// paced (Provider.Burst >= 1): its shortest window plus the margin, shared out evenly over that window's
// limit (the smallest limit among policies of that window), rounded up to the µs. 0 when the shortest
// window is longer than MaxPacedWindow: then every window is a quota, counted exactly, never spread out.
// Longer windows than the shortest are never paced.
func PaceOf(policies []Policy, margin time.Duration) time.Duration {
	if len(policies) == 0 {
		return 0
	}
	return time.Duration(paceMicros(ShortestPolicy(policies), micros(margin))) * time.Microsecond
}

// paceMicros is PaceOf in µs for the provider's shortest policy under margin (µs).
func paceMicros(shortest Policy, margin int64) int64 {
	if shortest.Window > MaxPacedWindow || shortest.Limit < 1 {
		return 0
	}
	return (micros(shortest.Window) + margin + shortest.Limit - 1) / shortest.Limit
}

// ShortestPolicy is the policy a provider is paced by: the shortest window, the smallest limit among ties
// (policies must not be empty).
func ShortestPolicy(policies []Policy) Policy {
	shortest := policies[0]
	for _, pol := range policies[1:] {
		if pol.Window < shortest.Window || (pol.Window == shortest.Window && pol.Limit < shortest.Limit) {
			shortest = pol
		}
	}
	return shortest
}

// checkBurst refuses a Provider.Burst outside 0..the limit of the shortest window.
func checkBurst(name string, policies []Policy, burst int64) error {
	if shortest := ShortestPolicy(policies); burst < 0 || burst > shortest.Limit {
		return fmt.Errorf("gate: provider %s: burst must be 0..%d (the limit of its shortest window, %s), got %d", name, shortest.Limit, shortest, burst)
	}
	return nil
}

// Pace returns how far apart a provider's slots are handed out, per unit of cost (0: not paced), and how
// many units may share one moment (Provider.Burst).
func (l *Limiter) Pace(providerName string) (every time.Duration, burst int64, err error) {
	p, err := l.provider(providerName)
	if err != nil {
		return 0, 0, err
	}
	pace, tolerance := p.paceAt(p.inForce.Load())
	if pace == 0 {
		return 0, 0, nil
	}
	return time.Duration(pace) * time.Microsecond, tolerance/pace + 1, nil
}
