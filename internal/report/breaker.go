package report

import (
	"context"
	"time"

	"github.com/paygate/paygate/gate"
)

// Breaker is a provider's circuit breaker (providers.<name>.breaker) as gate status --json prints it and
// the dashboard shows it; its keys are a public contract (add, never rename).
type Breaker struct {
	// State is "closed", "open", "probing", or "off" (failures: 0; the other keys are then zero).
	State string `json:"state"`
	// Failures are the transient failures in a row so far (closed), Threshold how many open it.
	Failures  int64 `json:"failures"`
	Threshold int   `json:"threshold"`
	// OpenForMs is the open interval in force (open, probing), or the first one's (closed); OpenMaxMs the
	// longest it doubles to.
	OpenForMs float64 `json:"open_for_ms"`
	OpenMaxMs float64 `json:"open_max_ms"`
	// ProbeAt is when the probe is due (open); ProbeBy when the probe's holder (Probe, its job's gate id)
	// must have answered before another job may take it (probing). RFC 3339, Redis clock.
	ProbeAt string `json:"probe_at,omitempty"`
	ProbeBy string `json:"probe_by,omitempty"`
	Probe   string `json:"probe,omitempty"`
	// Opened is how many times it opened (reopenings included) while its key lived (a day past its last
	// change); Since when its state last changed.
	Opened int64  `json:"opened"`
	Since  string `json:"since,omitempty"`

	Gate gate.BreakerState `json:"-"` // what it was read from, for the text report
}

// breakerOf reads a provider's breaker.
func breakerOf(ctx context.Context, l *gate.Limiter, provider string) (*Breaker, error) {
	b, err := l.BreakerOf(provider)
	if err != nil || b.Failures == 0 {
		return &Breaker{State: "off"}, err
	}
	st, err := l.ReadBreaker(ctx, provider)
	if err != nil {
		return nil, err
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	rfc := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	out := &Breaker{State: st.Phase.String(), Failures: st.Failures, Threshold: b.Failures, OpenForMs: ms(st.OpenFor),
		OpenMaxMs: ms(b.OpenMax), Probe: st.Probe, Opened: st.Opened, Since: rfc(st.Since), Gate: st}
	switch st.Phase {
	case gate.BreakerOpen:
		out.ProbeAt = rfc(st.Until)
	case gate.BreakerProbing:
		out.ProbeBy = rfc(st.Until)
	}
	return out, nil
}
