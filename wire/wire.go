// Package wire builds paygate's parts from a config.Config: the Redis client and the gate over it, a
// dispatcher per provider, the broker adapter the configuration names, the worker core's settings, and
// what the operator's view reads of the broker (Backlog).
// `worker run`, the demo and the benchmarks all build a worker through it, so that what they measure is
// what runs; each derived setting (the backoff from the delay tiers, the lateness limit from the margin,
// the largest job cost from the limits) is derived here and nowhere else.
package wire

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/consumers/kafka"
	"github.com/paygate/paygate/consumers/rabbitmq"
	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/providers"
)

// ConfigError marks an error in the configuration (as opposed to a server that does not answer): the
// commands exit with status 2 on it.
type ConfigError struct{ Err error }

func (e ConfigError) Error() string { return e.Err.Error() }
func (e ConfigError) Unwrap() error { return e.Err }

// Broker is what paygate needs of a broker adapter: the core's consumption, publishing (enqueue, the
// demo's producer), readiness (/readyz) and Close.
type Broker interface {
	consumers.Broker
	consumers.ResultSink
	Publish(ctx context.Context, route string, body []byte) error // route: consumers.Route (the provider, or <provider>.high, <provider>.low)
	Ready() error
	Close() error
}

// Options carry what a configuration file does not.
type Options struct {
	// Log receives the parts' logs (nil: discarded).
	Log *zap.Logger
	// Secret returns the value of the environment variable broker.rabbitmq.url_env names (nil:
	// config.Secret, which also reads <NAME>_FILE). The demo passes the URL it was given this way.
	Secret func(envVar string) string
}

func (o Options) log() *zap.Logger {
	if o.Log == nil {
		return zap.NewNop()
	}
	return o.Log
}

func (o Options) secret(name string) string {
	if o.Secret != nil {
		return o.Secret(name)
	}
	return config.Secret(name)
}

// Role says what a gate is built for.
type Role int

const (
	// Tool is an operator's command (gate try, gate status): it asks plainly, without the staleness
	// guard or the warm-up (a "gate try" on a lost state does not hold the provider).
	Tool Role = iota
	// Worker is a worker process: stale slots are given back, and a lost state is warmed up.
	Worker
)

// LeaseSlack is how long an in-flight lease outlives the provider's timeout (providers.<name>.max_in_flight):
// a request starts up to the late limit after its slot, and ends its lease with one more round trip to
// Redis. A worker killed while it holds a lease gives its place back this long after the timeout.
const LeaseSlack = 2 * time.Second

// PoolSpare is how many connections a process's pool keeps beyond its providers' handlers: the batched
// calls, the margin's reports, the ends of in-flight leases (Redis).
const PoolSpare = 8

// Redis returns a client for the configured Redis (single node, Cluster or Sentinel), its pool sized for
// a worker's load: a connection for every call that can be on its way at once, so that no decision waits
// for one. That is each provider's handlers (worker.concurrency each; a merchant's job, a release, a
// late request's move go alone) and PoolSpare, and never fewer than go-redis's 10 per CPU. go-redis
// opens them only as calls need them: a batching worker holds about one a provider. Its timeouts are
// go-redis's (docs/operations.md, "Scaling out").
func Redis(c *config.Config) (redis.UniversalClient, error) {
	opts, err := c.Redis.Options()
	if err != nil {
		return nil, ConfigError{err}
	}
	opts.PoolSize = PoolSize(c)
	return redis.NewUniversalClient(opts), nil
}

// PoolSize is the size of a process's Redis pool (per node, on a Cluster): see Redis.
func PoolSize(c *config.Config) int {
	return max(10*runtime.GOMAXPROCS(0), len(c.Providers)*c.Worker.Concurrency+PoolSpare)
}

// Gate builds the gate over every configured provider, on rdb.
func Gate(c *config.Config, rdb redis.UniversalClient, role Role) (*gate.Limiter, error) {
	ps := make(map[string]gate.Provider, len(c.Providers))
	for name, p := range c.Providers {
		perMerchant, merchants := p.MerchantPolicies()
		ps[name] = gate.Provider{Policies: p.Policies(), Algorithm: gate.Algorithm(p.Algorithm), Buckets: p.Buckets, Burst: p.Burst,
			MaxInFlight: p.MaxInFlight, Lease: p.Timeout + LeaseSlack, FromHeaders: p.LimitsFromHeaders,
			PerMerchant: perMerchant, Merchants: merchants, TrackMerchants: p.HasMerchants()}
		if p.Adaptive != nil {
			ps[name] = withRange(ps[name], *p.Adaptive)
		}
		spec := ps[name]
		spec.Breaker = breakerOf(c, p)
		ps[name] = spec
	}
	o := gate.Options{Prefix: c.Redis.KeyPrefix, Margin: c.Gate.Margin, MarginMax: c.Gate.MarginMax, Providers: ps,
		MinReplicasAcked: c.Redis.MinReplicasAcked, AckTimeout: c.Redis.ReplicasAckTimeout, Batch: c.Gate.Batch,
		BatchLinger: c.Gate.BatchLinger, BatchCalls: c.Gate.BatchCalls, Journal: c.Gate.Journal}
	if role == Worker {
		o.StaleAfter, o.WarmUp, o.WarmUpCap, o.Horizon = Core(c).LateLimit, c.Gate.WarmUp, c.Gate.WarmUpMax, consumers.LossNotice
		if c.Redis.Mode() == "cluster" {
			// A node restarted empty need not break the watch's connection (it may be to another node), and
			// its announcement crosses the cluster bus, which it may not have rejoined yet: the warm-up
			// covers the reservations workers hold, as without the watch.
			o.Horizon = c.Worker.MaxInlineWait
		}
	}
	return gate.New(rdb, o)
}

// Core returns the worker core's settings. Everything derived is derived here:
//   - a transient retry backs off from the first delay tier up to the last, and a gate that cannot answer
//     sends the job back for the first tier, then, as the outage lasts, for the tiers it has outlasted;
//   - a job that wakes more than half the margin (its floor) after its slot gives the slot back: the
//     other half is the trip to the provider;
//   - the largest cost a job may have is the provider's smallest limit.
func Core(c *config.Config) consumers.Config {
	tiers := c.Worker.DelayTiers
	return consumers.Config{
		Concurrency:     c.Worker.Concurrency,
		MaxInlineWait:   c.Worker.MaxInlineWait,
		LowHorizon:      min(c.Worker.LowHorizon, c.Worker.MaxInlineWait),
		MaxAttempts:     c.Worker.MaxAttempts,
		MaxDeferralAge:  c.Worker.MaxDeferralAge,
		ShutdownTimeout: c.Worker.ShutdownTimeout,
		BackoffBase:     tiers[0],
		BackoffMax:      tiers[len(tiers)-1],
		RedisRetry:      tiers[0],
		OutageTiers:     tiers,
		LateLimit:       c.Gate.Margin / 2,
		Providers:       MaxCosts(c),
		Endpoints:       c.JobEndpoints(),
		Shadow:          shadowed(c),
		Adaptive:        adaptive(c),
		Fair:            fair(c),
		ReadAhead:       readAhead(c),
	}
}

// KafkaReadAhead is how many records of a provider with fair shares a Kafka worker reads ahead (RabbitMQ's
// read-ahead is its prefetch): Kafka itself bounds nothing, and a partition's backlog would be read whole.
const KafkaReadAhead = 1000

// readAhead is how far a worker reads a provider's deliveries ahead for fair shares.
func readAhead(c *config.Config) int {
	if c.Broker.Kind == "kafka" {
		return KafkaReadAhead
	}
	return c.Broker.RabbitMQ.Prefetch
}

// fair lists the providers that share out between merchants (those with per_merchant or merchants), with
// the merchants' weights.
func fair(c *config.Config) map[string]map[string]int {
	out := map[string]map[string]int{}
	for name, p := range c.Providers {
		if !p.HasMerchants() {
			continue
		}
		weights := map[string]int{} // every named merchant, with its weight (default 1)
		for m, ms := range p.Merchants {
			weights[m] = max(ms.Weight, 1)
		}
		out[name] = weights
	}
	return out
}

// withRange gives the gate an adaptive provider's range (valid: config.Validate checked it).
func withRange(g gate.Provider, a config.Adaptive) gate.Provider {
	if lo, hi, err := a.Range(); err == nil {
		g.LearnMin, g.LearnMax = lo, hi
	}
	return g
}

// adaptive lists the providers whose limit is learned (providers.<name>.adaptive).
func adaptive(c *config.Config) map[string]bool {
	out := map[string]bool{}
	for name, p := range c.Providers {
		if p.Adaptive != nil {
			out[name] = true
		}
	}
	return out
}

// shadowed lists the providers in shadow mode (providers.<name>.mode).
func shadowed(c *config.Config) map[string]bool {
	out := map[string]bool{}
	for name, p := range c.Providers {
		if p.Mode == config.ModeShadow {
			out[name] = true
		}
	}
	return out
}

// MaxCosts maps each provider to the largest cost a job may have there: its smallest limit.
func MaxCosts(c *config.Config) map[string]int64 {
	out := make(map[string]int64, len(c.Providers))
	for name, p := range c.Providers {
		m := p.Limits[0].Requests
		for _, l := range p.Limits {
			m = min(m, l.Requests)
		}
		out[name] = m
	}
	return out
}

// dispatchers returns an HTTP client per configured provider, each with worker.concurrency connections.
// Providers with limits_from_headers tell g what they announce; adaptive ones tell their learner every
// answer.
func dispatchers(c *config.Config, g *gate.Limiter, learners map[string]*learner, o Options) (map[string]consumers.Dispatcher, func(), error) {
	out := map[string]consumers.Dispatcher{}
	var clients []*providers.Client
	closeAll := func() {
		for _, cl := range clients {
			cl.Close()
		}
	}
	for _, name := range c.ProviderNames() {
		po := providers.Options{Concurrency: c.Worker.Concurrency, Logger: o.log().Named("dispatch")}
		if c.Providers[name].LimitsFromHeaders && g != nil {
			po.OnLimits = followAnnounced(g, name, o.log())
		}
		if l := learners[name]; l != nil {
			po.OnAnswer = l.answered
		}
		cl, err := providers.New(name, c.Providers[name], po)
		if err != nil {
			closeAll()
			return nil, nil, ConfigError{err}
		}
		clients = append(clients, cl)
		out[name] = cl
	}
	return out, closeAll, nil
}

// followAnnounced hands what a provider's responses announce to the gate (providers.<name>.
// limits_from_headers): in force for the fleet when it changes anything. A failure is logged (at most every
// 10s) and costs nothing else: the limits in force stay.
func followAnnounced(g *gate.Limiter, provider string, log *zap.Logger) func([]providers.Announced) {
	var lastWarn atomic.Int64
	return func(announced []providers.Announced) {
		ps := make([]gate.Policy, len(announced))
		for i, a := range announced {
			ps[i] = gate.Policy{Limit: a.Limit, Window: a.Window}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		changed, err := g.FollowAnnounced(ctx, provider, ps)
		switch {
		case err != nil:
			if now := time.Now().UnixNano(); now-lastWarn.Load() > int64(10*time.Second) {
				lastWarn.Store(now)
				log.Warn("could not follow the limits the provider announces; the limits in force stay", zap.String("provider", provider), zap.Error(err))
			}
		case changed:
			log.Info("limits announced by the provider now in force for the fleet", zap.String("provider", provider), zap.String("announced", fmt.Sprint(ps)))
		}
	}
}

// OpenBroker connects the broker the configuration names and declares what the providers need.
func OpenBroker(ctx context.Context, c *config.Config, o Options) (Broker, error) {
	log := o.log()
	switch c.Broker.Kind {
	case "rabbitmq":
		r := c.Broker.RabbitMQ
		url := o.secret(r.URLEnv)
		if url == "" {
			return nil, ConfigError{fmt.Errorf("broker.rabbitmq.url_env: environment variable %s is not set (amqp://user:pass@host:5672/vhost, or amqps://…:5671/… for TLS)", r.URLEnv)}
		}
		tlsc, err := r.TLSConfig()
		if err != nil {
			return nil, ConfigError{err}
		}
		if err := r.CheckTLSURL(url); err != nil {
			return nil, ConfigError{err}
		}
		b, err := rabbitmq.Open(ctx, rabbitmq.Options{URL: url, TLS: tlsc, Exchange: r.Exchange, Prefetch: r.Prefetch,
			Providers: c.ProviderNames(), DelayTiers: c.Worker.DelayTiers, Results: c.Results.Enabled, Log: log.Named("rabbitmq")})
		if err != nil {
			return nil, rabbitRefusal(r, err)
		}
		return b, nil
	case "kafka":
		k := c.Broker.Kafka
		cl, err := KafkaCluster(c, o)
		if err != nil {
			return nil, err
		}
		b, err := kafka.Open(ctx, kafka.Options{Brokers: k.Brokers, TLS: cl.TLS, SASL: cl.SASL, Group: k.Group, TopicPrefix: k.TopicPrefix,
			Partitions: k.Partitions, ReplicationFactor: k.ReplicationFactor, Providers: c.ProviderNames(),
			DelayTiers: c.Worker.DelayTiers, Results: c.Results.Enabled, Log: log.Named("kafka")})
		if err != nil {
			return nil, kafkaRefusal(k, err)
		}
		return b, nil
	default:
		return nil, ConfigError{fmt.Errorf("broker.kind: %s is not supported", c.Broker.Kind)}
	}
}

// Parts are one worker's: its own Redis client, gate, provider clients and broker connection, and the
// core's settings. New(Parts.Core, ...) is the worker; callers that count gate calls wrap Parts.Gate.
type Parts struct {
	Redis       redis.UniversalClient
	Gate        *gate.Limiter
	Dispatchers map[string]consumers.Dispatcher
	Broker      Broker
	Core        consumers.Config
	closers     []func()
	learners    map[string]*learner // the adaptive providers'
	redisConf   config.Redis        // for RedisReady's words
}

// Build connects everything a worker process needs, in the order `worker run` logs problems: the
// gate (Redis need not answer yet: jobs are deferred until it does), the providers, then the broker.
func Build(ctx context.Context, c *config.Config, o Options) (p *Parts, err error) {
	p = &Parts{Core: Core(c), redisConf: c.Redis}
	defer func() {
		if err != nil {
			p.Close()
			p = nil
		}
	}()
	if p.Redis, err = Redis(c); err != nil {
		return p, err
	}
	rdb := p.Redis
	p.closers = append(p.closers, func() { _ = rdb.Close() })
	if p.Gate, err = Gate(c, rdb, Worker); err != nil {
		return p, err
	}
	if err = CheckRedis(ctx, c, rdb, p.Gate); err != nil {
		return p, err
	}
	p.learners = newLearners(c, p.Gate, o.log())
	d, closeD, err := dispatchers(c, p.Gate, p.learners, o)
	if err != nil {
		return p, err
	}
	p.Dispatchers = d
	p.closers = append(p.closers, closeD)
	if p.Broker, err = OpenBroker(ctx, c, o); err != nil {
		return p, err
	}
	b := p.Broker
	p.closers = append(p.closers, func() { _ = b.Close() })
	if c.Results.Enabled {
		p.Core.Results = b // both adapters publish results
	}
	return p, nil
}

// Worker returns the worker core over the parts; g is the gate it asks (nil: Parts.Gate).
func (p *Parts) Worker(g consumers.Gate, log *zap.Logger, metrics *consumers.Metrics) (*consumers.Worker, error) {
	if g == nil {
		g = p.Gate
	}
	if len(p.learners) > 0 {
		g = learningGate{Gate: g, learners: p.learners}
	}
	w, err := consumers.New(p.Core, g, p.Dispatchers, log, metrics)
	if err == nil {
		w.UseBreaker(p.Gate)                                                   // the providers' breakers, whatever gate g wraps
		w.UseWaiting(waitingKeys{rdb: p.Redis, prefix: p.redisConf.KeyPrefix}) // the fleet's higher classes waiting
	}
	return w, err
}

// RedisReady pings Redis for /readyz; a refusal names the setting to fix (RedisRefusal).
func (p *Parts) RedisReady(ctx context.Context) error {
	return RedisRefusal(p.redisConf, p.Redis.Ping(ctx).Err())
}

// Watch follows the gate's announcements for w (pauses, a lost state, its own connection) until ctx
// ends, as every worker does: see gate.Limiter.Watch.
func (p *Parts) Watch(ctx context.Context, w gate.Watcher) error {
	return p.Gate.Watch(ctx, p.Redis, w)
}

// Close closes the broker connection, the provider clients and the Redis client, in that order.
func (p *Parts) Close() {
	for _, c := range slices.Backward(p.closers) {
		c()
	}
	p.closers = nil
}

// Names are the broker objects a configuration uses: a queue (RabbitMQ) or topic (Kafka) per provider,
// one per delay tier, and the dead letters. Tools that read a broker as an operator would (the demo's
// census, a dashboard) take the names from here.
type Names struct {
	Providers []string // in c.ProviderNames() order
	Classes   []string // each provider's high and low queues or topics, in c.ProviderNames() order
	Delays    []string // in delay_tiers order
	Dead      string
}

// BrokerNames names the broker objects of c.
func BrokerNames(c *config.Config) Names {
	switch c.Broker.Kind {
	case "kafka":
		t := kafka.TopicsOf(c.Broker.Kafka.TopicPrefix, c.ProviderNames(), c.Worker.DelayTiers)
		return Names{Providers: t.Providers, Classes: t.Classes, Delays: t.Retries, Dead: t.Dead}
	default:
		t := rabbitmq.TopologyOf(c.Broker.RabbitMQ.Exchange, c.ProviderNames(), c.Worker.DelayTiers)
		return Names{Providers: t.Queues, Classes: t.Classes, Delays: t.Delays, Dead: t.Dead}
	}
}

// DeleteBroker removes the broker objects of c with the messages in them (RabbitMQ: its exchanges too):
// for demos, benchmarks and tests that declared their own. What is already gone is not an error.
func DeleteBroker(ctx context.Context, c *config.Config, o Options) error {
	switch c.Broker.Kind {
	case "kafka":
		cl, err := KafkaCluster(c, o)
		if err != nil {
			return err
		}
		return kafkaRefusal(c.Broker.Kafka, kafka.DeleteTopics(ctx, cl, kafka.TopicsOf(c.Broker.Kafka.TopicPrefix, c.ProviderNames(), c.Worker.DelayTiers)))
	default:
		url := o.secret(c.Broker.RabbitMQ.URLEnv)
		if url == "" {
			return ConfigError{fmt.Errorf("broker.rabbitmq.url_env: environment variable %s is not set", c.Broker.RabbitMQ.URLEnv)}
		}
		return rabbitRefusal(c.Broker.RabbitMQ, rabbitmq.DeleteTopology(url, rabbitmq.TopologyOf(c.Broker.RabbitMQ.Exchange, c.ProviderNames(), c.Worker.DelayTiers)))
	}
}
