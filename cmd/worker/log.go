package main

import (
	"context"
	"fmt"
	"io"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/paygate/paygate/config"
)

// newLogger builds the process logger from the log section, writing to w (stderr: stdout carries the
// commands' output). go-redis's own messages (pool dial failures and the like) are routed through it.
func newLogger(c config.Log, w io.Writer) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(c.Level)
	if err != nil {
		return nil, fmt.Errorf("log.level: %w", err)
	}
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	encoder := zapcore.NewJSONEncoder(enc)
	if c.Format == "console" {
		encoder = zapcore.NewConsoleEncoder(enc)
	}
	log := zap.New(zapcore.NewCore(encoder, zapcore.AddSync(w), level))
	redis.SetLogger(redisLogger{log.Named("redis")})
	return log, nil
}

type redisLogger struct{ log *zap.Logger }

func (l redisLogger) Printf(_ context.Context, format string, args ...any) {
	l.log.Warn(fmt.Sprintf(format, args...))
}
