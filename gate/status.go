package gate

import (
	"context"
	"fmt"
	"time"
)

// PolicyStatus is one policy's use of its window at a moment.
type PolicyStatus struct {
	Policy Policy
	// Used is the cost admitted in the window ending now. For TokenBucket and GCRA: the units the bucket
	// is short of full, up to Limit; for LeakyBucket, the units in the queue; for FixedWindow, the cost
	// counted in the current calendar window.
	Used int64
	// Reserved is the cost of reservations after now; they will count in the window. For TokenBucket and
	// GCRA: the units taken beyond Limit (debt that reservations run up); 0 for LeakyBucket. For
	// FixedWindow: the cost counted in later windows.
	Reserved int64
	// Remaining is Limit - Used - Reserved, never negative: what an Allow could take now, were nothing
	// queued before it. For FixedWindow, Limit - Used; for TokenBucket and GCRA, the whole tokens in the
	// bucket.
	Remaining int64
	// ResetAfter is how long until everything counted in Used and Reserved has left the window (the bucket
	// is full, the queue empty).
	ResetAfter time.Duration
}

// Status is a provider's budget as the gate sees it.
type Status struct {
	Provider string
	// Now is the Redis server's clock.
	Now time.Time
	// PausedUntil is the end of a pause in force, or the zero time.
	PausedUntil time.Time
	// Units is the number of units of cost in the log (admitted or reserved, not yet trimmed): one per job
	// of cost 1. For the other algorithms: the members of the id record (jobs admitted in the last
	// DedupWindow, and reservations: a job's id, a member for a cost above 1, and under SlidingWindow and
	// FixedWindow the markers of the counters that took it).
	Units int64
	// InFlight is the number of in-flight leases standing (Provider.MaxInFlight; 0 without a cap), and
	// MaxInFlight the cap.
	InFlight, MaxInFlight int64
	// Policies are the limits in force; LimitsSource says where they come from (SourceConfig or
	// SourceOverride) and LimitsVersion is the live limits' version (see SetLimits).
	Policies      []PolicyStatus
	LimitsSource  string
	LimitsVersion int64
}

// The reply of a status: now, paused until, units, leases, then statusPerPolicy numbers per policy.
const (
	statusNow = iota
	statusPausedUntil
	statusUnits
	statusLeases
	statusHead
)

// Per policy in a status reply.
const (
	statusUsed = iota
	statusReserved
	statusRemaining
	statusResetAfter
	statusPerPolicy
)

// Status reads a provider's budget without changing it.
func (l *Limiter) Status(ctx context.Context, providerName string) (Status, error) {
	var s Status
	err := l.inForce(ctx, providerName, func(p provider) (err error) {
		s, err = l.statusOf(ctx, p, nil, providerName)
		return err
	})
	return s, err
}

// statusOf reads the provider's status, with a merchant's policies after the provider's (merchant: nil for
// none).
func (l *Limiter) statusOf(ctx context.Context, p provider, merchant *merchantCall, providerName string) (Status, error) {
	reply, err := l.run(ctx, p, call{op: opStatus, merchant: merchant, margin: p.inForce.Load()}).Int64Slice()
	if err != nil {
		return Status{}, fmt.Errorf("gate: status %s: %w", providerName, err)
	}
	policies := p.policies
	if merchant != nil {
		policies = append(policies[:len(policies):len(policies)], merchant.limits.policies...)
	}
	if len(reply) != statusHead+statusPerPolicy*len(policies) {
		return Status{}, fmt.Errorf("gate: status %s: malformed reply %v", providerName, reply)
	}
	s := Status{Provider: providerName, Now: time.UnixMicro(reply[statusNow]), Units: reply[statusUnits],
		InFlight: reply[statusLeases], MaxInFlight: p.maxFlight, LimitsSource: p.source, LimitsVersion: p.version}
	if reply[statusPausedUntil] > 0 {
		s.PausedUntil = time.UnixMicro(reply[statusPausedUntil])
	}
	for i, pol := range policies {
		r := reply[statusHead+statusPerPolicy*i:]
		s.Policies = append(s.Policies, PolicyStatus{
			Policy:     pol,
			Used:       r[statusUsed],
			Reserved:   r[statusReserved],
			Remaining:  max(0, r[statusRemaining]),
			ResetAfter: time.Duration(r[statusResetAfter]) * time.Microsecond,
		})
	}
	return s, nil
}

// TracksMerchants reports whether the provider records its jobs' merchants (Provider.TrackMerchants, or
// merchants' limits).
func (l *Limiter) TracksMerchants(providerName string) bool {
	p, err := l.provider(providerName)
	return err == nil && p.track
}

// MerchantStatus is one merchant's use of a provider.
type MerchantStatus struct {
	Merchant string
	// Newest is its newest admission's slot (Redis clock).
	Newest time.Time
	// Policies are its own limits' use (Provider.PerMerchant or its entry in Provider.Merchants); none
	// when the provider has no merchants' limits.
	Policies []PolicyStatus
}

// Merchants reads the merchants a provider admitted jobs of lately (in the last minute, or its dedup window
// if longer): how many, and the newest max of them with their use of their own limits, newest first.
func (l *Limiter) Merchants(ctx context.Context, providerName string, max int) (seen int64, out []MerchantStatus, err error) {
	err = l.inForce(ctx, providerName, func(p provider) error {
		out = out[:0]
		raw, err := l.run(ctx, p, call{op: opMerchants, arg4: int64(max), margin: p.inForce.Load()}).Slice()
		if err != nil {
			return fmt.Errorf("gate: merchants %s: %w", providerName, err)
		}
		if len(raw) < 2 || len(raw)%2 != 0 {
			return fmt.Errorf("gate: merchants %s: malformed reply %v", providerName, raw)
		}
		seen, _ = raw[1].(int64)
		for j := 2; j+1 < len(raw); j += 2 {
			name, _ := raw[j].(string)
			slot, _ := raw[j+1].(int64)
			ms := MerchantStatus{Merchant: name, Newest: time.UnixMicro(slot)}
			if merchant := p.merchantOf(name); merchant != nil && len(merchant.limits.policies) > 0 {
				st, err := l.statusOf(ctx, p, merchant, providerName)
				if err != nil {
					return err
				}
				ms.Policies = st.Policies[len(p.policies):]
			}
			out = append(out, ms)
		}
		return nil
	})
	return seen, out, err
}
