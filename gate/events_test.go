package gate_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
)

// Workers count a provider's 429s and dead letters per minute into Redis; the dashboard reads the minutes
// back, on a single node and on the cluster (the minutes' keys share the provider's hash tag).
func TestEventsCountedPerMinute(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		a, b := twoProcesses(t, rdb, gate.SlidingLog, pol(5, time.Second))
		start := time.Now()
		for range 3 {
			if err := a.CountEvent(ctx, prov, gate.EventThrottled); err != nil {
				t.Fatal(err)
			}
		}
		for range 2 {
			if err := b.CountEvent(ctx, prov, gate.EventDead+"permanent"); err != nil {
				t.Fatal(err)
			}
		}
		minutes, err := b.EventsSince(ctx, prov, start.Add(-2*time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		last := minutes[len(minutes)-1].Minute
		if n := len(minutes); n < 3 || n > 4 || time.Since(last) < 0 || time.Since(last) > time.Minute {
			t.Fatalf("minutes %+v, want the last three (four, if a minute began meanwhile), the current one last", minutes)
		}
		total := map[string]int64{}
		for _, m := range minutes {
			for k, n := range m.Counts {
				total[k] += n
			}
		}
		if total[gate.EventThrottled] != 3 || total[gate.EventDead+"permanent"] != 2 || len(total) != 2 {
			t.Fatalf("counted %v, want 3 throttled and 2 dead:permanent from both processes", total)
		}
		if _, err := a.EventsSince(ctx, "nope", start); err == nil {
			t.Error("an unknown provider: no error")
		}
	})
}
