package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/consumers/kafka"
	"github.com/paygate/paygate/wire"
)

// census is what a broker holds once the workers have stopped: jobs still queued (provider queues and
// delay tiers) and the dead letters. It reads the topology by its public names, as an operator would.
type census struct {
	queued map[string]bool // job ids
	dead   []deadLetter
}

type deadLetter struct {
	id, provider, reason string
}

func newCensus() *census { return &census{queued: map[string]bool{}} }

// jobID reads a job's id from a body as loosely as possible: dead letters may be anything.
func jobID(body []byte) string {
	var j struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(body, &j)
	return j.ID
}

// kafkaCensus reads every provider and retry topic from the group's committed offsets to the end (what the
// group has not finished), and the dead-letter topic from the start; then it deletes the demo's topics.
func kafkaCensus(ctx context.Context, cfg *config.Config) (c *census, err error) {
	c = newCensus()
	group := cfg.Broker.Kafka.Group
	cluster, err := wire.KafkaCluster(cfg, wire.Options{})
	if err != nil {
		return nil, err
	}
	tr := cluster.Transport()
	defer tr.CloseIdleConnections()
	names := wire.BrokerNames(cfg)
	k := kafkaTopics{
		cluster: cluster,
		cl:      &kafkago.Client{Addr: kafkago.TCP(cluster.Brokers...), Timeout: 10 * time.Second, Transport: tr},
		names:   append(append(append(slices.Clone(names.Providers), names.Classes...), names.Delays...), names.Dead),
		dead:    names.Dead,
	}
	defer func() {
		if derr := wire.DeleteBroker(context.WithoutCancel(ctx), cfg, wire.Options{}); derr != nil && err == nil {
			err = fmt.Errorf("demo: deleting the demo's topics: %w", derr)
		}
	}()
	fetch, list, err := k.partitions(ctx)
	if err != nil {
		return nil, err
	}
	committed, err := k.cl.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: group, Topics: fetch})
	if err == nil && committed.Error != nil {
		err = committed.Error
	}
	if err != nil {
		return nil, fmt.Errorf("kafka: committed offsets: %w", err)
	}
	ends, err := k.cl.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: list})
	if err != nil {
		return nil, fmt.Errorf("kafka: list offsets: %w", err)
	}
	for _, topic := range k.names {
		if err := k.readTopic(ctx, c, topic, len(fetch[topic]), ends.Topics[topic], committed); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// kafkaTopics are the demo's topics on a cluster, as a census reads them.
type kafkaTopics struct {
	cluster kafka.Cluster
	cl      *kafkago.Client
	names   []string // provider topics, retry topics, then the dead-letter topic
	dead    string
}

// partitions reads the topics' partitions from the metadata: for each topic, their ids (to fetch the
// committed offsets) and the requests for their first and last offsets.
func (k kafkaTopics) partitions(ctx context.Context) (fetch map[string][]int, list map[string][]kafkago.OffsetRequest, err error) {
	meta, err := k.cl.Metadata(ctx, &kafkago.MetadataRequest{Topics: k.names})
	if err != nil {
		return nil, nil, fmt.Errorf("kafka: metadata: %w", err)
	}
	fetch = map[string][]int{}
	list = map[string][]kafkago.OffsetRequest{}
	for _, t := range meta.Topics {
		if t.Error != nil {
			return nil, nil, fmt.Errorf("kafka: metadata of %s: %w", t.Name, t.Error)
		}
		for _, p := range t.Partitions {
			fetch[t.Name] = append(fetch[t.Name], p.ID)
			list[t.Name] = append(list[t.Name], kafkago.FirstOffsetOf(p.ID), kafkago.LastOffsetOf(p.ID))
		}
	}
	if len(fetch) != len(k.names) {
		return nil, nil, fmt.Errorf("kafka: metadata names %d of the demo's %d topics", len(fetch), len(k.names))
	}
	return fetch, list, nil
}

// readTopic adds to c the records of a topic's partitions (want of them, with offsets ends): a provider or
// retry topic from the group's committed offset, the dead-letter topic from its start.
func (k kafkaTopics) readTopic(ctx context.Context, c *census, topic string, want int, ends []kafkago.PartitionOffsets,
	committed *kafkago.OffsetFetchResponse) error {
	if got := len(ends); got != want {
		return fmt.Errorf("kafka: offsets of %d of the %d partitions of %s", got, want, topic)
	}
	dead := topic == k.dead
	for _, po := range ends {
		if po.Error != nil {
			return fmt.Errorf("kafka: offsets of %s/%d: %w", topic, po.Partition, po.Error)
		}
		start := max(po.FirstOffset, 0)
		if f := committedOffset(committed, topic, po.Partition); !dead && f > start {
			start = f
		}
		err := readPartition(ctx, k.cluster, topic, po.Partition, start, po.LastOffset, func(m kafkago.Message) { c.addRecord(m, dead) })
		if err != nil {
			return err
		}
	}
	return nil
}

// committedOffset is the group's committed offset of topic/partition (-1: nothing committed).
func committedOffset(committed *kafkago.OffsetFetchResponse, topic string, partition int) int64 {
	for _, o := range committed.Topics[topic] {
		if o.Partition == partition {
			return o.CommittedOffset // -1: nothing committed
		}
	}
	return -1
}

// addRecord counts a Kafka record: a job still queued, or (dead) a dead letter with the provider and reason
// its headers carry.
func (c *census) addRecord(m kafkago.Message, dead bool) {
	if !dead {
		c.queued[jobID(m.Value)] = true
		return
	}
	d := deadLetter{id: jobID(m.Value)}
	for _, h := range m.Headers {
		switch h.Key {
		case consumers.HeaderProvider:
			d.provider = string(h.Value)
		case consumers.HeaderReason:
			d.reason = string(h.Value)
		}
	}
	c.dead = append(c.dead, d)
}

// readPartition hands fn the records of topic/partition at offsets [from, to).
func readPartition(ctx context.Context, cluster kafka.Cluster, topic string, partition int, from, to int64, fn func(kafkago.Message)) error {
	if from >= to {
		return nil
	}
	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: cluster.Brokers, Dialer: cluster.Dialer(), Topic: topic, Partition: partition,
		MaxWait: 100 * time.Millisecond})
	defer r.Close()
	if err := r.SetOffset(from); err != nil {
		return err
	}
	for {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			return fmt.Errorf("kafka: read %s/%d at %d of [%d, %d): %w", topic, partition, r.Offset(), from, to, err)
		}
		fn(m)
		if m.Offset+1 >= to {
			return nil
		}
	}
}

// rabbitCensus takes every message off the demo's delay, provider and dead-letter queues, then deletes the
// topology. Delay queues go first (a message expiring meanwhile moves to its provider queue, read next);
// and since a message being dead-lettered from a delay queue is briefly in neither, passes repeat until
// two in a row find nothing and every queue reports empty.
func rabbitCensus(ctx context.Context, url string, cfg *config.Config, secret func(string) string) (c *census, err error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	topo := wire.BrokerNames(cfg)
	defer func() {
		if derr := wire.DeleteBroker(context.WithoutCancel(ctx), cfg, wire.Options{Secret: secret}); derr != nil && err == nil {
			err = fmt.Errorf("demo: deleting the demo's topology: %w", derr)
		}
	}()
	all := append(append(append(slices.Clone(topo.Delays), topo.Providers...), topo.Classes...), topo.Dead)
	c = newCensus()
	take := func(q string) (int, error) {
		n := 0
		for ctx.Err() == nil {
			m, ok, err := ch.Get(q, true)
			if err != nil {
				return n, fmt.Errorf("rabbitmq: get %s: %w", q, err)
			}
			if !ok {
				return n, nil
			}
			n++
			if q != topo.Dead {
				c.queued[jobID(m.Body)] = true
				continue
			}
			d := deadLetter{id: jobID(m.Body)}
			d.provider, _ = m.Headers[consumers.HeaderProvider].(string)
			d.reason, _ = m.Headers[consumers.HeaderReason].(string)
			c.dead = append(c.dead, d)
		}
		return n, ctx.Err()
	}
	for quiet := 0; quiet < 2; {
		found := 0
		for _, q := range all {
			n, err := take(q)
			if err != nil {
				return nil, err
			}
			found += n
			st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
			if err != nil {
				return nil, fmt.Errorf("rabbitmq: inspect %s: %w", q, err)
			}
			found += st.Messages
		}
		if found == 0 {
			quiet++
		} else {
			quiet = 0
		}
		consumers.Sleep(ctx, 200*time.Millisecond)
	}
	return c, nil
}
