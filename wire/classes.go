package wire

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// waitingKeys is consumers.Waiting in Redis: <prefix>:{<provider>}:waiting, a string whose time to live
// is how long the fleet's low lanes of the provider still yield to high and normal deliveries waiting for
// handlers somewhere (set for worker.low_horizon each time, by each process at most every quarter of it).
type waitingKeys struct {
	rdb    redis.UniversalClient
	prefix string
}

// WaitingKey is the key that tells the fleet's low lanes of a provider to yield.
func WaitingKey(prefix, provider string) string { return prefix + ":{" + provider + "}:waiting" }

func (k waitingKeys) NoteWaiting(ctx context.Context, provider string, d time.Duration) error {
	return k.rdb.Set(ctx, WaitingKey(k.prefix, provider), 1, d).Err()
}

func (k waitingKeys) Waiting(ctx context.Context, provider string) (time.Duration, error) {
	d, err := k.rdb.PTTL(ctx, WaitingKey(k.prefix, provider)).Result()
	if err != nil || d < 0 { // -2: no key, -1: no expiry (never set so)
		return 0, err
	}
	return d, nil
}
