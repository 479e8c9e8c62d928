package gate

import (
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Verdict is the gate's answer for one job. Being denied is a verdict, not an error.
type Verdict struct {
	// Allowed reports that the job holds a slot: dispatch it after Delay.
	Allowed bool
	// Duplicate reports that the job id was already admitted inside the window. It consumes nothing more:
	// it is allowed at its own slot, the end of a pause in force, or now, whichever is latest; or denied
	// (Allowed false, RetryAfter set) when that is beyond the max wait.
	Duplicate bool
	// Paused reports that a provider pause (see Limiter.Pause) is what sets the slot.
	Paused bool
	// Delay is how long to wait before dispatching (0 for an admission now). Microsecond precision.
	Delay time.Duration
	// RetryAfter, when denied, is how long to wait before asking again with the same max wait: the call
	// then succeeds unless others took the room. Millisecond precision, rounded up, never 0 when denied.
	RetryAfter time.Duration
	// Remaining is the room left in the tightest policy's window at the slot, after this job; when denied,
	// the room left now, counting reservations already handed out.
	Remaining int64
	// Policy is the index of the policy that blocked (the one needing the latest slot), or of the tightest
	// policy when none blocked.
	Policy int
	// Limit is that policy.
	Limit Policy
	// ByMerchant reports that Policy is one of the job's merchant's (ReserveFor): Policy then counts on
	// from the provider's policies into the merchant's.
	ByMerchant bool
	// Now is the Redis server's clock at the decision; the slot is Now + Delay.
	Now time.Time
	// Asked is this process's clock as the call that decided the verdict was handed to the Redis client
	// (zero where not known). Redis decided after it, so the slot comes at least Delay after Asked:
	// lateness counted from Asked + Delay is never early, and leaves out what a job waited in a batch's
	// queue for a call to carry it, which counted from the job's own asking would look like lateness.
	// What the client does after (a wait for a pooled connection, retries, a redirection) still counts.
	Asked time.Time
	// AdmittedAt, when the id was already in the log (a Duplicate, a Moved job, or a stale one denied),
	// is the slot it was admitted at (Redis clock).
	AdmittedAt time.Time
	// Moved reports that the id was in the log at a slot more than Options.StaleAfter ago and was
	// admitted afresh at this verdict's slot, its old entry removed in the same step (see StaleAfter).
	// A moved job's entry stands for whichever of its requests the provider counts: never release it.
	Moved bool
	// ResetAfter is how long until the provider's budget would be entirely unused again if nothing more
	// were admitted: every window empty, every bucket full, every queue drained (after this job when
	// it was admitted). Microsecond precision.
	ResetAfter time.Duration
	// Margin is the margin the decision was made with: the margin in force, as this process knew it.
	Margin time.Duration
	// InFlight reports a denial by the provider's in-flight cap (Provider.MaxInFlight): every lease is
	// taken. RetryAfter is then at most FlightPoll: leases usually end long before they lapse, and Watch
	// announces each end (LandWatcher).
	InFlight bool
	// Cancelled reports a denial of a cancelled job (Limiter.Cancel): it is never admitted while the cancel
	// stands, whatever the budget. RetryAfter is then 0.
	Cancelled bool
	// Lease is the in-flight lease the admission took ("" when the provider has no cap): give it to Land
	// when the request ends, or when the job gives its admission up (before asking again: every admission
	// takes a lease of its own).
	Lease string
}

// FlightPoll bounds Verdict.RetryAfter of a denial by the in-flight cap: a lease usually ends long before
// it lapses, and an end announced by Watch may be missed (a reconnection), so a waiting job asks again at
// least this often.
const FlightPoll = 250 * time.Millisecond

// Slot is the moment, on the Redis clock, at which the job may be dispatched.
func (v Verdict) Slot() time.Time { return v.Now.Add(v.Delay) }

// Releasable reports whether the caller may give the admission back (Release, ReleaseFor): not a
// duplicate's (its entry may stand for a request the first delivery sent) nor a moved job's (its entry
// stands for whichever of its requests the provider counts).
func (v Verdict) Releasable() bool { return !v.Duplicate && !v.Moved }

// The reply of a reserve, field by field, as the family's contract (lua/family/contract.lua) documents it
// (unpackReply spreads the script's packed reply into these indices).
const (
	replyAllowed = iota
	replyDuplicate
	replyDelay
	replyRetryAfter
	replyRemaining
	replyPolicy
	replyNow
	replyPaused
	replyAdmittedAt
	replyMoved
	replyResetAfter
	replyInFlight
	replyLease
	replyCancelled
	replyLen
)

// reserveReply reads a single reserve's reply (lua/family's: a batch of one's, now_us then the job's
// batchReplyLen numbers) into replyLen numbers, as splitReplies reads a batch's.
func reserveReply(cmd *redis.Cmd) ([]int64, error) {
	got, err := cmd.Int64Slice()
	if err != nil {
		return nil, err
	}
	if len(got) != 1+batchReplyLen {
		return nil, fmt.Errorf("malformed reply %v", got)
	}
	return unpackReply(got[0], [batchReplyLen]int64(got[1:])), nil
}

// unpackReply spreads one job's batchReplyLen numbers (its flags and policy in the first: lua/family's
// allowed + 2 duplicate + 4 paused + 8 moved + 16 in_flight + 32 lease + 128 cancelled + 256 policy),
// decided at now (µs), into the replyLen numbers verdictOf reads.
func unpackReply(now int64, nums [batchReplyLen]int64) []int64 {
	flags := nums[0]
	r := make([]int64, replyLen)
	r[replyAllowed], r[replyDuplicate], r[replyPaused] = flags&1, flags>>1&1, flags>>2&1
	r[replyMoved], r[replyInFlight], r[replyLease] = flags>>3&1, flags>>4&1, flags>>5&3
	r[replyCancelled], r[replyPolicy] = flags>>7&1, flags>>8
	r[replyDelay], r[replyRetryAfter], r[replyRemaining], r[replyAdmittedAt], r[replyResetAfter] = nums[1], nums[2], nums[3], nums[4], nums[5]
	r[replyNow] = now
	return r
}

// verdictOf reads lua/family's reply to c, a reserve of one job (c.jobID, c.merchant, under c.margin).
func verdictOf(p provider, providerName string, c call, reply []int64) (Verdict, error) {
	policies := p.policies
	if c.merchant != nil {
		policies = append(policies[:len(policies):len(policies)], c.merchant.limits.policies...)
	}
	if len(reply) != replyLen || reply[replyPolicy] < 0 || reply[replyPolicy] >= int64(len(policies)) || reply[replyResetAfter] < 0 {
		return Verdict{}, fmt.Errorf("gate: reserve %s/%s: malformed reply %v", providerName, c.jobID, reply)
	}
	v := Verdict{
		Allowed:    reply[replyAllowed] == 1,
		Duplicate:  reply[replyDuplicate] == 1,
		Delay:      time.Duration(reply[replyDelay]) * time.Microsecond,
		Remaining:  reply[replyRemaining],
		Policy:     int(reply[replyPolicy]),
		Limit:      policies[reply[replyPolicy]],
		ByMerchant: int(reply[replyPolicy]) >= len(p.policies),
		Now:        time.UnixMicro(reply[replyNow]),
		Paused:     reply[replyPaused] == 1,
		Moved:      reply[replyMoved] == 1,
		Cancelled:  reply[replyCancelled] == 1,
		ResetAfter: time.Duration(reply[replyResetAfter]) * time.Microsecond,
		Margin:     time.Duration(c.margin) * time.Microsecond,
	}
	if reply[replyAdmittedAt] > 0 {
		v.AdmittedAt = time.UnixMicro(reply[replyAdmittedAt])
	}
	switch reply[replyLease] { // lua/family's lease members
	case 1:
		v.Lease = c.jobID + "\x00" + strconv.FormatInt(reply[replyNow], 10)
	case 2:
		v.Lease = c.jobID + "\x00d" + strconv.FormatInt(reply[replyNow], 10)
	}
	if !v.Allowed && !v.Cancelled {
		// Round up to the millisecond: asking again after RetryAfter must not be early.
		v.RetryAfter = (time.Duration(reply[replyRetryAfter])*time.Microsecond + time.Millisecond - 1).Truncate(time.Millisecond)
		if v.RetryAfter <= 0 {
			return Verdict{}, fmt.Errorf("gate: reserve %s/%s: denied without a retry time %v", providerName, c.jobID, reply)
		}
		if reply[replyInFlight] == 1 {
			v.InFlight, v.RetryAfter = true, min(v.RetryAfter, FlightPoll)
		}
	}
	return v, nil
}
