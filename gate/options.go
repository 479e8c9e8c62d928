package gate

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

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
	// BatchCalls is the most batched calls of one provider on their way at once (0..MaxBatchCalls; 0:
	// DefaultBatchCalls): while one is on its way, the reserves asked meanwhile go as a call of their own
	// beside it, up to this many, rather than wait for it to come back. 1: one at a time, the reserves
	// asked meanwhile go as the next call.
	BatchCalls int
	// Journal is how long the job journal (Limiter.Journal) remembers a job whose request left: how long
	// after it Cancel still tells that it left, and Job when and how it ended. 0: no journal.
	Journal time.Duration
	// Providers maps each provider name ([a-z0-9_-]{1,64}) to its budget.
	Providers map[string]Provider
}

// MaxBatch is the largest Options.Batch (lua/family takes up to 1000 jobs a call).
const MaxBatch = 1000

// DefaultBatchCalls is Options.BatchCalls when it is 0: one call at a time. More calls on their way
// shorten each job's wait, at the cost of fewer jobs a call (more Redis time a job): worth it where Redis
// has cores of its own and handlers wait on round trips; on cores Redis shares with the workers, the calls
// it adds cost more than the waits they save (BENCHMARKS.md's end-to-end section measures both).
const DefaultBatchCalls = 1

// MaxBatchCalls is the largest Options.BatchCalls.
const MaxBatchCalls = 64

// MaxBatchLinger is the longest Options.BatchLinger: a linger is meant to be short next to a window.
const MaxBatchLinger = 10 * time.Millisecond

// MaxAckTimeout is the longest Options.AckTimeout: a wait well within go-redis's read timeout (3s).
const MaxAckTimeout = time.Second

// New returns a Limiter that keeps its state in rdb: a single node, a Sentinel-managed primary or a Redis
// Cluster (all keys of one provider share a hash tag).
func New(rdb redis.Scripter, opts Options) (*Limiter, error) {
	if err := opts.check(rdb); err != nil {
		return nil, err
	}
	dedup := opts.DedupWindow
	if dedup == 0 {
		dedup = DefaultDedupWindow
	}
	fn, _ := rdb.(functions)
	l := &Limiter{rdb: rdb, fn: fn, channel: opts.Prefix + ":pauses", stale: micros(opts.StaleAfter),
		providers: make(map[string]*live, len(opts.Providers)), opts: opts, dedup: dedup, hold: marginHold, fresh: marginFresh,
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

// check refuses options out of their ranges (the providers are checked as they are built: newProvider).
func (opts Options) check(rdb redis.Scripter) error {
	if opts.Prefix == "" || strings.ContainsAny(opts.Prefix, "{} ") {
		return fmt.Errorf("gate: key prefix %q must be non-empty, without braces or spaces", opts.Prefix)
	}
	if opts.Margin < 0 || opts.Margin > MaxWindow {
		return fmt.Errorf("gate: margin must be 0..%s, got %s", MaxWindow, opts.Margin)
	}
	if len(opts.Providers) == 0 {
		return errors.New("gate: no providers")
	}
	if opts.Horizon < 0 || opts.WarmUpCap < 0 {
		return fmt.Errorf("gate: horizon and warm-up cap must be >= 0, got %s and %s", opts.Horizon, opts.WarmUpCap)
	}
	if opts.StaleAfter < 0 || opts.StaleAfter > MaxWindow {
		return fmt.Errorf("gate: stale-after must be 0..%s, got %s", MaxWindow, opts.StaleAfter)
	}
	if opts.DedupWindow < 0 || opts.DedupWindow > MaxWindow {
		return fmt.Errorf("gate: dedup window must be 0..%s, got %s", MaxWindow, opts.DedupWindow)
	}
	if opts.MarginMax < 0 || opts.MarginMax > MaxWindow {
		return fmt.Errorf("gate: margin ceiling must be 0..%s, got %s", MaxWindow, opts.MarginMax)
	}
	if opts.Batch < 0 || opts.Batch > MaxBatch {
		return fmt.Errorf("gate: batch must be 0..%d, got %d", MaxBatch, opts.Batch)
	}
	if opts.BatchCalls < 0 || opts.BatchCalls > MaxBatchCalls {
		return fmt.Errorf("gate: batch calls must be 0..%d, got %d", MaxBatchCalls, opts.BatchCalls)
	}
	if opts.BatchLinger < 0 || opts.BatchLinger > MaxBatchLinger {
		return fmt.Errorf("gate: batch linger must be 0..%s, got %s", MaxBatchLinger, opts.BatchLinger)
	}
	if opts.Journal < 0 {
		return fmt.Errorf("gate: journal must be >= 0, got %s", opts.Journal)
	}
	return opts.checkAcks(rdb)
}

// checkAcks refuses acknowledged admissions (Options.MinReplicasAcked) on a client without connections of
// its own to a primary, or with an AckTimeout out of range.
func (opts Options) checkAcks(rdb redis.Scripter) error {
	if opts.MinReplicasAcked < 0 {
		return fmt.Errorf("gate: min replicas acked must be >= 0, got %d", opts.MinReplicasAcked)
	}
	if opts.MinReplicasAcked == 0 {
		return nil
	}
	switch rdb.(type) {
	case *redis.Client, *redis.ClusterClient:
	default:
		return fmt.Errorf("gate: acknowledged admissions need a single node, Sentinel or Redis Cluster client, not %T", rdb)
	}
	if opts.AckTimeout < time.Millisecond || opts.AckTimeout > MaxAckTimeout {
		return fmt.Errorf("gate: ack timeout must be 1ms..%s, got %s", MaxAckTimeout, opts.AckTimeout)
	}
	return nil
}
