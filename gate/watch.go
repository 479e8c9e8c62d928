package gate

import (
	"context"
	"errors"
	"net"
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

// LandWatcher is a Watcher that also hears of every in-flight lease that ends (Land), to wake the jobs
// it holds back for one (Verdict.InFlight).
type LandWatcher interface {
	Watcher
	NoteLanded(provider string)
}

// CancelWatcher is a Watcher that also hears of every job cancelled while admitted for a slot still ahead
// (Limiter.Cancel), so that the holder of the slot gives it up rather than send the job.
type CancelWatcher interface {
	Watcher
	NoteCancel(provider, jobID string)
}

// watchPing is how long Watch waits in silence before it pings the connection; two silences in a row
// without an answer count as a lost connection: well within consumers.LossNotice.
const watchPing = 200 * time.Millisecond

// watchRedial is how long Watch waits after losing its connection before it reconnects.
const watchRedial = 50 * time.Millisecond

// Watch tells w of every announcement (see Announcement) as it happens: every pause any worker sets
// (Pause), every warm-up a decision begins, every change of live limits (to a LimitsWatcher) and every
// in-flight lease that ends with the cap full (to a LandWatcher); and of every loss of its own connection
// to Redis, until ctx ends. It reconnects by itself (a pause or warm-up announced while it is away binds
// only later decisions, hence NoteDisconnect). With Options.WarmUp, a holder of reservations that drops
// them on NoteLoss and NoteDisconnect lets the warm-up leave out its max wait (Options.Horizon).
func (l *Limiter) Watch(ctx context.Context, sub Subscriber, w Watcher) error {
	c := &watchConn{sub: sub, channel: l.channel, w: w}
	c.ps = sub.Subscribe(ctx, c.channel)
	defer func() { _ = c.ps.Close() }()
	for {
		msg, err := c.ps.ReceiveTimeout(ctx, watchPing)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			if !c.failed(ctx, err) {
				return nil
			}
		default:
			c.silent = false
			l.heard(msg, w)
		}
	}
}

// watchConn is Watch's subscription, and what it knows of the connection's health.
type watchConn struct {
	sub     Subscriber
	channel string
	w       Watcher
	ps      *redis.PubSub
	silent  bool // the last receive timed out, and a ping went out
}

// failed handles a receive that failed: a first silence is answered with a ping (its answer, or another
// error, comes through the next receive); a second one, a failed ping, or a broken connection is a lost
// connection, told to the watcher, and reconnected after a moment. It reports false when ctx ended
// meanwhile.
func (c *watchConn) failed(ctx context.Context, err error) bool {
	if isTimeout(err) && !c.silent {
		c.silent = true
		if c.ps.Ping(ctx) == nil {
			return true
		}
		c.w.NoteDisconnect(time.Now()) // the write failed: go-redis reconnects on the next receive
		c.silent = false
		return true
	}
	// Broken (the next receive reconnects and subscribes again), or silent past a ping: a hung
	// connection, given up on.
	c.w.NoteDisconnect(time.Now())
	if isTimeout(err) {
		_ = c.ps.Close()
		c.ps = c.sub.Subscribe(ctx, c.channel)
	}
	c.silent = false
	select {
	case <-time.After(watchRedial):
		return true
	case <-ctx.Done():
		return false
	}
}

// heard tells w what one message of the subscription says.
func (l *Limiter) heard(msg any, w Watcher) {
	switch msg := msg.(type) {
	case *redis.Subscription:
		if msg.Kind == "subscribe" {
			// Subscribed, the first time or again after go-redis replaced the connection (which it may do
			// without an error surfacing): whatever was announced before went unheard.
			w.NoteDisconnect(time.Now())
		}
	case *redis.Message:
		if a, err := ParseAnnouncement(msg.Payload); err == nil {
			l.tell(a, w)
		}
	}
	// anything else is a pong
}

// tell passes an announcement about one of this gate's providers on to w. Another deployment's provider
// on a shared prefix is none of its business.
func (l *Limiter) tell(a Announcement, w Watcher) {
	lp, known := l.providers[a.Provider]
	if !known {
		return
	}
	switch a.Kind {
	case AnnouncePause:
		w.NotePause(a.Provider, a.Until)
	case AnnounceLoss: // its pause binds later decisions; a holder of earlier ones drops them
		w.NoteLoss(a.Provider, a.Lost)
	case AnnounceLimits:
		lp.stale.Store(true) // read before the next decision, rather than be refused by it
		if lw, ok := w.(LimitsWatcher); ok {
			lw.NoteLimits(a.Provider, a.At)
		}
	case AnnounceLanded:
		if lw, ok := w.(LandWatcher); ok {
			lw.NoteLanded(a.Provider)
		}
	case AnnounceBreaker:
		if bw, ok := w.(BreakerWatcher); ok {
			bw.NoteBreaker(a.Provider, a.Breaker)
		}
	case AnnounceCancel:
		if cw, ok := w.(CancelWatcher); ok {
			cw.NoteCancel(a.Provider, a.ID)
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
