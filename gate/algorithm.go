package gate

import (
	"context"
	"crypto/sha1"
	"fmt"
	"hash/fnv"
	"strings"
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

// merchantKeys are the keys of a merchant's own state under algo: the tag is the provider's.
func merchantKeys(tag, merchant string, algo Algorithm, policies []Policy, margin time.Duration, buckets int) []string {
	mt := tag + "m:" + merchant + ":"
	if algo == SlidingLog {
		return []string{mt + "log"}
	}
	return keysFor(mt, algo, policies, margin, buckets, 0)[3:]
}

// MaxSlidingLogLimit is the largest limit SlidingLog takes: it keeps one sorted-set member per unit of cost
// in its longest window (about 100 bytes each: 10 MB per provider at this limit), and writing a job of
// cost n is O(n) inside Redis, where nothing else runs meanwhile. The counting algorithms (SlidingWindow,
// GCRA, ...) keep a few numbers per limit whatever the limit and the cost.
const MaxSlidingLogLimit = 100_000

// family is one algorithm's script: family.lua (checks, ids, duplicates, moves, pause, pace, warm-up,
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

func newFamily(a Algorithm, part string) *family {
	src := lua.Family + part
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
	case "release", "depart": // give back, or move what was sent: no new request (allow-oom)
		return f.fnRelease
	case "status", "merchants":
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

// functions is what runs the family as a Redis Function; every go-redis client has it.
type functions interface {
	FCall(ctx context.Context, function string, keys []string, args ...any) *redis.Cmd
	FunctionLoad(ctx context.Context, code string) *redis.StringCmd
}

// evalFor is how long a Limiter that met a server without functions (or an ACL user that may not use them)
// runs the family with EVALSHA before it tries FCALL again: a server upgraded in place, or an ACL mended,
// gets the faster path back.
const evalFor = 5 * time.Minute

// runFamily runs f with keys and args (args[0] is the op): FCALL, loading the library first where the server
// lacks it (a new server, or one restarted empty), or EVALSHA where the server has no functions or the user
// may not call or load them. The script's own error replies are returned as they are.
func (l *Limiter) runFamily(ctx context.Context, f *family, keys []string, args []any) *redis.Cmd {
	return l.runFamilyOn(ctx, l.rdb, l.fn, f, keys, args)
}

// runFamilyOn is runFamily through rdb and fn (nil: no functions): the client's, or one connection's.
func (l *Limiter) runFamilyOn(ctx context.Context, rdb redis.Scripter, fn functions, f *family, keys []string, args []any) *redis.Cmd {
	if fn != nil && time.Now().UnixNano() >= l.evalUntil.Load() {
		name := f.function(args[0])
		cmd := fn.FCall(ctx, name, keys, args...)
		if !noFunction(cmd.Err()) {
			return cmd
		}
		if !noFunctions(cmd.Err()) {
			lerr := l.loadFamily(ctx, f)
			if lerr == nil {
				if cmd = fn.FCall(ctx, name, keys, args...); !noFunction(cmd.Err()) {
					return cmd
				}
				// loaded elsewhere than where the call went (a proxy, say): this call by EVALSHA
			} else if noFunctions(lerr) {
				l.evalUntil.Store(time.Now().Add(evalFor).UnixNano())
			}
			// otherwise (Redis unreachable, say) this call alone goes by EVALSHA, and meets the same fate
		} else {
			l.evalUntil.Store(time.Now().Add(evalFor).UnixNano())
		}
	}
	return f.eval.Run(ctx, rdb, keys, args...)
}

// noFunction tells a missing function (or no functions at all: noFunctions) from every other error.
func noFunction(err error) bool {
	return err != nil && (strings.HasPrefix(err.Error(), "ERR Function not found") || noFunctions(err))
}

// noFunctions tells a server without functions, or an ACL user that may not use them (FCALL or FUNCTION
// LOAD), from every other error.
func noFunctions(err error) bool {
	s := err.Error()
	return strings.Contains(s, "unknown command") || strings.HasPrefix(s, "NOPERM")
}

// loadFamily loads f's library on the server, or on every primary of a Redis Cluster (every shard of a
// Ring): FCALL goes where its keys are. A library already there (another worker loaded it) is no error.
func (l *Limiter) loadFamily(ctx context.Context, f *family) error {
	load := func(ctx context.Context, c functions) error {
		if err := c.FunctionLoad(ctx, f.lib).Err(); err != nil && !strings.Contains(err.Error(), "already exists") {
			return err
		}
		return nil
	}
	each := func(ctx context.Context, c *redis.Client) error { return load(ctx, c) }
	switch c := l.rdb.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, each)
	case *redis.Ring:
		return c.ForEachShard(ctx, each)
	}
	return load(ctx, l.fn)
}

// keysFor names a provider's keys: the id record (sliding_log's log), pause and marks first, then the
// algorithm's own state. tag is "<prefix>:{<provider>}:".
func keysFor(tag string, algo Algorithm, policies []Policy, margin time.Duration, buckets int, version int64) []string {
	if algo == SlidingLog {
		return []string{tag + "log", tag + "pause", tag + "marks"}
	}
	keys := []string{tag + "ids", tag + "pause", tag + "marks"}
	switch algo {
	case SlidingWindow:
		// Named by the bucket width: a change of window, margin or bucket count starts a new hash rather
		// than reading the old one's buckets with another width.
		for _, p := range policies {
			keys = append(keys, fmt.Sprintf("%ssw:%d", tag, bucketWidth(p.Window, margin, buckets)))
		}
	case FixedWindow:
		for _, p := range policies {
			keys = append(keys, fmt.Sprintf("%sfw:%d", tag, micros(p.Window)))
		}
	// The buckets keep no history, only a level: read under other limits, the level of the old ones would
	// forget what was sent (a bucket of 10 with 3 taken, cut to 4, would hand out 4 more). Named by their
	// limits and the live limits' version too, a change of limits (configured, or live: set or reset, even
	// back to limits used before, whose old state knows nothing of what went since) starts them afresh
	// and warms up.
	case TokenBucket:
		keys = append(keys, tag+"tb:"+limitsName(policies, version))
	case GCRA:
		keys = append(keys, tag+"gcra:"+limitsName(policies, version))
	case LeakyBucket:
		keys = append(keys, tag+"leaky:"+limitsName(policies, version))
	}
	return keys
}

// limitsName names a set of policies at a version of the live limits in a key: a hash of the version and
// each limit and window (µs), in order.
func limitsName(policies []Policy, version int64) string {
	h := fnv.New32a()
	fmt.Fprintf(h, "v%d|", version)
	for _, p := range policies {
		fmt.Fprintf(h, "%d/%d|", p.Limit, micros(p.Window))
	}
	return fmt.Sprintf("%08x", h.Sum32())
}

// bucketWidth is SlidingWindow's sub-window in µs: buckets of them cover the window plus margin.
func bucketWidth(window, margin time.Duration, buckets int) int64 {
	w := micros(window) + micros(margin)
	return (w + int64(buckets) - 1) / int64(buckets)
}
