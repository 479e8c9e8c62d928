// Package gate is paygate's shared budget: every worker on every node asks it before calling a provider, and
// it never lets the providers' limits be exceeded.
//
// Each provider's budget is counted by the algorithm it is configured with (see Algorithm): by default an
// exact sliding log (lua/sliding_log.lua); or sub-window counters, a token bucket, GCRA, fixed windows or a
// leaky bucket, each one Lua script. Every decision uses the Redis server's clock and is either an
// admission now, a reservation of a slot in the near future (the worker sleeps until the slot, then
// dispatches), or a denial with the time after which asking again succeeds. Admission is idempotent per
// job id, and all of a provider's policies are checked atomically.
//
// The gate never logs; a Redis failure is returned as an error, never as an allow.
package gate

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/job"
	"github.com/paygate/paygate/lua"
)

const (
	// MaxIDLen is the longest job id the gate accepts, in bytes: a job id of 128 characters of up to 4
	// bytes each, with room for the worker's attempt suffix.
	MaxIDLen = 600
	// MaxWindow is the longest policy window.
	MaxWindow = 366 * 24 * time.Hour
	// MaxHorizon caps a max wait and a pause: longer ones mean "indefinitely" and are cut to it, which
	// keeps every time the scripts compute exact in a Lua double.
	MaxHorizon = 10 * 365 * 24 * time.Hour
)

var (
	pauseScript  = redis.NewScript(lua.Pause)
	marginScript = redis.NewScript(lua.Margin)
	sentScript   = redis.NewScript(lua.Sent)
	landScript   = redis.NewScript(lua.Land)
	limitsScript = redis.NewScript(lua.Limits)
)

// The reply of a reserve, index by index, as family.lua's header documents it.
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
	replyLen
)

// The reply of a status: now, paused until, units, then statusPerPolicy numbers per policy.
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

var (
	// ErrInvalid is matched (errors.Is) by every error about the caller's input rather than Redis: an
	// unknown provider, a bad job id, cost or max wait. Such a request can never succeed as it is.
	ErrInvalid = errors.New("invalid request")
	// ErrUnknownProvider is returned for a provider the gate was not configured with; it matches ErrInvalid.
	ErrUnknownProvider = errors.New("unknown provider")
)

// invalidError is an input error: its message is the caller's, and it matches ErrInvalid.
type invalidError struct {
	msg   string
	cause error
}

func (e *invalidError) Error() string        { return e.msg }
func (e *invalidError) Unwrap() error        { return e.cause }
func (e *invalidError) Is(target error) bool { return target == ErrInvalid }

func invalidf(format string, args ...any) error {
	return &invalidError{msg: fmt.Sprintf(format, args...)}
}

// Policy is one rate limit: at most Limit units of cost in any window of length Window.
type Policy struct {
	Limit  int64
	Window time.Duration
}

// String renders the policy as config and the CLI write it: "100/1s", "3000/1m0s" as "3000/1m".
func (p Policy) String() string { return fmt.Sprintf("%d/%s", p.Limit, FormatDuration(p.Window)) }

// FormatDuration is time.Duration.String without the zero units ("1m" rather than "1m0s").
func FormatDuration(d time.Duration) string {
	s := d.String()
	for _, z := range []struct{ suffix, unit string }{{"m0s", "m"}, {"h0m", "h"}} {
		if len(s) > len(z.suffix) && s[len(s)-len(z.suffix):] == z.suffix {
			s = s[:len(s)-len(z.suffix)] + z.unit
		}
	}
	return s
}

// Options configure a Limiter.
type Options struct {
	// Prefix starts every key: <Prefix>:{<provider>}:log. It must not contain braces.
	Prefix string
	// Margin is added to every window, so that slots a window apart still look a window apart to a
	// provider after network and scheduling jitter. It costs Margin/Window of the budget. With MarginMax
	// above it, it is the floor of the margin in force.
	Margin time.Duration
	// MarginMax is the ceiling of the margin in force, which follows the fleet (ReportLateness,
	// ReportThrottle) from Margin up to this; at or below Margin, the margin never moves. SlidingWindow
	// cuts its buckets by the margin, so its margin stays at Margin.
	MarginMax time.Duration
	// StaleAfter: a job id found in the log at a slot more than this long ago is a redelivery whose
	// earlier delivery may never have sent its request. Rather than go out now on the old entry (which
	// would leave the log saying "then" while the provider sees "now"), it is moved: its entry leaves
	// the log and it is admitted afresh, first come first served, in one atomic step (Verdict.Moved).
	// 0 disables it: a duplicate then always goes at its own slot or now. The worker uses margin/2.
	StaleAfter time.Duration
	// WarmUp turns on the warm-up after a loss of state. A Redis restart without persistence, a failover
	// to a replica that had not caught up, or a FLUSHALL forgets the log, while the provider still counts
	// what it received. The gate notices (a per-provider epoch key is missing) and pauses the provider
	// for its shortest window plus Margin plus Horizon, so that nothing admitted after the loss shares
	// one of those windows with a request sent, or a reservation handed out, before it. Windows longer
	// than that are not covered (see docs/gate.md, "What it does not cover"). The first decision a fresh gate makes for a
	// provider looks the same, so it warms up too.
	WarmUp bool
	// WarmUpCap bounds the window part of the warm-up: a provider whose shortest window is longer (a
	// daily cap only) is held for WarmUpCap instead, and that window is not covered. 0: no bound.
	WarmUpCap time.Duration
	// Horizon is how long after a loss of state a reservation handed out before it may still be used;
	// only the warm-up uses it. For holders that sleep on their reservations regardless, their max wait;
	// for holders that drop them as Watch tells them of the loss (the worker does), the time that takes
	// them (consumers.LossNotice).
	Horizon time.Duration
	// DedupWindow is how long after its slot an algorithm other than SlidingLog remembers an admitted job
	// id (for duplicates, moves and Release), at most the longest window plus margin; 0 means
	// DefaultDedupWindow. SlidingLog remembers ids for its longest window, in the log itself. The ids of
	// jobs admitted in this time are the one part of those algorithms' memory that grows with traffic.
	DedupWindow time.Duration
	// MinReplicasAcked: an admission is used only once this many replicas have acknowledged its write
	// (WAIT, on the connection that made it, for at most AckTimeout), so that a failover to one of them
	// keeps it. Not acknowledged in time, it is given back (a duplicate's permit, which another delivery
	// holds, is not) and the decision fails with ErrUnacknowledged: the job does not go out. So does
	// every move of an admission in time (Postpone, Departed). 0: off. It needs a *redis.Client (a single
	// node, or a Sentinel primary) or a *redis.ClusterClient.
	MinReplicasAcked int
	// AckTimeout bounds the wait for MinReplicasAcked: 1ms..MaxAckTimeout.
	AckTimeout time.Duration
	// Batch is the most reserves of one provider decided in one call: the ones asked while a call for the
	// provider is on its way go together as the next (each with the verdict its own call would have had,
	// in the order asked). 0 or 1: each alone. Reserves naming a merchant on a provider that counts or
	// tracks merchants, and all reserves under MinReplicasAcked, go alone.
	Batch int
	// BatchLinger is how long a call waits for company: a reserve that finds nothing on its way waits this
	// long (0..MaxBatchLinger) for others of its provider before its call goes, unless Batch of them come
	// sooner. 0: it goes at once. Fewer calls per job at high rates, for up to this much more latency.
	BatchLinger time.Duration
	// Providers maps each provider name ([a-z0-9_-]{1,64}) to its budget.
	Providers map[string]Provider
}

// MaxBatch is the largest Options.Batch (family.lua takes up to 1000 jobs a call).
const MaxBatch = 1000

// MaxBatchLinger is the longest Options.BatchLinger: a linger is meant to be short next to a window.
const MaxBatchLinger = 10 * time.Millisecond

// MaxAckTimeout is the longest Options.AckTimeout: a wait well within go-redis's read timeout (3s).
const MaxAckTimeout = time.Second

// ErrUnacknowledged: an admission's write, or its move (Postpone, Departed), did not reach
// Options.MinReplicasAcked replicas within Options.AckTimeout. An admission or a postponement was given
// back; the job must not go out now (ask again later).
var ErrUnacknowledged = errors.New("gate: admission not acknowledged by enough replicas")

// Limiter is the gate. It is safe for concurrent use; its state lives in Redis.
type Limiter struct {
	rdb       redis.Scripter
	fn        functions    // rdb, when it can FCALL
	evalUntil atomic.Int64 // unix ns: EVALSHA until then (a server without functions; see runFamily)
	pauses    string       // the channel pauses are announced on
	margin    time.Duration
	stale     int64 // µs
	providers map[string]*live
	// opts and dedup build a provider anew under live limits
	opts  Options
	dedup time.Duration
	// hold and fresh time the margin in force (marginHold, marginFresh; tests shorten them)
	hold, fresh time.Duration
	// acks and ackMillis are Options.MinReplicasAcked and AckTimeout (ms)
	acks, ackMillis int64
}

// The margin in force: a margin kept up is narrowed after marginHold, by steps a second apart; a worker's
// report counts for marginFresh.
const (
	marginHold  = 10 * time.Second
	marginFresh = 10 * time.Second
)

// live is one provider: as configured, and as in force (the configured limits, or the live ones that
// `worker limits set` put over them; see SetLimits).
type live struct {
	spec  Provider
	cur   atomic.Pointer[provider]
	mu    sync.Mutex  // one reading of the live limits at a time
	stale atomic.Bool // a change was announced (Watch): read them before the next decision
}

type provider struct {
	algo     Algorithm
	script   *family // family.lua with the algorithm's part
	policies []Policy
	keys     []string // the id record (sliding_log: the log), pause, marks, the algorithm's state, merchants, limits, flight, pace, epoch
	shape    int64    // the layout of the state (stateShape), which the epoch records
	// policyText is the settings' tail (family.lua's S[11..]): " limit window" (µs) per policy; settings
	// keeps the settings without a merchant's limits under the margin last asked for (provider.settings)
	policyText string
	settings   *atomic.Pointer[settingsAt]
	// nalgo is how many keys come before the merchants' registry: a merchant's own keys go there
	nalgo int
	// tag is the provider's key prefix (<prefix>:{<name>}:); keyMargin the margin its keys are named by
	tag       string
	keyMargin time.Duration
	// perMerchant are every merchant's limits (nil: none), named a merchant's own (Provider.Merchants)
	perMerchant *merchantLimits
	named       map[string]*merchantLimits
	// track records the merchants seen in the registry (Provider.TrackMerchants, or merchants' limits)
	track bool
	// version is the version of the live limits the policies follow (0: the configured ones, never
	// overridden); source says which: "config" or "override". configMin is the configured smallest limit.
	version   int64
	source    string
	configMin int64
	liveAt    int64 // µs: when the live limits were last set or reset (0: never, or not read)
	// maxFlight is Provider.MaxInFlight (0: no cap); lease its Lease in µs
	maxFlight, lease int64
	warmup           int64 // µs; 0: off
	// batch gathers the reserves asked while one is on its way (Options.Batch; nil: each alone)
	batch    *batcher
	minLimit int64
	dedup    int64 // µs: an admitted id is remembered, and the log kept, this long after its slot
	buckets  int
	// s3 is family.lua's S[3], the algorithm's own number: SlidingWindow's buckets; SlidingLog's cap on
	// its log, the most members it keeps, the newest (0: no cap; set by build under live limits); else 0
	s3 int64
	// burst is Provider.Burst (0: not paced); paced is the policy the pace follows
	burst int64
	paced Policy
	// floor and ceiling bound the margin in force (µs); inForce is the margin this process last learned
	floor, ceiling int64
	inForce        *atomic.Int64
	marginKeys     []string // <tag>margin, <tag>lateness
}

// merchantLimits are a merchant's policies (Provider.PerMerchant, or its own in Provider.Merchants).
type merchantLimits struct {
	policies []Policy
	text     string // " limit window" (µs) per policy, as in the settings (provider.policyText)
	minLimit int64
}

// noLimits are the limits of a merchant without any of its own.
var noLimits = merchantLimits{minLimit: math.MaxInt64}

// merchantCall is a decision's merchant: its name, limits (maybe none) and keys.
type merchantCall struct {
	name   string
	limits *merchantLimits
	keys   []string
}

// merchantOf is the merchant part of a call for a job of merchant m: nil when m is "" or the provider has
// no merchants' limits.
func (p provider) merchantOf(m string) *merchantCall {
	if m == "" {
		return nil
	}
	ml := p.named[m]
	if ml == nil {
		ml = p.perMerchant
	}
	switch {
	case ml != nil:
		return &merchantCall{name: m, limits: ml, keys: merchantKeys(p.tag, m, p.algo, ml.policies, p.keyMargin, p.buckets)}
	case p.track:
		return &merchantCall{name: m, limits: &noLimits} // recorded in the registry, counted by none of its own
	}
	return nil
}

// keysFor are the call's KEYS: the provider's, with the merchant's own state before the registry.
func (p provider) keysFor(mc *merchantCall) []string {
	if mc == nil {
		return p.keys
	}
	keys := make([]string, 0, len(p.keys)+len(mc.keys))
	return append(append(append(keys, p.keys[:p.nalgo]...), mc.keys...), p.keys[p.nalgo:]...)
}

// appendArgv appends ARGV[7..8] for a decision under margin m (µs): the merchant, and the settings (see
// family.lua's header).
func (p provider) appendArgv(argv []any, m int64, mc *merchantCall) []any {
	if mc == nil {
		return append(argv, "", p.settingsAt(m, nil))
	}
	return append(argv, mc.name, p.settingsAt(m, mc.limits))
}

// settingsAt is a provider's settings string under margin m, for a merchant with the limits ml (nil: none):
// margin, dedup, buckets, warm-up, pace, tolerance, max in flight, lease, the live limits' version, the
// state's shape, how many policies are the merchant's, then the provider's policies and the merchant's. Without a merchant's limits
// it is kept for the margin last asked for: a string the script has seen is parsed there only once.
func (p provider) settingsAt(m int64, ml *merchantLimits) string {
	s := p.settings.Load()
	if s == nil || s.m != m {
		pace, tolerance := p.paceAt(m)
		b := make([]byte, 0, 128)
		for _, v := range [...]int64{m, p.dedup, p.s3, p.warmup, pace, tolerance, p.maxFlight, p.lease, p.version, p.shape} {
			b = append(strconv.AppendInt(b, v, 10), ' ')
		}
		s = &settingsAt{m: m, head: string(b), s: string(b) + "0" + p.policyText}
		p.settings.Store(s)
	}
	if ml == nil || len(ml.policies) == 0 {
		return s.s
	}
	return s.head + strconv.Itoa(len(ml.policies)) + p.policyText + ml.text
}

// settingsText is policies as the settings' tail: " limit window" (µs) per policy.
func settingsText(policies []Policy) string {
	var b strings.Builder
	for _, pol := range policies {
		fmt.Fprintf(&b, " %d %d", pol.Limit, micros(pol.Window))
	}
	return b.String()
}

// settingsAt is a provider's settings under margin m: head is its first ten numbers (and a space), s the
// whole string for a job without a merchant's limits.
type settingsAt struct {
	m       int64
	head, s string
}

// paceAt is the pace and the burst tolerance in µs under margin m (0, 0: not paced).
func (p provider) paceAt(m int64) (pace, tolerance int64) {
	if p.burst == 0 {
		return 0, 0
	}
	pace = paceMicros(p.paced, m)
	return pace, (p.burst - 1) * pace
}

// New returns a Limiter that keeps its state in rdb: a single node, a Sentinel-managed primary or a Redis
// Cluster (all keys of one provider share a hash tag).
func New(rdb redis.Scripter, opts Options) (*Limiter, error) {
	if opts.Prefix == "" || strings.ContainsAny(opts.Prefix, "{} ") {
		return nil, fmt.Errorf("gate: key prefix %q must be non-empty, without braces or spaces", opts.Prefix)
	}
	if opts.Margin < 0 || opts.Margin > MaxWindow {
		return nil, fmt.Errorf("gate: margin must be 0..%s, got %s", MaxWindow, opts.Margin)
	}
	if len(opts.Providers) == 0 {
		return nil, errors.New("gate: no providers")
	}
	if opts.Horizon < 0 || opts.WarmUpCap < 0 {
		return nil, fmt.Errorf("gate: horizon and warm-up cap must be >= 0, got %s and %s", opts.Horizon, opts.WarmUpCap)
	}
	if opts.StaleAfter < 0 || opts.StaleAfter > MaxWindow {
		return nil, fmt.Errorf("gate: stale-after must be 0..%s, got %s", MaxWindow, opts.StaleAfter)
	}
	if opts.DedupWindow < 0 || opts.DedupWindow > MaxWindow {
		return nil, fmt.Errorf("gate: dedup window must be 0..%s, got %s", MaxWindow, opts.DedupWindow)
	}
	dedup := opts.DedupWindow
	if dedup == 0 {
		dedup = DefaultDedupWindow
	}
	if opts.MarginMax < 0 || opts.MarginMax > MaxWindow {
		return nil, fmt.Errorf("gate: margin ceiling must be 0..%s, got %s", MaxWindow, opts.MarginMax)
	}
	if opts.Batch < 0 || opts.Batch > MaxBatch {
		return nil, fmt.Errorf("gate: batch must be 0..%d, got %d", MaxBatch, opts.Batch)
	}
	if opts.BatchLinger < 0 || opts.BatchLinger > MaxBatchLinger {
		return nil, fmt.Errorf("gate: batch linger must be 0..%s, got %s", MaxBatchLinger, opts.BatchLinger)
	}
	if opts.MinReplicasAcked < 0 {
		return nil, fmt.Errorf("gate: min replicas acked must be >= 0, got %d", opts.MinReplicasAcked)
	}
	if opts.MinReplicasAcked > 0 {
		switch rdb.(type) {
		case *redis.Client, *redis.ClusterClient:
		default:
			return nil, fmt.Errorf("gate: acknowledged admissions need a single node, Sentinel or Redis Cluster client, not %T", rdb)
		}
		if opts.AckTimeout < time.Millisecond || opts.AckTimeout > MaxAckTimeout {
			return nil, fmt.Errorf("gate: ack timeout must be 1ms..%s, got %s", MaxAckTimeout, opts.AckTimeout)
		}
	}
	fn, _ := rdb.(functions)
	l := &Limiter{rdb: rdb, fn: fn, pauses: opts.Prefix + ":pauses", margin: max(opts.Margin, opts.MarginMax), stale: micros(opts.StaleAfter), providers: make(map[string]*live, len(opts.Providers)),
		opts: opts, dedup: dedup, hold: marginHold, fresh: marginFresh,
		acks: int64(opts.MinReplicasAcked), ackMillis: opts.AckTimeout.Milliseconds()}
	for name, spec := range opts.Providers {
		p, err := newProvider(opts, name, spec, dedup, 0)
		if err != nil {
			return nil, err
		}
		p.source = SourceConfig
		lp := &live{spec: spec}
		lp.cur.Store(&p)
		l.providers[name] = lp
	}
	return l, nil
}

// newProvider builds a provider under spec at a version of its live limits (0 for the configured ones).
func newProvider(opts Options, name string, spec Provider, dedup time.Duration, version int64) (provider, error) {
	margin := opts.Margin
	if !job.ValidProvider(name) {
		return provider{}, fmt.Errorf("gate: provider name %q must match ^%s$", name, job.ProviderPattern)
	}
	policies := spec.Policies
	if len(policies) == 0 {
		return provider{}, fmt.Errorf("gate: provider %s has no policies", name)
	}
	algo := spec.Algorithm
	if algo == "" {
		algo = SlidingLog
	}
	p := provider{algo: algo, script: families[algo], policies: append([]Policy(nil), policies...), minLimit: policies[0].Limit, source: SourceConfig}
	if p.script == nil {
		return provider{}, fmt.Errorf("gate: provider %s: unknown algorithm %q", name, algo)
	}
	buckets := spec.Buckets
	switch {
	case algo == SlidingWindow && buckets == 0:
		buckets = DefaultBuckets
	case algo == SlidingWindow && (buckets < 1 || buckets > MaxBuckets):
		return provider{}, fmt.Errorf("gate: provider %s: buckets must be 1..%d, got %d", name, MaxBuckets, buckets)
	case algo != SlidingWindow && buckets != 0:
		return provider{}, fmt.Errorf("gate: provider %s: buckets is only for %s, not %s", name, SlidingWindow, algo)
	}
	if err := checkPolicies("provider "+name, algo, policies, margin); err != nil {
		return provider{}, err
	}
	var longest time.Duration
	for _, pol := range policies {
		p.minLimit = min(p.minLimit, pol.Limit)
		longest = max(longest, pol.Window)
	}
	if err := p.buildMerchants(name, spec, margin); err != nil {
		return provider{}, err
	}
	for _, ml := range p.merchantLimits() {
		for _, pol := range ml.policies {
			longest = max(longest, pol.Window)
		}
	}
	if opts.WarmUp {
		shortest := policies[0].Window
		for _, pol := range policies {
			shortest = min(shortest, pol.Window)
		}
		if opts.WarmUpCap > 0 {
			shortest = min(shortest, opts.WarmUpCap)
		}
		p.warmup = micros(shortest + max(margin, opts.MarginMax) + min(opts.Horizon, MaxHorizon))
	}
	if err := checkBurst(name, policies, spec.Burst); err != nil {
		return provider{}, err
	}
	if spec.MaxInFlight < 0 || (spec.MaxInFlight > 0 && (spec.Lease <= 0 || spec.Lease > MaxHorizon)) {
		return provider{}, fmt.Errorf("gate: provider %s: max in flight must be >= 0, and with a cap the lease 1µs..%s; got %d and %s",
			name, MaxHorizon, spec.MaxInFlight, spec.Lease)
	}
	p.maxFlight, p.lease = spec.MaxInFlight, micros(spec.Lease)
	if p.warmup > 0 && p.maxFlight > 0 {
		// A lost state lost its leases too: the requests they stood for may be in flight for a lease yet.
		p.warmup = max(p.warmup, p.lease)
	}
	p.burst, p.paced, p.buckets, p.s3 = spec.Burst, ShortestPolicy(policies), buckets, int64(buckets)
	if p.burst >= p.paced.Limit {
		p.burst = 0 // a burst of the whole limit turns pacing off: no pace is kept (two Redis calls fewer)
	}
	p.policyText = settingsText(policies)
	p.configMin = p.minLimit
	p.floor, p.ceiling = micros(margin), micros(max(margin, opts.MarginMax))
	if algo == SlidingWindow || algo == FixedWindow {
		p.ceiling = p.floor // buckets cut by the margin; windows checked against it
	}
	// Kept, and trimmed, by the widest margin a decision may use, whatever this one's; SlidingLog's log is
	// its id record, and must hold the longest window.
	p.dedup = min(micros(dedup), micros(longest)+p.ceiling)
	if algo == SlidingLog {
		p.dedup = micros(longest) + p.ceiling
	}
	p.inForce = &atomic.Int64{}
	if opts.Batch > 1 {
		p.batch = &batcher{max: opts.Batch, linger: opts.BatchLinger, after: time.After, full: make(chan struct{}, 1)}
	}
	p.settings = &atomic.Pointer[settingsAt]{}
	p.inForce.Store(p.floor)
	tag := opts.Prefix + ":{" + name + "}:"
	p.tag, p.keyMargin = tag, margin
	p.keys = keysFor(tag, algo, policies, margin, buckets, version)
	p.nalgo = len(p.keys)
	p.version = version
	p.shape = stateShape(tag, algo, append(policies[:len(policies):len(policies)], p.merchantWindows()...), p.keys) // the pace is not part of the counted state
	// the merchants seen, the live limits, the leases, the pace, the epoch always last
	p.keys = append(p.keys, tag+"merchants", tag+"limits", tag+"flight", tag+"pace", tag+"epoch")
	p.marginKeys = []string{tag + "margin", tag + "lateness"}
	return p, nil
}

// checkPolicies checks one set of policies (a provider's, or a merchant's within it; who names it) for algo.
func checkPolicies(who string, algo Algorithm, policies []Policy, margin time.Duration) error {
	windows := map[int64]bool{} // in µs, as the scripts see them
	for i, pol := range policies {
		if pol.Limit < 1 || pol.Window < time.Millisecond || pol.Window > MaxWindow {
			return fmt.Errorf("gate: %s policy %d (%s): limit must be >= 1 and window 1ms..%s", who, i, pol, MaxWindow)
		}
		if algo == SlidingLog && pol.Limit > MaxSlidingLogLimit {
			return fmt.Errorf("gate: %s policy %d (%s): %s keeps one entry per unit of cost and takes limits up to %d; use %s or %s for larger budgets",
				who, i, pol, algo, MaxSlidingLogLimit, SlidingWindow, GCRA)
		}
		if algo != SlidingLog && windows[micros(pol.Window)] {
			return fmt.Errorf("gate: %s policy %d (%s): a window may appear once, to the µs (%s keeps its state per window)", who, i, pol, algo)
		}
		if algo == FixedWindow && pol.Window <= margin {
			return fmt.Errorf("gate: %s policy %d (%s): %s needs windows longer than the margin (%s)", who, i, pol, algo, margin)
		}
		windows[micros(pol.Window)] = true
	}
	return nil
}

// buildMerchants checks and keeps the merchants' limits (Provider.PerMerchant, Provider.Merchants).
func (p *provider) buildMerchants(name string, spec Provider, margin time.Duration) error {
	build := func(who string, policies []Policy) (*merchantLimits, error) {
		if !slices.Contains(MerchantAlgorithms, p.algo) {
			return nil, fmt.Errorf("gate: provider %s: %s does not count merchants' limits (%v do)", name, p.algo, MerchantAlgorithms)
		}
		if err := checkPolicies(who, p.algo, policies, margin); err != nil {
			return nil, err
		}
		ml := &merchantLimits{policies: append([]Policy(nil), policies...), minLimit: policies[0].Limit}
		ml.text = settingsText(policies)
		for _, pol := range policies {
			ml.minLimit = min(ml.minLimit, pol.Limit)
		}
		return ml, nil
	}
	p.track = spec.TrackMerchants || len(spec.PerMerchant) > 0 || len(spec.Merchants) > 0
	var err error
	if len(spec.PerMerchant) > 0 {
		if p.perMerchant, err = build("provider "+name+" per merchant", spec.PerMerchant); err != nil {
			return err
		}
	}
	for m, ms := range spec.Merchants {
		if m == "" || len(m) > MaxMerchantLen {
			return fmt.Errorf("gate: provider %s: merchant names must be 1..%d bytes, got %q", name, MaxMerchantLen, m)
		}
		if len(ms.Policies) == 0 {
			continue
		}
		if p.named == nil {
			p.named = map[string]*merchantLimits{}
		}
		if p.named[m], err = build("provider "+name+" merchant "+m, ms.Policies); err != nil {
			return err
		}
	}
	return nil
}

// merchantWindows lists the distinct windows of the merchants' limits, shortest first: the counters name a
// merchant's state by its windows, so a window that comes or goes is a change of the state's shape
// (stateShape), which warms up.
func (p provider) merchantWindows() []Policy {
	seen := map[time.Duration]bool{}
	for _, ml := range p.merchantLimits() {
		for _, pol := range ml.policies {
			seen[pol.Window] = true
		}
	}
	var out []Policy
	for _, w := range slices.Sorted(maps.Keys(seen)) {
		out = append(out, Policy{Window: w})
	}
	return out
}

// merchantLimits lists every set of merchants' limits the provider has.
func (p provider) merchantLimits() []*merchantLimits {
	var out []*merchantLimits
	if p.perMerchant != nil {
		out = append(out, p.perMerchant)
	}
	for _, ml := range p.named {
		out = append(out, ml)
	}
	return out
}

// MaxMerchantLen is the longest merchant name the gate takes, in bytes (the job contract's 128 characters
// of UTF-8 fit).
const MaxMerchantLen = 512

// MaxPacedWindow is the longest window a provider is paced by: a longer one (an hourly or daily cap) is a
// quota, counted exactly but never spread out over its window.
const MaxPacedWindow = time.Minute

// PaceOf is how far apart a provider with these policies has its slots handed out per unit of cost, when
// paced (Provider.Burst >= 1): its shortest window plus the margin, shared out evenly over that window's
// limit (the smallest limit among policies of that window), rounded up to the µs. 0 when the shortest
// window is longer than MaxPacedWindow: then every window is a quota, counted exactly, never spread out.
// Longer windows than the shortest are never paced.
func PaceOf(policies []Policy, margin time.Duration) time.Duration {
	if len(policies) == 0 {
		return 0
	}
	return time.Duration(paceMicros(ShortestPolicy(policies), micros(margin))) * time.Microsecond
}

// paceMicros is PaceOf in µs for the provider's shortest policy under margin m (µs).
func paceMicros(shortest Policy, m int64) int64 {
	if shortest.Window > MaxPacedWindow || shortest.Limit < 1 {
		return 0
	}
	return (micros(shortest.Window) + m + shortest.Limit - 1) / shortest.Limit
}

// ShortestPolicy is the policy a provider is paced by: the shortest window, the smallest limit among ties
// (policies must not be empty).
func ShortestPolicy(policies []Policy) Policy {
	shortest := policies[0]
	for _, pol := range policies[1:] {
		if pol.Window < shortest.Window || (pol.Window == shortest.Window && pol.Limit < shortest.Limit) {
			shortest = pol
		}
	}
	return shortest
}

// checkBurst refuses a Provider.Burst outside 0..the limit of the shortest window.
func checkBurst(name string, policies []Policy, burst int64) error {
	if shortest := ShortestPolicy(policies); burst < 0 || burst > shortest.Limit {
		return fmt.Errorf("gate: provider %s: burst must be 0..%d (the limit of its shortest window, %s), got %d", name, shortest.Limit, shortest, burst)
	}
	return nil
}

// Pace returns how far apart a provider's slots are handed out, per unit of cost (0: not paced), and how
// many units may share one moment (Provider.Burst).
func (l *Limiter) Pace(providerName string) (every time.Duration, burst int64, err error) {
	p, err := l.provider(providerName)
	if err != nil {
		return 0, 0, err
	}
	pace, tolerance := p.paceAt(p.inForce.Load())
	if pace == 0 {
		return 0, 0, nil
	}
	return time.Duration(pace) * time.Microsecond, tolerance/pace + 1, nil
}

// stateShape names the layout a provider's state is kept in: its keys, and for the buckets the windows
// their fields are named by. The epoch records it (family.lua's S[10]), so that a change of algorithm,
// windows, buckets or margin, which starts the state afresh under new names while the provider still
// counts what it was sent, warms up like a loss of state. A sliding log keeps one layout whatever its
// limits.
func stateShape(tag string, algo Algorithm, policies []Policy, keys []string) int64 {
	h := fnv.New32a()
	fmt.Fprint(h, algo)
	for _, k := range keys {
		fmt.Fprint(h, "|", strings.TrimPrefix(k, tag))
	}
	if algo != SlidingLog {
		for _, pol := range policies {
			fmt.Fprint(h, "|", micros(pol.Window))
		}
	}
	return int64(h.Sum32())
}

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
	return l.decide(ctx, providerName, merchant, jobID, cost, maxWait, false)
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
	return l.decide(ctx, providerName, "", jobID, cost, maxWait, false)
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
	return l.decide(ctx, providerName, "", jobID, cost, 0, true)
}

func (l *Limiter) decide(ctx context.Context, providerName, merchant, jobID string, cost int64, maxWait time.Duration, force bool) (Verdict, error) {
	var v Verdict
	reread := false
	err := l.inForce(ctx, providerName, func(p provider) (err error) {
		if cost > p.minLimit && cost <= p.configMin && !reread {
			// Held back by the live limits this process knows: read them first, since another process
			// may have reset them (a decision this process does not make would not tell it).
			reread = true
			if err := l.refresh(ctx, providerName, -1); err != nil {
				return err
			}
			if p, err = l.provider(providerName); err != nil {
				return err
			}
		}
		v, err = l.decideOn(ctx, p, providerName, merchant, jobID, cost, maxWait, force)
		return err
	})
	return v, err
}

func (l *Limiter) decideOn(ctx context.Context, p provider, providerName, merchant, jobID string, cost int64, maxWait time.Duration, force bool) (Verdict, error) {
	if err := checkID(jobID); err != nil {
		return Verdict{}, err
	}
	mc := p.merchantOf(merchant)
	switch {
	case cost < 1 || cost > p.configMin:
		return Verdict{}, invalidf("gate: cost must be 1..%d for provider %s, got %d", p.configMin, providerName, cost)
	case mc != nil && cost > mc.limits.minLimit:
		return Verdict{}, invalidf("gate: cost must be 1..%d for merchant %q of provider %s, got %d", mc.limits.minLimit, merchant, providerName, cost)
	case len(merchant) > MaxMerchantLen:
		return Verdict{}, invalidf("gate: merchant must be at most %d bytes, got %d", MaxMerchantLen, len(merchant))
	case maxWait < 0:
		return Verdict{}, invalidf("gate: max wait must be >= 0, got %s", maxWait)
	case cost > p.minLimit:
		// Within the configured limits but not within the live ones: held back while they stand.
		return aboveLive(p), nil
	}
	wait := microsFloor(min(maxWait, MaxHorizon)) // never a slot past the caller's wait
	forced := 0
	if force {
		forced = 1
	}
	m := p.inForce.Load()
	if mc == nil && l.acks == 0 && p.batch != nil {
		// Decided with the provider's other waiting reserves in one call, where there are any (batcher).
		return l.batched(ctx, p, providerName, &pending{id: jobID, cost: cost, wait: wait, forced: forced, m: m})
	}
	var conn *redis.Conn // the admission's connection, where WAIT counts its replicas (Options.MinReplicasAcked)
	if l.acks > 0 {
		var err error
		if conn, err = l.connFor(ctx, p.keys[0]); err != nil {
			return Verdict{}, fmt.Errorf("gate: reserve %s/%s: %w", providerName, jobID, err)
		}
		defer conn.Close()
	}
	asked := time.Now()
	reply, err := l.runAtOn(ctx, conn, p, m, mc, "reserve", jobID, cost, wait, l.stale, forced).Int64Slice()
	if err != nil {
		if cc, ok := l.rdb.(*redis.ClusterClient); ok && conn != nil && movedOn(err) {
			// The node connection does not follow a slot that moved: the cluster client reads the slots
			// again, and the job's next decision goes to the node that holds it now.
			cc.ReloadState(ctx)
		}
		return Verdict{}, fmt.Errorf("gate: reserve %s/%s: %w", providerName, jobID, err)
	}
	v, err := verdictOf(p, mc, providerName, jobID, m, reply)
	v.Asked = asked
	if err != nil || !v.Allowed || conn == nil {
		return v, err
	}
	if err := l.acknowledged(ctx, conn, p, mc, providerName, jobID, cost, v); err != nil {
		return Verdict{}, fmt.Errorf("gate: reserve %s/%s: %w", providerName, jobID, err)
	}
	return v, nil
}

// verdictOf reads family.lua's reserve reply for jobID, decided under margin m (µs).
func verdictOf(p provider, mc *merchantCall, providerName, jobID string, m int64, reply []int64) (Verdict, error) {
	policies := p.policies
	if mc != nil {
		policies = append(policies[:len(policies):len(policies)], mc.limits.policies...)
	}
	if len(reply) != replyLen || reply[replyPolicy] < 0 || reply[replyPolicy] >= int64(len(policies)) || reply[replyResetAfter] < 0 {
		return Verdict{}, fmt.Errorf("gate: reserve %s/%s: malformed reply %v", providerName, jobID, reply)
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
		ResetAfter: time.Duration(reply[replyResetAfter]) * time.Microsecond,
		Margin:     time.Duration(m) * time.Microsecond,
	}
	if reply[replyAdmittedAt] > 0 {
		v.AdmittedAt = time.UnixMicro(reply[replyAdmittedAt])
	}
	switch reply[replyLease] { // family.lua's lease members
	case 1:
		v.Lease = jobID + "\x00" + strconv.FormatInt(reply[replyNow], 10)
	case 2:
		v.Lease = jobID + "\x00d" + strconv.FormatInt(reply[replyNow], 10)
	}
	if !v.Allowed {
		// Round up to the millisecond: asking again after RetryAfter must not be early.
		v.RetryAfter = (time.Duration(reply[replyRetryAfter])*time.Microsecond + time.Millisecond - 1).Truncate(time.Millisecond)
		if v.RetryAfter <= 0 {
			return Verdict{}, fmt.Errorf("gate: reserve %s/%s: denied without a retry time %v", providerName, jobID, reply)
		}
		if reply[replyInFlight] == 1 {
			v.InFlight, v.RetryAfter = true, min(v.RetryAfter, FlightPoll)
		}
	}
	return v, nil
}

// movedOn tells a Redis Cluster redirection (the slot is elsewhere now, or moving) from other errors.
func movedOn(err error) bool {
	s := err.Error()
	return strings.HasPrefix(s, "MOVED ") || strings.HasPrefix(s, "ASK ") || strings.HasPrefix(s, "TRYAGAIN") || strings.HasPrefix(s, "CLUSTERDOWN")
}

// connFor is a connection of its own to the primary that holds key, for an admission and its WAIT.
func (l *Limiter) connFor(ctx context.Context, key string) (*redis.Conn, error) {
	switch c := l.rdb.(type) {
	case *redis.Client:
		return c.Conn(), nil
	case *redis.ClusterClient:
		node, err := c.MasterForKey(ctx, key)
		if err != nil {
			return nil, err
		}
		return node.Conn(), nil
	}
	return nil, fmt.Errorf("gate: no connection of its own on a %T", l.rdb) // New refuses it
}

// acknowledged waits until Options.MinReplicasAcked replicas hold what conn wrote (the admission v). When
// they do not within AckTimeout, it gives back what it can and fails with ErrUnacknowledged: the lease the
// admission took, and its units, except a duplicate's and a moved job's (their entry stands for a request
// another delivery may have sent, as the worker never releases them either). Token buckets, GCRA and
// leaky buckets take units back only from their newest admission (Release): an unacknowledged one with
// others after it keeps its units spent until they refill.
func (l *Limiter) acknowledged(ctx context.Context, conn *redis.Conn, p provider, mc *merchantCall, providerName, jobID string, cost int64, v Verdict) error {
	n, err := conn.Do(ctx, "WAIT", l.acks, l.ackMillis).Int64()
	if err == nil && n >= l.acks {
		return nil
	}
	// Best effort (unacknowledged, the admission may be on no replica, and soon on no primary either), and
	// whatever became of the caller's context meanwhile.
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if v.Releasable() {
		merchant := ""
		if mc != nil {
			merchant = mc.name
		}
		_, _ = l.ReleaseFor(gctx, providerName, merchant, jobID, cost, v.Slot())
	}
	_ = l.Land(gctx, providerName, v.Lease)
	if err != nil {
		return fmt.Errorf("%w: WAIT: %w", ErrUnacknowledged, err)
	}
	return fmt.Errorf("%w: %d of %d within %dms", ErrUnacknowledged, n, l.acks, l.ackMillis)
}

// Pause makes every worker's next decisions for the provider wait until `until` (say, after a 429 with
// Retry-After). Only the length of the pause crosses to Redis: it is counted from the Redis clock, so the
// caller's clock never enters a decision. A shorter pause never cuts a longer one short.
func (l *Limiter) Pause(ctx context.Context, providerName string, until time.Time) error {
	p, err := l.provider(providerName)
	if err != nil {
		return err
	}
	d := time.Until(until)
	if d <= 0 {
		return nil
	}
	if err := pauseScript.Run(ctx, l.rdb, p.keys[1:2], micros(min(d, MaxHorizon)), l.pauses, providerName).Err(); err != nil {
		return fmt.Errorf("gate: pause %s: %w", providerName, err)
	}
	return nil
}

// MarginState is a provider's margin in force, and why.
type MarginState struct {
	// Margin is the margin in force: Options.Margin, or wider while the fleet needs it.
	Margin time.Duration
	// Floor and Ceiling are Options.Margin and Options.MarginMax (Ceiling == Floor: it never moves).
	Floor, Ceiling time.Duration
	// Changed is when it last widened or narrowed (Redis clock; zero: never).
	Changed time.Time
	// Why: "floor", or what widened it (the fleet's lateness, a throttle), or that it is narrowing.
	Why string
}

// Margin returns the margin in force for a provider as this process last learned it (its decisions use
// it): Options.Margin until a report or ReadMargin says otherwise.
func (l *Limiter) Margin(providerName string) (time.Duration, error) {
	p, err := l.provider(providerName)
	if err != nil {
		return 0, err
	}
	return time.Duration(p.inForce.Load()) * time.Microsecond, nil
}

// ReportLateness tells the gate how late this reporter's (a worker's) wake-ups on its slots have been,
// its p99 over its recent ones. The margin in force follows the fleet: 4 x the highest p99 among the
// reports of the last 10s, within [Options.Margin, Options.MarginMax]; it widens at once and, 10s after,
// narrows a quarter of the way a second (lua/margin.lua). Every worker's next decisions use what this returns, as do this process's.
func (l *Limiter) ReportLateness(ctx context.Context, providerName, reporter string, p99 time.Duration) (MarginState, error) {
	return l.margins(ctx, providerName, "lateness", reporter, micros(max(p99, 0)))
}

// ReportThrottle tells the gate that the provider throttled a request the gate had admitted on time: it
// counted more in a window than the gate did, so the margin is too thin for the trip to it. The margin in
// force doubles (at least by Options.Margin), up to Options.MarginMax.
func (l *Limiter) ReportThrottle(ctx context.Context, providerName, reporter string) (MarginState, error) {
	return l.margins(ctx, providerName, "throttled", reporter, 0)
}

// ReadMargin reads the margin in force from Redis (and this process takes it up).
func (l *Limiter) ReadMargin(ctx context.Context, providerName string) (MarginState, error) {
	return l.margins(ctx, providerName, "read", "", 0)
}

func (l *Limiter) margins(ctx context.Context, providerName, op, reporter string, late int64) (MarginState, error) {
	p, err := l.provider(providerName)
	if err != nil {
		return MarginState{}, err
	}
	if op != "read" && (reporter == "" || len(reporter) > 200 || reporter[0] == '_') {
		return MarginState{}, invalidf("gate: reporter must be 1..200 bytes, not starting with _, got %q", reporter)
	}
	st := MarginState{Floor: time.Duration(p.floor) * time.Microsecond, Ceiling: time.Duration(p.ceiling) * time.Microsecond}
	if p.ceiling == p.floor {
		st.Margin, st.Why = st.Floor, "fixed"
		return st, nil
	}
	reply, err := marginScript.Run(ctx, l.rdb, p.marginKeys, op, reporter, late, p.floor, p.ceiling, micros(l.hold), micros(l.fresh)).Slice()
	if err != nil {
		return MarginState{}, fmt.Errorf("gate: margin %s %s: %w", op, providerName, err)
	}
	if len(reply) != 3 {
		return MarginState{}, fmt.Errorf("gate: margin %s %s: malformed reply %v", op, providerName, reply)
	}
	m, err1 := strconv.ParseInt(fmt.Sprint(reply[0]), 10, 64)
	changed, err2 := strconv.ParseInt(fmt.Sprint(reply[1]), 10, 64)
	if err1 != nil || err2 != nil || m < p.floor || m > p.ceiling {
		return MarginState{}, fmt.Errorf("gate: margin %s %s: malformed reply %v", op, providerName, reply)
	}
	p.inForce.Store(m)
	st.Margin, st.Why = time.Duration(m)*time.Microsecond, fmt.Sprint(reply[2])
	if changed > 0 {
		st.Changed = time.UnixMicro(changed)
	}
	return st, nil
}

// Subscriber is the part of a go-redis client that Watch needs (every client has it).
type Subscriber interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// Watcher is told what Watch hears. Its methods run on the watcher's goroutine and must not block.
type Watcher interface {
	// NotePause: a worker set a pause of the provider ending at until (Redis clock; compare it with
	// Verdict.Slot). A reservation handed out before the pause is already in the state: the Redis pause
	// only binds later decisions, so the holder learns of it here and holds it too.
	NotePause(provider string, until time.Time)
	// NoteLoss: a decision found the provider's state gone at `at` (Redis clock) and began the warm-up
	// (Options.WarmUp). A reservation decided before it (Verdict.Now before at) belongs to a state that is
	// no more: the new one may hand its slot to another job, so it must not be used.
	NoteLoss(provider string, at time.Time)
	// NoteDisconnect: the watch lost its connection to Redis at `at` (local clock) and is reconnecting.
	// A restart of Redis, or an announcement missed meanwhile, goes unseen otherwise: no reservation asked
	// for before at may be used, for any provider.
	NoteDisconnect(at time.Time)
}

// watchPing is how long Watch waits in silence before it pings the connection; two silences in a row
// without an answer count as a lost connection: well within consumers.LossNotice.
const watchPing = 200 * time.Millisecond

// Watch tells w of every pause any worker sets (Pause) and every warm-up a decision begins, as they
// happen, and of every loss of its own connection to Redis, until ctx ends. It reconnects by itself (a
// pause or warm-up announced while it is away binds only later decisions, hence NoteDisconnect). With
// Options.WarmUp, a holder of reservations that drops them on NoteLoss and NoteDisconnect lets the
// warm-up leave out its max wait (Options.Horizon).
func (l *Limiter) Watch(ctx context.Context, sub Subscriber, w Watcher) error {
	ps := sub.Subscribe(ctx, l.pauses)
	defer func() { _ = ps.Close() }()
	silent := 0
	for {
		msg, err := ps.ReceiveTimeout(ctx, watchPing)
		switch {
		case ctx.Err() != nil:
			return nil
		case isTimeout(err) && silent == 0:
			silent++
			if ps.Ping(ctx) == nil { // its answer, or another error, comes through ReceiveTimeout
				continue
			}
			w.NoteDisconnect(time.Now()) // the write failed: go-redis reconnects on the next receive
			silent = 0
			continue
		case err != nil:
			// Broken (the next ReceiveTimeout reconnects and subscribes again), or silent past a ping: a
			// hung connection, given up on.
			w.NoteDisconnect(time.Now())
			if isTimeout(err) {
				_ = ps.Close()
				ps = sub.Subscribe(ctx, l.pauses)
			}
			silent = 0
			select { // a moment before reconnecting
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
				return nil
			}
			continue
		}
		silent = 0
		if sub, ok := msg.(*redis.Subscription); ok && sub.Kind == "subscribe" {
			// Subscribed, the first time or again after go-redis replaced the connection (which it may do
			// without an error surfacing): whatever was announced before went unheard.
			w.NoteDisconnect(time.Now())
			continue
		}
		m, ok := msg.(*redis.Message)
		if !ok {
			continue // a pong
		}
		fields := strings.Fields(m.Payload)
		if len(fields) < 2 {
			continue
		}
		if len(fields) == 3 && fields[1] == "limits" { // "<provider> limits <at_us>": live limits set or reset (limits.lua)
			at, err := strconv.ParseInt(fields[2], 10, 64)
			if lp, known := l.providers[fields[0]]; known && err == nil {
				lp.stale.Store(true) // read before the next decision, rather than be refused by it
				if lw, ok := w.(LimitsWatcher); ok {
					lw.NoteLimits(fields[0], time.UnixMicro(at))
				}
			}
			continue
		}
		if len(fields) == 2 && fields[1] == "landed" { // "<provider> landed": an in-flight lease ended (land.lua)
			if lw, ok := w.(LandWatcher); ok {
				if _, known := l.providers[fields[0]]; known {
					lw.NoteLanded(fields[0])
				}
			}
			continue
		}
		var at []int64
		for _, f := range fields[1:] {
			n, err := strconv.ParseInt(f, 10, 64)
			if err != nil || n <= 0 {
				break
			}
			at = append(at, n)
		}
		if _, known := l.providers[fields[0]]; !known || len(at) != len(fields)-1 {
			continue // another deployment's provider on a shared prefix, or not ours
		}
		switch len(at) {
		case 1: // "<provider> <until_us>": a pause (pause.lua)
			w.NotePause(fields[0], time.UnixMicro(at[0]))
		case 2: // "<provider> <until_us> <lost_us>": a warm-up (family.lua); its pause binds later decisions
			w.NoteLoss(fields[0], time.UnixMicro(at[1]))
		}
	}
}

// Land ends an in-flight lease (Verdict.Lease): the provider answered the request, whatever the answer,
// or the job gave its admission up. (A request that got no answer, a timeout, may still be in flight
// there: leave its lease to lapse.) When the cap was full, the end is announced, so that a job waiting for
// a lease (Verdict.InFlight) goes at once. A lease that had lapsed, or was ended before, is no error. An
// empty lease is nothing to end.
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
	flight := p.keys[len(p.keys)-3] // see newProvider
	if err := landScript.Run(ctx, l.rdb, []string{flight}, lease, l.pauses, providerName, p.maxFlight).Err(); err != nil {
		return fmt.Errorf("gate: land %s: %w", providerName, err)
	}
	return nil
}

// LandWatcher is a Watcher that also hears of every in-flight lease that ends (Land), to wake the jobs
// it holds back for one (Verdict.InFlight).
type LandWatcher interface {
	Watcher
	NoteLanded(provider string)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

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
		if n, err = l.run(ctx, p, p.merchantOf(merchant), "release", jobID, cost, at, 0, 0).Int64(); err != nil {
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
	return l.depart(ctx, "depart", providerName, merchant, jobID, slot, late)
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
	return l.depart(ctx, "postpone", providerName, merchant, jobID, slot, 0)
}

// depart runs family.lua's op depart, or postpone. With Options.MinReplicasAcked, the move is made on a
// connection of its own and waited for as an admission is (acknowledged): a postponed request does not go
// until its new slot would survive a failover; a departure (its request left already) returns its new
// slot with the error, the move standing on the primary.
func (l *Limiter) depart(ctx context.Context, op, providerName, merchant, jobID string, slot time.Time, late time.Duration) (time.Time, error) {
	if err := checkID(jobID); err != nil {
		return time.Time{}, err
	}
	if slot.IsZero() {
		return time.Time{}, invalidf("gate: a departure needs the admission's slot")
	}
	var at int64
	err := l.inForce(ctx, providerName, func(p provider) error {
		var conn *redis.Conn
		if l.acks > 0 {
			var err error
			if conn, err = l.connFor(ctx, p.keys[0]); err != nil {
				return fmt.Errorf("gate: %s %s/%s: %w", op, providerName, jobID, err)
			}
			defer conn.Close()
		}
		mc := p.merchantOf(merchant)
		var err error
		if at, err = l.runAtOn(ctx, conn, p, p.inForce.Load(), mc, op, jobID, 1, slot.UnixMicro(), late.Microseconds(), 0).Int64(); err != nil {
			return fmt.Errorf("gate: %s %s/%s: %w", op, providerName, jobID, err)
		}
		if conn == nil || at == 0 {
			return nil
		}
		return l.movedAcknowledged(ctx, conn, op, providerName, merchant, jobID, time.UnixMicro(at))
	})
	if at == 0 || (err != nil && (op == "postpone" || !errors.Is(err, ErrUnacknowledged))) {
		return time.Time{}, err
	}
	return time.UnixMicro(at), err
}

// movedAcknowledged waits until Options.MinReplicasAcked replicas hold the move conn made (op, to slot).
// Not acknowledged, a postponed admission is given back (best effort, as acknowledged does for a
// reserve): its request must not go. A departure's request went already; its move stands.
func (l *Limiter) movedAcknowledged(ctx context.Context, conn *redis.Conn, op, providerName, merchant, jobID string, slot time.Time) error {
	n, err := conn.Do(ctx, "WAIT", l.acks, l.ackMillis).Int64()
	if err == nil && n >= l.acks {
		return nil
	}
	if op == "postpone" {
		gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_, _ = l.ReleaseFor(gctx, providerName, merchant, jobID, 1, slot)
	}
	if err != nil {
		return fmt.Errorf("gate: %s %s/%s: %w: WAIT: %w", op, providerName, jobID, ErrUnacknowledged, err)
	}
	return fmt.Errorf("gate: %s %s/%s: %w: %d of %d within %dms", op, providerName, jobID, ErrUnacknowledged, n, l.acks, l.ackMillis)
}

// run calls the provider's script under the margin in force: op, then ARGV[2..6] as given, then the
// provider's own arguments (and the merchant's, when mc is not nil).
func (l *Limiter) run(ctx context.Context, p provider, mc *merchantCall, op string, jobID string, args ...any) *redis.Cmd {
	return l.runAt(ctx, p, p.inForce.Load(), mc, op, jobID, args...)
}

// runAt calls the provider's script under margin m (µs).
func (l *Limiter) runAt(ctx context.Context, p provider, m int64, mc *merchantCall, op string, jobID string, args ...any) *redis.Cmd {
	return l.runAtOn(ctx, nil, p, m, mc, op, jobID, args...)
}

// runAtOn is runAt on conn (nil: any of the client's connections).
func (l *Limiter) runAtOn(ctx context.Context, conn *redis.Conn, p provider, m int64, mc *merchantCall, op string, jobID string, args ...any) *redis.Cmd {
	argv := make([]any, 0, 2+len(args)+2)
	argv = append(append(argv, op, jobID), args...)
	if conn != nil {
		return l.runFamilyOn(ctx, conn, conn, p.script, p.keysFor(mc), p.appendArgv(argv, m, mc))
	}
	return l.runFamily(ctx, p.script, p.keysFor(mc), p.appendArgv(argv, m, mc))
}

// checkID refuses a job id the scripts would refuse: empty, longer than MaxIDLen, or with a NUL (the
// separator of a job's unit members).
func checkID(jobID string) error {
	switch {
	case jobID == "" || len(jobID) > MaxIDLen:
		return invalidf("gate: job id must be 1..%d bytes, got %d", MaxIDLen, len(jobID))
	case strings.IndexByte(jobID, 0) >= 0:
		return invalidf("gate: job id must not contain NUL")
	}
	return nil
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
	if err := sentScript.Run(ctx, l.rdb, p.keys[2:3], jobID, p.dedup).Err(); err != nil {
		return fmt.Errorf("gate: sent %s/%s: %w", providerName, jobID, err)
	}
	return nil
}

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

// Algorithm returns the algorithm that counts a provider's budget.
func (l *Limiter) Algorithm(providerName string) (Algorithm, error) {
	p, err := l.provider(providerName)
	return p.algo, err
}

// Status reads a provider's budget without changing it.
func (l *Limiter) Status(ctx context.Context, providerName string) (Status, error) {
	var s Status
	err := l.inForce(ctx, providerName, func(p provider) (err error) {
		s, err = l.statusOf(ctx, p, providerName)
		return err
	})
	return s, err
}

func (l *Limiter) statusOf(ctx context.Context, p provider, providerName string) (Status, error) {
	return l.statusFor(ctx, p, nil, providerName)
}

// statusFor is statusOf with a merchant's policies after the provider's (mc: nil for none).
func (l *Limiter) statusFor(ctx context.Context, p provider, mc *merchantCall, providerName string) (Status, error) {
	reply, err := l.run(ctx, p, mc, "status", "", 0, 0, 0, 0).Int64Slice()
	if err != nil {
		return Status{}, fmt.Errorf("gate: status %s: %w", providerName, err)
	}
	policies := p.policies
	if mc != nil {
		policies = append(policies[:len(policies):len(policies)], mc.limits.policies...)
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
// if longer): how many,
// and the newest max of them with their use of their own limits, newest first.
func (l *Limiter) Merchants(ctx context.Context, providerName string, max int) (seen int64, out []MerchantStatus, err error) {
	err = l.inForce(ctx, providerName, func(p provider) error {
		out = out[:0]
		raw, err := l.run(ctx, p, nil, "merchants", "", 0, max, 0, 0).Slice()
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
			if mc := p.merchantOf(name); mc != nil && len(mc.limits.policies) > 0 {
				st, err := l.statusFor(ctx, p, mc, providerName)
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

// Keys returns the Redis keys that hold a provider's state: the id record (sliding_log: the log), pause,
// marks, then the algorithm's own keys, then the merchants seen, the live limits, the in-flight leases,
// the pace and the epoch; for tests and operators.
func (l *Limiter) Keys(providerName string) ([]string, error) {
	p, err := l.provider(providerName)
	if err != nil {
		return nil, err
	}
	return append([]string(nil), p.keys...), nil
}

// provider is the named provider as in force.
func (l *Limiter) provider(name string) (provider, error) {
	lp, err := l.liveProvider(name)
	if err != nil {
		return provider{}, err
	}
	return *lp.cur.Load(), nil
}

// liveProvider is the named provider, configured and in force; an unknown name is ErrUnknownProvider.
func (l *Limiter) liveProvider(name string) (*live, error) {
	lp, ok := l.providers[name]
	if !ok {
		return nil, &invalidError{msg: fmt.Sprintf("gate: unknown provider %q", name), cause: ErrUnknownProvider}
	}
	return lp, nil
}

// micros rounds a duration (>= 0, <= MaxHorizon) up to whole microseconds, the unit of every time the
// scripts see.
func micros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// microsFloor rounds a duration down to whole microseconds.
func microsFloor(d time.Duration) int64 { return int64(d / time.Microsecond) }
