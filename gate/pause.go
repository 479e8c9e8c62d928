package gate

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/lua"
)

var pauseScript = redis.NewScript(lua.Pause)

// Pause makes every worker's next decisions for the provider wait until `until` (say, after a 429 with
// Retry-After), and announces the pause (AnnouncePause) to the holders of earlier reservations. Only the
// length of the pause crosses to Redis: it is counted from the Redis clock, so the caller's clock never
// enters a decision. A shorter pause never cuts a longer one short.
func (l *Limiter) Pause(ctx context.Context, providerName string, until time.Time) error {
	p, err := l.provider(providerName)
	if err != nil {
		return err
	}
	d := time.Until(until)
	if d <= 0 {
		return nil
	}
	if err := pauseScript.Run(ctx, l.rdb, []string{p.keys.pause, p.keys.breaker}, micros(min(d, MaxHorizon)), l.channel, providerName).Err(); err != nil {
		return fmt.Errorf("gate: pause %s: %w", providerName, err)
	}
	return nil
}
