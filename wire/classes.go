package wire

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// waitingKeys is consumers.Waiting in Redis: <prefix>:{<provider>}:waiting, a string holding until when
// (unix ms) the fleet's low lanes of the provider yield to high and normal deliveries waiting for handlers
// somewhere (set for worker.low_horizon each time, by each process at most every quarter of it). It also
// expires then; the time it holds is what is read, so that a Redis that does not expire keys on its own
// clock (the demo's miniredis) does not hold the lanes for ever.
type waitingKeys struct {
	rdb    redis.UniversalClient
	prefix string
}

// WaitingKey is the key that tells the fleet's low lanes of a provider to yield.
func WaitingKey(prefix, provider string) string { return prefix + ":{" + provider + "}:waiting" }

func (k waitingKeys) NoteWaiting(ctx context.Context, provider string, d time.Duration) error {
	return k.rdb.Set(ctx, WaitingKey(k.prefix, provider), time.Now().Add(d).UnixMilli(), d).Err()
}

func (k waitingKeys) Waiting(ctx context.Context, provider string) (time.Duration, error) {
	ms, err := k.rdb.Get(ctx, WaitingKey(k.prefix, provider)).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return max(time.Until(time.UnixMilli(ms)), 0), nil
}
