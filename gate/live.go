package gate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/lua"
)

var limitsScript = redis.NewScript(lua.Limits)

// Where a provider's limits in force come from (Status.LimitsSource, LiveLimits.Source).
const (
	SourceConfig   = "config"   // the limits the Limiter was built with
	SourceOverride = "override" // live limits set with SetLimits (`worker limits set`)
	SourceHeaders  = "headers"  // live limits the provider announced (FollowAnnounced)
	SourceLearned  = "learned"  // a limit learned from the provider's answers (Learn)
)

// LimitsWatcher is a Watcher that is also told when any process changed a provider's live limits
// (SetLimits, ResetLimits): at is the change's moment on the Redis clock. A reservation decided before it
// (Verdict.Now before at) was decided under the old limits; used after the change, it could put the
// provider over the new ones, so it must not be used: give it up and ask again.
type LimitsWatcher interface {
	Watcher
	NoteLimits(provider string, at time.Time)
}

// LiveLimits are a provider's limits in force and where they come from.
type LiveLimits struct {
	Provider string
	// Policies are the limits in force; Configured the ones the Limiter was built with.
	Policies, Configured []Policy
	// Source is SourceConfig or SourceOverride.
	Source string
	// Version counts the changes (set or reset) of the provider's live limits, ever: 0 when never changed.
	Version int64
	// At is when they were last set or reset (Redis clock); zero when never.
	At time.Time
	// Changed reports that the call returning them changed them (SetLimits, ResetLimits): setting the
	// live limits in force again changes nothing.
	Changed bool
}

// SetLimits puts live limits over a provider's configured ones, for every process of the fleet. They are
// checked as the configured ones are (the provider's algorithm, margin and burst), and kept in Redis
// (<prefix>:{<provider>}:limits) until ResetLimits. Every decision checks the live limits' version
// atomically with the decision itself, so once SetLimits returns, nothing is admitted under the limits it
// replaced; reservations decided before it are announced as void (LimitsWatcher).
//
// A job whose cost is within the configured limits but above a live limit is denied while the live limits
// stand (retry after the shortest window). The burst follows the new shortest limit: a burst of the whole
// limit (no pacing) stays so, and a smaller one is cut to the new limit. A change of windows under
// algorithms other than SlidingLog starts their state afresh, which warms up (Options.WarmUp).
func (l *Limiter) SetLimits(ctx context.Context, providerName string, policies []Policy) (LiveLimits, error) {
	lp, err := l.liveProvider(providerName)
	if err != nil {
		return LiveLimits{}, err
	}
	if _, err := l.build(providerName, lp, 0, policies); err != nil {
		return LiveLimits{}, &invalidError{msg: err.Error()}
	}
	if longest, configured := longestWindow(policies), longestWindow(lp.spec.Policies); longest > configured {
		return LiveLimits{}, invalidf("gate: provider %s: live limits may not add a window longer than the configured ones (%s > %s): "+
			"the gate keeps no history beyond those, so it could not count what the provider already has in it; change the configuration instead",
			providerName, FormatDuration(longest), FormatDuration(configured))
	}
	return l.changeLimits(ctx, providerName, lp, "set", FormatPolicies(policies), SourceOverride)
}

// ResetLimits puts a provider back on its configured limits, as SetLimits puts live ones in force.
func (l *Limiter) ResetLimits(ctx context.Context, providerName string) (LiveLimits, error) {
	lp, err := l.liveProvider(providerName)
	if err != nil {
		return LiveLimits{}, err
	}
	return l.changeLimits(ctx, providerName, lp, "reset", "", SourceOverride)
}

// FollowAnnounced lowers a provider's limits, for the whole fleet, to what the provider announces in its
// responses (providers.<name>.limits_from_headers). Each configured limit whose window an announcement
// names (an announcement without a window: the shortest configured one) is cut to the announced limit;
// nothing is ever raised above the configuration, and announced windows the configuration lacks are
// left out. An announcement at or above the configuration takes back what earlier announcements set. An
// operator's live limits (SetLimits) stand over announcements. It is cheap when nothing changes: the
// announcement is compared with the limits this process has in force, and Redis is asked only for a
// change. changed reports whether this call changed the live limits.
func (l *Limiter) FollowAnnounced(ctx context.Context, providerName string, announced []Policy) (changed bool, err error) {
	lp, err := l.liveProvider(providerName)
	if err != nil {
		return false, err
	}
	cur := lp.cur.Load()
	if cur.source == SourceOverride {
		return false, nil
	}
	target, lowered := lowerTo(lp.spec.Policies, announced)
	var st LiveLimits
	switch {
	case !lowered && cur.source != SourceHeaders:
		return false, nil // the configuration in force, and announced
	case lowered && cur.source == SourceHeaders && slices.Equal(cur.policies, target):
		return false, nil // in force already
	case !lowered:
		st, err = l.changeLimits(ctx, providerName, lp, "reset", "", SourceHeaders)
	default:
		if _, err := l.build(providerName, lp, 0, target); err != nil {
			return false, fmt.Errorf("gate: limits %s announced by %s: %w", FormatPolicies(target), providerName, err)
		}
		st, err = l.changeLimits(ctx, providerName, lp, "set", FormatPolicies(target), SourceHeaders)
	}
	return err == nil && st.Changed, err
}

// Learn moves a provider's learned limit (providers.<name>.adaptive) one step for the whole fleet: down
// (to 95 %, 85 % when the window before had a cut too) after a 429, up after requests succeeded while the limit bound (by a quarter until the first
// cut, then by 2 %, at least 1), within lo..hi (one window), at most one step per window fleet-wide, and
// never over an operator's or the headers' live limits. The learned limit is put in force as live limits
// with source learned (see lua/limits.lua). changed reports whether this call moved it.
func (l *Limiter) Learn(ctx context.Context, providerName string, up bool, lo, hi Policy) (changed bool, err error) {
	lp, err := l.liveProvider(providerName)
	if err != nil {
		return false, err
	}
	if lo.Window != hi.Window || lo.Limit < 1 || lo.Limit > hi.Limit {
		return false, invalidf("gate: learn %s: want a range of one window, got %s..%s", providerName, lo, hi)
	}
	dir := "down"
	if up {
		dir = "up"
	}
	p := lp.cur.Load()
	reply, err := limitsScript.Run(ctx, l.rdb, p.keys.live(), "learn", dir, l.channel, providerName, SourceLearned,
		lo.Limit, hi.Limit, FormatDuration(lo.Window), micros(lo.Window)).Slice()
	if err != nil {
		return false, fmt.Errorf("gate: learn the limits of %s: %w", providerName, err)
	}
	st, err := liveReply(reply)
	if err != nil {
		return false, fmt.Errorf("gate: learn the limits of %s: %w", providerName, err)
	}
	return st.changed, l.adopt(providerName, lp, st)
}

// Limits reads a provider's limits in force from Redis.
func (l *Limiter) Limits(ctx context.Context, providerName string) (LiveLimits, error) {
	if _, err := l.liveProvider(providerName); err != nil {
		return LiveLimits{}, err
	}
	if err := l.refresh(ctx, providerName, -1); err != nil {
		return LiveLimits{}, err
	}
	return l.liveOf(providerName), nil
}

func (l *Limiter) changeLimits(ctx context.Context, providerName string, lp *live, op, spec, source string) (LiveLimits, error) {
	p := lp.cur.Load()
	reply, err := limitsScript.Run(ctx, l.rdb, p.keys.live(), op, spec, l.channel, providerName, source).Slice()
	if err != nil {
		return LiveLimits{}, fmt.Errorf("gate: %s limits of %s: %w", op, providerName, err)
	}
	st, err := liveReply(reply)
	if err != nil {
		return LiveLimits{}, fmt.Errorf("gate: %s limits of %s: %w", op, providerName, err)
	}
	if err := l.adopt(providerName, lp, st); err != nil {
		return LiveLimits{}, err
	}
	live := l.liveOf(providerName)
	live.Changed = st.changed
	return live, nil
}

func (l *Limiter) liveOf(providerName string) LiveLimits {
	lp := l.providers[providerName]
	p := lp.cur.Load()
	out := LiveLimits{Provider: providerName, Policies: append([]Policy(nil), p.policies...),
		Configured: append([]Policy(nil), lp.spec.Policies...), Source: p.source, Version: p.version}
	if p.liveAt > 0 {
		out.At = time.UnixMicro(p.liveAt)
	}
	return out
}

// inForce runs op on the provider as in force. When the script refuses it because the live limits
// changed since (another process set or reset them), it reads them and runs op again.
func (l *Limiter) inForce(ctx context.Context, providerName string, op func(p provider) error) error {
	if lp, ok := l.providers[providerName]; ok && lp.stale.Swap(false) {
		if err := l.refresh(ctx, providerName, -1); err != nil {
			lp.stale.Store(true)
			return err
		}
	}
	for try := 1; ; try++ {
		p, err := l.provider(providerName)
		if err != nil {
			return err
		}
		err = op(p)
		version, changed := limitsChanged(err)
		if !changed || try == 3 { // three changes within one decision: give up, as for a Redis error
			return err
		}
		if err := l.refresh(ctx, providerName, version); err != nil {
			return err
		}
	}
}

// limitsChanged reads lua/family's refusal of a call made under limits no longer in force.
func limitsChanged(err error) (version int64, ok bool) {
	var re redis.Error
	if err == nil || !errors.As(err, &re) {
		return 0, false
	}
	v, found := strings.CutPrefix(re.Error(), "PAYGATE_LIMITS ")
	if !found {
		return 0, false
	}
	n, perr := strconv.ParseInt(v, 10, 64)
	return n, perr == nil
}

// refresh reads the provider's live limits and puts them in force in this process, unless it follows
// version already (-1: read whatever).
func (l *Limiter) refresh(ctx context.Context, providerName string, version int64) error {
	lp := l.providers[providerName]
	lp.mu.Lock()
	defer lp.mu.Unlock()
	p := lp.cur.Load()
	if version >= 0 && p.version == version {
		return nil // another call read them meanwhile
	}
	reply, err := limitsScript.Run(ctx, l.rdb, p.keys.live(), "show", "", l.channel, providerName, "").Slice()
	if err != nil {
		return fmt.Errorf("gate: read the live limits of %s: %w", providerName, err)
	}
	st, err := liveReply(reply)
	if err != nil {
		return fmt.Errorf("gate: read the live limits of %s: %w", providerName, err)
	}
	return l.adoptLocked(providerName, lp, st)
}

// liveState is limits.lua's reply: the live limits as Redis holds them.
type liveState struct {
	version int64
	limits  string // "" for the configured ones
	at      int64  // µs
	source  string // SourceOverride or SourceHeaders; "" for the configured ones
	changed bool   // the call that read them changed them
}

func (l *Limiter) adopt(providerName string, lp *live, st liveState) error {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	return l.adoptLocked(providerName, lp, st)
}

// adoptLocked puts the live limits Redis holds in force in this process (lp.mu held). Whatever their
// version: a lower one than this process knew means Redis lost them (a restart without persistence, a
// FLUSHALL), and a reply that lost a race with a newer change is corrected by the next decision, which
// the scripts refuse under any but the version in force.
func (l *Limiter) adoptLocked(providerName string, lp *live, st liveState) error {
	var policies []Policy
	if st.limits != "" {
		var err error
		if policies, err = ParsePolicies(st.limits); err != nil {
			return fmt.Errorf("gate: the live limits of %s in Redis: %w", providerName, err)
		}
		policies = l.fit(lp.spec, st.source, policies)
	}
	p, err := l.build(providerName, lp, st.version, policies)
	if err != nil {
		return fmt.Errorf("gate: the live limits of %s in Redis: %w", providerName, err)
	}
	p.liveAt = st.at
	if policies != nil && st.source != "" {
		p.source = st.source
	}
	lp.cur.Store(&p)
	return nil
}

// build makes the provider under live policies (nil: the configured ones) at a version of the live limits.
func (l *Limiter) build(providerName string, lp *live, version int64, policies []Policy) (provider, error) {
	spec := lp.spec
	if policies != nil {
		configured := ShortestPolicy(spec.Policies)
		spec.Policies = policies
		if shortest := ShortestPolicy(policies); spec.Burst >= configured.Limit {
			spec.Burst = shortest.Limit // a burst of the whole limit: still no pacing
		} else {
			spec.Burst = min(spec.Burst, shortest.Limit)
		}
	}
	p, err := newProvider(l.opts, providerName, spec, l.dedup, version)
	if err != nil {
		return provider{}, err
	}
	if p.algo == SlidingLog && policies != nil {
		// The log is sliding_log's whole state: kept for the configured longest window under live limits
		// too (they add no longer one), so that a reset, or any later change, counts what they admitted.
		// Live limits without that window may admit more within it than any limit: the log then keeps
		// the newest twice the largest limit at most, which every policy's count and earliest slot need
		// (a count past the cap is past every limit, even less a move's units).
		if configured := micros(longestWindow(lp.spec.Policies)) + p.ceiling; configured > p.dedup {
			p.dedup = configured
			p.logCap = 2 * max(largestLimit(lp.spec.Policies), largestLimit(policies))
		}
	}
	base := lp.cur.Load()
	if base != nil {
		p.inForce = base.inForce // the margin in force is the provider's, whatever its limits
		p.configMin = base.configMin
	}
	if policies != nil {
		p.source = SourceOverride
	}
	return p, nil
}

func largestLimit(policies []Policy) int64 {
	var l int64
	for _, p := range policies {
		l = max(l, p.Limit)
	}
	return l
}

func longestWindow(policies []Policy) time.Duration {
	var w time.Duration
	for _, p := range policies {
		w = max(w, p.Window)
	}
	return w
}

// fit holds live limits that came from the provider (headers) or were learned to what this process's
// configuration allows now: a configuration changed since they were set may no longer follow them (nil:
// the configured limits), or bound them lower. An operator's live limits are taken as they are.
func (l *Limiter) fit(spec Provider, source string, live []Policy) []Policy {
	switch source {
	case SourceLearned:
		if spec.LearnMax.Limit == 0 || len(live) != 1 || live[0].Window != spec.LearnMin.Window {
			return nil
		}
		return []Policy{{Limit: min(max(live[0].Limit, spec.LearnMin.Limit), spec.LearnMax.Limit), Window: live[0].Window}}
	case SourceHeaders:
		if !spec.FromHeaders {
			return nil
		}
		out, _ := lowerTo(spec.Policies, live)
		return out
	}
	return live
}

// lowerTo is the configured policies with each limit cut to an announced one of its window (an
// announcement without a window: the shortest configured window's), never raised; announced windows the
// configuration lacks are left out. lowered reports whether any limit was cut.
func lowerTo(configured, announced []Policy) (out []Policy, lowered bool) {
	out = append([]Policy(nil), configured...)
	shortest := ShortestPolicy(configured).Window
	for _, a := range announced {
		w := a.Window
		if w == 0 {
			w = shortest
		}
		for i := range out {
			if out[i].Window == w && a.Limit >= 1 && a.Limit < out[i].Limit {
				out[i].Limit, lowered = a.Limit, true
			}
		}
	}
	return out, lowered
}

// aboveLive is the denial of a job whose cost the configured limits allow and the live ones do not.
func aboveLive(p provider) Verdict {
	i := 0
	for j, pol := range p.policies {
		if pol.Limit < p.policies[i].Limit {
			i = j
		}
	}
	retry := max(time.Second, ShortestPolicy(p.policies).Window)
	return Verdict{Policy: i, Limit: p.policies[i], RetryAfter: retry, Margin: time.Duration(p.inForce.Load()) * time.Microsecond}
}

// liveReply reads limits.lua's {version, limits, at_us, source, changed}.
func liveReply(reply []any) (liveState, error) {
	if len(reply) != 5 {
		return liveState{}, fmt.Errorf("malformed reply %v", reply)
	}
	version, ok1 := reply[0].(int64)
	limits, ok2 := reply[1].(string)
	at, ok3 := reply[2].(int64)
	source, ok4 := reply[3].(string)
	changed, ok5 := reply[4].(int64)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
		return liveState{}, fmt.Errorf("malformed reply %v", reply)
	}
	return liveState{version: version, limits: limits, at: at, source: source, changed: changed == 1}, nil
}

// ParsePolicies reads limits written as "N/duration", comma-separated: "200/1s,5000/1m". Each needs N >= 1
// and a window Go's time.ParseDuration reads (ms, s, m, h).
func ParsePolicies(spec string) ([]Policy, error) {
	var out []Policy
	for part := range strings.SplitSeq(spec, ",") {
		part = strings.TrimSpace(part)
		n, per, ok := strings.Cut(part, "/")
		limit, err := strconv.ParseInt(strings.TrimSpace(n), 10, 64)
		if !ok || err != nil || limit < 1 {
			return nil, fmt.Errorf("limit %q: want N/duration with N >= 1, e.g. 100/1s", part)
		}
		d, err := time.ParseDuration(strings.TrimSpace(per))
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("limit %q: want a positive duration after the slash, e.g. 100/1s", part)
		}
		out = append(out, Policy{Limit: limit, Window: d})
	}
	return out, nil
}

// FormatPolicies writes policies as ParsePolicies reads them.
func FormatPolicies(policies []Policy) string {
	parts := make([]string, len(policies))
	for i, p := range policies {
		parts[i] = p.String()
	}
	return strings.Join(parts, ",")
}
