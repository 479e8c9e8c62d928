package gate

import (
	"crypto/sha1"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/lua"
)

// Algorithm names how the gate counts one provider's budget. Every algorithm is one Lua script with the
// Redis clock, answers in the same Verdict, and checks all of a provider's policies in one atomic step.
type Algorithm string

const (
	// SlidingLog is exact: one sorted-set member per unit of cost in the longest window. The default.
	SlidingLog Algorithm = "sliding_log"
	// SlidingWindow counts units in Buckets sub-windows per policy (one hash per policy). It never admits
	// more than the exact log; it may admit less, by at most one sub-window's worth of time.
	SlidingWindow Algorithm = "sliding_window"
	// TokenBucket holds Limit tokens per policy, refilled Limit per Window: bursts of Limit, then the rate.
	// The only algorithm that can Force.
	TokenBucket Algorithm = "token_bucket"
	// GCRA is the generic cell rate algorithm with a burst of Limit: the token bucket kept as one
	// theoretical arrival time per policy.
	GCRA Algorithm = "gcra"
	// FixedWindow counts units per calendar window (aligned to the Unix epoch on the Redis clock). Up to
	// 2 x Limit can pass within one Window across a boundary, by design.
	FixedWindow Algorithm = "fixed_window"
	// LeakyBucket is a queue of Limit units leaking at Limit per Window: no bursts, one unit every
	// Window/Limit.
	LeakyBucket Algorithm = "leaky_bucket"
)

// Algorithms lists every algorithm, the default first.
var Algorithms = []Algorithm{SlidingLog, SlidingWindow, TokenBucket, GCRA, FixedWindow, LeakyBucket}

const (
	// DefaultBuckets is the number of sub-windows per policy window of SlidingWindow.
	DefaultBuckets = 10
	// MaxBuckets bounds Provider.Buckets: every decision reads every bucket.
	MaxBuckets = 100
	// DefaultDedupWindow is Options.DedupWindow when left 0.
	DefaultDedupWindow = time.Minute
)

// Provider is one provider's budget: its policies, all enforced together, and the algorithm that counts
// them.
type Provider struct {
	Policies []Policy
	// Algorithm counts the policies; "" is SlidingLog.
	Algorithm Algorithm
	// Buckets is SlidingWindow's number of sub-windows per policy window, 1..MaxBuckets (0:
	// DefaultBuckets). It must be 0 for the other algorithms.
	Buckets int
	// Burst paces the provider's slots: 0 hands out every slot the algorithm allows (a window's worth may
	// share one instant); N >= 1 spaces slots (shortest window + margin) / limit apart per unit of cost,
	// N units at most at one moment, so that a fleet wakes one job at a time and the provider sees a
	// steady stream. At most the limit of the shortest window, which turns pacing off (as 0 does: no pace
	// is kept, and fixed_window may then put a limit's worth on each side of a window boundary). Longer
	// windows, and a shortest one longer than MaxPacedWindow, are quotas: counted exactly, never paced.
	Burst int64
	// MaxInFlight caps the provider's requests in flight across every worker (0: no cap). Each admission
	// takes a lease in the same step as its slot (Verdict.Lease); Land ends it when the request ends. A
	// full cap denies with Verdict.InFlight, spending nothing. A duplicate let go takes a lease of its own.
	MaxInFlight int64
	// Lease is how long after its slot a lease lapses by itself, so that a worker that died holding one
	// (kill -9) cannot leak it: the provider's request timeout plus a slack. Required with MaxInFlight.
	Lease time.Duration
	// FromHeaders: the provider's live limits may come from its announcements (FollowAnnounced); without
	// it, announced limits left in Redis by an earlier configuration are not followed.
	FromHeaders bool
	// LearnMin and LearnMax bound a learned limit (Learn); zero: the provider's limits are not learned,
	// and a learned limit left in Redis by an earlier configuration is not followed.
	LearnMin, LearnMax Policy
	// PerMerchant are the limits of every merchant inside the provider's (a connected account's own
	// quota): a job with a merchant (ReserveFor) is admitted only at a slot where the provider's policies
	// and its merchant's all have room, in one step. Jobs without a merchant count against the provider
	// only. Merchants names the exceptions: a merchant listed there with policies of its own has those
	// instead. Only the algorithms in MerchantAlgorithms count merchants' limits.
	PerMerchant []Policy
	Merchants   map[string]Merchant
	// TrackMerchants records the merchants of the jobs admitted (Limiter.Merchants) even without limits of
	// their own; merchants' limits record them anyway.
	TrackMerchants bool
	// Breaker is the provider's circuit breaker, one for the fleet (Failures 0: none).
	Breaker Breaker
}

// Merchant is a merchant named in Provider.Merchants.
type Merchant struct {
	// Policies replace Provider.PerMerchant for this merchant; none: PerMerchant applies.
	Policies []Policy
}

// MerchantAlgorithms are the algorithms that count merchants' limits (Provider.PerMerchant): those that
// keep a count per window, which a merchant can have beside its provider's. The buckets (TokenBucket,
// GCRA, LeakyBucket) keep one level for all of a provider's policies, and do not.
var MerchantAlgorithms = []Algorithm{SlidingLog, SlidingWindow, FixedWindow}

// MaxSlidingLogLimit is the largest limit SlidingLog takes: it keeps one sorted-set member per unit of cost
// in its longest window (about 100 bytes each: 10 MB per provider at this limit), and writing a job of
// cost n is O(n) inside Redis, where nothing else runs meanwhile. The counting algorithms (SlidingWindow,
// GCRA, ...) keep a few numbers per limit whatever the limit and the cost.
const MaxSlidingLogLimit = 100_000

// family is one algorithm's script: lua/family (checks, ids, duplicates, moves, pause, pace, warm-up,
// release, status) followed by the algorithm's own counting, and the line that runs it.
//
// It runs as a Redis Function where the server has them (Redis 7 and later): FUNCTION LOAD once, then FCALL.
// A function's library is run once, when it is loaded, so the script's definitions (some 80 functions) are
// made once instead of on every call, as EVALSHA does (see docs/gate.md). Elsewhere (miniredis, older Redis,
// an ACL user without FCALL) the same source runs with EVALSHA.
type family struct {
	src  string        // the source with `return paygate(eval_args())`
	eval *redis.Script // src
	// lib is FUNCTION LOAD's source: the library fn, registering three functions with the flags their
	// operations want: fn (reserve), fn_release (allow-oom: a release only gives back), fn_ro (no-writes:
	// status and merchants, served on a full or read-only server)
	lib string
	// fn is paygate_<algorithm>_<12 hex of the source's SHA-1>: workers of two versions (a rolling upgrade)
	// each call their own; fnRelease and fnRO are its other two functions
	fn, fnRelease, fnRO string
}

// newFamily makes algorithm a's family from src, its script (lua.SlidingLog, ...). The function's name
// follows the source's SHA-1, so that workers of two versions each call their own.
func newFamily(a Algorithm, src string) *family {
	sum := sha1.Sum([]byte(src))
	fn := fmt.Sprintf("paygate_%s_%x", a, sum[:6])
	evalSrc := src + "\nreturn paygate(eval_args())\n"
	return &family{
		src:  evalSrc,
		eval: redis.NewScript(evalSrc),
		lib: "#!lua name=" + fn + "\n" + src + "\n" +
			"redis.register_function('" + fn + "', paygate)\n" +
			"redis.register_function{function_name = '" + fn + "_release', callback = paygate_release, flags = {'allow-oom'}}\n" +
			"redis.register_function{function_name = '" + fn + "_ro', callback = paygate_ro, flags = {'no-writes'}}\n",
		fn: fn, fnRelease: fn + "_release", fnRO: fn + "_ro",
	}
}

// function is the name of f's function for op (ARGV[1]).
func (f *family) function(op any) string {
	switch op {
	case opRelease, opDepart: // give back, or move what was sent: no new request (allow-oom)
		return f.fnRelease
	case opStatus, opMerchants:
		return f.fnRO
	}
	return f.fn
}

var families = map[Algorithm]*family{
	SlidingLog:    newFamily(SlidingLog, lua.SlidingLog),
	SlidingWindow: newFamily(SlidingWindow, lua.SlidingWindow),
	TokenBucket:   newFamily(TokenBucket, lua.TokenBucket),
	GCRA:          newFamily(GCRA, lua.GCRA),
	FixedWindow:   newFamily(FixedWindow, lua.FixedWindow),
	LeakyBucket:   newFamily(LeakyBucket, lua.LeakyBucket),
}
