package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/job"
)

// MarksTopic is where the operator's tools record what became of T.dead's records (T.dead.marks): a topic
// cannot lose a record, so a dead letter replayed or purged stays in T.dead, and its mark says so. One
// partition, compacted: the latest mark of each dead letter is kept for as long as the topic lives. A
// record's key is the dead letter's place, "<partition>/<offset>"; its value a deadMark.
func MarksTopic(prefix string) string { return prefix + ".dead.marks" }

// deadMark is a mark's value (JSON).
type deadMark struct {
	State consumers.DeadState `json:"state"`
	// DeadAt is the dead letter's record time (unix ms): a mark applies only to the record it was made
	// for, should T.dead be deleted and its offsets used again.
	DeadAt int64  `json:"dead_at"`
	ID     string `json:"id,omitempty"` // the job's id, for a reader of the topic
	At     string `json:"at"`           // when the mark was made, RFC 3339
}

// markDead adds to a dead letter's headers the provider's status, when it answered (a record's time is
// when it died).
func markDead(h map[string]string, why error) {
	delete(h, consumers.HeaderStatus)
	if st := consumers.StatusOf(why); st > 0 {
		h[consumers.HeaderStatus] = strconv.Itoa(st)
	}
}

// Dead is T.dead as the operator's tools handle it (worker dead list|replay|purge), with its marks.
type Dead struct {
	b *Broker
	// marks writes to T.dead.marks, on a transport of its own: the broker's writer may have cached the
	// cluster's topics before T.dead.marks was created
	marks     *kafkago.Writer
	transport *kafkago.Transport
}

var _ consumers.DeadLetters = (*Dead)(nil)

// Dead returns the broker's dead letters, T.dead, creating T.dead.marks when it is missing.
func (b *Broker) Dead(ctx context.Context) (*Dead, error) {
	cl, closeIdle := b.o.cluster().client(10 * time.Second)
	defer closeIdle()
	res, err := cl.CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: []kafkago.TopicConfig{{
		Topic: MarksTopic(b.o.TopicPrefix), NumPartitions: 1, ReplicationFactor: b.o.ReplicationFactor,
		ConfigEntries: []kafkago.ConfigEntry{{ConfigName: "cleanup.policy", ConfigValue: "compact"}},
	}}})
	if err != nil {
		return nil, b.o.cluster().explain(ctx, "creating "+MarksTopic(b.o.TopicPrefix), err)
	}
	for topic, err := range res.Errors {
		if err != nil && !errors.Is(err, kafkago.TopicAlreadyExists) {
			return nil, fmt.Errorf("kafka: creating %s: %w", topic, err)
		}
	}
	tr := b.o.cluster().Transport()
	w := &kafkago.Writer{Addr: kafkago.TCP(b.o.Brokers...), Transport: tr, RequiredAcks: kafkago.RequireAll,
		BatchTimeout: 2 * time.Millisecond, MaxAttempts: 5}
	return &Dead{b: b, marks: w, transport: tr}, nil
}

// Close closes the marks' writer and its connections (the broker stays open).
func (d *Dead) Close() error {
	err := d.marks.Close()
	d.transport.CloseIdleConnections()
	return err
}

// Scan reads T.dead.marks, then every record T.dead holds when it starts, each partition from its oldest
// record, without a consumer group; it sorts them (consumers.SortDead: by record time) and hands them to
// visit, each with the state its latest mark gives (dead without one).
func (d *Dead) Scan(ctx context.Context, visit func(consumers.DeadLetter) (bool, error)) error {
	marks := map[string]deadMark{}
	err := d.read(ctx, MarksTopic(d.b.o.TopicPrefix), func(m kafkago.Message) {
		var mk deadMark
		if json.Unmarshal(m.Value, &mk) == nil {
			marks[string(m.Key)] = mk
		}
	})
	if err != nil {
		return err
	}
	var letters []consumers.DeadLetter
	err = d.read(ctx, d.b.dead(), func(m kafkago.Message) {
		l := &deadLetter{d: d, m: m, info: d.infoOf(m)}
		if mk, ok := marks[l.key()]; ok && mk.DeadAt == m.Time.UnixMilli() {
			l.info.State = mk.State
		}
		letters = append(letters, l)
	})
	if err != nil {
		return err
	}
	return consumers.VisitDead(letters, visit)
}

// read hands fn every record a topic holds now, partition by partition, in offset order.
func (d *Dead) read(ctx context.Context, topic string, fn func(kafkago.Message)) error {
	ends, err := d.ends(ctx, topic)
	if err != nil {
		return err
	}
	for _, p := range slices.Sorted(maps.Keys(ends)) {
		if err := d.readPartition(ctx, topic, p, ends[p], fn); err != nil {
			return err
		}
	}
	return nil
}

// ends are the first and last offsets (the next to be written) of each partition of a topic.
func (d *Dead) ends(ctx context.Context, topic string) (map[int][2]int64, error) {
	cl, closeIdle := d.b.o.cluster().client(10 * time.Second)
	defer closeIdle()
	meta, err := cl.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, d.b.o.cluster().explain(ctx, "metadata of "+topic, err)
	}
	var reqs []kafkago.OffsetRequest
	for _, t := range meta.Topics {
		if t.Error != nil {
			return nil, fmt.Errorf("kafka: %s: %w", topic, t.Error)
		}
		for _, p := range t.Partitions {
			reqs = append(reqs, kafkago.FirstOffsetOf(p.ID), kafkago.LastOffsetOf(p.ID))
		}
	}
	res, err := cl.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("kafka: offsets of %s: %w", topic, err)
	}
	out := map[int][2]int64{}
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("kafka: offsets of %s/%d: %w", topic, p.Partition, p.Error)
		}
		out[p.Partition] = [2]int64{p.FirstOffset, p.LastOffset}
	}
	return out, nil
}

// readPartition hands fn the records of one partition from offset span[0] up to span[1] (not included).
func (d *Dead) readPartition(ctx context.Context, topic string, partition int, span [2]int64, fn func(kafkago.Message)) error {
	if span[0] >= span[1] {
		return nil
	}
	// A short MaxWait: the reader fetches ahead past the last record, and Close waits for that fetch, which
	// the broker holds up to MaxWait on a partition with nothing more (with 250ms, a scan took 600ms).
	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: d.b.o.Brokers, Dialer: d.b.o.cluster().Dialer(), Topic: topic,
		Partition: partition, MaxWait: 20 * time.Millisecond})
	defer r.Close()
	if err := r.SetOffset(span[0]); err != nil {
		return fmt.Errorf("kafka: %s/%d: %w", topic, partition, err)
	}
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return fmt.Errorf("kafka: reading %s/%d: %w", topic, partition, err)
		}
		fn(m)
		// Done at the end it had when the scan began, or at the partition's end should that record be
		// gone (compacted away, past the retention).
		if m.Offset >= span[1]-1 || m.Offset+1 >= m.HighWaterMark {
			return nil
		}
	}
}

// infoOf reads a dead letter's headers; its time is when it died.
func (d *Dead) infoOf(m kafkago.Message) consumers.DeadInfo {
	h := headers(m.Headers)
	num := func(k string) int { n, _ := strconv.Atoi(h[k]); return n }
	info := consumers.DeadInfo{
		Where: fmt.Sprintf("%s/%d/%d", m.Topic, m.Partition, m.Offset), Provider: h[consumers.HeaderProvider],
		Priority: job.Priority(h[consumers.HeaderPriority]),
		Reason:   consumers.Reason(h[consumers.HeaderReason]), Error: h[consumers.HeaderError], Status: num(consumers.HeaderStatus),
		Attempt: num(consumers.HeaderAttempt), DeadAt: m.Time, Replays: num(consumers.HeaderReplays),
		State: consumers.DeadStateDead, Body: m.Value,
	}
	if ms, err := strconv.ParseInt(h[consumers.HeaderFirstSeen], 10, 64); err == nil && ms > 0 {
		info.FirstSeen = time.UnixMilli(ms)
	}
	return info
}

// deadLetter is one record of T.dead, read by a scan.
type deadLetter struct {
	d    *Dead
	m    kafkago.Message
	info consumers.DeadInfo
}

func (l *deadLetter) Info() consumers.DeadInfo { return l.info }

func (l *deadLetter) key() string { return fmt.Sprintf("%d/%d", l.m.Partition, l.m.Offset) }

// Replay produces a copy to its route's topic (T.<provider>, or T.<provider>.high or .low for the class it
// died in; acknowledged by every in-sync replica), then marks the dead
// letter replayed. Killed between the two, the dead letter stays unmarked, and a second replay sends the
// job again under its id and idempotency key.
func (l *deadLetter) Replay(ctx context.Context) error {
	if l.info.State != consumers.DeadStateDead {
		return fmt.Errorf("kafka: dead letter %s is %s already", l.info.Where, l.info.State)
	}
	if l.info.Provider == "" {
		return fmt.Errorf("kafka: dead letter %s names no provider", l.info.Where)
	}
	h := map[string]string{}
	for k, v := range headers(l.m.Headers) {
		if consumers.ReplayHeader(k) {
			h[k] = v
		}
	}
	h[consumers.HeaderReplays] = strconv.Itoa(l.info.Replays + 1)
	h[consumers.HeaderFirstSeen] = strconv.FormatInt(time.Now().UnixMilli(), 10)
	topic := l.d.b.topic(consumers.Route(l.info.Provider, l.info.Priority))
	if err := l.d.b.produce(ctx, topic, l.m.Value, h); err != nil {
		return fmt.Errorf("kafka: replay to %s: %w", topic, err)
	}
	return l.mark(ctx, consumers.DeadStateReplayed)
}

// Purge marks the dead letter purged.
func (l *deadLetter) Purge(ctx context.Context) error {
	if l.info.State != consumers.DeadStateDead {
		return fmt.Errorf("kafka: dead letter %s is %s already", l.info.Where, l.info.State)
	}
	return l.mark(ctx, consumers.DeadStatePurged)
}

func (l *deadLetter) mark(ctx context.Context, state consumers.DeadState) error {
	var job struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(l.m.Value, &job)
	v, _ := json.Marshal(deadMark{State: state, DeadAt: l.m.Time.UnixMilli(), ID: job.ID, At: time.Now().UTC().Format(time.RFC3339Nano)})
	err := l.d.marks.WriteMessages(ctx, kafkago.Message{Topic: MarksTopic(l.d.b.o.TopicPrefix), Key: []byte(l.key()), Value: v, Time: time.Now()})
	if err != nil {
		return fmt.Errorf("kafka: marking %s %s in %s: %w", l.info.Where, state, MarksTopic(l.d.b.o.TopicPrefix), err)
	}
	l.info.State = state
	return nil
}
