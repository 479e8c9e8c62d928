package gateapi

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/internal/report"
)

// reservation is the body of reserve and allow.
type reservation struct {
	ID        string `json:"id"`
	Cost      *int64 `json:"cost"`
	Merchant  string `json:"merchant"`
	MaxWaitMs int64  `json:"max_wait_ms"`
	Priority  string `json:"priority"`
}

// read decodes and checks a reservation; cost defaults to 1.
func (r *reservation) read(body []byte, wait bool) error {
	if err := decode(body, r); err != nil {
		return err
	}
	switch {
	case r.ID == "":
		return &apiError{http.StatusBadRequest, "id", "required: the job's id, the same on every try of one payment"}
	case r.Cost != nil && *r.Cost < 1:
		return &apiError{http.StatusBadRequest, "cost", fmt.Sprintf("must be >= 1, got %d", *r.Cost)}
	case r.MaxWaitMs < 0 || (!wait && r.MaxWaitMs != 0):
		return &apiError{http.StatusBadRequest, "max_wait_ms", "must be >= 0 (reserve), and is not taken by allow"}
	case r.Priority != "" && !slices.Contains(Priorities, r.Priority):
		return &apiError{http.StatusBadRequest, "priority", fmt.Sprintf("must be high, normal or low, got %q", r.Priority)}
	}
	if r.Cost == nil {
		one := int64(1)
		r.Cost = &one
	}
	return nil
}

// reserve is POST …/reserve: a slot within max_wait_ms, first come first served with the workers', or a
// denial with retry_after_ms.
func (a *api) reserve(ctx context.Context, provider string, body []byte) (any, error) {
	var r reservation
	if err := r.read(body, true); err != nil {
		return nil, err
	}
	return a.decide(ctx, provider, r)
}

// allow is POST …/allow: now or denied.
func (a *api) allow(ctx context.Context, provider string, body []byte) (any, error) {
	var r reservation
	if err := r.read(body, false); err != nil {
		return nil, err
	}
	return a.decide(ctx, provider, r)
}

func (a *api) decide(ctx context.Context, provider string, r reservation) (any, error) {
	algo, err := a.o.Gate.Algorithm(provider)
	if err != nil {
		return nil, err
	}
	v, err := a.o.Gate.ReserveFor(ctx, provider, r.Merchant, r.ID, *r.Cost, time.Duration(r.MaxWaitMs)*time.Millisecond)
	if err != nil {
		return nil, err
	}
	return report.VerdictOf(provider, r.ID, *r.Cost, algo, v, false), nil
}

// release is POST …/release: an admission given back (the request was not sent), with the slot its
// verdict named.
func (a *api) release(ctx context.Context, provider string, body []byte) (any, error) {
	var r struct {
		ID       string `json:"id"`
		Cost     int64  `json:"cost"`
		Merchant string `json:"merchant"`
		Slot     string `json:"slot"`
	}
	if err := decode(body, &r); err != nil {
		return nil, err
	}
	slot, err := time.Parse(time.RFC3339Nano, r.Slot)
	if err != nil {
		return nil, &apiError{http.StatusBadRequest, "slot", "required: the verdict's slot (RFC 3339), got " + fmt.Sprintf("%q", r.Slot)}
	}
	if r.Cost < 1 {
		r.Cost = 1
	}
	n, err := a.o.Gate.ReleaseFor(ctx, provider, r.Merchant, r.ID, r.Cost, slot)
	if err != nil {
		return nil, err
	}
	return map[string]int64{"released": n}, nil
}

// sent is POST …/sent: the provider accepted the request, so that a repeat of its id is a duplicate of
// it rather than a new request.
func (a *api) sent(ctx context.Context, provider string, body []byte) (any, error) {
	var r struct {
		ID string `json:"id"`
	}
	if err := decode(body, &r); err != nil {
		return nil, err
	}
	if err := a.o.Gate.Sent(ctx, provider, r.ID); err != nil {
		return nil, err
	}
	return map[string]bool{"sent": true}, nil
}

// land is POST …/land: the request of an admission with a lease (max_in_flight) has ended.
func (a *api) land(ctx context.Context, provider string, body []byte) (any, error) {
	var r struct {
		Lease string `json:"lease"`
	}
	if err := decode(body, &r); err != nil {
		return nil, err
	}
	if r.Lease == "" {
		return nil, &apiError{http.StatusBadRequest, "lease", "required: the verdict's lease"}
	}
	if err := a.o.Gate.Land(ctx, provider, r.Lease); err != nil {
		return nil, err
	}
	return map[string]bool{"landed": true}, nil
}

// pause is POST …/pause: a 429 the caller met pauses the whole fleet for its Retry-After.
func (a *api) pause(ctx context.Context, provider string, body []byte) (any, error) {
	var r struct {
		RetryAfterMs int64 `json:"retry_after_ms"`
	}
	if err := decode(body, &r); err != nil {
		return nil, err
	}
	d := time.Duration(r.RetryAfterMs) * time.Millisecond
	if d <= 0 || d > MaxPause {
		return nil, &apiError{http.StatusBadRequest, "retry_after_ms", fmt.Sprintf("must be 1..%d (the provider's Retry-After), got %d", MaxPause.Milliseconds(), r.RetryAfterMs)}
	}
	if _, err := a.o.Gate.Algorithm(provider); err != nil {
		return nil, err
	}
	if err := a.o.Gate.Pause(ctx, provider, time.Now().Add(d)); err != nil {
		return nil, err
	}
	return map[string]int64{"paused_ms": r.RetryAfterMs}, nil
}

// status is GET …/status: the provider's budget as `worker gate status --json` prints it.
func (a *api) status(ctx context.Context, provider string, _ []byte) (any, error) {
	if _, err := a.o.Gate.Algorithm(provider); err != nil {
		return nil, err
	}
	return report.Of(ctx, a.o.Gate, provider)
}

// report is POST …/report: the answer a caller's request got, for the provider's breaker (providers.
// <name>.breaker): a transient failure (5xx, a timeout, a refused or reset connection) counts toward
// opening it, any other answer ends a run of failures. Without a breaker it changes nothing.
func (a *api) report(ctx context.Context, provider string, body []byte) (any, error) {
	var r struct {
		ID     string `json:"id"`
		Slot   string `json:"slot"`
		Failed bool   `json:"failed"`
	}
	if err := decode(body, &r); err != nil {
		return nil, err
	}
	if r.ID == "" {
		return nil, &apiError{http.StatusBadRequest, "id", "required: the job's id"}
	}
	var sent time.Time
	if r.Slot != "" {
		var err error
		if sent, err = time.Parse(time.RFC3339Nano, r.Slot); err != nil {
			return nil, &apiError{http.StatusBadRequest, "slot", fmt.Sprintf("must be the verdict's slot (RFC 3339), got %q", r.Slot)}
		}
	}
	if _, err := a.o.Gate.Algorithm(provider); err != nil {
		return nil, err
	}
	if !a.o.Gate.HasBreaker(provider) {
		return map[string]any{"breaker": "none"}, nil
	}
	report := func() (gate.BreakerState, error) { return a.o.Gate.ReportAnswer(ctx, provider, r.ID) }
	if r.Failed {
		report = func() (gate.BreakerState, error) { return a.o.Gate.ReportFailure(ctx, provider, r.ID, sent) }
	}
	st, err := report()
	if err != nil {
		return nil, err
	}
	return map[string]any{"breaker": st.Phase.String(), "failures": st.Failures, "counted": st.Counted}, nil
}
