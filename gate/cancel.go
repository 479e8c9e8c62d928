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
	// CancelQueued: the job was not admitted, nor is it known to have left (queued, deferred, waiting for
	// its not_before, or never seen): no later reserve of it is admitted while the cancel stands.
	CancelQueued CancelState = iota
	// CancelLeft: its request left, or will, at Cancellation.Slot: admitted for a slot now or past, marked
	// sent, in the job journal, or admitted for a slot ahead whose holder did not give it up in time (or
	// that a duplicate holds too). Nothing changed: it goes on as it would have.
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
		return "given_up"
	case CancelAlready:
		return "already_cancelled"
	}
	return "CancelState(" + strconv.Itoa(int(s)) + ")"
}

// Cancellation is Cancel's answer.
type Cancellation struct {
	State CancelState
	// Slot is when its request left or will (CancelLeft: the admission's slot, Redis clock, or the
	// journal's departure, the worker's), or the slot given up (CancelGivenUp); zero otherwise, and for a
	// request known only as marked sent.
	Slot time.Time
	// Now is the Redis clock as the cancel was decided.
	Now time.Time
}

// CancelOptions are the bounds of a Cancel.
type CancelOptions struct {
	// Keep is how long the cancel stands: longer than any job can still come (twice the fleet's
	// max_deferral_age: a job's life counts from its not_before, which is at most that far ahead).
	Keep time.Duration
	// Attempts is how many of the job's gate ids to look for: its own and its retries' (gate ids as
	// consumers.GateID makes them); at least MinCancelAttempts are.
	Attempts int
	// Notice is how long past a slot still ahead its holder may take to give it up once told
	// (consumers.LossNotice): a slot not given up by then is taken as used.
	Notice time.Duration
	// Poll is how often the holder's answer is looked for (default 20ms).
	Poll time.Duration
	// Reason is the operator's, kept while the cancel stands (CancelReason); "" for none.
	Reason string
}

// MinCancelAttempts is the fewest of a job's gate ids a Cancel or a Job looks for, whatever
// worker.max_attempts says (a copy moved with its attempt header kept may carry more).
const MinCancelAttempts = 32

// Cancel cancels jobID of a provider in one step where admissions are decided: from its return on, no
// reserve of the job (any attempt of it) is admitted while the cancel stands, on any worker, unless the
// answer is CancelLeft, which changes nothing. A job admitted for a slot still ahead is announced
// (AnnounceCancel); its holder, told, says in Redis that it will not send it (AckCancel), and Cancel waits
// for that at most until the slot plus opts.Notice, then decides in one more step: given up
// (CancelGivenUp), or left (the cancel lifted). The decision is made even when ctx ends meanwhile.
func (l *Limiter) Cancel(ctx context.Context, providerName, jobID string, opts CancelOptions) (Cancellation, error) {
	p, err := l.provider(providerName)
	if err != nil {
		return Cancellation{}, err
	}
	if err := checkCancelID(jobID); err != nil {
		return Cancellation{}, err
	}
	if opts.Keep <= 0 || opts.Notice < 0 {
		return Cancellation{}, invalidf("gate: cancel: want a keep > 0 and a notice >= 0, got %s and %s", opts.Keep, opts.Notice)
	}
	if opts.Poll <= 0 {
		opts.Poll = 20 * time.Millisecond
	}
	n := max(opts.Attempts, MinCancelAttempts)
	keys := l.cancelKeys(p)
	for {
		r, err := l.cancelCall(ctx, keys, "cancel", jobID, n, p.dedup, micros(opts.Keep), micros(opts.Notice), l.channel, providerName, opts.Reason).Int64Slice()
		code, c, err := cancellation(jobID, r, err)
		if err != nil {
			return Cancellation{}, err
		}
		switch code {
		case 2: // admitted ahead: its holder was told
			return l.awaitHolder(ctx, keys, jobID, n, p.dedup, c, opts)
		case 4: // another cancel waits for the holder: ask again once it has decided
			if err := sleepCtx(ctx, c.Slot.Sub(c.Now)+opts.Notice+opts.Poll); err != nil {
				return Cancellation{}, err
			}
			continue
		}
		return c, nil
	}
}

// awaitHolder waits for the holder of a slot ahead to give it up (AckCancel), at most until the slot plus
// the notice, then settles: given up, or left. It settles even when ctx ends meanwhile.
func (l *Limiter) awaitHolder(ctx context.Context, keys []string, jobID string, n int, dedup int64, c Cancellation, opts CancelOptions) (Cancellation, error) {
	deadline := time.Now().Add(c.Slot.Sub(c.Now) + opts.Notice)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		got, err := l.cancelCall(ctx, keys, "peek", jobID, n, dedup, 0, 0, "", "", "").Int64()
		if err != nil || got != 2 {
			break // given up (5), or a failed read: settle decides
		}
		_ = sleepCtx(ctx, opts.Poll)
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	r, err := l.cancelCall(sctx, keys, "settle", jobID, n, dedup, micros(opts.Keep), micros(opts.Notice), "", "", "").Int64Slice()
	_, settled, err := cancellation(jobID, r, err)
	if err != nil {
		return Cancellation{}, err
	}
	if settled.State == CancelGivenUp {
		settled.Slot = c.Slot
	}
	return settled, nil
}

// AckCancel is the holder of a slot ahead, told that its job was cancelled (CancelWatcher), saying that it
// will not send the job: true when the cancel waits for it (the job must not be sent: give the slot up and
// ask again, and the reserve is denied as cancelled); false when none does (the cancel found it had left,
// and was lifted: send it on its slot).
func (l *Limiter) AckCancel(ctx context.Context, providerName, jobID string) (bool, error) {
	p, err := l.provider(providerName)
	if err != nil {
		return false, err
	}
	if err := checkCancelID(jobID); err != nil {
		return false, err
	}
	got, err := l.cancelCall(ctx, l.cancelKeys(p), "ack", jobID, 1, p.dedup, 0, 0, "", "", "").Int64()
	if err != nil {
		return false, fmt.Errorf("gate: cancel ack %s/%s: %w", providerName, jobID, err)
	}
	return got == 1, nil
}

// checkCancelID refuses what is not a job's own id (a retry's gate id carries "\x1f<attempt>").
func checkCancelID(jobID string) error {
	if err := checkID(jobID); err != nil {
		return err
	}
	if strings.IndexByte(jobID, 0x1f) >= 0 {
		return invalidf("gate: a job's own id has no \\x1f (that separates a retry's gate id)")
	}
	return nil
}

func (l *Limiter) cancelCall(ctx context.Context, keys []string, op, jobID string, n int, dedup, keep, notice int64, channel, providerName, reason string) *redis.Cmd {
	return cancelScript.Run(ctx, l.rdb, keys, op, jobID, n, dedup, keep, notice, channel, providerName, reason)
}

// cancelStates are cancel.lua's states, by number, as the caller reads them (2: a holder told, being
// given up; 4: another cancel waits for it).
var cancelStates = [...]CancelState{CancelQueued, CancelLeft, CancelGivenUp, CancelAlready, CancelAlready, CancelGivenUp}

// cancellation reads a cancel or settle reply: its state's number, and what it says.
func cancellation(jobID string, r []int64, err error) (int64, Cancellation, error) {
	if err != nil {
		return 0, Cancellation{}, fmt.Errorf("gate: cancel %s: %w", jobID, err)
	}
	if len(r) != 3 || r[0] < 0 || r[0] >= int64(len(cancelStates)) {
		return 0, Cancellation{}, fmt.Errorf("gate: cancel %s: malformed reply %v", jobID, r)
	}
	c := Cancellation{State: cancelStates[r[0]], Now: time.UnixMicro(r[2])}
	if r[1] > 0 {
		c.Slot = time.UnixMicro(r[1])
	}
	return r[0], c, nil
}

// sleepCtx waits d, or until ctx ends (its error).
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// CancelReason is the reason a standing cancel of jobID (or the job of a gate id) was given ("" for none,
// or when no cancel stands).
func (l *Limiter) CancelReason(ctx context.Context, providerName, jobID string) (string, error) {
	p, err := l.provider(providerName)
	if err != nil {
		return "", err
	}
	got, err := l.cancelCall(ctx, l.cancelKeys(p), "reason", OwnID(jobID), 1, p.dedup, 0, 0, "", "", "").Text()
	if err != nil {
		return "", fmt.Errorf("gate: cancel reason %s/%s: %w", providerName, jobID, err)
	}
	return got, nil
}

// OwnID is a job's own id in a gate id: a retry's gate id carries "\x1f<attempt>" (consumers.GateID), and
// cancels, which lua/family checks by the job's own id, reach every attempt.
func OwnID(gateID string) string {
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
	if err := checkCancelID(jobID); err != nil {
		return JobState{}, err
	}
	attempts = max(attempts, MinCancelAttempts)
	raw, err := l.cancelCall(ctx, l.cancelKeys(p), "show", jobID, attempts, p.dedup, 0, 0, "", "", "").Slice()
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
