package gate

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/lua"
)

var cancelScript = redis.NewScript(lua.Cancel)

// CancelState is where a cancel found its job (Cancellation.State).
type CancelState int

const (
	// CancelQueued: the job was not admitted (queued, deferred, waiting for its not_before): no later
	// reserve of it is admitted while the cancel stands.
	CancelQueued CancelState = iota
	// CancelLeft: its request left, or is leaving, at Cancellation.Slot (admitted for a slot now or past,
	// marked sent, or its holder did not give a slot still ahead up in time). Nothing changed.
	CancelLeft
	// CancelGivenUp: it was admitted for a slot still ahead, and its holder gave the slot up: no later
	// reserve of it is admitted while the cancel stands.
	CancelGivenUp
	// CancelAlready: a cancel of it stood already.
	CancelAlready
)

func (s CancelState) String() string {
	switch s {
	case CancelQueued:
		return "cancelled"
	case CancelLeft:
		return "left"
	case CancelGivenUp:
		return "cancelled-given-up"
	case CancelAlready:
		return "already-cancelled"
	}
	return "CancelState(" + strconv.Itoa(int(s)) + ")"
}

// Cancellation is Cancel's answer.
type Cancellation struct {
	State CancelState
	// Slot is the admission's slot (Redis clock): when its request left or was due to (CancelLeft), or the
	// slot given up (CancelGivenUp); zero otherwise, and for a request known only as marked sent.
	Slot time.Time
	// Now is the Redis clock as the cancel was decided.
	Now time.Time
}

// CancelOptions are the bounds of a Cancel.
type CancelOptions struct {
	// Keep is how long the cancel stands (the fleet's max_deferral_age: no job is handled later than that).
	Keep time.Duration
	// Attempts is how many of the job's gate ids to look for: its own and its first Attempts-1 retries'
	// (gate ids as consumers.GateID makes them). At least 1.
	Attempts int
	// Notice is how long past a slot still ahead its holder may take to give it up once told
	// (consumers.LossNotice): a slot not given up by then is taken as used.
	Notice time.Duration
	// Poll is how often the admission is looked for while its holder is told (default 20ms).
	Poll time.Duration
}

// Cancel cancels jobID of a provider, one step in Redis where admissions are decided: from its return on,
// no reserve of the job (any attempt of it) is admitted while the cancel stands, on any worker, unless the
// answer is CancelLeft. A job admitted for a slot still ahead is announced (AnnounceCancel) so that its
// holder gives the slot up; Cancel waits for that, at most until the slot plus opts.Notice, then decides
// in one more step: given up (CancelGivenUp), or taken as used (CancelLeft, the cancel lifted, since the
// request may be at the provider).
func (l *Limiter) Cancel(ctx context.Context, providerName, jobID string, opts CancelOptions) (Cancellation, error) {
	p, err := l.provider(providerName)
	if err != nil {
		return Cancellation{}, err
	}
	if err := checkID(jobID); err != nil {
		return Cancellation{}, err
	}
	if strings.IndexByte(jobID, 0x1f) >= 0 {
		return Cancellation{}, invalidf("gate: a job's own id has no \\x1f (that separates a retry's gate id)")
	}
	if opts.Attempts < 1 || opts.Keep <= 0 {
		return Cancellation{}, invalidf("gate: cancel: want attempts >= 1 and a keep > 0, got %d and %s", opts.Attempts, opts.Keep)
	}
	if opts.Poll <= 0 {
		opts.Poll = 20 * time.Millisecond
	}
	keys := []string{p.keys.ids, p.keys.marks}
	c, err := l.cancelStep(ctx, keys, "cancel", jobID, opts.Attempts, p.dedup, micros(opts.Keep), l.channel, providerName)
	if err != nil || c.State != CancelGivenUp {
		return c, err
	}
	// Admitted for a slot ahead: its holder was told. Wait for the admission to leave the record (given
	// up), at most until the slot plus the notice; then decide.
	deadline := time.Now().Add(c.Slot.Sub(c.Now) + opts.Notice)
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return Cancellation{}, ctx.Err()
		case <-time.After(opts.Poll):
		}
		held, err := l.cancelStep(ctx, keys, "peek", jobID, opts.Attempts, p.dedup, 0, "", "")
		if err != nil {
			return Cancellation{}, err
		}
		if held.State != CancelGivenUp {
			break
		}
	}
	settled, err := l.cancelStep(ctx, keys, "settle", jobID, opts.Attempts, p.dedup, 0, "", "")
	if err != nil {
		return Cancellation{}, err
	}
	if settled.State == CancelLeft {
		return settled, nil
	}
	return Cancellation{State: CancelGivenUp, Slot: c.Slot, Now: c.Now}, nil
}

// cancelStep runs one op of cancel.lua; its state 2 reads as CancelGivenUp (admitted for a slot ahead).
func (l *Limiter) cancelStep(ctx context.Context, keys []string, op, jobID string, attempts int, dedup, keep int64, channel, providerName string) (Cancellation, error) {
	r, err := cancelScript.Run(ctx, l.rdb, keys, op, jobID, attempts, dedup, keep, channel, providerName).Int64Slice()
	if err != nil {
		return Cancellation{}, fmt.Errorf("gate: cancel %s: %w", jobID, err)
	}
	if len(r) != 3 || r[0] < 0 || r[0] > 3 {
		return Cancellation{}, fmt.Errorf("gate: cancel %s: malformed reply %v", jobID, r)
	}
	c := Cancellation{State: []CancelState{CancelQueued, CancelLeft, CancelGivenUp, CancelAlready}[r[0]], Now: time.UnixMicro(r[2])}
	if r[1] > 0 {
		c.Slot = time.UnixMicro(r[1])
	}
	return c, nil
}
