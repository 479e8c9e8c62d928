// Package memory is an in-process broker for the worker core: for fast tests, and as the reference the
// other adapters' conformance is measured against. It keeps every settlement so a test can read the
// ledger.
package memory

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/paygate/paygate/consumers"
)

// Settled is what became of one delivery.
type Settled struct {
	Provider string
	Body     []byte
	Kind     string // ack, defer, dead, requeue
	After    time.Duration
	Attempt  int
	Reason   consumers.Reason
	Why      error
}

// Broker holds one queue per provider.
type Broker struct {
	mu          sync.Mutex
	queues      map[string]chan *Delivery
	settled     []Settled
	outstanding map[*Delivery]bool // handed out, not settled
	// Redeliver, when set, puts deferred jobs back on their queue after their delay (scaled by it), as
	// a delay tier would; nil keeps them out.
	Redeliver func(after time.Duration) time.Duration
}

var _ consumers.Broker = (*Broker)(nil)

// New returns a broker with a queue of the given capacity per provider.
func New(capacity int, providers ...string) *Broker {
	b := &Broker{queues: map[string]chan *Delivery{}, outstanding: map[*Delivery]bool{}}
	for _, p := range providers {
		for _, r := range consumers.Routes(p) { // a queue per class (consumers.Route)
			b.queues[r] = make(chan *Delivery, capacity)
		}
	}
	return b
}

// Publish enqueues a job body for provider.
func (b *Broker) Publish(_ context.Context, provider string, body []byte) error {
	return b.put(&Delivery{b: b, provider: provider, body: body, firstSeen: time.Now()})
}

// PublishAged enqueues a redelivery: a job first seen at firstSeen, after attempt failures.
func (b *Broker) PublishAged(provider string, body []byte, attempt int, firstSeen time.Time) error {
	return b.put(&Delivery{b: b, provider: provider, body: body, attempt: attempt, firstSeen: firstSeen})
}

func (b *Broker) put(d *Delivery) error {
	q, ok := b.queues[d.provider]
	if !ok {
		return errors.New("memory: no queue for " + d.provider)
	}
	select {
	case q <- d:
		return nil
	default:
		return errors.New("memory: queue full")
	}
}

// Consume streams provider's queue until ctx is done.
func (b *Broker) Consume(ctx context.Context, provider string) (<-chan consumers.Delivery, error) {
	q, ok := b.queues[provider]
	if !ok {
		return nil, errors.New("memory: no queue for " + provider)
	}
	out := make(chan consumers.Delivery)
	go func() {
		defer close(out)
		for {
			select {
			case d := <-q:
				b.mu.Lock()
				b.outstanding[d] = true
				b.mu.Unlock()
				select {
				case out <- d:
				case <-ctx.Done():
					_ = d.Requeue(context.Background())
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// Settled returns the ledger so far.
func (b *Broker) Settled() []Settled {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]Settled(nil), b.settled...)
}

// Pending is the number of jobs waiting in provider's queue.
func (b *Broker) Pending(provider string) int { return len(b.queues[provider]) }

// Delivery is one in-memory message; it may be settled once.
type Delivery struct {
	b         *Broker
	provider  string
	body      []byte
	attempt   int
	firstSeen time.Time
	mu        sync.Mutex
	done      bool
}

var _ consumers.Delivery = (*Delivery)(nil)

func (d *Delivery) Body() []byte         { return d.body }
func (d *Delivery) Attempt() int         { return d.attempt }
func (d *Delivery) FirstSeen() time.Time { return d.firstSeen }

func (d *Delivery) settle(s Settled) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done {
		return errors.New("memory: delivery settled twice")
	}
	d.done = true
	s.Provider, s.Body = d.provider, d.body
	d.b.mu.Lock()
	defer d.b.mu.Unlock()
	if !d.b.outstanding[d] && s.Kind != "requeue" {
		return errors.New("memory: delivery abandoned by a crash")
	}
	delete(d.b.outstanding, d)
	d.b.settled = append(d.b.settled, s)
	return nil
}

// Crash acts out a consumer process dying: every delivery handed out and not settled goes back to its
// queue, and settling the old one afterwards fails, as on a closed channel.
func (b *Broker) Crash() {
	b.mu.Lock()
	var back []*Delivery
	for d := range b.outstanding {
		back = append(back, &Delivery{b: b, provider: d.provider, body: d.body, attempt: d.attempt, firstSeen: d.firstSeen})
		delete(b.outstanding, d)
	}
	b.mu.Unlock()
	for _, d := range back {
		_ = b.put(d)
	}
}

func (d *Delivery) Ack(context.Context) error { return d.settle(Settled{Kind: "ack"}) }

func (d *Delivery) Requeue(context.Context) error {
	if err := d.settle(Settled{Kind: "requeue"}); err != nil {
		return err
	}
	return d.b.put(&Delivery{b: d.b, provider: d.provider, body: d.body, attempt: d.attempt, firstSeen: d.firstSeen})
}

func (d *Delivery) Defer(_ context.Context, after time.Duration, attempt int, why error) error {
	if err := d.settle(Settled{Kind: "defer", After: after, Attempt: attempt, Why: why}); err != nil {
		return err
	}
	if d.b.Redeliver != nil {
		next := &Delivery{b: d.b, provider: d.provider, body: d.body, attempt: attempt, firstSeen: d.firstSeen}
		time.AfterFunc(d.b.Redeliver(after), func() { _ = d.b.put(next) })
	}
	return nil
}

func (d *Delivery) DeadLetter(_ context.Context, reason consumers.Reason, attempt int, why error) error {
	return d.settle(Settled{Kind: "dead", Reason: reason, Attempt: attempt, Why: why})
}
