package wire

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/paygate/paygate/internal/throttle"
)

// LogRedis sends go-redis's own lines (its pool's: a dial that failed, a connection dropped) to log, at
// warn level, through the rate limit of the worker's other repeated warnings: at most one per 10s, with
// how many were swallowed. go-redis has one logger per process; `worker run` sets it once.
func LogRedis(log *zap.Logger) {
	redis.SetLogger(&redisLogger{log: log.Named("go-redis")})
}

type redisLogger struct {
	log *zap.Logger
	th  throttle.Log
}

func (l *redisLogger) Printf(_ context.Context, format string, v ...any) {
	if ok, missed := l.th.Allow(time.Now()); ok {
		l.log.Warn(fmt.Sprintf(format, v...), zap.Int("suppressed_since_last", missed))
	}
}
