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
	// Reason is the operator's, kept while the cancel stands (CancelReason); "" for none.
	Reason string
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
	keys := l.cancelKeys(p)
	c, err := l.cancelStep(ctx, keys, "cancel", jobID, opts.Attempts, p.dedup, micros(opts.Keep), l.channel, providerName, opts.Reason)
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
		held, err := l.cancelStep(ctx, keys, "peek", jobID, opts.Attempts, p.dedup, 0, "", "", "")
		if err != nil {
			return Cancellation{}, err
		}
		if held.State != CancelGivenUp {
			break
		}
	}
	settled, err := l.cancelStep(ctx, keys, "settle", jobID, opts.Attempts, p.dedup, 0, "", "", "")
	if err != nil {
		return Cancellation{}, err
	}
	if settled.State == CancelLeft {
		return settled, nil
	}
	return Cancellation{State: CancelGivenUp, Slot: c.Slot, Now: c.Now}, nil
}

// cancelStep runs one op of cancel.lua; its state 2 reads as CancelGivenUp (admitted for a slot ahead).
func (l *Limiter) cancelStep(ctx context.Context, keys []string, op, jobID string, attempts int, dedup, keep int64, channel, providerName, reason string) (Cancellation, error) {
	r, err := cancelScript.Run(ctx, l.rdb, keys, op, jobID, attempts, dedup, keep, channel, providerName, reason).Int64Slice()
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

// CancelReason is the reason a standing cancel of jobID was given ("" for none, or when no cancel stands).
func (l *Limiter) CancelReason(ctx context.Context, providerName, jobID string) (string, error) {
	p, err := l.provider(providerName)
	if err != nil {
		return "", err
	}
	got, err := cancelScript.Run(ctx, l.rdb, []string{p.keys.ids, p.keys.marks, p.keys.cancels, p.keys.flight}, "reason", jobIDOf(jobID), 1, p.dedup, 0, "", "", "").Text()
	if err != nil {
		return "", fmt.Errorf("gate: cancel reason %s/%s: %w", providerName, jobID, err)
	}
	return got, nil
}

// jobIDOf is a job's own id in a gate id (a retry's carries "\x1f<attempt>").
func jobIDOf(gateID string) string {
	id, _, _ := strings.Cut(gateID, "\x1f")
	return id
}

// JobState is what the gate holds of a job (Limiter.Job): its admissions, marks, cancel and leases.
type JobState struct {
	Now time.Time // the Redis clock as it was read
	// Attempts are the job's gate ids looked for (its own, then its retries'), each as the gate holds it.
	Attempts []AttemptState
	// Cancelled is until when a cancel of the job stands (zero: none); Reason the cancel's.
	Cancelled time.Time
	Reason    string
	// Leases are the in-flight leases standing for any of its gate ids: member, and when it lapses.
	Leases []Lease
	// Left is when its latest request left, and Outcome how that handling ended ("" while in flight), as
	// the job journal holds them (Options.Journal; zero: not there).
	Left    time.Time
	Outcome string
}

// AttemptState is one gate id of a job as the gate holds it; zero times where it holds nothing.
type AttemptState struct {
	GateID string
	// Slot is its admission in the id record (the record keeps it until the slot plus the provider's dedup).
	Slot time.Time
	// Sent, Duplicate and Probe are until when its marks stand: its request accepted though not settled
	// (Limiter.Sent), a duplicate of it let go on its slot, the breaker's probe taken.
	Sent, Duplicate, Probe time.Time
}

// Lease is a standing in-flight lease of a job.
type Lease struct {
	Member string
	Lapses time.Time
}

// Job reads what the gate holds of jobID (its own id) and its first attempts-1 retries, in one step that
// writes nothing.
func (l *Limiter) Job(ctx context.Context, providerName, jobID string, attempts int) (JobState, error) {
	p, err := l.provider(providerName)
	if err != nil {
		return JobState{}, err
	}
	if err := checkID(jobID); err != nil {
		return JobState{}, err
	}
	attempts = max(attempts, 1)
	keys := l.cancelKeys(p)
	raw, err := cancelScript.Run(ctx, l.rdb, keys, "show", jobID, attempts, p.dedup, 0, "", "", "").Slice()
	if err != nil {
		return JobState{}, fmt.Errorf("gate: job %s/%s: %w", providerName, jobID, err)
	}
	bad := func() (JobState, error) {
		return JobState{}, fmt.Errorf("gate: job %s/%s: malformed reply %v", providerName, jobID, raw)
	}
	num := func(i int) (int64, bool) {
		v, ok := raw[i].(int64)
		return v, ok
	}
	us := func(v int64) time.Time {
		if v <= 0 {
			return time.Time{}
		}
		return time.UnixMicro(v)
	}
	const head = 6 // now, cancel_until, reason, left, outcome, n
	if len(raw) < head {
		return bad()
	}
	now, ok1 := num(0)
	until, ok2 := num(1)
	reason, ok3 := raw[2].(string)
	left, ok4 := num(3)
	outcome, ok5 := raw[4].(string)
	n, ok6 := num(5)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 || n != int64(attempts) || len(raw) < head+4*attempts || (len(raw)-head-4*attempts)%2 != 0 {
		return bad()
	}
	st := JobState{Now: us(now), Cancelled: us(until), Reason: reason, Left: us(left), Outcome: outcome}
	for k := range attempts {
		var v [4]int64
		for j := range v {
			var ok bool
			if v[j], ok = num(head + 4*k + j); !ok {
				return bad()
			}
		}
		gid := jobID
		if k > 0 {
			gid += "\x1f" + strconv.Itoa(k)
		}
		st.Attempts = append(st.Attempts, AttemptState{GateID: gid, Slot: us(v[0]), Sent: us(v[1]), Duplicate: us(v[2]), Probe: us(v[3])})
	}
	for i := head + 4*attempts; i < len(raw); i += 2 {
		member, ok := raw[i].(string)
		lapse, ok2 := num(i + 1)
		if !ok || !ok2 {
			return bad()
		}
		st.Leases = append(st.Leases, Lease{Member: member, Lapses: us(lapse)})
	}
	return st, nil
}

// cancelKeys are cancel.lua's KEYS for a provider: its id record, marks, cancels' reasons, in-flight leases,
// and the journal's hashes that may hold a job (none without a journal).
func (l *Limiter) cancelKeys(p provider) []string {
	keys := []string{p.keys.ids, p.keys.marks, p.keys.cancels, p.keys.flight}
	if l.opts.Journal > 0 {
		keys = append(keys, p.journalKeys(time.Now(), l.opts.Journal)...)
	}
	return keys
}
