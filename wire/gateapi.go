package wire

import (
	"context"
	"crypto/tls"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/gateapi"
)

// GateService is `worker gate serve`'s parts: the API's handler over a gate of its own, the TLS it
// serves with (nil: plain HTTP), and Close for its Redis client.
type GateService struct {
	Handler http.Handler
	TLS     *tls.Config
	Redis   redis.UniversalClient
}

// Close closes the service's Redis client.
func (s *GateService) Close() { _ = s.Redis.Close() }

// BuildGateService builds the gate's HTTP API from c: a gate as the workers build theirs (the warm-up and
// the batched calls included), the bearer tokens of gate_service.tokens_env, the TLS of gate_service. A
// missing token or a refused Redis is a ConfigError.
func BuildGateService(ctx context.Context, c *config.Config, reg *prometheus.Registry, o Options) (*GateService, error) {
	tokens, err := c.GateService.Tokens()
	if err != nil {
		return nil, ConfigError{err}
	}
	tlsc, err := c.GateService.ServerTLS()
	if err != nil {
		return nil, ConfigError{err}
	}
	g, rdb, err := CheckedGate(ctx, c, Worker)
	if err != nil {
		return nil, err
	}
	ready := func(ctx context.Context) error { return RedisRefusal(c.Redis, rdb.Ping(ctx).Err()) }
	h := gateapi.New(gateapi.Options{Gate: g, Tokens: tokens, Registry: reg, Ready: ready, Log: o.log().Named("gate-api")})
	return &GateService{Handler: h, TLS: tlsc, Redis: rdb}, nil
}
