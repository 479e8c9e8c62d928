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
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
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

// Limiter is the gate. It is safe for concurrent use; its state lives in Redis.
//
// Where each part lives: options.go (Options, New); provider.go and keys.go (a provider's budget as
// built, and its Redis keys by name); settings.go (lua/family's settings string); reserve.go (Reserve and
// its kin: one decision), batch.go (reserves decided together), call.go (the one way to lua/family) and
// verdict.go (its reply read); release.go (Release, Departed, Postpone, Sent, Land); pause.go, margin.go,
// breaker.go (the providers' circuit breakers);
// live.go (live limits); watch.go and announce.go (the announcements); status.go (reading a budget).
type Limiter struct {
	rdb       redis.Scripter
	fn        functions    // rdb, when it can FCALL
	evalUntil atomic.Int64 // unix ns: EVALSHA until then (a server without functions; see invoke)
	channel   string       // the channel every Announcement goes on: <prefix>:pauses
	stale     int64        // µs: Options.StaleAfter
	providers map[string]*live
	// opts and dedup build a provider anew under live limits
	opts  Options
	dedup time.Duration
	// hold and fresh time the margin in force (marginHold, marginFresh; tests shorten them)
	hold, fresh time.Duration
	// acks and ackMillis are Options.MinReplicasAcked and AckTimeout (ms)
	acks, ackMillis int64
}

// live is one provider: as configured, and as in force (the configured limits, or the live ones that
// `worker limits set` put over them; see SetLimits).
type live struct {
	spec  Provider
	cur   atomic.Pointer[provider]
	mu    sync.Mutex  // one reading of the live limits at a time
	stale atomic.Bool // a change was announced (Watch): read them before the next decision
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

// Algorithm returns the algorithm that counts a provider's budget.
func (l *Limiter) Algorithm(providerName string) (Algorithm, error) {
	p, err := l.provider(providerName)
	return p.algo, err
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

// micros rounds a duration (>= 0, <= MaxHorizon) up to whole microseconds, the unit of every time the
// scripts see.
func micros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// microsFloor rounds a duration down to whole microseconds.
func microsFloor(d time.Duration) int64 { return int64(d / time.Microsecond) }
