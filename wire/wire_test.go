package wire_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/internal/testenv"
	"github.com/paygate/paygate/providers/sim"
	"github.com/paygate/paygate/wire"
)

// testConfig is a worker's configuration for one provider, acme, at these limits, on RabbitMQ, under a
// fresh prefix: config's defaults but for those below.
func testConfig(t *testing.T, url string, limits ...config.Limit) *config.Config {
	t.Helper()
	name := fmt.Sprintf("wire-test-%d", time.Now().UnixNano())
	c := config.Default()
	c.Redis.Addrs, c.Redis.KeyPrefix = []string{testenv.RedisAddr()}, name
	c.Broker.RabbitMQ.URLEnv, c.Broker.RabbitMQ.Exchange, c.Broker.RabbitMQ.Prefetch = "WIRE_TEST_AMQP_URL", name, 8
	w := &c.Worker
	w.Concurrency, w.MaxDeferralAge, w.ShutdownTimeout, w.DelayTiers = 4, time.Hour, 5*time.Second, []time.Duration{2 * time.Second, 7 * time.Second, time.Hour}
	c.Providers["acme"] = config.Provider{URL: url, Timeout: 5 * time.Second, Limits: limits}.WithDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return c
}

// Every derived setting comes from the configuration, once.
func TestCore(t *testing.T) {
	c := testConfig(t, "http://127.0.0.1:1/pay", config.Limit{Requests: 3000, Per: time.Minute}, config.Limit{Requests: 100, Per: time.Second})
	got := wire.Core(c)
	if got.LowHorizon != 500*time.Millisecond { // worker.low_horizon's default, within max_inline_wait
		t.Fatalf("low horizon %v", got.LowHorizon)
	}
	if got.BackoffBase != 2*time.Second || got.BackoffMax != time.Hour || got.RedisRetry != 2*time.Second {
		t.Errorf("backoff %s..%s, redis retry %s: want the first and last delay tiers (2s..1h, 2s)", got.BackoffBase, got.BackoffMax, got.RedisRetry)
	}
	if got.LateLimit != 10*time.Millisecond {
		t.Errorf("late limit %s, want half the margin, 10ms", got.LateLimit)
	}
	if got.Providers["acme"] != 100 {
		t.Errorf("largest cost %d, want the smallest limit, 100", got.Providers["acme"])
	}
	if got.Concurrency != 4 || got.MaxInlineWait != 5*time.Second || got.MaxAttempts != 8 || got.MaxDeferralAge != time.Hour || got.ShutdownTimeout != 5*time.Second {
		t.Errorf("worker settings not carried over: %+v", got)
	}
}

// A worker's gate warms up a state it finds missing; an operator's tool asks plainly.
func TestGateRoles(t *testing.T) {
	c := testConfig(t, "http://127.0.0.1:1/pay", config.Limit{Requests: 10, Per: time.Second})
	rdb, err := wire.Redis(c)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	ctx := context.Background()
	tool, err := wire.Gate(c, rdb, wire.Tool)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := tool.Reserve(ctx, "acme", "tool-1", 1, 0); err != nil || !v.Allowed {
		t.Fatalf("tool on a fresh state: %+v, %v; want admitted now", v, err)
	}
	c.Redis.KeyPrefix += "-worker"
	worker, err := wire.Gate(c, rdb, wire.Worker)
	if err != nil {
		t.Fatal(err)
	}
	v, err := worker.Reserve(ctx, "acme", "worker-1", 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if v.Allowed || v.RetryAfter < time.Second {
		t.Fatalf("worker on a fresh state: %+v; want held for the warm-up (the 1s window and more)", v)
	}
}

// A configuration error is marked as one; a missing secret names its variable, not a value.
func TestConfigErrors(t *testing.T) {
	c := testConfig(t, "http://127.0.0.1:1/pay", config.Limit{Requests: 10, Per: time.Second})
	_, err := wire.OpenBroker(context.Background(), c, wire.Options{Secret: func(string) string { return "" }})
	var ce wire.ConfigError
	if !errors.As(err, &ce) || err.Error() != "broker.rabbitmq.url_env: environment variable WIRE_TEST_AMQP_URL is not set (amqp://user:pass@host:5672/vhost, or amqps://…:5671/… for TLS)" {
		t.Fatalf("err %v", err)
	}
	c.Broker.Kind = "carrier-pigeon"
	if _, err := wire.Build(context.Background(), c, wire.Options{}); !errors.As(err, &ce) {
		t.Fatalf("err %v, want a ConfigError", err)
	}
}

// The parts make a worker: a job published through the built broker reaches the provider through the
// built gate and dispatcher, once.
func TestBuild(t *testing.T) {
	ref, err := sim.Start("127.0.0.1:0", sim.Options{Limits: []sim.Window{{Limit: 10, Per: time.Second}}})
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	c := testConfig(t, ref.URL()+"/pay", config.Limit{Requests: 10, Per: time.Second})
	c.Gate.WarmUp = false
	o := testOptions()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	parts, err := wire.Build(ctx, c, o)
	if err != nil {
		t.Fatal(err)
	}
	defer parts.Close()
	defer func() {
		if err := wire.DeleteBroker(context.Background(), c, o); err != nil {
			t.Error(err)
		}
	}()
	w, err := parts.Worker(nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if names := wire.BrokerNames(c); len(names.Providers) != 1 || names.Providers[0] != c.Broker.RabbitMQ.Exchange+".acme" || len(names.Delays) != 3 {
		t.Fatalf("broker names %+v", names)
	}
	run, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(run, parts.Broker) }()
	for i := range 3 {
		body := fmt.Appendf(nil, `{"id":"wire-%d","provider":"acme","amount":100,"currency":"EUR"}`, i)
		if err := parts.Broker.Publish(ctx, "acme", body); err != nil {
			t.Fatal(err)
		}
	}
	for ref.Stats().Accepted < 3 && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := ref.Stats(); st.Accepted != 3 || st.Requests != 3 || st.Violations != 0 {
		t.Fatalf("provider saw %+v, want 3 accepted of 3 requests", st)
	}
}

// The pool holds a connection for every call that can be on its way at once: each provider's handlers
// and the process's own, never fewer than go-redis's 10 per CPU; the client is built with it.
func TestPoolSize(t *testing.T) {
	c := testConfig(t, "http://127.0.0.1:1/pay", config.Limit{Requests: 10, Per: time.Second})
	floor := 10 * runtime.GOMAXPROCS(0)
	if got := wire.PoolSize(c); got != max(floor, 4+wire.PoolSpare) {
		t.Fatalf("one provider, 4 handlers: pool of %d, want %d", got, max(floor, 4+wire.PoolSpare))
	}
	c.Worker.Concurrency = 16
	for i := range 5 {
		c.Providers[fmt.Sprint("p", i)] = c.Providers["acme"]
	}
	want := max(floor, 6*16+wire.PoolSpare)
	if got := wire.PoolSize(c); got != want {
		t.Fatalf("6 providers, 16 handlers each: pool of %d, want %d", got, want)
	}
	rdb, err := wire.Redis(c)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	if got := rdb.(*redis.Client).Options().PoolSize; got != want {
		t.Fatalf("the client's pool: %d, want %d", got, want)
	}
}

// testOptions reads the test broker's URL as the worker reads its secret.
func testOptions() wire.Options {
	return wire.Options{Secret: func(name string) string {
		if name == "WIRE_TEST_AMQP_URL" {
			return testenv.AMQPURL()
		}
		return ""
	}}
}
