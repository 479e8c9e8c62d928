package demo

import (
	"context"
	"encoding/json"
	"maps"
	"sync"

	"github.com/paygate/paygate/consumers"
)

// resultCounts tees the workers' results (the demo runs with results.enabled): it counts them by outcome
// and keeps the first as an example for the report, then hands each on to the broker.
type resultCounts struct {
	mu      sync.Mutex
	by      map[string]int
	example json.RawMessage
}

func newResultCounts() *resultCounts { return &resultCounts{by: map[string]int{}} }

// tee wraps a worker's sink.
func (r *resultCounts) tee(next consumers.ResultSink) consumers.ResultSink {
	return teeSink{r, next}
}

type teeSink struct {
	r    *resultCounts
	next consumers.ResultSink
}

func (t teeSink) PublishResult(ctx context.Context, provider, outcome, id string, body []byte) error {
	if err := t.next.PublishResult(ctx, provider, outcome, id, body); err != nil {
		return err
	}
	t.r.mu.Lock()
	defer t.r.mu.Unlock()
	t.r.by[outcome]++
	if t.r.example == nil && outcome == consumers.ResultSucceeded {
		t.r.example = append(json.RawMessage(nil), body...)
	}
	return nil
}

func (r *resultCounts) snapshot() (map[string]int, json.RawMessage) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.by), r.example
}
