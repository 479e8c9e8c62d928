package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/paygate/paygate/consumers"
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
// group has not finished), and the dead-letter topic from the start.
func kafkaCensus(ctx context.Context, brokers []string, prefix string, providers []string) (*census, error) {
	c := newCensus()
	cl := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 10 * time.Second}
	var pending []string
	for _, p := range providers {
		pending = append(pending, prefix+"."+p)
	}
	for _, t := range delayTiers {
		pending = append(pending, prefix+".retry."+consumers.TierName(t))
	}
	dead := prefix + ".dead"
	parts := make([]int, partitions)
	for i := range parts {
		parts[i] = i
	}
	fetch := map[string][]int{}
	list := map[string][]kafkago.OffsetRequest{}
	for _, t := range append(pending, dead) {
		fetch[t] = parts
		for _, p := range parts {
			list[t] = append(list[t], kafkago.FirstOffsetOf(p), kafkago.LastOffsetOf(p))
		}
	}
	committed, err := cl.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: prefix, Topics: fetch})
	if err == nil && committed.Error != nil {
		err = committed.Error
	}
	if err != nil {
		return nil, fmt.Errorf("kafka: committed offsets: %w", err)
	}
	ends, err := cl.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: list})
	if err != nil {
		return nil, fmt.Errorf("kafka: list offsets: %w", err)
	}
	from := func(topic string, p int) int64 {
		for _, o := range committed.Topics[topic] {
			if o.Partition == p && o.CommittedOffset >= 0 {
				return o.CommittedOffset
			}
		}
		return -1
	}
	for _, topic := range append(pending, dead) {
		for _, po := range ends.Topics[topic] {
			if po.Error != nil {
				return nil, fmt.Errorf("kafka: offsets of %s/%d: %w", topic, po.Partition, po.Error)
			}
			start := po.FirstOffset
			if f := from(topic, po.Partition); topic != dead && f > start {
				start = f
			}
			err := readPartition(ctx, brokers, topic, po.Partition, start, po.LastOffset, func(m kafkago.Message) {
				if topic != dead {
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
			})
			if err != nil {
				return nil, err
			}
		}
	}
	return c, nil
}

// readPartition hands fn the records of topic/partition at offsets [from, to).
func readPartition(ctx context.Context, brokers []string, topic string, partition int, from, to int64, fn func(kafkago.Message)) error {
	if from >= to {
		return nil
	}
	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: brokers, Topic: topic, Partition: partition, MaxWait: 100 * time.Millisecond})
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

// rabbitCensus takes every message off the demo's delay, provider and dead-letter queues (delay queues
// first: a message expiring meanwhile moves to its provider queue, read next), then deletes the topology.
func rabbitCensus(ctx context.Context, url, exchange string, providers []string) (*census, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	c := newCensus()
	var delays []string
	for _, t := range delayTiers {
		delays = append(delays, exchange+".delay."+consumers.TierName(t))
	}
	var queues []string
	for _, p := range providers {
		queues = append(queues, exchange+"."+p)
	}
	take := func(q string, fn func(amqp.Delivery)) error {
		for ctx.Err() == nil {
			m, ok, err := ch.Get(q, true)
			if err != nil {
				return fmt.Errorf("rabbitmq: get %s: %w", q, err)
			}
			if !ok {
				return nil
			}
			fn(m)
		}
		return ctx.Err()
	}
	for _, q := range append(delays, queues...) {
		if err := take(q, func(m amqp.Delivery) { c.queued[jobID(m.Body)] = true }); err != nil {
			return nil, err
		}
	}
	err = take(exchange+".dead", func(m amqp.Delivery) {
		d := deadLetter{id: jobID(m.Body)}
		d.provider, _ = m.Headers[consumers.HeaderProvider].(string)
		d.reason, _ = m.Headers[consumers.HeaderReason].(string)
		c.dead = append(c.dead, d)
	})
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, q := range append(append(delays, queues...), exchange+".dead") {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			errs = append(errs, err)
		}
	}
	for _, x := range append(delays, exchange) {
		if err := ch.ExchangeDelete(x, false, false); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("rabbitmq: deleting the demo's topology: %w", err)
	}
	return c, nil
}
