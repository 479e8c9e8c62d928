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
func DeleteTopics(ctx context.Context, c Cluster, t Topics) error {
	cl, closeIdle := c.client(10 * time.Second)
	defer closeIdle()
	topics := append(append(append(slices.Clone(t.Providers), t.Classes...), t.Retries...), t.Dead, t.Results)
	res, err := cl.DeleteTopics(ctx, &kafkago.DeleteTopicsRequest{Topics: topics})
	if err != nil {
		return c.explain(ctx, "deleting topics", err)
	}
	for topic, err := range res.Errors {
		if err != nil && err != kafkago.UnknownTopicOrPartition {
			return fmt.Errorf("kafka: deleting %s: %w", topic, err)
		}
	}
	return nil
}

// Lag returns, for each topic, how many records the consumer group has yet to commit: the sum over its
// partitions of the end offset less the group's committed offset (the whole partition where the group
// has committed nothing). For the operator's view (worker dashboard).
func Lag(ctx context.Context, c Cluster, group string, topics []string) (map[string]int64, error) {
	cl, closeIdle := c.client(5 * time.Second)
	defer closeIdle()
	meta, err := cl.Metadata(ctx, &kafkago.MetadataRequest{Topics: topics})
	if err != nil {
		return nil, c.explain(ctx, "metadata", err)
	}
	parts := map[string][]int{}
	ends := map[string][]kafkago.OffsetRequest{}
	for _, t := range meta.Topics {
		if t.Error != nil {
			continue // not created yet
		}
		for _, p := range t.Partitions {
			parts[t.Name] = append(parts[t.Name], p.ID)
			ends[t.Name] = append(ends[t.Name], kafkago.LastOffsetOf(p.ID))
		}
	}
	if len(parts) == 0 {
		return map[string]int64{}, nil
	}
	last, err := cl.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: ends})
	if err != nil {
		return nil, fmt.Errorf("kafka: end offsets: %w", err)
	}
	committed, err := cl.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: group, Topics: parts})
	if err != nil {
		return nil, fmt.Errorf("kafka: group %s offsets: %w", group, err)
	}
	done := map[string]map[int]int64{}
	for t, ps := range committed.Topics {
		done[t] = map[int]int64{}
		for _, p := range ps {
			if p.Error == nil && p.CommittedOffset >= 0 {
				done[t][p.Partition] = p.CommittedOffset
			}
		}
	}
	out := make(map[string]int64, len(parts))
	for t, ps := range last.Topics {
		for _, p := range ps {
			if p.Error != nil {
				return nil, fmt.Errorf("kafka: end offset of %s/%d: %w", t, p.Partition, p.Error)
			}
			out[t] += max(0, p.LastOffset-done[t][p.Partition])
		}
	}
	return out, nil
}

// client is a kafkago.Client of the cluster on a transport of its own, and what closes its connections.
func (c Cluster) client(timeout time.Duration) (*kafkago.Client, func()) {
	tr := c.Transport()
	return &kafkago.Client{Addr: kafkago.TCP(c.Brokers...), Timeout: timeout, Transport: tr}, tr.CloseIdleConnections
}
