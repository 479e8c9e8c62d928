package kafka

import (
	"context"
	"fmt"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"
)

// ResultsTopic is the topic results go to (T.results); a record's key is the job id, its headers name the
// provider and the outcome.
func ResultsTopic(prefix string) string { return prefix + ".results" }

// PublishResult produces a job's result to T.results, keyed by the job id, and waits for every in-sync
// replica.
func (b *Broker) PublishResult(ctx context.Context, provider, outcome, id string, body []byte) error {
	return b.writer.WriteMessages(ctx, kafkago.Message{Topic: ResultsTopic(b.o.TopicPrefix), Key: []byte(id), Value: body,
		Time: time.Now(), Headers: []kafkago.Header{{Key: "provider", Value: []byte(provider)}, {Key: "outcome", Value: []byte(outcome)}}})
}

// Follow reads T.results, every partition from its oldest retained record, without a consumer group
// (nothing is committed, no other reader is disturbed), calls bound once it knows the partitions, and
// hands each record's value to out until ctx ends: for an operator's terminal (`worker results`).
func Follow(ctx context.Context, c Cluster, prefix string, bound func(), out func([]byte)) error {
	topic := ResultsTopic(prefix)
	conn, err := c.Dialer().DialContext(ctx, "tcp", c.Brokers[0])
	if err != nil {
		return wrap("connect", err)
	}
	parts, err := conn.ReadPartitions(topic)
	conn.Close()
	if err != nil {
		return fmt.Errorf("kafka: the partitions of %s: %w", topic, err)
	}
	bound()
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, len(parts))
	for _, p := range parts {
		wg.Go(func() {
			r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: c.Brokers, Dialer: c.Dialer(), Topic: topic, Partition: p.ID,
				MaxWait: 250 * time.Millisecond})
			defer r.Close()
			if err := r.SetOffset(kafkago.FirstOffset); err != nil {
				errs <- err
				return
			}
			for {
				m, err := r.ReadMessage(ctx)
				if err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
				mu.Lock()
				out(m.Value)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		return fmt.Errorf("kafka: reading %s: %w", topic, err)
	default:
		return nil
	}
}
