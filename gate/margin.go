package gate

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/lua"
)

var marginScript = redis.NewScript(lua.Margin)

// The margin in force: a margin kept up is narrowed after marginHold, by steps a second apart; a worker's
// report counts for marginFresh.
const (
	marginHold  = 10 * time.Second
	marginFresh = 10 * time.Second
)

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

// margins runs margin.lua's op (lateness, throttled or read) for a reporter, and takes up the margin in
// force it returns.
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
	keys := []string{p.keys.margin, p.keys.lateness}
	reply, err := marginScript.Run(ctx, l.rdb, keys, op, reporter, late, p.floor, p.ceiling, micros(l.hold), micros(l.fresh)).Slice()
	if err != nil {
		return MarginState{}, fmt.Errorf("gate: margin %s %s: %w", op, providerName, err)
	}
	if len(reply) != 3 {
		return MarginState{}, fmt.Errorf("gate: margin %s %s: malformed reply %v", op, providerName, reply)
	}
	margin, err1 := strconv.ParseInt(fmt.Sprint(reply[0]), 10, 64)
	changed, err2 := strconv.ParseInt(fmt.Sprint(reply[1]), 10, 64)
	if err1 != nil || err2 != nil || margin < p.floor || margin > p.ceiling {
		return MarginState{}, fmt.Errorf("gate: margin %s %s: malformed reply %v", op, providerName, reply)
	}
	p.inForce.Store(margin)
	st.Margin, st.Why = time.Duration(margin)*time.Microsecond, fmt.Sprint(reply[2])
	if changed > 0 {
		st.Changed = time.UnixMicro(changed)
	}
	return st, nil
}
