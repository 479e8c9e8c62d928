package gate

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/lua"
)

var breakerScript = redis.NewScript(lua.Breaker)

// Breaker is a provider's circuit breaker (Provider.Breaker), one for the whole fleet, kept in Redis
// (lua/breaker.lua): after Failures transient failures in a row, reported by any worker (ReportFailure;
// an answer that is no transient failure ends the run: ReportAnswer), the provider opens. Its pause then
// holds every decision; after OpenFor one job may take the probe (TakeProbe), whose reserve alone goes
// through the hold. The probe's answer closes the breaker and lifts the hold; its failure reopens it for
// twice as long, up to OpenMax.
type Breaker struct {
	// Failures is how many transient failures in a row, across the fleet, open the breaker; 0: no breaker.
	Failures int
	// OpenFor is how long the breaker first stays open before a probe; each reopening doubles it, up to
	// OpenMax.
	OpenFor, OpenMax time.Duration
	// Probe is how long the probe's holder has to report its answer before another job may take the
	// probe (a worker killed while it holds it): its max wait, the provider's timeout and a slack.
	Probe time.Duration
	// Reach is how far the hold reaches past the moment a probe is due (or its holder's time lapses): the
	// longest max wait the fleet's reserves ask for, so that a reserve while the breaker is open is denied
	// until the probe is due (RetryAfter) rather than reserved at the hold's end.
	Reach time.Duration
}

// check refuses a breaker's settings out of their ranges.
func (b Breaker) check(name string) error {
	if b.Failures == 0 {
		return nil
	}
	if b.Failures < 0 || b.OpenFor <= 0 || b.OpenMax < b.OpenFor || b.OpenMax > MaxHorizon || b.Probe <= 0 || b.Probe > MaxHorizon ||
		b.Reach < 0 || b.Reach > MaxHorizon {
		return fmt.Errorf("gate: provider %s: breaker wants failures >= 0 and, with failures, 0 < open_for <= open_max, probe > 0 and reach >= 0 (each at most %s); got %+v",
			name, MaxHorizon, b)
	}
	return nil
}

// BreakerPhase is where a provider's breaker stands.
type BreakerPhase int

// The phases, as lua/breaker.lua numbers them (and paygate_breaker_state exports them).
const (
	BreakerClosed  BreakerPhase = iota // requests go; transient failures are counted
	BreakerOpen                        // held: nothing goes until the probe is due (Until)
	BreakerProbing                     // one job holds the probe (Probe); the rest wait for its answer
)

func (p BreakerPhase) String() string {
	switch p {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	case BreakerProbing:
		return "probing"
	}
	return "BreakerPhase(" + strconv.Itoa(int(p)) + ")"
}

// breakerPhaseOf reads a phase by name.
func breakerPhaseOf(name string) (BreakerPhase, bool) {
	for _, p := range []BreakerPhase{BreakerClosed, BreakerOpen, BreakerProbing} {
		if p.String() == name {
			return p, true
		}
	}
	return 0, false
}

// BreakerState is a provider's breaker as one call of lua/breaker.lua, or an announcement, left it. Times
// are on the Redis clock.
type BreakerState struct {
	Phase BreakerPhase
	// Failures are the transient failures in a row so far (closed); 0 otherwise.
	Failures int64
	// OpenFor is the open interval in force (open, probing), or the first one's (closed).
	OpenFor time.Duration
	// Until is, while open, when the probe is due (or when another writer's longer pause ends, for a
	// probe refused for it); while probing, when the probe's holder's time lapses. Zero when closed.
	Until time.Time
	// Hold is the end of the hold the breaker keeps in the provider's pause (zero when closed).
	Hold time.Time
	// Now is the Redis clock at the call (or the announcement).
	Now time.Time
	// Seq is the state's version: it moves forward at every announced change (a change of phase, a run of
	// failures beginning or ending); a state with a lower Seq is older. 0: the breaker never changed.
	Seq int64
	// Changed: this call changed the phase (opened, reopened, probe taken, closed).
	Changed bool
	// Granted (TakeProbe): the job holds the probe. Counted (ReportFailure): the failure counted (toward
	// opening, or as the probe's).
	Granted, Counted bool
	// Opened is how many times the breaker opened (reopenings included) while its key lived.
	Opened int64
	// Since is when the phase last changed (zero: never).
	Since time.Time
	// Probe is the job holding the probe (probing).
	Probe string
}

// BreakerWatcher is a Watcher that also hears of every change of a provider's breaker (a change of
// phase, a run of failures beginning or ending), to hold its jobs, wake them, and report answers while a
// run is in progress.
type BreakerWatcher interface {
	Watcher
	NoteBreaker(provider string, st BreakerState)
}

// Breaker ops of lua/breaker.lua.
const (
	breakerState  = "state"
	breakerFail   = "fail"
	breakerAnswer = "answer"
	breakerProbe  = "probe"
)

// HasBreaker reports whether the provider has a breaker (Provider.Breaker.Failures > 0).
func (l *Limiter) HasBreaker(providerName string) bool {
	lp, err := l.liveProvider(providerName)
	return err == nil && lp.spec.Breaker.Failures > 0
}

// BreakerOf returns a provider's breaker settings (Failures 0: none).
func (l *Limiter) BreakerOf(providerName string) (Breaker, error) {
	lp, err := l.liveProvider(providerName)
	if err != nil {
		return Breaker{}, err
	}
	return lp.spec.Breaker, nil
}

// ReadBreaker reads a provider's breaker without changing it. A provider without one is closed.
func (l *Limiter) ReadBreaker(ctx context.Context, providerName string) (BreakerState, error) {
	return l.breaker(ctx, providerName, breakerState, "", time.Time{})
}

// ReportFailure counts a transient failure (5xx, a timeout, a refused or reset connection, a retry_on
// status) of jobID's request, sent on its slot (the admission's, Redis clock; zero: unknown). While
// closed, it counts toward opening, unless the request was sent before the breaker last closed; from the
// probe's holder, it reopens the breaker. Every other failure (a request in flight when it opened) is not
// counted. The state returned says which (Counted, Changed).
func (l *Limiter) ReportFailure(ctx context.Context, providerName, jobID string, sent time.Time) (BreakerState, error) {
	return l.breaker(ctx, providerName, breakerFail, jobID, sent)
}

// ReportAnswer reports an answer to jobID's request that is no transient failure (a success, a decline, a
// 4xx, a 429): it ends a run of failures, and from the probe's holder it closes the breaker and lifts its
// hold (never a pause another writer set: a 429's stays). A closed breaker without failures is not
// written: call it while a run is known to be in progress (BreakerState.Failures), or not known at all.
func (l *Limiter) ReportAnswer(ctx context.Context, providerName, jobID string) (BreakerState, error) {
	return l.breaker(ctx, providerName, breakerAnswer, jobID, time.Time{})
}

// TakeProbe asks for the breaker's probe for jobID: granted (Granted) to one job at a time once the
// breaker has been open for its interval (or the holder's time lapsed), and again to the job that holds
// it. The probe's reserve is then admitted through the breaker's hold, as if there were no pause (a
// pause another writer set beyond the hold still holds it). Not granted, Until says how long to wait.
func (l *Limiter) TakeProbe(ctx context.Context, providerName, jobID string) (BreakerState, error) {
	if err := checkID(jobID); err != nil {
		return BreakerState{}, err
	}
	return l.breaker(ctx, providerName, breakerProbe, jobID, time.Time{})
}

// breaker runs one op of lua/breaker.lua for the provider.
func (l *Limiter) breaker(ctx context.Context, providerName, op, jobID string, sent time.Time) (BreakerState, error) {
	lp, err := l.liveProvider(providerName)
	if err != nil {
		return BreakerState{}, err
	}
	b := lp.spec.Breaker
	if b.Failures <= 0 {
		return BreakerState{Phase: BreakerClosed}, nil
	}
	keys := lp.cur.Load().keys
	at := int64(0)
	if !sent.IsZero() {
		at = sent.UnixMicro()
	}
	raw, err := breakerScript.Run(ctx, l.rdb, []string{keys.breaker, keys.pause, keys.marks}, op, providerName, l.channel, jobID,
		at, b.Failures, micros(b.OpenFor), micros(b.OpenMax), micros(b.Probe), micros(b.Reach)).Slice()
	if err != nil {
		return BreakerState{}, fmt.Errorf("gate: breaker %s %s: %w", op, providerName, err)
	}
	st, err := breakerReply(raw)
	if err != nil {
		return BreakerState{}, fmt.Errorf("gate: breaker %s %s: %w", op, providerName, err)
	}
	if op == breakerProbe {
		st.Granted, st.Counted = st.Counted, false
	}
	return st, nil
}

// The reply of lua/breaker.lua, by index.
const (
	brPhase = iota
	brFailures
	brOpenFor
	brUntil
	brHold
	brNow
	brSeq
	brChanged
	brFlag
	brOpened
	brSince
	brProbe
	brLen
)

// breakerReply reads lua/breaker.lua's reply (Counted carries its flag, whatever the op).
func breakerReply(raw []any) (BreakerState, error) {
	if len(raw) != brLen {
		return BreakerState{}, fmt.Errorf("malformed reply %v", raw)
	}
	n := make([]int64, brProbe)
	for i := range n {
		v, ok := raw[i].(int64)
		if !ok {
			return BreakerState{}, fmt.Errorf("malformed reply %v", raw)
		}
		n[i] = v
	}
	probe, ok := raw[brProbe].(string)
	if !ok || n[brPhase] < int64(BreakerClosed) || n[brPhase] > int64(BreakerProbing) {
		return BreakerState{}, fmt.Errorf("malformed reply %v", raw)
	}
	return BreakerState{Phase: BreakerPhase(n[brPhase]), Failures: n[brFailures], OpenFor: time.Duration(n[brOpenFor]) * time.Microsecond,
		Until: usTime(n[brUntil]), Hold: usTime(n[brHold]), Now: usTime(n[brNow]), Seq: n[brSeq], Changed: n[brChanged] == 1,
		Counted: n[brFlag] == 1, Opened: n[brOpened], Since: usTime(n[brSince]), Probe: probe}, nil
}

// usTime is a time in µs on the Redis clock; 0 is the zero time.
func usTime(us int64) time.Time {
	if us <= 0 {
		return time.Time{}
	}
	return time.UnixMicro(us)
}
