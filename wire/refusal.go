package wire

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/consumers/rabbitmq"
	"github.com/paygate/paygate/gate"
)

// rabbitRefusal turns the broker's refusal (see rabbitmq.Refusal: credentials, vhost, not an AMQP URL)
// into a ConfigError naming broker.rabbitmq.url_env and its variable: no retry mends it, so `worker run`
// and the tools stop at once with status 2. Other errors it returns as they are.
func rabbitRefusal(r config.RabbitMQ, err error) error {
	var refused *rabbitmq.Refusal
	if !errors.As(err, &refused) {
		return err
	}
	return ConfigError{fmt.Errorf("broker.rabbitmq.url_env: RabbitMQ refused the URL in $%s: %s", r.URLEnv, refused.What)}
}

// RedisRefusal describes a refusal of Redis (WRONGPASS, NOAUTH, NOPERM, a password the server does not
// want) as a ConfigError naming the setting to fix; other errors, an unreachable server's included, it
// returns as they are. It never shows the password.
func RedisRefusal(r config.Redis, err error) error {
	var re redis.Error
	if err == nil || !errors.As(err, &re) {
		return err
	}
	user := r.Username
	if user == "" {
		user = "default"
	}
	msg := re.Error()
	var setting string
	switch {
	case strings.HasPrefix(msg, "WRONGPASS"):
		setting = fmt.Sprintf("redis.password_env: Redis refused user %q with the password in $%s (WRONGPASS)", user, r.PasswordEnv)
	case strings.HasPrefix(msg, "NOAUTH"):
		setting = fmt.Sprintf("redis.password_env: Redis wants a password (NOAUTH), and $%s is not set", r.PasswordEnv)
		if r.PasswordEnv == "" {
			setting = "redis.password_env: Redis wants a password (NOAUTH); name the variable that holds it"
		}
	case strings.HasPrefix(msg, "NOPERM"):
		setting = fmt.Sprintf("redis.username: user %q lacks a permission the gate needs (%s); it needs its key prefix %q and scripts", user, msg, r.KeyPrefix+":*")
	case strings.HasPrefix(msg, "ERR AUTH") && strings.Contains(msg, "without any password configured"):
		setting = fmt.Sprintf("redis.password_env: $%s holds a password, but Redis has none configured for user %q", r.PasswordEnv, user)
	default:
		return err
	}
	return ConfigError{errors.New(setting)}
}

// CheckRedis asks Redis once, with the gate's own kind of call, so that a refusal stops a command at
// start (a ConfigError from RedisRefusal) instead of deferring every job for ever. An unreachable Redis
// is no refusal: nil, and the worker defers its jobs until Redis answers (a tool's first call fails).
func CheckRedis(ctx context.Context, c *config.Config, rdb redis.UniversalClient, g *gate.Limiter) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	err := rdb.Ping(ctx).Err()
	if err == nil {
		_, err = g.ReadMargin(ctx, c.ProviderNames()[0]) // a script on the gate's keys: NOPERM shows here
	}
	if err = RedisRefusal(c.Redis, err); errors.As(err, new(ConfigError)) {
		return err
	}
	return nil
}

// CheckedGate is a command's Redis client and gate over it (role), Redis asked once (CheckRedis): a
// refusal is a ConfigError, and the client is closed on any error.
func CheckedGate(ctx context.Context, c *config.Config, role Role) (*gate.Limiter, redis.UniversalClient, error) {
	rdb, err := Redis(c)
	if err != nil {
		return nil, nil, err
	}
	l, err := Gate(c, rdb, role)
	if err == nil {
		err = CheckRedis(ctx, c, rdb, l)
	}
	if err != nil {
		_ = rdb.Close()
		return nil, nil, err
	}
	return l, rdb, nil
}
