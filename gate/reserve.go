package gate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrUnacknowledged: an admission's write, or its move (Postpone, Departed), did not reach
// Options.MinReplicasAcked replicas within Options.AckTimeout. An admission or a postponement was given
// back; the job must not go out now (ask again later).
var ErrUnacknowledged = errors.New("gate: admission not acknowledged by enough replicas")

// Allow admits the job now or denies it; it never reserves a future slot.
func (l *Limiter) Allow(ctx context.Context, providerName, jobID string, cost int64) (Verdict, error) {
	return l.Reserve(ctx, providerName, jobID, cost, 0)
}

// ReserveFor is Reserve for a job of a merchant: with the provider's merchants' limits
// (Provider.PerMerchant, Provider.Merchants), the slot is the earliest at which the provider's policies and
// the merchant's all keep within their limits, decided in one step. A merchant "" (none), or a provider
// without merchants' limits, is Reserve. A job id stands for one merchant: a redelivery must name the
// same one.
func (l *Limiter) ReserveFor(ctx context.Context, providerName, merchant, jobID string, cost int64, maxWait time.Duration) (Verdict, error) {
	return l.decide(ctx, request{provider: providerName, merchant: merchant, jobID: jobID, cost: cost, maxWait: maxWait})
}

// Reserve finds the earliest slot, first come first served, at which admitting the job keeps every policy
// of the provider within its limit. If the slot is at most maxWait away, the job is recorded at the slot
// and the verdict is Allowed with the Delay to sleep before dispatching. Otherwise nothing is recorded and
// the verdict is a denial with RetryAfter.
//
// A job id already in the log is a Duplicate: it consumes nothing more and is allowed at its own slot, the
// end of a pause, or now, whichever is latest (denied if that is beyond maxWait). A maxWait beyond
// MaxHorizon is cut to it.
func (l *Limiter) Reserve(ctx context.Context, providerName, jobID string, cost int64, maxWait time.Duration) (Verdict, error) {
	return l.decide(ctx, request{provider: providerName, jobID: jobID, cost: cost, maxWait: maxWait})
}

// Force admits a job now even when the provider's token bucket is empty: it takes what tokens there are
// (the bucket drains to zero, never into debt) and goes, for a call that must go now whatever the budget.
// A forced call can therefore exceed the provider's limit by its cost. A pause still holds it (denied,
// Paused, RetryAfter to the pause's end), and a duplicate is answered as by Allow. Only for TokenBucket
// providers; for the others it is an error matching ErrInvalid.
func (l *Limiter) Force(ctx context.Context, providerName, jobID string, cost int64) (Verdict, error) {
	p, err := l.provider(providerName)
	if err != nil {
		return Verdict{}, err
	}
	if p.algo != TokenBucket {
		return Verdict{}, invalidf("gate: force is only for %s providers; %s uses %s", TokenBucket, providerName, p.algo)
	}
	return l.decide(ctx, request{provider: providerName, jobID: jobID, cost: cost, force: true})
}

// request is one job's reserve as its caller asked it (Reserve, ReserveFor, Allow, Force).
type request struct {
	provider, merchant, jobID string
	cost                      int64
	maxWait                   time.Duration
	force                     bool
}

// decide is the one place a reserve is decided: under the provider's limits in force (inForce reads them
// again when the script refuses a call made under limits changed since).
func (l *Limiter) decide(ctx context.Context, r request) (Verdict, error) {
	var v Verdict
	reread := false
	err := l.inForce(ctx, r.provider, func(p provider) (err error) {
		if r.cost > p.minLimit && r.cost <= p.configMin && !reread {
			// Held back by the live limits this process knows: read them first, since another process
			// may have reset them (a decision this process does not make would not tell it).
			reread = true
			if err := l.refresh(ctx, r.provider, -1); err != nil {
				return err
			}
			if p, err = l.provider(r.provider); err != nil {
				return err
			}
		}
		v, err = l.reserveOn(ctx, p, r)
		return err
	})
	return v, err
}

// reserveOn decides r under p: checked, then in a batch with the provider's other reserves (Options.Batch),
// alone, or alone and acknowledged by replicas (Options.MinReplicasAcked).
func (l *Limiter) reserveOn(ctx context.Context, p provider, r request) (Verdict, error) {
	merchant, err := r.check(p)
	if err != nil {
		return Verdict{}, err
	}
	if r.cost > p.minLimit {
		// Within the configured limits but not within the live ones: held back while they stand.
		return aboveLive(p), nil
	}
	c := call{op: opReserve, jobID: r.jobID, cost: r.cost, arg4: microsFloor(min(r.maxWait, MaxHorizon)), // never a slot past the caller's wait
		arg5: l.stale, force: r.force, merchant: merchant, margin: p.inForce.Load()}
	switch {
	case l.acks > 0:
		return l.reserveAcknowledged(ctx, p, r.provider, c)
	case merchant == nil && p.batch != nil:
		// Decided with the provider's other waiting reserves in one call, where there are any (batcher).
		return l.batched(ctx, p, r.provider, &pending{call: c})
	}
	return l.reserve(ctx, p, r.provider, c)
}

// check refuses a request the provider can never admit as it is, and returns the merchant's part of its
// call (nil: none).
func (r request) check(p provider) (*merchantCall, error) {
	if err := checkID(r.jobID); err != nil {
		return nil, err
	}
	merchant := p.merchantOf(r.merchant)
	switch {
	case r.cost < 1 || r.cost > p.configMin:
		return nil, invalidf("gate: cost must be 1..%d for provider %s, got %d", p.configMin, r.provider, r.cost)
	case merchant != nil && r.cost > merchant.limits.minLimit:
		return nil, invalidf("gate: cost must be 1..%d for merchant %q of provider %s, got %d", merchant.limits.minLimit, r.merchant, r.provider, r.cost)
	case len(r.merchant) > MaxMerchantLen:
		return nil, invalidf("gate: merchant must be at most %d bytes, got %d", MaxMerchantLen, len(r.merchant))
	case r.maxWait < 0:
		return nil, invalidf("gate: max wait must be >= 0, got %s", r.maxWait)
	}
	return merchant, nil
}

// reserve decides one job in a call of its own (c, a reserve).
func (l *Limiter) reserve(ctx context.Context, p provider, providerName string, c call) (Verdict, error) {
	asked := time.Now()
	reply, err := reserveReply(l.run(ctx, p, c))
	if err != nil {
		if cc, ok := l.rdb.(*redis.ClusterClient); ok && c.conn != nil && movedOn(err) {
			// The node connection does not follow a slot that moved: the cluster client reads the slots
			// again, and the job's next decision goes to the node that holds it now.
			cc.ReloadState(ctx)
		}
		return Verdict{}, fmt.Errorf("gate: reserve %s/%s: %w", providerName, c.jobID, err)
	}
	v, err := verdictOf(p, providerName, c, reply)
	v.Asked = asked
	return v, err
}

// reserveAcknowledged is reserve on a connection of its own, where an admission is then waited for until
// Options.MinReplicasAcked replicas hold it (acknowledged).
func (l *Limiter) reserveAcknowledged(ctx context.Context, p provider, providerName string, c call) (Verdict, error) {
	conn, err := l.connFor(ctx, p.keys.ids)
	if err != nil {
		return Verdict{}, fmt.Errorf("gate: reserve %s/%s: %w", providerName, c.jobID, err)
	}
	defer conn.Close()
	c.conn = conn
	v, err := l.reserve(ctx, p, providerName, c)
	if err != nil || !v.Allowed {
		return v, err
	}
	if err := l.acknowledged(ctx, providerName, c, v); err != nil {
		return Verdict{}, fmt.Errorf("gate: reserve %s/%s: %w", providerName, c.jobID, err)
	}
	return v, nil
}

// acknowledged waits until Options.MinReplicasAcked replicas hold what c.conn wrote (the admission v). When
// they do not within AckTimeout, it gives back what it can and fails with ErrUnacknowledged: the lease the
// admission took, and its units unless v is not Releasable (its entry stands for a request another
// delivery may have sent). Token buckets, GCRA and leaky buckets take units back only from their newest
// admission (Release): an unacknowledged one with others after it keeps its units spent until they refill.
func (l *Limiter) acknowledged(ctx context.Context, providerName string, c call, v Verdict) error {
	err := l.replicated(ctx, c.conn)
	if err == nil {
		return nil
	}
	// Best effort (unacknowledged, the admission may be on no replica, and soon on no primary either), and
	// whatever became of the caller's context meanwhile.
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if v.Releasable() {
		_, _ = l.ReleaseFor(gctx, providerName, c.merchantName(), c.jobID, c.cost, v.Slot())
	}
	_ = l.Land(gctx, providerName, v.Lease)
	return err
}
