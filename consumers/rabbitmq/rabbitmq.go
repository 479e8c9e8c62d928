// Package rabbitmq is the RabbitMQ adapter of the worker core (amqp091-go).
//
// Topology, declared idempotently on every (re)connect; names derive from the exchange name X:
//
//	X                 direct exchange, durable; jobs are published with routing key = provider
//	X.<provider>      quorum queue bound by the provider's name; a message redelivered more than 1000
//	                  times is dead-lettered to X.dead by RabbitMQ itself (x-delivery-limit)
//	X.<provider>.high the same for the provider's high and low jobs, bound by <provider>.high and
//	X.<provider>.low  <provider>.low (consumers.Route)
//	X.delay.<tier>    fanout exchange and quorum queue with x-message-ttl = tier, dead-lettering back to X
//	                  at least once, keeping the provider routing key
//	X.dead            quorum queue of dead letters, with x-paygate-* headers saying why
//
// Consuming and publishing use separate connections, each kept alive by a supervisor that redials with
// backoff and jitter. A delivery is settled on the channel it came from; if that channel died, the
// message is redelivered and the gate's duplicate admission and the idempotency key absorb it.
//
// An amqps:// URL dials TLS, on every connect and reconnect of both connections; Options.TLS sets the CAs
// to trust (a private CA), else amqp091-go trusts the system's roots.
package rabbitmq

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/internal/throttle"
	"github.com/paygate/paygate/job"
)

// Header names are consumers.Header*, the same on every broker.
const (
	headerPublishID = "x-paygate-publish-id" // correlates a basic.return with its publish
	// deliveryLimit breaks a loop of redeliveries (a job that kills its worker every time). Every requeue
	// counts, shutdowns included, so it is far above what restarts and publish failures add up to.
	deliveryLimit = 1000
)

// Options configure the adapter.
type Options struct {
	URL string // amqp:// or amqps://
	// TLS, if set, replaces amqp091-go's default for an amqps:// URL (TLS 1.2+, the system's roots, the
	// URL's cacertfile, certfile, keyfile and server_name_indication parameters); it needs an amqps:// URL
	// without those parameters. Every dial, first or reconnect, of both connections uses it.
	TLS        *tls.Config
	Exchange   string
	Prefetch   int
	Providers  []string
	DelayTiers []time.Duration // ascending
	// Results declares X.results (results.enabled): a topic exchange and a quorum queue bound to all of it.
	Results bool
	Log     *zap.Logger
}

// Broker is the RabbitMQ adapter: consumers.Broker plus publishing.
type Broker struct {
	o       Options
	consume *session
	publish *session
	pub     *publisher
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

var _ consumers.Broker = (*Broker)(nil)

// Open connects, declares the topology, and keeps both connections alive until Close.
func Open(ctx context.Context, o Options) (*Broker, error) {
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if o.Prefetch < 1 {
		o.Prefetch = 1
	}
	if len(o.DelayTiers) == 0 {
		return nil, errors.New("rabbitmq: at least one delay tier is required")
	}
	if err := checkURL(o.URL); err != nil {
		return nil, err
	}
	if o.TLS != nil {
		if err := checkTLSURL(o.URL); err != nil {
			return nil, err
		}
	}
	life, cancel := context.WithCancel(context.WithoutCancel(ctx))
	b := &Broker{o: o, cancel: cancel}
	b.consume = newSession("consume "+o.Exchange, o.URL, o.TLS, o.Log, b.declare)
	b.publish = newSession("publish "+o.Exchange, o.URL, o.TLS, o.Log, nil)
	b.pub = &publisher{s: b.publish}
	for _, s := range []*session{b.consume, b.publish} {
		b.wg.Go(func() { s.run(life) })
	}
	wait, cancelWait := context.WithTimeout(ctx, 30*time.Second)
	defer cancelWait()
	for _, s := range []*session{b.consume, b.publish} {
		if _, err := s.get(wait); err != nil {
			b.Close()
			var r *Refusal
			if last := s.lastError(); errors.As(last, &r) {
				return nil, fmt.Errorf("rabbitmq: connect %s: %w", redact(o.URL), last)
			}
			return nil, fmt.Errorf("rabbitmq: connect %s: %w (last error: %v)", redact(o.URL), err, s.lastError())
		}
	}
	return b, nil
}

// Close stops the supervisors and closes both connections (and with them every channel);
// unacknowledged deliveries return to their queues. Settle or requeue in-flight deliveries first.
func (b *Broker) Close() error {
	b.cancel()
	b.consume.close()
	b.publish.close()
	b.wg.Wait()
	return nil
}

// Ready reports whether both connections are up (for /readyz).
func (b *Broker) Ready() error {
	for _, s := range []*session{b.consume, b.publish} {
		if err := s.ready(); err != nil {
			return err
		}
	}
	return nil
}

// queue is a route's queue (consumers.Route): X.<provider>, X.<provider>.high, X.<provider>.low.
func (b *Broker) queue(route string) string { return b.o.Exchange + "." + route }
func (b *Broker) dead() string              { return b.o.Exchange + ".dead" }
func (b *Broker) delay(tier time.Duration) string {
	return b.o.Exchange + ".delay." + consumers.TierName(tier)
}

// declare creates the topology; it runs on every (re)connect of the consuming connection.
func (b *Broker) declare(conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	x := b.o.Exchange
	if err := ch.ExchangeDeclare(x, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", x, err)
	}
	if _, err := ch.QueueDeclare(b.dead(), true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}); err != nil {
		return fmt.Errorf("declare queue %s: %w", b.dead(), err)
	}
	if b.o.Results {
		if err := b.declareResults(ch); err != nil {
			return err
		}
	}
	for _, p := range routes(b.o.Providers) {
		q := b.queue(p)
		args := amqp.Table{
			amqp.QueueTypeArg:           amqp.QueueTypeQuorum,
			"x-delivery-limit":          deliveryLimit,
			"x-dead-letter-exchange":    "",
			"x-dead-letter-routing-key": b.dead(),
			"x-dead-letter-strategy":    "at-least-once",
			"x-overflow":                "reject-publish",
		}
		if _, err := ch.QueueDeclare(q, true, false, false, false, args); err != nil {
			return fmt.Errorf("declare queue %s: %w", q, err)
		}
		if err := ch.QueueBind(q, p, x, false, nil); err != nil {
			return fmt.Errorf("bind queue %s: %w", q, err)
		}
	}
	for _, tier := range b.o.DelayTiers {
		name := b.delay(tier)
		if err := ch.ExchangeDeclare(name, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %s: %w", name, err)
		}
		args := amqp.Table{
			amqp.QueueTypeArg:        amqp.QueueTypeQuorum,
			"x-message-ttl":          tier.Milliseconds(),
			"x-dead-letter-exchange": x, // no dead-letter routing key: the provider's routing key is kept
			"x-dead-letter-strategy": "at-least-once",
			"x-overflow":             "reject-publish",
		}
		if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
			return fmt.Errorf("declare queue %s: %w", name, err)
		}
		if err := ch.QueueBind(name, "", name, false, nil); err != nil {
			return fmt.Errorf("bind queue %s: %w", name, err)
		}
	}
	return nil
}

// Consume streams a route's queue (consumers.Route: a provider's, or its high or low jobs') across
// reconnects until ctx is done; then it cancels the consumer, hands over what was already delivered, and
// closes the stream. Each route has its consumer, on a channel of its own with its prefetch.
func (b *Broker) Consume(ctx context.Context, provider string) (<-chan consumers.Delivery, error) {
	out := make(chan consumers.Delivery)
	b.wg.Go(func() {
		defer close(out)
		for ctx.Err() == nil {
			if err := b.consumeOnce(ctx, provider, out); err != nil && ctx.Err() == nil {
				b.o.Log.Warn("consumer stopped; resuming", zap.String("queue", b.queue(provider)), zap.Error(err))
				consumers.Sleep(ctx, time.Second)
			}
		}
	})
	return out, nil
}

func (b *Broker) consumeOnce(ctx context.Context, provider string, out chan<- consumers.Delivery) error {
	conn, err := b.consume.get(ctx)
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	// The channel stays open when consumption stops: the core still acks in-flight deliveries on it. It
	// closes with its connection (Broker.Close), or is already dead when the loop ends on an error.
	if err := ch.Qos(b.o.Prefetch, 0, false); err != nil {
		return err
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	cancelled := ch.NotifyCancel(make(chan string, 1))
	tag := "paygate-" + provider + "-" + randomID()
	msgs, err := ch.ConsumeWithContext(context.WithoutCancel(ctx), b.queue(provider), tag, false, false, false, false, nil)
	if err != nil {
		return err
	}
	for {
		select {
		case m, ok := <-msgs:
			if !ok {
				return errors.New("delivery stream closed")
			}
			select {
			case out <- b.wrap(m, provider):
				continue
			case <-ctx.Done():
				_ = m.Nack(false, true) // never handed over: back to the queue
			}
		case err := <-closed:
			return fmt.Errorf("channel closed: %v", err)
		case <-cancelled:
			ch.Close() // its deliveries cannot be acked any more; they are redelivered
			// The session declares the topology on every connect; a cancel on a live connection means a
			// queue was deleted under us, so put it back before consuming again.
			if err := b.declare(conn); err != nil {
				return fmt.Errorf("consumer cancelled by the broker; redeclare: %w", err)
			}
			return errors.New("consumer cancelled by the broker (queue deleted?); topology redeclared")
		case <-ctx.Done():
		}
		// Stopping: no new deliveries; what the broker already sent goes back to the queue. Bounded, so
		// that a broker that does not confirm the cancel cannot hold the shutdown.
		_ = ch.Cancel(tag, false)
		deadline := time.NewTimer(5 * time.Second)
		defer deadline.Stop()
		for {
			select {
			case m, ok := <-msgs:
				if !ok {
					return nil
				}
				_ = m.Nack(false, true)
			case err := <-closed:
				_ = err // stopping: a close now, cleanly or not, ends the drain all the same
				return nil
			case <-deadline.C:
				return nil
			}
		}
	}
}

// Publish sends a job to the exchange with routing key = its route (consumers.Route: the provider, or
// <provider>.high, <provider>.low), persistent, mandatory, and waits for the broker's confirm.
func (b *Broker) Publish(ctx context.Context, provider string, body []byte) error {
	return b.pub.publish(ctx, b.o.Exchange, provider, amqp.Publishing{
		ContentType: "application/json", DeliveryMode: amqp.Persistent, Timestamp: time.Now(), Body: body,
	})
}

// delivery is one message from a provider queue.
type delivery struct {
	m        amqp.Delivery
	b        *Broker
	route    string // its queue's routing key (consumers.Route): a deferred copy comes back by it
	provider string
	class    job.Priority
	received time.Time
}

var _ consumers.Delivery = (*delivery)(nil)

func (b *Broker) wrap(m amqp.Delivery, route string) consumers.Delivery {
	provider, class := consumers.SplitRoute(route)
	return &delivery{m: m, b: b, route: route, provider: provider, class: class, received: time.Now()}
}

func (d *delivery) Body() []byte { return d.m.Body }

func (d *delivery) Attempt() int {
	n, _ := headerInt(d.m.Headers, consumers.HeaderAttempt)
	return int(max(n, 0))
}

func (d *delivery) FirstSeen() time.Time {
	if ms, ok := headerInt(d.m.Headers, consumers.HeaderFirstSeen); ok && ms > 0 {
		return time.UnixMilli(ms)
	}
	return d.received
}

func (d *delivery) Ack(context.Context) error { return d.m.Ack(false) }

func (d *delivery) Requeue(context.Context) error { return d.m.Nack(false, true) }

func (d *delivery) Defer(ctx context.Context, after time.Duration, attempt int, why error) error {
	tier := consumers.Tier(d.b.o.DelayTiers, after)
	h := d.headers(attempt, why)
	h[consumers.HeaderNotBefore] = time.Now().Add(after).UnixMilli()
	return d.republish(ctx, d.b.delay(tier), d.route, h)
}

func (d *delivery) DeadLetter(ctx context.Context, reason consumers.Reason, attempt int, why error) error {
	h := d.headers(attempt, why)
	h[consumers.HeaderReason] = string(reason)
	markDead(h, why)
	return d.republish(ctx, "", d.b.dead(), h)
}

// republish publishes a copy with confirms and acknowledges the original only after the confirm. If the
// copy is not confirmed, the original is returned to its queue after a pause (an error path, not a delay
// mechanism: the pause bounds the loop while the broker refuses publishes).
func (d *delivery) republish(ctx context.Context, exchange, key string, h amqp.Table) error {
	err := d.b.pub.publish(ctx, exchange, key, amqp.Publishing{
		Headers: h, ContentType: d.m.ContentType, ContentEncoding: d.m.ContentEncoding,
		DeliveryMode: amqp.Persistent, MessageId: d.m.MessageId, Timestamp: d.m.Timestamp, Body: d.m.Body,
	})
	if err != nil {
		consumers.Sleep(ctx, time.Second)
		return errors.Join(fmt.Errorf("rabbitmq: publish to %q %q: %w", exchange, key, err), d.m.Nack(false, true))
	}
	return d.m.Ack(false)
}

func (d *delivery) headers(attempt int, why error) amqp.Table {
	h := amqp.Table{}
	for k, v := range d.m.Headers {
		if k != "x-death" && k != headerPublishID { // x-death grows with every tier pass
			h[k] = v
		}
	}
	h[consumers.HeaderAttempt] = int64(attempt)
	h[consumers.HeaderFirstSeen] = d.FirstSeen().UnixMilli()
	h[consumers.HeaderProvider] = d.provider
	if d.class != job.Normal {
		h[consumers.HeaderPriority] = string(d.class)
	}
	if why != nil {
		h[consumers.HeaderError] = consumers.ErrorText(why)
	}
	return h
}

func headerInt(h amqp.Table, key string) (int64, bool) {
	switch v := h[key].(type) {
	case int64:
		return v, true
	case int32:
		return int64(v), true
	case int:
		return int64(v), true
	case int16:
		return int64(v), true
	case int8:
		return int64(v), true
	case uint8:
		return int64(v), true
	case float64:
		if v == math.Trunc(v) {
			return int64(v), true
		}
	case string:
		n, err := strconv.ParseInt(v, 10, 64)
		return n, err == nil
	}
	return 0, false
}

// publisher publishes on a confirm-mode channel of the publishing connection, reopened as needed.
//
// A mandatory message that no queue takes comes back (basic.return) before its ack. amqp091-go delivers
// returns and confirms on separate channels; one goroutine reads both from unbuffered channels, so it
// sees the return of a publish before its confirm, and it resolves each publish by its delivery tag.
type publisher struct {
	s  *session
	mu sync.Mutex // guards ch; held while publishing so delivery tags and waiters line up
	ch *amqp.Channel
	// waiting maps a delivery tag to its publish's outcome; wmu is only ever held briefly, so settle
	// never waits for a publish in progress.
	wmu     sync.Mutex
	waiting map[uint64]*pending
}

type pending struct {
	id   string // x-paygate-publish-id, to match a return
	done chan error
}

func (p *publisher) channel(ctx context.Context) (*amqp.Channel, error) {
	if p.ch != nil && !p.ch.IsClosed() {
		return p.ch, nil
	}
	conn, err := p.s.get(ctx)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return nil, err
	}
	returns := ch.NotifyReturn(make(chan amqp.Return))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation))
	waiting := map[uint64]*pending{}
	p.wmu.Lock()
	p.ch, p.waiting = ch, waiting
	p.wmu.Unlock()
	go p.settle(returns, confirms, waiting)
	return ch, nil
}

// settle resolves the publishes of one channel; when the channel closes, those still waiting fail.
func (p *publisher) settle(returns <-chan amqp.Return, confirms <-chan amqp.Confirmation, waiting map[uint64]*pending) {
	returned := map[string]bool{}
	for returns != nil || confirms != nil {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			if id, isString := r.Headers[headerPublishID].(string); isString {
				returned[id] = true
			}
		case c, ok := <-confirms:
			if !ok {
				confirms = nil
				continue
			}
			p.wmu.Lock()
			w := waiting[c.DeliveryTag]
			delete(waiting, c.DeliveryTag)
			p.wmu.Unlock()
			if w == nil {
				continue
			}
			switch {
			case returned[w.id]:
				delete(returned, w.id)
				w.done <- errors.New("no queue is bound for it (returned)")
			case !c.Ack:
				w.done <- errors.New("broker refused the message (nack)")
			default:
				w.done <- nil
			}
		}
	}
	p.wmu.Lock()
	for tag, w := range waiting {
		delete(waiting, tag)
		w.done <- errors.New("channel closed before the broker confirmed")
	}
	p.wmu.Unlock()
}

func (p *publisher) publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	w := &pending{id: randomID(), done: make(chan error, 1)}
	if msg.Headers == nil {
		msg.Headers = amqp.Table{}
	}
	msg.Headers[headerPublishID] = w.id
	p.mu.Lock()
	ch, err := p.channel(ctx)
	if err != nil {
		p.mu.Unlock()
		return err
	}
	tag := ch.GetNextPublishSeqNo()
	p.wmu.Lock()
	waiting := p.waiting
	waiting[tag] = w
	p.wmu.Unlock()
	if err := ch.PublishWithContext(ctx, exchange, key, true, false, msg); err != nil {
		p.wmu.Lock()
		delete(waiting, tag)
		p.wmu.Unlock()
		p.mu.Unlock()
		return err
	}
	p.mu.Unlock()
	select {
	case err := <-w.done:
		if err != nil {
			return fmt.Errorf("%q %q: %w", exchange, key, err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err() // unconfirmed: the caller does not ack the original
	}
}

// checkTLSURL refuses a URL that a TLS config would not apply to: amqp091-go dials amqp:// in plain
// text whatever the config says, and ignores the URL's TLS parameters when given a config.
func checkTLSURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("rabbitmq: %s", redact(raw))
	}
	if u.Scheme != "amqps" {
		return fmt.Errorf("rabbitmq: a TLS configuration needs an amqps:// URL, got %s://", u.Scheme)
	}
	q := u.Query()
	for _, p := range []string{"cacertfile", "certfile", "keyfile", "server_name_indication"} {
		if q.Has(p) {
			return fmt.Errorf("rabbitmq: the URL's TLS parameter %s would be ignored with a TLS configuration given", p)
		}
	}
	return nil
}

// session keeps one AMQP connection alive: it dials, runs onConnect (topology), and redials with
// exponential backoff and full jitter when the connection closes.
type session struct {
	name      string
	url       string
	tls       *tls.Config // nil: amqp091-go's default for amqps://
	log       *zap.Logger
	onConnect func(*amqp.Connection) error

	mu        sync.Mutex
	conn      *amqp.Connection
	up        chan struct{} // closed while conn is usable
	lastErr   error
	blocked   bool
	connected bool          // once: a refusal before the first connection ends run
	stopped   chan struct{} // closed when run has returned
	failLog   throttle.Log  // "connection failed; retrying", at most once per 10s
}

func newSession(name, url string, tlsc *tls.Config, log *zap.Logger, onConnect func(*amqp.Connection) error) *session {
	return &session{name: name, url: url, tls: tlsc, log: log, onConnect: onConnect, up: make(chan struct{}), stopped: make(chan struct{})}
}

func (s *session) run(ctx context.Context) {
	defer close(s.stopped)
	for attempt := 0; ctx.Err() == nil; attempt++ {
		conn, err := amqp.DialConfig(s.url, amqp.Config{
			Heartbeat:  10 * time.Second,
			Properties: amqp.Table{"connection_name": "paygate-" + s.name},
			// A copy per dial: DialConfig writes the server name into the config it is given, and the
			// two sessions dial concurrently.
			TLSClientConfig: s.tls.Clone(),
		})
		if err == nil && s.onConnect != nil {
			if err = s.onConnect(conn); err != nil {
				conn.Close()
			}
		}
		if err != nil {
			err = refusal(s.url, err)
			var r *Refusal
			s.mu.Lock()
			s.lastErr = err
			first := !s.connected
			s.mu.Unlock()
			if first && errors.As(err, &r) {
				return // the configuration is wrong: Open says so at once
			}
			wait := consumers.Backoff(attempt+1, 100*time.Millisecond, 30*time.Second)
			if attempt > 0 {
				s.failLog.Warn(s.log, time.Now(), "rabbitmq connection failed; retrying", zap.String("connection", s.name), zap.Error(err), zap.Duration("in", wait))
			}
			consumers.Sleep(ctx, wait)
			continue
		}
		closed := conn.NotifyClose(make(chan *amqp.Error, 1))
		blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
		s.mu.Lock()
		s.conn, s.lastErr, s.blocked, s.connected = conn, nil, false, true
		close(s.up)
		s.mu.Unlock()
		if attempt > 0 {
			s.log.Info("rabbitmq reconnected", zap.String("connection", s.name))
		}
		attempt = -1
	watch:
		for {
			select {
			case b := <-blocked:
				s.mu.Lock()
				s.blocked = b.Active
				s.mu.Unlock()
				s.log.Warn("rabbitmq flow control", zap.String("connection", s.name), zap.Bool("blocked", b.Active), zap.String("reason", b.Reason))
			case err := <-closed:
				s.mu.Lock()
				s.up = make(chan struct{})
				s.conn, s.lastErr = nil, fmt.Errorf("connection closed: %v", err)
				s.mu.Unlock()
				if ctx.Err() == nil {
					s.log.Warn("rabbitmq connection lost; reconnecting", zap.String("connection", s.name), zap.Any("error", err))
				}
				break watch
			case <-ctx.Done():
				return
			}
		}
	}
}

// get waits for a usable connection.
func (s *session) get(ctx context.Context) (*amqp.Connection, error) {
	for {
		s.mu.Lock()
		conn, up := s.conn, s.up
		s.mu.Unlock()
		if conn != nil && !conn.IsClosed() {
			return conn, nil
		}
		wait := (<-chan time.Time)(nil)
		if conn != nil { // closed, and the supervisor has not noticed yet: look again shortly
			wait = time.After(10 * time.Millisecond)
		}
		select {
		case <-up:
			if conn != nil {
				<-wait
			}
		case <-wait:
		case <-s.stopped:
			return nil, fmt.Errorf("rabbitmq %s connection closed", s.name)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (s *session) ready() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.conn == nil || s.conn.IsClosed():
		return fmt.Errorf("rabbitmq %s connection down: %v", s.name, s.lastErr)
	case s.blocked:
		return fmt.Errorf("rabbitmq %s connection blocked by flow control", s.name)
	}
	return nil
}

func (s *session) lastError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr
}

// close closes the connection and with it every channel, waiting at most 5s for the broker's reply.
func (s *session) close() {
	s.mu.Lock()
	conn := s.conn
	s.mu.Unlock()
	if conn != nil {
		_ = conn.CloseDeadline(time.Now().Add(5 * time.Second))
	}
}

func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// redact hides the password of an AMQP URL for error messages.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable AMQP URL)"
	}
	return u.Redacted()
}

// Topology is what the adapter declares for an exchange X: the names an operator, a test or the demo
// reads or removes.
type Topology struct {
	Exchange string   // X, direct
	Queues   []string // X.<provider>, in the order given
	Classes  []string // X.<provider>.high and X.<provider>.low, each provider's in the order given
	Delays   []string // X.delay.<tier>: each a fanout exchange and its queue
	Dead     string   // X.dead
	Results  string   // X.results: a topic exchange and its queue (declared with results.enabled)
}

// TopologyOf names the topology Open declares for these providers and delay tiers.
func TopologyOf(exchange string, providers []string, tiers []time.Duration) Topology {
	b := &Broker{o: Options{Exchange: exchange}}
	t := Topology{Exchange: exchange, Dead: b.dead(), Results: Results(exchange)}
	for _, p := range providers {
		t.Queues = append(t.Queues, b.queue(p))
		t.Classes = append(t.Classes, b.queue(consumers.Route(p, job.High)), b.queue(consumers.Route(p, job.Low)))
	}
	for _, d := range tiers {
		t.Delays = append(t.Delays, b.delay(d))
	}
	return t
}

// DeleteTopology removes every queue and exchange of t, with the messages in them. What is already gone
// is not an error.
func DeleteTopology(url string, t Topology) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return fmt.Errorf("rabbitmq: connect %s: %w", redact(url), refusal(url, err))
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	var errs []error
	for _, q := range append(append(append(append([]string(nil), t.Delays...), t.Queues...), t.Classes...), t.Dead, t.Results) {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			errs = append(errs, err)
		}
	}
	for _, x := range append(append([]string(nil), t.Delays...), t.Exchange, t.Results) {
		if err := ch.ExchangeDelete(x, false, false); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Inspector reads how many messages wait in queues (passive declares), for the operator's view: on a
// connection of its own, opened on first use and again after a failure. Safe for concurrent use.
type Inspector struct {
	url string
	tls *tls.Config
	mu  sync.Mutex
	con *amqp.Connection
}

// NewInspector returns an inspector of the broker at url (amqps:// with tlsc, as Options.TLS).
func NewInspector(url string, tlsc *tls.Config) *Inspector { return &Inspector{url: url, tls: tlsc} }

// Depths returns the ready messages of each queue that exists (a missing one is left out).
func (i *Inspector) Depths(queues []string) (map[string]int64, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.con == nil || i.con.IsClosed() {
		con, err := amqp.DialConfig(i.url, amqp.Config{TLSClientConfig: i.tls, Properties: amqp.Table{"connection_name": "paygate-dashboard"}})
		if err != nil {
			return nil, fmt.Errorf("rabbitmq: connect %s: %w", redact(i.url), refusal(i.url, err))
		}
		i.con = con
	}
	out := make(map[string]int64, len(queues))
	var ch *amqp.Channel
	defer func() {
		if ch != nil {
			_ = ch.Close()
		}
	}()
	for _, q := range queues {
		if ch == nil || ch.IsClosed() {
			var err error
			if ch, err = i.con.Channel(); err != nil {
				_ = i.con.Close()
				return nil, fmt.Errorf("rabbitmq: channel: %w", err)
			}
		}
		st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		var ae *amqp.Error
		switch {
		case errors.As(err, &ae) && ae.Code == amqp.NotFound:
			continue // not declared yet (no worker has run): the channel is closed, the next one opens another
		case err != nil:
			_ = i.con.Close()
			return nil, fmt.Errorf("rabbitmq: queue %s: %w", q, err)
		}
		out[q] = int64(st.Messages)
	}
	return out, nil
}

// Close closes the inspector's connection.
func (i *Inspector) Close() error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.con != nil {
		return i.con.Close()
	}
	return nil
}

// routes are the providers' routes (consumers.Routes), each provider's highest class first.
func routes(providers []string) []string {
	var out []string
	for _, p := range providers {
		out = append(out, consumers.Routes(p)...)
	}
	return out
}
