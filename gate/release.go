package gate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/lua"
)

var (
	sentScript = redis.NewScript(lua.Sent)
	landScript = redis.NewScript(lua.Land)
)

// Release gives back a job's admission: its units leave the log and are free for later decisions, and it
// returns how many. A worker that woke too late to use its slot releases it and reserves again, so that
// what the log records is what the provider sees. slot is the admission's slot (Verdict.Slot): if the id
// is in the log at another slot, a redelivery was since admitted (moved) under it, and its entry is not
// released. A zero slot releases the id wherever it is. Releasing a job that is not in the log does
// nothing. Nor is an admission released once a duplicate of it was let go (Verdict.Duplicate, allowed):
// that delivery may be sending on it; nor once its request was marked Sent.
//
// Every algorithm forgets the id (a later Reserve of it is a new job) and gives its units back where it
// can: SlidingLog always, SlidingWindow and FixedWindow out of the counter they went into (while it is
// still counted); TokenBucket, GCRA and LeakyBucket undo the admission exactly when it is the newest one,
// and otherwise keep its units spent until they refill or leak (never handing out more than the limit).
// The units returned are the id's left in the record, whatever the algorithm could give back.
func (l *Limiter) Release(ctx context.Context, providerName, jobID string, cost int64, slot time.Time) (int64, error) {
	return l.ReleaseFor(ctx, providerName, "", jobID, cost, slot)
}

// ReleaseFor is Release for a job admitted by ReserveFor: its units go back to its merchant's limits too.
func (l *Limiter) ReleaseFor(ctx context.Context, providerName, merchant, jobID string, cost int64, slot time.Time) (int64, error) {
	if err := checkID(jobID); err != nil {
		return 0, err
	}
	at := int64(0)
	if !slot.IsZero() {
		at = slot.UnixMicro()
	}
	var n int64
	err := l.inForce(ctx, providerName, func(p provider) (err error) {
		if cost < 1 || cost > p.configMin {
			return invalidf("gate: cost must be 1..%d for provider %s, got %d", p.configMin, providerName, cost)
		}
		c := call{op: opRelease, jobID: jobID, cost: cost, arg4: at, merchant: p.merchantOf(merchant), margin: p.inForce.Load()}
		if n, err = l.run(ctx, p, c).Int64(); err != nil {
			return fmt.Errorf("gate: release %s/%s: %w", providerName, jobID, err)
		}
		return nil
	})
	return n, err
}

// Departed records that the request of an admission (ReserveFor's, at slot) left late: at most late after
// its slot. Under SlidingLog the job's units move to slot + late (no later than the Redis clock's now), so
// that the log holds when the provider got the request: a slot decided after this counts it there, and
// the request one window on is spaced from when this one left, not from when it should have. It returns
// the admission's new slot, the one Release then takes (zero: nothing moved; the id is not in the log at
// slot, or late does not reach past it). The other algorithms keep no time per unit: for them it moves
// nothing and returns zero. A caller that wakes on time but sends late (a stalled process, a slow
// connection pool) calls it once the request is written; what its estimate of late may overstate only
// spends budget, never more than the limit.
//
// With Options.MinReplicasAcked the move is waited for as an admission is. Not acknowledged in time, it
// returns the new slot (the move stands on the primary) with an error wrapping ErrUnacknowledged: the
// request left already, and a failover before the replicas catch up counts it at its old slot.
func (l *Limiter) Departed(ctx context.Context, providerName, merchant, jobID string, slot time.Time, late time.Duration) (time.Time, error) {
	if late < 0 {
		return time.Time{}, invalidf("gate: departed needs a lateness >= 0, got %s", late)
	}
	return l.depart(ctx, opDepart, providerName, merchant, jobID, slot, late)
}

// Postpone moves an admission (ReserveFor's, at slot) whose holder woke too late to use its slot to the
// Redis clock's now, where its request is about to leave, if every window the move adds its units to
// keeps room for them; it returns the new slot, or zero when it moves nothing. A late wake-up then sends
// rather than give its unit back, which costs the unit whenever later slots were handed out meanwhile.
// SlidingLog only, as Departed.
//
// Nothing moves where a reserve now would be held back: the provider is paused, or its state was lost or
// failed over (a warm-up is due: the next reserve begins it), or the admission's in-flight lease lapsed;
// nor where a window would go over its limit, or (the job of a merchant with limits of its own) the job
// was admitted before those limits and its merchant's log does not hold it. The in-flight lease moves
// with the admission. The pace is not asked: a postponed request may go between two paced slots, the
// windows kept exact. Under a backlog reservations reach less than a window ahead, and the move fits; it
// is refused when the slots after this one, to a window past now, already hold the limit.
//
// With Options.MinReplicasAcked the move is waited for as an admission is: not acknowledged in time, the
// admission is given back (best effort) and Postpone fails with ErrUnacknowledged. The request must not
// go: the replicas may hold it at its old slot, and a failover would hand out the slots after it again.
func (l *Limiter) Postpone(ctx context.Context, providerName, merchant, jobID string, slot time.Time) (time.Time, error) {
	return l.depart(ctx, opPostpone, providerName, merchant, jobID, slot, 0)
}

// depart runs lua/family's op depart, or postpone. With Options.MinReplicasAcked, the move is made on a
// connection of its own and waited for as an admission is (moveAcknowledged): a postponed request does not
// go until its new slot would survive a failover; a departure (its request left already) returns its new
// slot with the error, the move standing on the primary.
func (l *Limiter) depart(ctx context.Context, op, providerName, merchant, jobID string, slot time.Time, late time.Duration) (time.Time, error) {
	if err := checkID(jobID); err != nil {
		return time.Time{}, err
	}
	if slot.IsZero() {
		return time.Time{}, invalidf("gate: a departure needs the admission's slot")
	}
	var at int64
	err := l.inForce(ctx, providerName, func(p provider) (err error) {
		c := call{op: op, jobID: jobID, cost: 1, arg4: slot.UnixMicro(), arg5: late.Microseconds(),
			merchant: p.merchantOf(merchant), margin: p.inForce.Load()}
		if l.acks > 0 {
			if c.conn, err = l.connFor(ctx, p.keys.ids); err != nil {
				return fmt.Errorf("gate: %s %s/%s: %w", op, providerName, jobID, err)
			}
			defer c.conn.Close()
		}
		if at, err = l.run(ctx, p, c).Int64(); err != nil {
			return fmt.Errorf("gate: %s %s/%s: %w", op, providerName, jobID, err)
		}
		if c.conn == nil || at == 0 {
			return nil
		}
		return l.moveAcknowledged(ctx, providerName, c, time.UnixMicro(at))
	})
	if at == 0 || (err != nil && (op == opPostpone || !errors.Is(err, ErrUnacknowledged))) {
		return time.Time{}, err
	}
	return time.UnixMicro(at), err
}

// moveAcknowledged waits until Options.MinReplicasAcked replicas hold the move c made (to slot). Not
// acknowledged, a postponed admission is given back (best effort, as acknowledged does for a reserve): its
// request must not go. A departure's request went already; its move stands.
func (l *Limiter) moveAcknowledged(ctx context.Context, providerName string, c call, slot time.Time) error {
	err := l.replicated(ctx, c.conn)
	if err == nil {
		return nil
	}
	if c.op == opPostpone {
		gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_, _ = l.ReleaseFor(gctx, providerName, c.merchantName(), c.jobID, 1, slot)
	}
	return fmt.Errorf("gate: %s %s/%s: %w", c.op, providerName, c.jobID, err)
}

// Sent records that jobID's request (as admitted, under that id) reached the provider and was accepted,
// though its delivery could not be settled and will come again. A stale redelivery of it is then a plain
// duplicate rather than moved (see Options.StaleAfter): the provider will only replay it, and moving it
// would spend a unit the provider never uses. The mark lasts as long as the gate remembers the id.
func (l *Limiter) Sent(ctx context.Context, providerName, jobID string) error {
	p, err := l.provider(providerName)
	if err != nil {
		return err
	}
	if err := checkID(jobID); err != nil {
		return err
	}
	// The id record keeps an id sent already (its slot past) at most dedup.
	if err := sentScript.Run(ctx, l.rdb, []string{p.keys.marks}, jobID, p.dedup).Err(); err != nil {
		return fmt.Errorf("gate: sent %s/%s: %w", providerName, jobID, err)
	}
	return nil
}

// Land ends an in-flight lease (Verdict.Lease): the provider answered the request, whatever the answer,
// or the job gave its admission up. (A request that got no answer, a timeout, may still be in flight
// there: leave its lease to lapse.) When the cap was full, the end is announced (AnnounceLanded), so that a
// job waiting for a lease (Verdict.InFlight) goes at once. A lease that had lapsed, or was ended before,
// is no error. An empty lease is nothing to end.
func (l *Limiter) Land(ctx context.Context, providerName, lease string) error {
	if lease == "" {
		return nil
	}
	p, err := l.provider(providerName)
	if err != nil {
		return err
	}
	id, admitted, ok := strings.Cut(lease, "\x00")
	if _, err := strconv.ParseInt(strings.TrimPrefix(admitted, "d"), 10, 64); !ok || err != nil {
		return invalidf("gate: %q is not a lease (Verdict.Lease)", lease)
	}
	if err := checkID(id); err != nil {
		return err
	}
	if err := landScript.Run(ctx, l.rdb, []string{p.keys.flight}, lease, l.channel, providerName, p.maxFlight).Err(); err != nil {
		return fmt.Errorf("gate: land %s: %w", providerName, err)
	}
	return nil
}
