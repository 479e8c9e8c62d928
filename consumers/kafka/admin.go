package kafka

import (
	"context"
	"fmt"
	"slices"
	"time"

	kafkago "github.com/segmentio/kafka-go"
)

// DeleteTopics removes every topic of t, with the records in them: for demos, benchmarks and tests that
// made their own. Topics already gone are not an error.
func DeleteTopics(ctx context.Context, brokers []string, t Topics) error {
	tr := &kafkago.Transport{}
	defer tr.CloseIdleConnections()
	cl := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 10 * time.Second, Transport: tr}
	topics := append(append(slices.Clone(t.Providers), t.Retries...), t.Dead)
	res, err := cl.DeleteTopics(ctx, &kafkago.DeleteTopicsRequest{Topics: topics})
	if err != nil {
		return fmt.Errorf("kafka: deleting topics: %w", err)
	}
	for topic, err := range res.Errors {
		if err != nil && err != kafkago.UnknownTopicOrPartition {
			return fmt.Errorf("kafka: deleting %s: %w", topic, err)
		}
	}
	return nil
}
