// Package config loads paygate's YAML configuration with viper, overlays PAYGATE_<PATH> environment
// variables, and validates the result. Nothing else in paygate knows viper.
//
// Loading is strict: an unknown key is an error naming it, and Validate reports every problem at once, each
// with its field path and the bad value ("providers.acme.limits[0].per: must be > 0, got 0s").
// Secrets are never in the file: it names the environment variables that hold them.
//
// The source is in parts: the types and their defaults (config.go); loading, with viper and mapstructure's
// exact, strict decoding (load.go); the rules and their messages (validate.go); the secrets the *_env keys
// name (secrets.go); and the Redis and TLS settings (redis.go, tls.go).
package config

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/paygate/paygate/gate"
)

// EnvPrefix starts every environment override: PAYGATE_REDIS_ADDRS overrides redis.addrs.
const EnvPrefix = "PAYGATE"

// Config is paygate's whole configuration.
type Config struct {
	Log     Log     `mapstructure:"log"`
	HTTP    HTTP    `mapstructure:"http"`
	Redis   Redis   `mapstructure:"redis"`
	Gate    Gate    `mapstructure:"gate"`
	Broker  Broker  `mapstructure:"broker"`
	Worker  Worker  `mapstructure:"worker"`
	Results Results `mapstructure:"results"`
	// GateService configures `worker gate serve`, the gate's HTTP API.
	GateService GateService         `mapstructure:"gate_service"`
	Providers   map[string]Provider `mapstructure:"providers"`
}

// Results configures the result messages (docs/results.md): off by default, since a results queue that
// no one reads grows until the broker stops every publisher, the workers' own included.
type Results struct {
	Enabled bool `mapstructure:"enabled"`
}

// Log configures zap.
type Log struct {
	Level  string `mapstructure:"level"`  // debug | info | warn | error
	Format string `mapstructure:"format"` // json | console
}

// HTTP is the operations endpoint: /metrics, /healthz, /readyz.
type HTTP struct {
	Listen string `mapstructure:"listen"`
}

// Redis locates the gate's Redis: one address is a single node, several a Redis Cluster, and a master name
// means Sentinel (the addresses are then the sentinels).
type Redis struct {
	Addrs       []string `mapstructure:"addrs"`
	MasterName  string   `mapstructure:"master_name"`
	Username    string   `mapstructure:"username"`
	PasswordEnv string   `mapstructure:"password_env"` // name of the variable holding the password
	DB          int      `mapstructure:"db"`
	TLS         bool     `mapstructure:"tls"`         // rediss:// addresses turn it on too
	TLSCAFile   string   `mapstructure:"tls_ca_file"` // PEM file of the CAs to trust; empty: the system's roots
	// TLSCertFile and TLSKeyFile, together, are the client certificate Redis may ask for (tls-auth-clients).
	TLSCertFile string `mapstructure:"tls_cert_file"`
	TLSKeyFile  string `mapstructure:"tls_key_file"`
	KeyPrefix   string `mapstructure:"key_prefix"`
	// MinReplicasAcked: an admission goes out only once this many replicas hold it (gate.Options.MinReplicasAcked).
	MinReplicasAcked   int           `mapstructure:"min_replicas_acked"`
	ReplicasAckTimeout time.Duration `mapstructure:"replicas_ack_timeout"`
}

// Gate tunes the budget decisions.
type Gate struct {
	// Margin is added to every window to absorb jitter between the gate's decision and the provider's
	// receipt; it costs Margin/Window of the budget. It is the floor of the margin in force.
	Margin time.Duration `mapstructure:"margin"`
	// MarginMax is the ceiling the margin in force may widen to while the fleet's lateness, or a throttle
	// on a request sent in time, needs it (gate.Options.MarginMax); equal to Margin: it never moves.
	MarginMax time.Duration `mapstructure:"margin_max"`
	// WarmUp holds a provider after its state in Redis was lost (a restart without persistence), for its
	// shortest window plus the margin plus consumers.LossNotice (gate.Options.WarmUp).
	WarmUp bool `mapstructure:"warmup"`
	// WarmUpMax caps the window part of the warm-up (gate.Options.WarmUpCap).
	WarmUpMax time.Duration `mapstructure:"warmup_max"`
	// Batch is the most reserves of one provider a worker decides in one call (gate.Options.Batch).
	Batch int `mapstructure:"batch"`
	// BatchLinger is how long a reserve that finds no call on its way waits for others of its provider
	// before its call goes (gate.Options.BatchLinger); 0: at once.
	BatchLinger time.Duration `mapstructure:"batch_linger"`
	// BatchCalls is the most calls of one provider a worker has on their way at once
	// (gate.Options.BatchCalls).
	BatchCalls int `mapstructure:"batch_calls"`
	// Journal is how long the job journal remembers a job whose request left (gate.Options.Journal), for
	// worker cancel and worker job show; 0: no journal.
	Journal time.Duration `mapstructure:"journal"`
}

// Broker selects and configures the job queue.
type Broker struct {
	Kind     string   `mapstructure:"kind"` // rabbitmq | kafka
	RabbitMQ RabbitMQ `mapstructure:"rabbitmq"`
	Kafka    Kafka    `mapstructure:"kafka"`
}

// RabbitMQ names the broker URL's environment variable (it holds credentials) and the topology.
type RabbitMQ struct {
	URLEnv   string `mapstructure:"url_env"`
	Exchange string `mapstructure:"exchange"`
	Prefetch int    `mapstructure:"prefetch"`
	// ConsumerTimeout is the broker's consumer_timeout (RabbitMQ's default is 30m): a delivery held
	// unacknowledged longer closes its channel and is redelivered. The worker refuses to start when it
	// could hold one that long.
	ConsumerTimeout time.Duration `mapstructure:"consumer_timeout"`
	// TLSCAFile is a PEM file of the CAs to trust for an amqps:// URL; empty: the system's roots.
	TLSCAFile string `mapstructure:"tls_ca_file"`
	// TLSCertFile and TLSKeyFile, together, are the client certificate the broker may ask for (amqps:// only).
	TLSCertFile string `mapstructure:"tls_cert_file"`
	TLSKeyFile  string `mapstructure:"tls_key_file"`
}

// Kafka configures the Kafka adapter.
type Kafka struct {
	Brokers     []string `mapstructure:"brokers"`
	Group       string   `mapstructure:"group"`
	TopicPrefix string   `mapstructure:"topic_prefix"`
	// Partitions and ReplicationFactor apply to the topics the worker creates when they are missing.
	Partitions        int `mapstructure:"partitions"`
	ReplicationFactor int `mapstructure:"replication_factor"`
	// TLS turns on TLS 1.2+ to every broker, trusting TLSCAFile or else the system's roots; TLSCertFile
	// and TLSKeyFile, together, are the client certificate the brokers may ask for.
	TLS         bool   `mapstructure:"tls"`
	TLSCAFile   string `mapstructure:"tls_ca_file"`
	TLSCertFile string `mapstructure:"tls_cert_file"`
	TLSKeyFile  string `mapstructure:"tls_key_file"`
	// SASL authenticates every connection (no mechanism: none).
	SASL KafkaSASL `mapstructure:"sasl"`
}

// KafkaSASL is broker.kafka.sasl: the mechanism, the user, and the variable holding the password.
type KafkaSASL struct {
	Mechanism   string `mapstructure:"mechanism"` // "" (none) or one of SASLMechanisms
	Username    string `mapstructure:"username"`
	PasswordEnv string `mapstructure:"password_env"`
}

// Worker tunes job processing.
type Worker struct {
	Concurrency     int             `mapstructure:"concurrency"`     // per provider per process
	MaxInlineWait   time.Duration   `mapstructure:"max_inline_wait"` // longest reservation waited in-process
	LowHorizon      time.Duration   `mapstructure:"low_horizon"`     // longest reservation a low job asks for
	MaxAttempts     int             `mapstructure:"max_attempts"`
	MaxDeferralAge  time.Duration   `mapstructure:"max_deferral_age"`
	ShutdownTimeout time.Duration   `mapstructure:"shutdown_timeout"`
	DelayTiers      []time.Duration `mapstructure:"delay_tiers"`
}

// Provider is one payment provider's API and rate limits.
type Provider struct {
	URL     string        `mapstructure:"url"`
	Timeout time.Duration `mapstructure:"timeout"`
	Limits  []Limit       `mapstructure:"limits"`
	// Algorithm is the gate's algorithm for this provider (one of Algorithms; default sliding_log).
	Algorithm string `mapstructure:"algorithm"`
	// Buckets is sliding_window's number of sub-windows per limit window (default 10); only for it.
	Buckets int `mapstructure:"buckets"`
	// Burst is how many units of cost may go at one moment (default 1). Slots are paced: the shortest
	// window plus gate.margin, shared out evenly over its limit, so that a fleet wakes one job at a time
	// and the provider sees a steady stream; burst N lets N share a moment. At most the shortest window's
	// limit (which turns pacing off for it). Longer windows, and a shortest window over 1m, are quotas:
	// counted exactly, never paced.
	Burst int64 `mapstructure:"burst"`
	// MaxInFlight caps this provider's requests in flight across the whole fleet (0, the default: no
	// cap). Each dispatch holds a lease, taken with its slot and ended when its request ends; a dead
	// worker's lapse after the provider's timeout plus a slack (gate.Provider.MaxInFlight).
	MaxInFlight int64 `mapstructure:"max_in_flight"`
	// Mode is "enforce" (the default: the gate holds jobs to the limits) or "shadow": the gate decides and
	// counts, but every job goes at once, whatever it says (paygate_gate_decisions_total{decision=
	// "would_deny"} counts what it would have held back). For putting paygate in front of a provider
	// already in production.
	Mode string `mapstructure:"mode"`
	// LimitsFromHeaders lowers the provider's limits, for the whole fleet, to what its responses announce
	// (RateLimit-Policy, RateLimit-Limit, X-RateLimit-Limit), never above the configured ones.
	LimitsFromHeaders bool `mapstructure:"limits_from_headers"`
	// Adaptive learns a limit the provider does not publish, between Min and Max ("10/1s", "500/1s", one
	// window): the fleet starts at Min, raises it while the limit binds and requests succeed, and cuts it
	// on a 429. Limits are then left out: Min is the configured limit (what holds without Redis).
	Adaptive *Adaptive `mapstructure:"adaptive"`
	// PerMerchant are every merchant's own limits inside the provider's (a connected account's quota): a
	// job with a merchant goes only when its merchant's limits and the provider's all allow it, decided
	// in one step. Jobs without a merchant count against the provider only. Not for token_bucket, gcra
	// or leaky_bucket.
	PerMerchant *PerMerchant `mapstructure:"per_merchant"`
	// Merchants names merchants with limits of their own, in place of PerMerchant's. Names keep their
	// case (the job's merchant is matched exactly).
	Merchants map[string]Merchant `mapstructure:"merchants"`
	// MerchantHeader carries the job's merchant on its request (default X-Merchant), for providers that
	// count per merchant; not sent for a job without one.
	MerchantHeader string `mapstructure:"merchant_header"`
	// Method is the HTTP method of a dispatch: POST (default), PUT or PATCH.
	Method string `mapstructure:"method"`
	// Endpoints are the provider's endpoints by operation (endpoints.go): a job's operation picks one,
	// under the provider's one budget; a job without one goes to URL with Method.
	Endpoints map[string]Endpoint `mapstructure:"endpoints"`
	// Auth is how requests authenticate (auth.go): header, oauth2 or hmac. AuthHeader and AuthEnv are
	// the shorthand of {type: header}.
	Auth *Auth `mapstructure:"auth"`
	// TLSCAFile, TLSCertFile and TLSKeyFile are the CAs the provider's API and token endpoint are trusted
	// by (empty: the system's roots) and the client certificate presented to them (mutual TLS).
	TLSCAFile   string `mapstructure:"tls_ca_file"`
	TLSCertFile string `mapstructure:"tls_cert_file"`
	TLSKeyFile  string `mapstructure:"tls_key_file"`
	// Headers are sent with every request (names are case-insensitive; viper lowercases them).
	Headers map[string]string `mapstructure:"headers"`
	// AuthHeader carries the secret read from the environment variable AuthEnv (e.g. Authorization).
	AuthHeader string `mapstructure:"auth_header"`
	AuthEnv    string `mapstructure:"auth_env"`
	// IdempotencyHeader carries the job's idempotency key on every attempt.
	IdempotencyHeader string `mapstructure:"idempotency_header"`
	// RetryOn lists 4xx statuses to treat as transient (retried) rather than permanent.
	RetryOn []int `mapstructure:"retry_on"`
	// RetryAfterDefault is the pause after a 429 (or 503) whose Retry-After is missing or unusable;
	// RetryAfterMax caps a longer Retry-After.
	RetryAfterDefault time.Duration `mapstructure:"retry_after_default"`
	RetryAfterMax     time.Duration `mapstructure:"retry_after_max"`
	// Breaker is the provider's circuit breaker, fleet-wide (breaker.go): on by default.
	Breaker Breaker `mapstructure:"breaker"`
	// ResponseMax is how many bytes of an answer's body a result keeps (default 64 KiB); beyond it the
	// result is marked truncated. ResultHeaders are the answer's headers a result keeps (default
	// Location, Request-Id, X-Request-Id). DeclinedWhen tells a declined payment from a failure.
	ResponseMax   int           `mapstructure:"response_max"`
	ResultHeaders []string      `mapstructure:"result_headers"`
	DeclinedWhen  *DeclinedWhen `mapstructure:"declined_when"`
}

// PerMerchant is providers.<name>.per_merchant.
type PerMerchant struct {
	Limits []Limit `mapstructure:"limits"`
}

// Merchant is one entry of providers.<name>.merchants.
type Merchant struct {
	Limits []Limit `mapstructure:"limits"`
	// Weight is the merchant's share of the provider against other merchants with jobs waiting (default
	// 1): a merchant of weight 3 has three jobs taken to one of a merchant of weight 1.
	Weight int `mapstructure:"weight"`
}

// MaxWeight is the largest providers.<name>.merchants.<m>.weight.
const MaxWeight = 1000

// HasMerchants reports whether the provider shares out between merchants: it has per_merchant or
// merchants (either turns fair shares on; see docs/configuration.md).
func (pr Provider) HasMerchants() bool { return pr.PerMerchant != nil || len(pr.Merchants) > 0 }

// Provider defaults, applied by Load to every provider that leaves the key out. The algorithm's are the
// gate's own.
const (
	DefaultMethod            = "POST"
	ModeEnforce              = "enforce"
	ModeShadow               = "shadow"
	DefaultAlgorithm         = string(gate.SlidingLog)
	DefaultBuckets           = gate.DefaultBuckets // sliding_window's sub-windows per limit window
	DefaultBurst             = 1                   // paced: one unit at a time
	MaxInFlight              = 100_000             // providers.<name>.max_in_flight at most
	DefaultIdempotencyHeader = "Idempotency-Key"
	DefaultMerchantHeader    = "X-Merchant"
	DefaultRetryAfter        = time.Second
	DefaultRetryAfterMax     = time.Hour
)

// Algorithms are the names a provider may give in algorithm: gate.Algorithms, the default first.
var Algorithms = func() []string {
	names := make([]string, len(gate.Algorithms))
	for i, a := range gate.Algorithms {
		names[i] = string(a)
	}
	return names
}()

// Policies are the provider's limits as the gate takes them.
func (pr Provider) Policies() []gate.Policy { return policies(pr.Limits) }

func policies(limits []Limit) []gate.Policy {
	out := make([]gate.Policy, 0, len(limits))
	for _, l := range limits {
		out = append(out, gate.Policy{Limit: l.Requests, Window: l.Per})
	}
	return out
}

// MerchantPolicies are PerMerchant's limits (nil: none) and each named merchant's, as the gate takes them.
func (pr Provider) MerchantPolicies() (perMerchant []gate.Policy, named map[string]gate.Merchant) {
	if pr.PerMerchant != nil {
		perMerchant = policies(pr.PerMerchant.Limits)
	}
	for m, ms := range pr.Merchants {
		if named == nil {
			named = map[string]gate.Merchant{}
		}
		named[m] = gate.Merchant{Policies: policies(ms.Limits)}
	}
	return perMerchant, named
}

// WithDefaults returns the provider with the documented defaults in the keys it leaves out. Load applies
// it; code that builds a Provider itself (tests, the demo) gets the same defaults by calling it.
func (pr Provider) WithDefaults() Provider {
	if pr.Method == "" {
		pr.Method = DefaultMethod
	}
	if pr.Algorithm == "" {
		pr.Algorithm = DefaultAlgorithm
	}
	if pr.Mode == "" {
		pr.Mode = ModeEnforce
	}
	if pr.Adaptive != nil && len(pr.Limits) == 0 {
		if lo, _, err := pr.Adaptive.Range(); err == nil {
			pr.Limits = []Limit{{Requests: lo.Limit, Per: lo.Window}} // the floor: what holds without Redis
		}
	}
	if pr.Algorithm == string(gate.SlidingWindow) && pr.Buckets == 0 {
		pr.Buckets = DefaultBuckets
	}
	if pr.Burst == 0 {
		pr.Burst = DefaultBurst
	}
	pr.Method = strings.ToUpper(pr.Method)
	pr = pr.endpointDefaults()
	if pr.MerchantHeader == "" {
		pr.MerchantHeader = DefaultMerchantHeader
	}
	if pr.IdempotencyHeader == "" {
		pr.IdempotencyHeader = DefaultIdempotencyHeader
	}
	if pr.RetryAfterDefault == 0 {
		pr.RetryAfterDefault = DefaultRetryAfter
	}
	if pr.RetryAfterMax == 0 {
		pr.RetryAfterMax = DefaultRetryAfterMax
	}
	pr.Breaker = pr.Breaker.withDefaults()
	pr = pr.answerDefaults()
	return pr
}

// Adaptive is a provider's learned limit's range (providers.<name>.adaptive).
type Adaptive struct {
	Min string `mapstructure:"min"`
	Max string `mapstructure:"max"`
}

// Range reads the range: two policies of one window, min <= max.
func (a Adaptive) Range() (lo, hi gate.Policy, err error) {
	l, err1 := gate.ParsePolicies(a.Min)
	h, err2 := gate.ParsePolicies(a.Max)
	switch {
	case err1 != nil || len(l) != 1:
		return lo, hi, fmt.Errorf("min: want one N/duration, e.g. 10/1s, got %q", a.Min)
	case err2 != nil || len(h) != 1:
		return lo, hi, fmt.Errorf("max: want one N/duration, e.g. 500/1s, got %q", a.Max)
	case l[0].Window != h[0].Window || l[0].Limit > h[0].Limit:
		return lo, hi, fmt.Errorf("want min and max of one window, min <= max, got %s and %s", l[0], h[0])
	}
	return l[0], h[0], nil
}

// Limit is one window: at most Requests units of cost per Per.
type Limit struct {
	Requests int64         `mapstructure:"requests"`
	Per      time.Duration `mapstructure:"per"`
}

// defaults are documented in docs/configuration.md and config.yaml; every key has one (or is listed with an empty
// value), which is also what lets PAYGATE_<PATH> override a key the file leaves out.
var defaults = map[string]any{
	"log.level":                        "info",
	"results.enabled":                  false,
	"log.format":                       "json",
	"http.listen":                      "127.0.0.1:9090",
	"gate_service.listen":              "127.0.0.1:8090",
	"gate_service.tokens_env":          "PAYGATE_GATE_TOKENS",
	"gate_service.tls_cert_file":       "",
	"gate_service.tls_key_file":        "",
	"gate_service.tls_client_ca_file":  "",
	"redis.addrs":                      []string{"127.0.0.1:6379"},
	"redis.master_name":                "",
	"redis.username":                   "",
	"redis.password_env":               "PAYGATE_REDIS_PASSWORD",
	"redis.db":                         0,
	"redis.tls":                        false,
	"redis.tls_ca_file":                "",
	"redis.tls_cert_file":              "",
	"redis.tls_key_file":               "",
	"redis.key_prefix":                 "paygate",
	"redis.min_replicas_acked":         0,
	"redis.replicas_ack_timeout":       "50ms",
	"gate.margin":                      "20ms",
	"gate.margin_max":                  "100ms",
	"gate.warmup":                      true,
	"gate.warmup_max":                  "1m",
	"gate.batch":                       32,
	"gate.batch_linger":                "0s",
	"gate.journal":                     "1h",
	"gate.batch_calls":                 gate.DefaultBatchCalls,
	"broker.kind":                      "rabbitmq",
	"broker.rabbitmq.url_env":          "PAYGATE_AMQP_URL",
	"broker.rabbitmq.exchange":         "payments",
	"broker.rabbitmq.prefetch":         32,
	"broker.rabbitmq.consumer_timeout": "30m",
	"broker.rabbitmq.tls_ca_file":      "",
	"broker.rabbitmq.tls_cert_file":    "",
	"broker.rabbitmq.tls_key_file":     "",
	"broker.kafka.brokers":             []string{"127.0.0.1:9092"},
	"broker.kafka.group":               "paygate",
	"broker.kafka.topic_prefix":        "payments",
	"broker.kafka.partitions":          6,
	"broker.kafka.replication_factor":  1,
	"broker.kafka.tls":                 false,
	"broker.kafka.tls_ca_file":         "",
	"broker.kafka.tls_cert_file":       "",
	"broker.kafka.tls_key_file":        "",
	"broker.kafka.sasl.mechanism":      "",
	"broker.kafka.sasl.username":       "",
	"broker.kafka.sasl.password_env":   "PAYGATE_KAFKA_PASSWORD",
	"worker.concurrency":               16,
	"worker.max_inline_wait":           "5s",
	"worker.low_horizon":               "500ms",
	"worker.max_attempts":              8,
	"worker.max_deferral_age":          "24h",
	"worker.shutdown_timeout":          "30s",
	"worker.delay_tiers":               []string{"1s", "5s", "30s", "2m", "10m", "1h"},
}

// ProviderNames returns the configured providers' names, sorted.
func (c *Config) ProviderNames() []string {
	names := make([]string, 0, len(c.Providers))
	for n := range c.Providers {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
