// Package report is one provider's budget as the operator sees it: what `worker gate status --json` prints
// and what `worker dashboard` serves for each provider, read from Redis through the gate.
package report

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/paygate/paygate/gate"
)

// Policy is one of a provider's limits in force.
type Policy struct {
	Policy       int    `json:"policy"`
	Limit        string `json:"limit"`
	Used         int64  `json:"used"`
	Reserved     int64  `json:"reserved"`
	Remaining    int64  `json:"remaining"`
	ResetAfterMs int64  `json:"reset_after_ms"`
}

// Status is a provider's budget (the JSON of gate status --json).
type Status struct {
	Provider    string `json:"provider"`
	Algorithm   string `json:"algorithm"`
	Now         string `json:"now"`
	PausedUntil string `json:"paused_until,omitempty"`
	Units       int64  `json:"units"`
	// In-flight leases standing, and the cap (providers.<name>.max_in_flight; both 0 without one).
	InFlight    int64    `json:"in_flight"`
	MaxInFlight int64    `json:"max_in_flight"`
	Policies    []Policy `json:"policies"`
	// Where the policies come from: "config", or "override" (worker limits set), and the live limits'
	// version (how many times they were set or reset).
	LimitsSource  string `json:"limits_source"`
	LimitsVersion int64  `json:"limits_version"`
	// The margin in force (gate.margin .. gate.margin_max), and why it is what it is.
	MarginMs      float64 `json:"margin_ms"`
	MarginFloorMs float64 `json:"margin_floor_ms"`
	MarginMaxMs   float64 `json:"margin_max_ms"`
	MarginWhy     string  `json:"margin_why"`
	// The merchants (providers with per_merchant or merchants): see Merchants.
	Merchants *Merchants `json:"merchants,omitempty"`
	// The provider's circuit breaker: see Breaker.
	Breaker *Breaker `json:"breaker"`

	// What it was read from, for the text report.
	Gate   gate.Status      `json:"-"`
	Margin gate.MarginState `json:"-"`
}

// Merchants are a provider's merchants: how many had jobs admitted lately (in the last minute, or the
// gate's dedup window if longer), the TopMerchants using the most of their own limits (used + reserved in
// their first limit; by newest admission for merchants without limits), and the rest taken together. Of the
// merchants seen, the ScanMerchants with the newest admissions are read.
type Merchants struct {
	Seen int64         `json:"seen"`
	Top  []MerchantUse `json:"top"`
	Rest MerchantRest  `json:"rest"`
}

// MerchantUse is one of the top merchants.
type MerchantUse struct {
	Merchant string `json:"merchant"`
	Limit    string `json:"limit,omitempty"` // its first limit; "" without limits of its own
	Used     int64  `json:"used"`
	Reserved int64  `json:"reserved"`
	Newest   string `json:"newest"` // its newest admission's slot
}

// MerchantRest is the merchants read beyond the top ones.
type MerchantRest struct {
	Merchants int64 `json:"merchants"`
	Used      int64 `json:"used"` // used + reserved, of those read
}

const (
	TopMerchants  = 10
	ScanMerchants = 1000
)

// Of reads a provider's status: the margin in force first (the counts are then under it), the policies, and
// the merchants where the provider tracks them.
func Of(ctx context.Context, l *gate.Limiter, provider string) (Status, error) {
	m, err := l.ReadMargin(ctx, provider)
	if err != nil {
		return Status{}, err
	}
	st, err := l.Status(ctx, provider)
	if err != nil {
		return Status{}, err
	}
	algo, err := l.Algorithm(provider)
	if err != nil {
		return Status{}, err
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	rep := Status{Provider: st.Provider, Algorithm: string(algo), Now: st.Now.UTC().Format(time.RFC3339Nano), Units: st.Units,
		InFlight: st.InFlight, MaxInFlight: st.MaxInFlight, LimitsSource: st.LimitsSource, LimitsVersion: st.LimitsVersion,
		MarginMs: ms(m.Margin), MarginFloorMs: ms(m.Floor), MarginMaxMs: ms(m.Ceiling), MarginWhy: m.Why, Gate: st, Margin: m}
	if !st.PausedUntil.IsZero() {
		rep.PausedUntil = st.PausedUntil.UTC().Format(time.RFC3339Nano)
	}
	for i, p := range st.Policies {
		rep.Policies = append(rep.Policies, Policy{
			Policy: i, Limit: p.Policy.String(), Used: p.Used, Reserved: p.Reserved,
			Remaining: p.Remaining, ResetAfterMs: CeilMs(p.ResetAfter),
		})
	}
	if l.TracksMerchants(provider) {
		if rep.Merchants, err = merchantsOf(ctx, l, provider); err != nil {
			return Status{}, err
		}
	}
	if rep.Breaker, err = breakerOf(ctx, l, provider); err != nil {
		return Status{}, err
	}
	return rep, nil
}

// CeilMs is d in whole milliseconds, rounded up.
func CeilMs(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

func merchantsOf(ctx context.Context, l *gate.Limiter, provider string) (*Merchants, error) {
	seen, ms, err := l.Merchants(ctx, provider, ScanMerchants)
	if err != nil {
		return nil, err
	}
	use := func(m gate.MerchantStatus) int64 {
		if len(m.Policies) == 0 {
			return 0
		}
		return m.Policies[0].Used + m.Policies[0].Reserved
	}
	slices.SortStableFunc(ms, func(a, b gate.MerchantStatus) int { return cmp.Compare(use(b), use(a)) }) // newest first among equals
	rep := &Merchants{Seen: seen, Top: []MerchantUse{}, Rest: MerchantRest{Merchants: seen}}
	for i, m := range ms {
		if i >= TopMerchants {
			rep.Rest.Used += use(m)
			continue
		}
		u := MerchantUse{Merchant: m.Merchant, Newest: m.Newest.UTC().Format(time.RFC3339Nano)}
		if len(m.Policies) > 0 {
			u.Limit, u.Used, u.Reserved = m.Policies[0].Policy.String(), m.Policies[0].Used, m.Policies[0].Reserved
		}
		rep.Top = append(rep.Top, u)
		rep.Rest.Merchants--
	}
	return rep, nil
}

// Verdict is a gate decision as `worker gate try --json` prints it and `worker gate serve` answers it;
// its keys are a public contract (add, never rename).
type Verdict struct {
	Provider     string  `json:"provider"`
	ID           string  `json:"id"`
	Cost         int64   `json:"cost"`
	Allowed      bool    `json:"allowed"`
	Duplicate    bool    `json:"duplicate"`
	Paused       bool    `json:"paused"`
	DelayMs      float64 `json:"delay_ms"`
	RetryAfterMs int64   `json:"retry_after_ms"`
	Remaining    int64   `json:"remaining"`
	Policy       int     `json:"policy"`
	Limit        string  `json:"limit"`
	Now          string  `json:"now"`
	ResetAfterMs int64   `json:"reset_after_ms"`
	Algorithm    string  `json:"algorithm"`
	Forced       bool    `json:"forced"`
	// Slot is when the job may go (Redis clock, RFC 3339 with ns), for a release; Lease its in-flight
	// lease (providers with max_in_flight), for a land; Releasable whether it may be given back.
	Slot       string `json:"slot,omitempty"`
	Lease      string `json:"lease,omitempty"`
	Releasable bool   `json:"releasable"`
	InFlight   bool   `json:"in_flight"`
	// Cancelled: denied because `worker cancel` cancelled the id: never admitted while the cancel stands
	// (retry_after_ms 0: do not ask again).
	Cancelled bool `json:"cancelled"`
	// AdmittedAt is, for an id already admitted (a duplicate), the slot it was admitted at: the one a
	// release names.
	AdmittedAt string `json:"admitted_at,omitempty"`
}

// VerdictOf is v, the gate's answer to job id of provider at cost, as Verdict.
func VerdictOf(provider, id string, cost int64, algo gate.Algorithm, v gate.Verdict, forced bool) Verdict {
	out := Verdict{
		Provider:     provider,
		ID:           id,
		Cost:         cost,
		Allowed:      v.Allowed,
		Duplicate:    v.Duplicate,
		Paused:       v.Paused,
		DelayMs:      float64(v.Delay.Microseconds()) / 1000,
		RetryAfterMs: v.RetryAfter.Milliseconds(),
		Remaining:    v.Remaining,
		Policy:       v.Policy,
		Limit:        v.Limit.String(),
		Now:          v.Now.UTC().Format(time.RFC3339Nano),
		ResetAfterMs: CeilMs(v.ResetAfter),
		Algorithm:    string(algo),
		Forced:       forced,
		Cancelled:    v.Cancelled,
		Lease:        v.Lease,
		InFlight:     v.InFlight,
	}
	if v.Allowed {
		out.Slot = v.Slot().UTC().Format(time.RFC3339Nano)
		out.Releasable = v.Releasable()
	}
	if !v.AdmittedAt.IsZero() {
		out.AdmittedAt = v.AdmittedAt.UTC().Format(time.RFC3339Nano)
	}
	return out
}
