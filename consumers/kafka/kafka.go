// Package kafka is the Kafka adapter of the worker core (segmentio/kafka-go).
//
// Topics derive from the prefix T and are created when missing:
//
//	T.<provider>      jobs for one provider
//	T.<provider>.high its high and low jobs (consumers.Route)
//	T.<provider>.low
//	T.retry.<tier>    deferred jobs; held until their not-before header, then produced back to the topic
//	                  of their provider and class (T.<provider>, T.<provider>.high, T.<provider>.low)
//	T.dead            dead letters, with x-paygate-* headers saying why
//
// One consumer-group member per process subscribes to all of them (kafka-go's ConsumerGroup/Generation
// API, so that each assigned partition is read on its own). Records are never committed before they are
// processed: several records of a partition may be in flight at once (up to the worker's concurrency), and
// only the contiguous prefix of settled offsets is committed, within the generation that read them. When
// a generation ends, its uncommitted records are read again by whoever gets the partition; the gate's
// duplicate admission and the idempotency key absorb the repeat.
package kafka

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"go.uber.org/zap"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/job"
)

// Options configure the adapter.
type Options struct {
	Brokers           []string
	TLS               *tls.Config    // nil: plaintext (Cluster.TLS)
	SASL              sasl.Mechanism // nil: no authentication (Cluster.SASL)
	Group             string
	TopicPrefix       string
	Partitions        int
	ReplicationFactor int
	Providers         []string
	DelayTiers        []time.Duration // ascending
	Results           bool            // create T.results (results.enabled)
	Log               *zap.Logger
}

// Broker is the Kafka adapter: consumers.Broker plus publishing.
type Broker struct {
	o         Options
	writer    *kafkago.Writer
	transport *kafkago.Transport // the writer's

	mu      sync.Mutex
	streams map[string]chan consumers.Delivery // by route (consumers.Route), for the current run
	started bool                               // a run is going
	done    chan struct{}                      // closed when the current run has ended
	ready   error
	// abandon, closed, makes the member leave as a crashed process would. Only the tests close it
	// (Abandon, in export_test.go): a real crash needs no help.
	abandon     chan struct{}
	abandonOnce sync.Once
}

// drainTimeout bounds how long a stopping partition waits for its in-flight records to settle.
const drainTimeout = time.Minute

var _ consumers.Broker = (*Broker)(nil)

// cluster is how every connection of the adapter reaches the brokers.
func (o Options) cluster() Cluster { return Cluster{Brokers: o.Brokers, TLS: o.TLS, SASL: o.SASL} }

// Open creates missing topics and returns the adapter; consumption starts with the first Consume. A
// refusal of the credentials or of a certificate (see ErrAuthentication) fails at once, whatever the
// other brokers would say.
func Open(ctx context.Context, o Options) (*Broker, error) {
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if len(o.DelayTiers) == 0 || len(o.Brokers) == 0 {
		return nil, errors.New("kafka: brokers and at least one delay tier are required")
	}
	o.Partitions, o.ReplicationFactor = max(o.Partitions, 1), max(o.ReplicationFactor, 1)
	b := &Broker{o: o, abandon: make(chan struct{})}
	b.newRun()
	if err := b.createTopics(ctx); err != nil {
		return nil, err
	}
	// The writer's own transport, so that Close can close its connections and stop its metadata goroutine
	// (kafka-go's shared default keeps them for the process's life).
	b.transport = o.cluster().Transport()
	b.writer = &kafkago.Writer{
		Addr:         kafkago.TCP(o.Brokers...),
		Transport:    b.transport,
		Balancer:     &kafkago.Hash{},    // a result by its key, the job id (one partition per id); keyless jobs round-robin
		RequiredAcks: kafkago.RequireAll, // the default (none) would be fire-and-forget
		BatchTimeout: 2 * time.Millisecond,
		MaxAttempts:  5,
	}
	return b, nil
}

// topic is a route's topic (consumers.Route): T.<provider>, T.<provider>.high, T.<provider>.low.
func (b *Broker) topic(route string) string { return b.o.TopicPrefix + "." + route }
func (b *Broker) dead() string              { return b.o.TopicPrefix + ".dead" }
func (b *Broker) retry(tier time.Duration) string {
	return b.o.TopicPrefix + ".retry." + consumers.TierName(tier)
}
func (b *Broker) isRetry(topic string) bool { // a provider named retry has T.retry.high, not a tier
	return strings.HasPrefix(topic, b.o.TopicPrefix+".retry.") && slices.ContainsFunc(b.o.DelayTiers, func(t time.Duration) bool { return b.retry(t) == topic })
}
func (b *Broker) routeOf(topic string) string {
	return strings.TrimPrefix(topic, b.o.TopicPrefix+".")
}

// topics are the topics Open creates: the dead letters, the results (results.enabled), then consumed().
func (b *Broker) topics() []string {
	ts := []string{b.dead()}
	if b.o.Results {
		ts = append(ts, ResultsTopic(b.o.TopicPrefix))
	}
	return append(ts, b.consumed()...)
}

// consumed are the topics the group reads: each provider's (one per class), and each delay tier's.
func (b *Broker) consumed() []string {
	var ts []string
	for _, p := range routes(b.o.Providers) {
		ts = append(ts, b.topic(p))
	}
	for _, t := range b.o.DelayTiers {
		ts = append(ts, b.retry(t))
	}
	return ts
}

func (b *Broker) createTopics(ctx context.Context) error {
	d := b.o.cluster().Dialer()
	var lastErr error
	for _, addr := range b.o.Brokers {
		conn, err := d.DialContext(ctx, "tcp", addr)
		if Refused(err) {
			return wrap("connect", err) // the credentials or a certificate: the other brokers would say the same
		}
		if err != nil {
			lastErr = err
			continue
		}
		defer conn.Close()
		ctrl, err := conn.Controller()
		if err != nil {
			return wrap("find controller", err)
		}
		cc, err := d.DialContext(ctx, "tcp", net.JoinHostPort(ctrl.Host, strconv.Itoa(ctrl.Port)))
		if err != nil {
			return wrap("dial controller", err)
		}
		defer cc.Close()
		var configs []kafkago.TopicConfig
		for _, t := range b.topics() {
			configs = append(configs, kafkago.TopicConfig{Topic: t, NumPartitions: b.o.Partitions, ReplicationFactor: b.o.ReplicationFactor})
		}
		if err := cc.CreateTopics(configs...); err != nil && !errors.Is(err, kafkago.TopicAlreadyExists) {
			return wrap("create topics", err)
		}
		return nil
	}
	return fmt.Errorf("kafka: no broker reachable: %w", lastErr)
}

// Publish produces a job to its route's topic (consumers.Route: T.<provider>, T.<provider>.high,
// T.<provider>.low) and waits for every in-sync replica.
func (b *Broker) Publish(ctx context.Context, route string, body []byte) error {
	return b.writer.WriteMessages(ctx, kafkago.Message{Topic: b.topic(route), Value: body, Time: time.Now()})
}

// Ready reports whether the group is consuming (for /readyz).
func (b *Broker) Ready() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ready
}

// Close waits for a run whose context has ended to finish, then flushes the writer and closes its
// connections.
func (b *Broker) Close() error {
	b.mu.Lock()
	started, done := b.started, b.done
	b.mu.Unlock()
	if started {
		<-done
	}
	err := b.writer.Close()
	b.transport.CloseIdleConnections() // a Writer does not close a transport it was given
	return err
}

// newRun prepares the streams of the next run.
func (b *Broker) newRun() {
	b.streams = map[string]chan consumers.Delivery{}
	for _, r := range routes(b.o.Providers) {
		b.streams[r] = make(chan consumers.Delivery)
	}
	b.done = make(chan struct{})
}

// Consume returns a route's stream (consumers.Route: a provider's, or its high or low jobs'); the first
// call of a run starts the group member, which serves every route's stream until ctx is done, then closes
// them all. A later Consume starts a new run.
func (b *Broker) Consume(ctx context.Context, route string) (<-chan consumers.Delivery, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch, ok := b.streams[route]
	if !ok {
		return nil, fmt.Errorf("kafka: provider %s is not configured", route)
	}
	if !b.started {
		b.started = true
		b.ready = errors.New("kafka: joining the consumer group")
		go b.run(ctx, b.streams, b.done)
	}
	return ch, nil
}

func (b *Broker) setReady(err error) {
	b.mu.Lock()
	b.ready = err
	b.mu.Unlock()
}

// run is the group member: one generation after another until ctx is done.
func (b *Broker) run(ctx context.Context, streams map[string]chan consumers.Delivery, done chan struct{}) {
	defer func() {
		for _, ch := range streams {
			close(ch)
		}
		b.mu.Lock()
		b.started = false
		b.ready = errors.New("kafka: not consuming")
		b.newRun()
		b.mu.Unlock()
		close(done)
	}()
	for ctx.Err() == nil {
		if err := b.member(ctx, streams); err != nil && ctx.Err() == nil {
			b.setReady(fmt.Errorf("kafka: %w", err))
			b.o.Log.Warn("kafka consumer group error; rejoining", zap.Error(err))
			consumers.Sleep(ctx, time.Second)
		}
	}
}

func (b *Broker) member(ctx context.Context, streams map[string]chan consumers.Delivery) error {
	cg, err := kafkago.NewConsumerGroup(kafkago.ConsumerGroupConfig{
		ID:                b.o.Group,
		Brokers:           b.o.Brokers,
		Dialer:            b.o.cluster().Dialer(),
		Topics:            b.consumed(),           // not the dead letters, nor the results
		HeartbeatInterval: 250 * time.Millisecond, // a rebalance is noticed at the next heartbeat
		SessionTimeout:    10 * time.Second,
		RebalanceTimeout:  10 * time.Second,
		JoinGroupBackoff:  200 * time.Millisecond,
		StartOffset:       kafkago.FirstOffset,
		Logger:            nil,
	})
	if err != nil {
		return err
	}
	defer cg.Close()
	for {
		gen, err := cg.Next(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, kafkago.ErrGroupClosed):
			return err
		case errors.Is(err, kafkago.RebalanceInProgress):
			// A member joined or left: the group rejoins with the same member id. Leaving here instead
			// (a new member a second later) would start another rebalance for everyone, and the
			// abandoned member id would hold the next one up to the rebalance timeout.
			b.o.Log.Debug("kafka group rebalancing", zap.Error(err))
			continue
		case err != nil:
			// The group has left and backs off before it joins again by itself: report, and wait for
			// the next generation on the same group.
			b.setReady(fmt.Errorf("kafka: %w", err))
			b.o.Log.Warn("kafka consumer group error; rejoining", zap.Error(err))
			continue
		}
		b.setReady(nil)
		n := 0
		for _, pas := range gen.Assignments {
			n += len(pas)
		}
		b.o.Log.Info("kafka group generation joined", zap.Int32("generation", gen.ID), zap.Int("partitions", n))
		for _, topic := range slices.Sorted(maps.Keys(gen.Assignments)) {
			for _, pa := range gen.Assignments[topic] {
				gen.Start(func(gctx context.Context) { b.partition(ctx, gctx, gen, topic, pa, streams) })
			}
		}
	}
}

// partition reads one assigned partition until the generation (gctx) or the member (ctx) ends.
func (b *Broker) partition(ctx, gctx context.Context, gen *kafkago.Generation, topic string, pa kafkago.PartitionAssignment, streams map[string]chan consumers.Delivery) {
	both, cancel := context.WithCancel(gctx)
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	r := kafkago.NewReader(kafkago.ReaderConfig{
		Brokers: b.o.Brokers, Dialer: b.o.cluster().Dialer(), Topic: topic, Partition: pa.ID, MinBytes: 1, MaxBytes: 4 << 20,
		MaxWait: 500 * time.Millisecond,
	})
	defer r.Close()
	offset := pa.Offset
	if offset < 0 { // no commit yet: from the start
		offset = kafkago.FirstOffset
	}
	if err := r.SetOffset(offset); err != nil {
		b.o.Log.Warn("kafka set offset", zap.String("topic", topic), zap.Int("partition", pa.ID), zap.Error(err))
		return
	}
	t := &tracker{b: b, gen: gen, gctx: gctx, topic: topic, partition: pa.ID, idle: make(chan struct{}, 1),
		commitTo: -1, kick: make(chan struct{}, 1)}
	stopCommits, committed := make(chan struct{}), make(chan struct{})
	go func() { defer close(committed); t.commits(stopCommits) }()
	defer t.loseUncommitted()                          // after the last commit: nothing more will be
	defer func() { close(stopCommits); <-committed }() // the last commit, of what the drain settled
	defer t.drain(gctx, b.abandon)
	for {
		m, err := r.FetchMessage(both)
		if err != nil {
			return // the generation or the member ended
		}
		if b.isRetry(topic) {
			if !b.release(both, m) {
				return
			}
			t.add(m.Offset)
			if err := t.done(m.Offset, nil); err != nil {
				return
			}
			continue
		}
		t.add(m.Offset)
		d := &delivery{m: m, b: b, t: t, route: b.routeOf(topic), received: time.Now()}
		d.provider, d.class = consumers.SplitRoute(d.route)
		t.handOut(1)
		select {
		case streams[d.route] <- d:
		case <-ctx.Done():
			t.handOut(-1)
			return // shutting down: the record stays uncommitted and is read again
		case <-gctx.Done():
			t.handOut(-1)
			return
		}
	}
}

// release holds a retry record until its not-before time, then produces it back to its provider's
// topic for its class (consumers.HeaderPriority). It reports false when the context ended first.
func (b *Broker) release(ctx context.Context, m kafkago.Message) bool {
	h := headers(m.Headers)
	if ms, err := strconv.ParseInt(h[consumers.HeaderNotBefore], 10, 64); err == nil {
		if wait := time.Until(time.UnixMilli(ms)); wait > 0 && !consumers.Sleep(ctx, wait) {
			return false
		}
	}
	provider, class := h[consumers.HeaderProvider], job.Priority(h[consumers.HeaderPriority])
	if !slices.Contains(b.o.Providers, provider) || (class != "" && !job.ValidPriority(class)) {
		// Not ours to route: dead-letter it rather than lose or loop it.
		h[consumers.HeaderReason] = string(consumers.ReasonInvalid)
		h[consumers.HeaderError] = fmt.Sprintf("retry record for unknown provider %q or class %q", provider, class)
		return b.produce(ctx, b.dead(), m.Value, h) == nil
	}
	for ctx.Err() == nil {
		err := b.produce(ctx, b.topic(consumers.Route(provider, class)), m.Value, h)
		if err == nil {
			return true
		}
		b.o.Log.Warn("kafka: could not release a retry record; retrying", zap.Error(err))
		consumers.Sleep(ctx, time.Second)
	}
	return false
}

func (b *Broker) produce(ctx context.Context, topic string, value []byte, h map[string]string) error {
	msg := kafkago.Message{Topic: topic, Value: value, Time: time.Now()}
	for _, k := range slices.Sorted(maps.Keys(h)) {
		msg.Headers = append(msg.Headers, kafkago.Header{Key: k, Value: []byte(h[k])})
	}
	return b.writer.WriteMessages(ctx, msg)
}

// tracker commits the contiguous prefix of settled offsets of one partition, in its generation.
type tracker struct {
	b         *Broker
	gen       *kafkago.Generation
	gctx      context.Context // ends with the generation
	topic     string
	partition int

	mu      sync.Mutex
	pending []int64        // offsets read, in order, not yet committed
	settled map[int64]bool // among pending
	// commitTo is the next offset to commit (the end of the settled prefix), -1 when nothing is new;
	// unconfirmed the lost-ack functions of the offsets before it, which commits sends (kick wakes it)
	commitTo    int64
	unconfirmed []func()
	kick        chan struct{}
	lost        map[int64]func() // among settled: what to call if the ack is lost (consumers.Unconfirmed)
	gaveUp      bool             // loseUncommitted has run: a late ack that cannot commit is lost at once
	out         int              // records handed to the core, not yet settled or requeued
	idle        chan struct{}    // signalled when out drops to 0
}

func (t *tracker) handOut(n int) {
	t.mu.Lock()
	t.out += n
	if t.out == 0 {
		select {
		case t.idle <- struct{}{}:
		default:
		}
	}
	t.mu.Unlock()
}

// drain keeps the generation (and so its commits) alive until the records handed out are settled, the
// generation ends, the member is abandoned, or drainTimeout passes.
func (t *tracker) drain(gctx context.Context, abandon <-chan struct{}) {
	deadline := time.After(drainTimeout)
	for {
		t.mu.Lock()
		out := t.out
		t.mu.Unlock()
		if out <= 0 {
			return
		}
		select {
		case <-t.idle:
		case <-gctx.Done():
			return
		case <-abandon:
			return
		case <-deadline:
			return
		}
	}
}

// loseUncommitted runs, once the partition is given up, what the core asked for each record it acked
// that was never committed (an earlier record was still unsettled): those will be read again.
func (t *tracker) loseUncommitted() {
	t.mu.Lock()
	lost, unconfirmed := t.lost, t.unconfirmed // settled, but after a gap; or contiguous after the last commit
	t.lost, t.unconfirmed, t.commitTo, t.gaveUp = nil, nil, -1, true
	t.mu.Unlock()
	for _, fn := range lost {
		fn()
	}
	for _, fn := range unconfirmed {
		fn()
	}
}

func (t *tracker) add(offset int64) {
	t.mu.Lock()
	t.pending = append(t.pending, offset)
	t.mu.Unlock()
}

// commitEvery is how long a partition's commits gather: a busy partition commits about this often, the
// latest offset whose records are all settled, rather than once per record. A member that dies loses at
// most this much of its commits: those records are read again, and the gate admits them as duplicates.
const commitEvery = 100 * time.Millisecond

// commits sends the partition's commits off the records' path, one at a time and in order: each the
// latest contiguous settled offset, gathered for commitEvery after a record settles, until stop (when it
// sends the last). A commit that fails runs the lost-ack functions of the records it covered.
func (t *tracker) commits(stop <-chan struct{}) {
	for {
		select {
		case <-t.kick:
		case <-stop:
			t.commitNow()
			return
		}
		select {
		case <-time.After(commitEvery):
		case <-stop:
		}
		t.commitNow()
	}
}

func (t *tracker) commitNow() {
	t.mu.Lock()
	to, fns := t.commitTo, t.unconfirmed
	t.commitTo, t.unconfirmed = -1, nil
	t.mu.Unlock()
	if to < 0 {
		return
	}
	if err := t.gen.CommitOffsets(map[string]map[int]int64{t.topic: {t.partition: to}}); err != nil {
		t.b.o.Log.Warn("kafka commit failed; the records will be read again", zap.String("topic", t.topic), zap.Int("partition", t.partition), zap.Error(err))
		for _, fn := range fns { // acked, never committed: they will be read again
			fn()
		}
	}
}

// done marks an offset settled and hands what is now contiguous to the committer (commits). It fails when
// the generation has ended: the record will be read again by whoever holds the partition now.
func (t *tracker) done(offset int64, onLost func()) error {
	if t.gctx.Err() != nil {
		return errors.New("kafka: the consumer group generation ended; the record will be read again")
	}
	t.mu.Lock()
	if t.gaveUp {
		// The partition is given up and its last commit sent: nothing more is committed, this record
		// will be read again by whoever holds the partition now.
		t.mu.Unlock()
		if onLost != nil {
			onLost()
		}
		return nil
	}
	if t.settled == nil {
		t.settled = map[int64]bool{}
	}
	t.settled[offset] = true
	if onLost != nil {
		if t.lost == nil {
			t.lost = map[int64]func(){}
		}
		t.lost[offset] = onLost
	}
	next := int64(-1)
	var committing []func() // lost-ack functions of the offsets this commit covers
	for len(t.pending) > 0 && t.settled[t.pending[0]] {
		if fn := t.lost[t.pending[0]]; fn != nil {
			committing = append(committing, fn)
		}
		delete(t.settled, t.pending[0])
		delete(t.lost, t.pending[0])
		next = t.pending[0] + 1
		t.pending = t.pending[1:]
	}
	if next >= 0 {
		t.commitTo = next
		t.unconfirmed = append(t.unconfirmed, committing...)
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
	t.mu.Unlock()
	return nil
}

// delivery is one record of a provider topic.
type delivery struct {
	m        kafkago.Message
	b        *Broker
	t        *tracker
	route    string // its topic's route (consumers.Route)
	provider string
	class    job.Priority
	received time.Time
	once     sync.Once
	onLost   func()
}

var (
	_ consumers.Delivery    = (*delivery)(nil)
	_ consumers.Unconfirmed = (*delivery)(nil)
)

// OnLostAck registers what to do if this record, once acked, is never committed (consumers.Unconfirmed).
func (d *delivery) OnLostAck(fn func()) { d.onLost = fn }

func (d *delivery) Body() []byte { return d.m.Value }

func (d *delivery) Attempt() int {
	n, _ := strconv.Atoi(headers(d.m.Headers)[consumers.HeaderAttempt])
	return max(n, 0)
}

func (d *delivery) FirstSeen() time.Time {
	if ms, err := strconv.ParseInt(headers(d.m.Headers)[consumers.HeaderFirstSeen], 10, 64); err == nil && ms > 0 {
		return time.UnixMilli(ms)
	}
	return d.received
}

func (d *delivery) settle() error {
	settled, err := false, error(nil)
	d.once.Do(func() { settled = true; err = d.t.done(d.m.Offset, d.onLost); d.t.handOut(-1) })
	if !settled {
		return errors.New("kafka: delivery settled twice")
	}
	return err
}

func (d *delivery) Ack(context.Context) error { return d.settle() }

// Requeue leaves the record uncommitted: it is read again after a restart or rebalance.
func (d *delivery) Requeue(context.Context) error {
	settled := false
	d.once.Do(func() { settled = true; d.t.handOut(-1) })
	if !settled {
		return errors.New("kafka: delivery settled twice")
	}
	return nil
}

func (d *delivery) Defer(ctx context.Context, after time.Duration, attempt int, why error) error {
	h := d.headers(attempt, why)
	h[consumers.HeaderNotBefore] = strconv.FormatInt(time.Now().Add(after).UnixMilli(), 10)
	h[consumers.HeaderProvider] = d.provider
	d.markClass(h)
	if err := d.b.produce(ctx, d.b.retry(consumers.Tier(d.b.o.DelayTiers, after)), d.m.Value, h); err != nil {
		return fmt.Errorf("kafka: defer: %w", err) // uncommitted: read again later
	}
	return d.settle()
}

func (d *delivery) DeadLetter(ctx context.Context, reason consumers.Reason, attempt int, why error) error {
	h := d.headers(attempt, why)
	h[consumers.HeaderReason] = string(reason)
	h[consumers.HeaderProvider] = d.provider
	d.markClass(h)
	markDead(h, why)
	if err := d.b.produce(ctx, d.b.dead(), d.m.Value, h); err != nil {
		return fmt.Errorf("kafka: dead-letter: %w", err)
	}
	return d.settle()
}

func (d *delivery) headers(attempt int, why error) map[string]string {
	h := headers(d.m.Headers)
	h[consumers.HeaderAttempt] = strconv.Itoa(attempt)
	h[consumers.HeaderFirstSeen] = strconv.FormatInt(d.FirstSeen().UnixMilli(), 10)
	delete(h, consumers.HeaderNotBefore)
	if why != nil {
		h[consumers.HeaderError] = consumers.ErrorText(why)
	}
	return h
}

// markClass names a high or low job's class in a deferral's or dead letter's headers, so that it goes
// back to its class's topic.
func (d *delivery) markClass(h map[string]string) {
	if d.class != job.Normal {
		h[consumers.HeaderPriority] = string(d.class)
	}
}

func headers(hs []kafkago.Header) map[string]string {
	out := make(map[string]string, len(hs))
	for _, h := range hs {
		out[h.Key] = string(h.Value)
	}
	return out
}

// Topics is what the adapter creates for a topic prefix T: the names an operator, a test or the demo reads.
type Topics struct {
	Providers []string // T.<provider>, in the order given
	Classes   []string // T.<provider>.high and T.<provider>.low, each provider's in the order given
	Retries   []string // T.retry.<tier>
	Dead      string   // T.dead
	Results   string   // T.results (created with results.enabled)
}

// TopicsOf names the topics Open creates for these providers and delay tiers.
func TopicsOf(prefix string, providers []string, tiers []time.Duration) Topics {
	b := &Broker{o: Options{TopicPrefix: prefix}}
	t := Topics{Dead: b.dead(), Results: ResultsTopic(prefix)}
	for _, p := range providers {
		t.Providers = append(t.Providers, b.topic(p))
		t.Classes = append(t.Classes, b.topic(consumers.Route(p, job.High)), b.topic(consumers.Route(p, job.Low)))
	}
	for _, d := range tiers {
		t.Retries = append(t.Retries, b.retry(d))
	}
	return t
}

// routes are the providers' routes (consumers.Routes), each provider's highest class first.
func routes(providers []string) []string {
	var out []string
	for _, p := range providers {
		out = append(out, consumers.Routes(p)...)
	}
	return out
}
