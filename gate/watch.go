package gate

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

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
	ps := sub.Subscribe(ctx, l.channel)
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
				ps = sub.Subscribe(ctx, l.channel)
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
