// Package config loads paygate's YAML configuration with viper, overlays PAYGATE_<PATH> environment
// variables, and validates the result. Nothing else in paygate knows viper.
//
// Loading is strict: an unknown key is an error naming it, and Validate reports every problem at once, each
// with its field path and the bad value ("providers.acme.limits[0].per: must be > 0, got 0s").
// Secrets are never in the file: it names the environment variables that hold them.
package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"

	"github.com/paygate/paygate/gate"
)

// EnvPrefix starts every environment override: PAYGATE_REDIS_ADDRS overrides redis.addrs.
const EnvPrefix = "PAYGATE"

// maxWindow is the longest limit window (the gate's MaxWindow).
const maxWindow = 366 * 24 * time.Hour

// Config is paygate's whole configuration.
type Config struct {
	Log       Log                 `mapstructure:"log"`
	HTTP      HTTP                `mapstructure:"http"`
	Redis     Redis               `mapstructure:"redis"`
	Gate      Gate                `mapstructure:"gate"`
	Broker    Broker              `mapstructure:"broker"`
	Worker    Worker              `mapstructure:"worker"`
	Providers map[string]Provider `mapstructure:"providers"`
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
	KeyPrefix   string   `mapstructure:"key_prefix"`
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
}

// Kafka configures the Kafka adapter.
type Kafka struct {
	Brokers     []string `mapstructure:"brokers"`
	Group       string   `mapstructure:"group"`
	TopicPrefix string   `mapstructure:"topic_prefix"`
	// Partitions and ReplicationFactor apply to the topics the worker creates when they are missing.
	Partitions        int `mapstructure:"partitions"`
	ReplicationFactor int `mapstructure:"replication_factor"`
}

// Worker tunes job processing.
type Worker struct {
	Concurrency     int             `mapstructure:"concurrency"`     // per provider per process
	MaxInlineWait   time.Duration   `mapstructure:"max_inline_wait"` // longest reservation waited in-process
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
	// Method is the HTTP method of a dispatch: POST (default), PUT or PATCH.
	Method string `mapstructure:"method"`
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
}

// Provider defaults, applied by Load to every provider that leaves the key out.
const (
	DefaultMethod            = "POST"
	DefaultAlgorithm         = "sliding_log"
	DefaultBuckets           = 10 // sliding_window's sub-windows per limit window
	MaxBuckets               = 100
	DefaultBurst             = 1 // paced: one unit at a time
	DefaultIdempotencyHeader = "Idempotency-Key"
	DefaultRetryAfter        = time.Second
	DefaultRetryAfterMax     = time.Hour
)

// Policies are the provider's limits as the gate takes them.
func (pr Provider) Policies() []gate.Policy {
	out := make([]gate.Policy, 0, len(pr.Limits))
	for _, l := range pr.Limits {
		out = append(out, gate.Policy{Limit: l.Requests, Window: l.Per})
	}
	return out
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
	if pr.Algorithm == "sliding_window" && pr.Buckets == 0 {
		pr.Buckets = DefaultBuckets
	}
	if pr.Burst == 0 {
		pr.Burst = DefaultBurst
	}
	pr.Method = strings.ToUpper(pr.Method)
	if pr.IdempotencyHeader == "" {
		pr.IdempotencyHeader = DefaultIdempotencyHeader
	}
	if pr.RetryAfterDefault == 0 {
		pr.RetryAfterDefault = DefaultRetryAfter
	}
	if pr.RetryAfterMax == 0 {
		pr.RetryAfterMax = DefaultRetryAfterMax
	}
	return pr
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
	"log.format":                       "json",
	"http.listen":                      "127.0.0.1:9090",
	"redis.addrs":                      []string{"127.0.0.1:6379"},
	"redis.master_name":                "",
	"redis.username":                   "",
	"redis.password_env":               "PAYGATE_REDIS_PASSWORD",
	"redis.db":                         0,
	"redis.tls":                        false,
	"redis.tls_ca_file":                "",
	"redis.key_prefix":                 "paygate",
	"gate.margin":                      "20ms",
	"gate.margin_max":                  "100ms",
	"gate.warmup":                      true,
	"gate.warmup_max":                  "1m",
	"broker.kind":                      "rabbitmq",
	"broker.rabbitmq.url_env":          "PAYGATE_AMQP_URL",
	"broker.rabbitmq.exchange":         "payments",
	"broker.rabbitmq.prefetch":         32,
	"broker.rabbitmq.consumer_timeout": "30m",
	"broker.rabbitmq.tls_ca_file":      "",
	"broker.kafka.brokers":             []string{"127.0.0.1:9092"},
	"broker.kafka.group":               "paygate",
	"broker.kafka.topic_prefix":        "payments",
	"broker.kafka.partitions":          6,
	"broker.kafka.replication_factor":  1,
	"worker.concurrency":               16,
	"worker.max_inline_wait":           "5s",
	"worker.max_attempts":              8,
	"worker.max_deferral_age":          "24h",
	"worker.shutdown_timeout":          "30s",
	"worker.delay_tiers":               []string{"1s", "5s", "30s", "2m", "10m", "1h"},
}

// Load reads the YAML file at path (empty: defaults only), overlays PAYGATE_<PATH> environment variables,
// and validates. A *ValidationError lists every problem found.
func Load(path string) (*Config, error) {
	v := viper.New()
	for k, d := range defaults {
		v.SetDefault(k, d)
	}
	v.SetEnvPrefix(EnvPrefix)
	// PAYGATE_PROVIDERS_ACME_PAY_TIMEOUT reaches providers.acme-pay.timeout.
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_", "-", "_"))
	v.AllowEmptyEnv(true) // PAYGATE_REDIS_MASTER_NAME= clears a value the file sets
	v.AutomaticEnv()
	var p problems
	if path != "" {
		v.SetConfigFile(path)
		v.SetConfigType("yaml")
		if err := v.ReadInConfig(); err != nil {
			return nil, fmt.Errorf("config: read %s: %w", path, err)
		}
		p = append(p, upperCaseKeys(path)...)
		// Provider keys the file leaves out can still come from the environment.
		for name := range v.GetStringMap("providers") {
			for _, key := range envKeys(reflect.TypeFor[Provider]()) {
				_ = v.BindEnv("providers." + name + "." + key) // cannot fail with a key given
			}
		}
	}
	unknown := unknownKeys(v.AllSettings(), reflect.TypeFor[Config](), "")
	p = append(p, unknown...)
	var c Config
	hook := viper.DecodeHook(mapstructure.ComposeDecodeHookFunc(durationHook, commaListHook, strictScalarHook))
	strict := func(dc *mapstructure.DecoderConfig) { dc.WeaklyTypedInput = false }
	decode := v.UnmarshalExact // a backstop: unknownKeys names unknown keys with their full paths
	if len(unknown) > 0 {
		decode = v.Unmarshal
	}
	var undecoded []string
	if err := decode(&c, hook, strict); err != nil {
		decoded := decodeProblems(err)
		p = append(p, decoded...)
		for _, d := range decoded {
			undecoded = append(undecoded, strings.SplitN(d, ": ", 2)[0])
		}
	}
	for name, pr := range c.Providers {
		c.Providers[name] = pr.WithDefaults()
	}
	if !v.InConfig("gate.margin_max") && os.Getenv(EnvPrefix+"_GATE_MARGIN_MAX") == "" {
		c.Gate.MarginMax = max(c.Gate.MarginMax, c.Gate.Margin) // a margin raised alone takes the ceiling along
	}
	if err := c.Validate(); err != nil {
		// A field that did not decode is zero; do not report it twice.
		for _, problem := range err.(*ValidationError).Problems {
			path := strings.SplitN(problem, ": ", 2)[0]
			if !slices.ContainsFunc(undecoded, func(u string) bool { return within(problem, u) || within(u, path) }) {
				p = append(p, problem)
			}
		}
	}
	if len(p) > 0 {
		return nil, &ValidationError{Problems: p}
	}
	return &c, nil
}

// Algorithms are the gate algorithms a provider may name in algorithm (gate.Algorithms, which a test keeps
// in step).
var Algorithms = []string{"sliding_log", "sliding_window", "token_bucket", "gcra", "fixed_window", "leaky_bucket"}

// secretKeys are keys people write when they put a secret in the file; the error says where it goes.
var secretKeys = map[string]string{"password": "password_env", "url": "url_env", "token": "auth_env",
	"secret": "auth_env", "api_key": "auth_env", "apikey": "auth_env", "auth": "auth_env", "authorization": "auth_env"}

// envVar is the variable that overrides a key: PAYGATE_REDIS_ADDRS for redis.addrs.
func envVar(key string) string {
	return EnvPrefix + "_" + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(key))
}

// EnvNames returns every environment variable c reads: PAYGATE_<PATH> for each key, its providers' keys
// included, and the variables its *_env keys name (the secrets).
func (c *Config) EnvNames() map[string]bool {
	names := map[string]bool{}
	for k := range defaults {
		names[envVar(k)] = true
	}
	for name, p := range c.Providers {
		for _, key := range envKeys(reflect.TypeFor[Provider]()) {
			names[envVar("providers."+name+"."+key)] = true
		}
		for h := range p.Headers { // viper reads an override of a header the file sets
			names[envVar("providers."+name+".headers."+strings.ToLower(h))] = true
		}
		if p.AuthEnv != "" {
			names[p.AuthEnv] = true
			names[p.AuthEnv+FileSuffix] = true // each secret may come from a file instead
		}
	}
	for _, secret := range []string{c.Redis.PasswordEnv, c.Broker.RabbitMQ.URLEnv} {
		if secret != "" {
			names[secret] = true
			names[secret+FileSuffix] = true
		}
	}
	return names
}

// UnknownEnv returns the PAYGATE_ variables in environ ("NAME=value" pairs) that c does not read, sorted:
// typos such as PAYGATE_REDIS_ADRS, which would otherwise be silently ignored. allowed names variables
// read elsewhere (PAYGATE_CONFIG).
func (c *Config) UnknownEnv(environ []string, allowed ...string) []string {
	known := c.EnvNames()
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, EnvPrefix+"_") && !known[name] && !slices.Contains(allowed, name) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// within reports whether a problem line (or a path) is about path or a field under it.
func within(problem, path string) bool {
	rest, ok := strings.CutPrefix(problem, path)
	return ok && (rest == "" || strings.HasPrefix(rest, ":") || strings.HasPrefix(rest, ".") || strings.HasPrefix(rest, "["))
}

// envKeys lists the keys of a struct that an environment variable can set: scalars and comma lists.
func envKeys(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		switch f.Type.Kind() {
		case reflect.Map, reflect.Struct:
			continue
		case reflect.Slice:
			if f.Type.Elem().Kind() == reflect.Struct {
				continue
			}
		}
		out = append(out, f.Tag.Get("mapstructure"))
	}
	return out
}

// upperCaseKeys names keys written with capitals: viper lowercases keys, so "Acme" would silently become
// "acme" while jobs keep saying "Acme", and "Providers:" would pass for "providers:". Header names, which
// are case-insensitive, may use capitals.
func upperCaseKeys(path string) []string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil // ReadInConfig just read it; nothing new to report
	}
	var doc map[string]any
	if yaml.Unmarshal(raw, &doc) != nil {
		return nil
	}
	var out []string
	var walk func(v any, path string)
	walk = func(v any, path string) {
		switch v := v.(type) {
		case map[string]any:
			for k, sub := range v {
				kp := join(path, k)
				switch {
				case strings.HasPrefix(path, "providers.") && strings.HasSuffix(path, ".headers"):
					continue
				case k == strings.ToLower(k):
				case path == "providers" && providerName.MatchString(strings.ToLower(k)):
					out = append(out, fmt.Sprintf("%s: provider name must match [a-z0-9_-]{1,64}, got %q", kp, k))
				case path != "providers":
					out = append(out, fmt.Sprintf("%s: keys are lower case (%s)", kp, strings.ToLower(k)))
				}
				walk(sub, join(path, strings.ToLower(k)))
			}
		case []any:
			for i, sub := range v {
				walk(sub, fmt.Sprintf("%s[%d]", path, i))
			}
		}
	}
	walk(doc, "")
	sort.Strings(out)
	return out
}

// ValidationError lists every problem in a configuration, one per line, each starting with its field path.
type ValidationError struct {
	Problems []string
}

func (e *ValidationError) Error() string {
	return "config: " + strings.Join(e.Problems, "\nconfig: ")
}

// durationHook decodes "1s"-style strings into durations and refuses bare numbers, which mapstructure would
// otherwise read as nanoseconds.
func durationHook(from, to reflect.Type, data any) (any, error) {
	if to != reflect.TypeFor[time.Duration]() {
		return data, nil
	}
	switch from.Kind() {
	case reflect.String:
		d, err := time.ParseDuration(strings.TrimSpace(data.(string)))
		if err != nil {
			return nil, fmt.Errorf("want a duration such as 500ms, 1s, 1m or 24h, got %q", data)
		}
		return d, nil
	case reflect.Int, reflect.Int64, reflect.Int32, reflect.Float64, reflect.Float32, reflect.Uint, reflect.Uint64:
		if reflect.ValueOf(data).IsZero() {
			return time.Duration(0), nil // zero needs no unit
		}
		return nil, fmt.Errorf("a duration needs a unit (500ms, 1s, 1m, 24h), got %v", data)
	}
	return data, nil
}

// commaListHook lets a list be given as "a,b,c" (environment variables): viper hands PAYGATE_REDIS_ADDRS
// over split on whitespace only.
func commaListHook(from, to reflect.Type, data any) (any, error) {
	if to.Kind() != reflect.Slice {
		return data, nil
	}
	var items []string
	switch d := data.(type) {
	case string:
		items = []string{d}
	case []string:
		items = d
	default:
		return data, nil
	}
	out := []string{}
	for _, item := range items {
		for part := range strings.SplitSeq(item, ",") {
			if part = strings.TrimSpace(part); part != "" {
				out = append(out, part)
			}
		}
	}
	return out, nil
}

// strictScalarHook replaces mapstructure's weak typing, which would read 1.9 as 1 and 1 as true. Strings
// (environment variables) are parsed exactly; everything else must already have the field's kind.
func strictScalarHook(from, to reflect.Type, data any) (any, error) {
	if to == reflect.TypeFor[time.Duration]() || data == nil {
		return data, nil
	}
	switch to.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		switch d := data.(type) {
		case string:
			n, err := strconv.ParseInt(strings.TrimSpace(d), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("want an integer, got %q", d)
			}
			return n, nil
		case float64:
			if d != math.Trunc(d) || math.Abs(d) > 1<<53 {
				return nil, fmt.Errorf("want an integer, got %v", d)
			}
			return int64(d), nil
		case bool:
			return nil, fmt.Errorf("want an integer, got %v", d)
		}
	case reflect.Bool:
		switch d := data.(type) {
		case bool:
		case string:
			b, err := strconv.ParseBool(strings.TrimSpace(d))
			if err != nil {
				return nil, fmt.Errorf("want true or false, got %q", d)
			}
			return b, nil
		default:
			return nil, fmt.Errorf("want true or false, got %v", d)
		}
	case reflect.String:
		switch data.(type) {
		case string:
		case int, int64, float64, bool, uint64:
			return nil, fmt.Errorf("want a string, got %v (quote it)", data)
		}
	}
	return data, nil
}

// decodeProblems turns mapstructure's error tree into one line per field.
func decodeProblems(err error) []string {
	var out []string
	var de *mapstructure.DecodeError
	for _, e := range flatten(err) {
		if errors.As(e, &de) {
			out = append(out, fmt.Sprintf("%s: %v", fieldPath(de.Name()), de.Unwrap()))
			continue
		}
		out = append(out, e.Error())
	}
	sort.Strings(out)
	return out
}

// flatten finds the leaves of an error tree: every *mapstructure.DecodeError, however deeply joined or wrapped.
func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	if _, ok := err.(*mapstructure.DecodeError); !ok {
		if inner := errors.Unwrap(err); inner != nil {
			return flatten(inner)
		}
	}
	return []error{err}
}

// fieldPath rewrites mapstructure's "providers[acme].limits[0].per" as "providers.acme.limits[0].per".
var mapIndex = regexp.MustCompile(`\[([^\]0-9][^\]]*)\]`)

func fieldPath(name string) string { return mapIndex.ReplaceAllString(name, ".$1") }

// unknownKeys walks the settings viper read against the Config type and names every key it does not know.
func unknownKeys(settings map[string]any, t reflect.Type, path string) []string {
	known := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		known[f.Tag.Get("mapstructure")] = f.Type
	}
	var out []string
	for key, val := range settings {
		p := join(path, key)
		ft, ok := known[key]
		if !ok {
			msg := fmt.Sprintf("%s: unknown key", p)
			if env, secret := secretKeys[strings.ToLower(key)]; secret && known[env] != nil {
				msg += fmt.Sprintf("; secrets never live in the file: set %s to the name of an environment variable holding it", join(path, env))
			}
			out = append(out, msg)
			continue
		}
		out = append(out, unknownIn(val, ft, p)...)
	}
	sort.Strings(out)
	return out
}

func unknownIn(val any, t reflect.Type, path string) []string {
	switch {
	case t.Kind() == reflect.Struct && t != reflect.TypeFor[time.Duration]():
		if m, ok := val.(map[string]any); ok {
			return unknownKeys(m, t, path)
		}
	case t.Kind() == reflect.Map:
		if m, ok := val.(map[string]any); ok {
			var out []string
			for k, v := range m {
				out = append(out, unknownIn(v, t.Elem(), join(path, k))...)
			}
			return out
		}
	case t.Kind() == reflect.Slice:
		if s, ok := val.([]any); ok {
			var out []string
			for i, v := range s {
				out = append(out, unknownIn(v, t.Elem(), fmt.Sprintf("%s[%d]", path, i))...)
			}
			return out
		}
	}
	return nil // type mismatches are reported by the decoder
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

var (
	providerName = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)
	envName      = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	resourceName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,200}$`)
	headerName   = regexp.MustCompile("^[A-Za-z0-9!#$%&'*+.^_`|~-]+$") // RFC 9110 token
)

// Validate reports every problem in c, each with its field path and the bad value.
func (c *Config) Validate() error {
	var p problems
	p.check(slices.Contains([]string{"debug", "info", "warn", "error"}, c.Log.Level),
		"log.level", "must be debug, info, warn or error, got %q", c.Log.Level)
	p.check(slices.Contains([]string{"json", "console"}, c.Log.Format),
		"log.format", "must be json or console, got %q", c.Log.Format)
	p.hostPort("http.listen", c.HTTP.Listen)

	c.Redis.validate(&p)
	p.env("redis.password_env", c.Redis.PasswordEnv, true)
	p.check(c.Redis.DB >= 0, "redis.db", "must be >= 0, got %d", c.Redis.DB)
	p.check(c.Redis.DB == 0 || len(c.Redis.Addrs) < 2 || c.Redis.MasterName != "",
		"redis.db", "must be 0 with Redis Cluster (several addrs), got %d", c.Redis.DB)
	p.check(c.Redis.KeyPrefix != "" && !strings.ContainsAny(c.Redis.KeyPrefix, "{} \t\n"),
		"redis.key_prefix", "must be non-empty, without braces or whitespace, got %q", c.Redis.KeyPrefix)

	p.check(c.Gate.Margin >= 0, "gate.margin", "must be >= 0, got %s", c.Gate.Margin)
	p.check(c.Gate.MarginMax >= c.Gate.Margin && c.Gate.MarginMax <= time.Second, "gate.margin_max",
		"must be gate.margin (%s)..1s, got %s", c.Gate.Margin, c.Gate.MarginMax)
	p.check(c.Gate.WarmUpMax > 0, "gate.warmup_max", "must be > 0, got %s", c.Gate.WarmUpMax)

	switch c.Broker.Kind {
	case "rabbitmq":
		r := c.Broker.RabbitMQ
		p.env("broker.rabbitmq.url_env", r.URLEnv, false)
		p.check(resourceName.MatchString(r.Exchange), "broker.rabbitmq.exchange",
			"must be 1..200 of [A-Za-z0-9._-], got %q", r.Exchange)
		p.check(r.Prefetch >= 1, "broker.rabbitmq.prefetch", "must be >= 1, got %d", r.Prefetch)
		p.check(r.ConsumerTimeout > 0, "broker.rabbitmq.consumer_timeout", "must be > 0 (the broker's consumer_timeout), got %s", r.ConsumerTimeout)
		if r.TLSCAFile != "" {
			if _, err := caPool("broker.rabbitmq.tls_ca_file", r.TLSCAFile); err != nil {
				p = append(p, err.Error())
			}
		}
	case "kafka":
		k := c.Broker.Kafka
		p.check(len(k.Brokers) > 0, "broker.kafka.brokers", "must list at least one host:port")
		for i, b := range k.Brokers {
			p.hostPort(fmt.Sprintf("broker.kafka.brokers[%d]", i), b)
		}
		p.check(k.Group != "", "broker.kafka.group", "must be non-empty")
		p.check(resourceName.MatchString(k.TopicPrefix), "broker.kafka.topic_prefix",
			"must be 1..200 of [A-Za-z0-9._-], got %q", k.TopicPrefix)
		p.check(k.Partitions >= 1, "broker.kafka.partitions", "must be >= 1, got %d", k.Partitions)
		p.check(k.ReplicationFactor >= 1, "broker.kafka.replication_factor", "must be >= 1, got %d", k.ReplicationFactor)
	default:
		p.add("broker.kind", "must be rabbitmq or kafka, got %q", c.Broker.Kind)
	}

	w := c.Worker
	p.check(w.Concurrency >= 1, "worker.concurrency", "must be >= 1, got %d", w.Concurrency)
	p.check(w.MaxInlineWait >= 0, "worker.max_inline_wait", "must be >= 0, got %s", w.MaxInlineWait)
	p.check(w.MaxAttempts >= 1, "worker.max_attempts", "must be >= 1, got %d", w.MaxAttempts)
	p.check(w.MaxDeferralAge > 0, "worker.max_deferral_age", "must be > 0, got %s", w.MaxDeferralAge)
	p.check(w.ShutdownTimeout > 0, "worker.shutdown_timeout", "must be > 0, got %s", w.ShutdownTimeout)
	p.check(len(w.DelayTiers) > 0, "worker.delay_tiers", "must list at least one delay")
	for i, d := range w.DelayTiers {
		switch {
		case d < time.Millisecond:
			p.add(fmt.Sprintf("worker.delay_tiers[%d]", i), "must be >= 1ms, got %s", d)
		case i > 0 && d <= w.DelayTiers[i-1]:
			p.add(fmt.Sprintf("worker.delay_tiers[%d]", i), "must be longer than the tier before (%s), got %s", w.DelayTiers[i-1], d)
		}
	}

	p.check(len(c.Providers) > 0, "providers", "must configure at least one provider")
	for _, name := range c.ProviderNames() {
		c.Providers[name].validate(&p, "providers."+name, name, c.Gate.Margin)
	}
	if len(p) > 0 {
		return &ValidationError{Problems: p}
	}
	return nil
}

func (pr Provider) validate(p *problems, path, name string, margin time.Duration) {
	p.check(providerName.MatchString(name), path, "provider name must match [a-z0-9_-]{1,64}, got %q", name)
	if u, err := url.Parse(pr.URL); pr.URL == "" {
		p.add(path+".url", "required: the provider's API, an absolute http or https URL")
	} else {
		p.check(err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "",
			path+".url", "must be an absolute http or https URL, got %q", pr.URL)
	}
	p.check(pr.Timeout > 0, path+".timeout", "must be > 0, got %s", pr.Timeout)
	p.check(slices.Contains(Algorithms, pr.Algorithm), path+".algorithm", "unknown algorithm %q (supported: %s)", pr.Algorithm, strings.Join(Algorithms, ", "))
	switch {
	case pr.Buckets != 0 && pr.Algorithm != "sliding_window":
		p.add(path+".buckets", "only for algorithm sliding_window (this provider uses %s), got %d", pr.Algorithm, pr.Buckets)
	case pr.Buckets != 0 && (pr.Buckets < 1 || pr.Buckets > MaxBuckets):
		p.add(path+".buckets", "must be 1..%d, got %d", MaxBuckets, pr.Buckets)
	}
	p.check(len(pr.Limits) > 0, path+".limits", "must list at least one {requests, per}")
	seen := map[time.Duration]int{} // by the µs, as the gate counts windows
	for i, l := range pr.Limits {
		lp := fmt.Sprintf("%s.limits[%d]", path, i)
		p.check(l.Requests >= 1, lp+".requests", "must be >= 1, got %d", l.Requests)
		p.check(pr.Algorithm != "sliding_log" || l.Requests <= gate.MaxSlidingLogLimit, lp+".requests",
			"must be <= %d under sliding_log, which keeps one entry per unit of cost (use sliding_window or gcra for larger budgets), got %d", gate.MaxSlidingLogLimit, l.Requests)
		switch {
		case l.Per <= 0:
			p.add(lp+".per", "must be > 0, got %s", l.Per)
		case l.Per < time.Millisecond:
			p.add(lp+".per", "must be >= 1ms, got %s", l.Per)
		case l.Per > maxWindow:
			p.add(lp+".per", "must be <= %s (366 days), got %s", maxWindow, l.Per)
		case margin >= l.Per:
			p.add(lp+".per", "must be longer than gate.margin (%s), got %s", margin, l.Per)
		}
		µs := (l.Per + time.Microsecond - 1).Truncate(time.Microsecond)
		if j, dup := seen[µs]; dup && l.Per > 0 {
			p.add(lp+".per", "repeats the window of limits[%d] (%s, to the µs); keep the tighter one", j, pr.Limits[j].Per)
		}
		seen[µs] = i
	}
	if valid := !slices.ContainsFunc(pr.Limits, func(l Limit) bool { return l.Requests < 1 || l.Per <= 0 }); valid && len(pr.Limits) > 0 {
		shortest := gate.ShortestPolicy(pr.Policies()) // the limit the gate paces by
		p.check(pr.Burst >= 1 && pr.Burst <= shortest.Limit, path+".burst",
			"must be 1..%d (the requests of the shortest limit, %d per %s), got %d", shortest.Limit, shortest.Limit, shortest.Window, pr.Burst)
	}
	p.check(slices.Contains([]string{"POST", "PUT", "PATCH"}, pr.Method), path+".method", "must be POST, PUT or PATCH, got %q", pr.Method)
	for h := range pr.Headers {
		p.check(headerName.MatchString(h), path+".headers."+h, "must be an HTTP header name")
	}
	switch {
	case pr.AuthHeader != "" && pr.AuthEnv == "":
		p.add(path+".auth_env", "must name the environment variable holding the %s secret", pr.AuthHeader)
	case pr.AuthHeader == "" && pr.AuthEnv != "":
		p.add(path+".auth_header", "must name the header that carries $%s (e.g. Authorization)", pr.AuthEnv)
	case pr.AuthHeader != "":
		p.check(headerName.MatchString(pr.AuthHeader), path+".auth_header", "must be an HTTP header name, got %q", pr.AuthHeader)
		p.env(path+".auth_env", pr.AuthEnv, false)
	}
	p.check(headerName.MatchString(pr.IdempotencyHeader), path+".idempotency_header", "must be an HTTP header name, got %q", pr.IdempotencyHeader)
	for i, st := range pr.RetryOn {
		p.check(st >= 400 && st <= 499 && st != 429, fmt.Sprintf("%s.retry_on[%d]", path, i), "must be a 4xx status other than 429, got %d", st)
	}
	p.check(pr.RetryAfterDefault > 0, path+".retry_after_default", "must be > 0, got %s", pr.RetryAfterDefault)
	p.check(pr.RetryAfterMax >= pr.RetryAfterDefault, path+".retry_after_max", "must be >= retry_after_default (%s), got %s", pr.RetryAfterDefault, pr.RetryAfterMax)
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

// Secret reads the environment variable named by a *_env key. The value never goes into logs or errors.
func Secret(envVar string) string {
	s, _ := secret(envVar)
	return s
}

// FileSuffix names the companion of a secret's variable that holds a file to read it from instead:
// PAYGATE_REDIS_PASSWORD_FILE=/run/secrets/redis (Docker and Kubernetes secrets).
const FileSuffix = "_FILE"

// secret reads envVar, or when it is unset or empty the file named by envVar_FILE, without the file's
// trailing newline. Its errors name the variable and the file, never the secret.
func secret(envVar string) (string, error) {
	if envVar == "" {
		return "", nil
	}
	if v := os.Getenv(envVar); v != "" {
		return v, nil
	}
	path := os.Getenv(envVar + FileSuffix)
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("$%s%s: cannot read the secret file %s: %v", envVar, FileSuffix, path, errors.Unwrap(err))
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

type problems []string

func (p *problems) add(path, format string, args ...any) {
	*p = append(*p, path+": "+fmt.Sprintf(format, args...))
}

func (p *problems) check(ok bool, path, format string, args ...any) {
	if !ok {
		p.add(path, format, args...)
	}
}

func (p *problems) hostPort(path, addr string) {
	listen := path == "http.listen" // may omit the host and pick a free port
	p.check(hostPortOK(addr, listen), path, "must be host:port with a port 1..65535, got %q", addr)
}

func hostPortOK(addr string, listen bool) bool {
	host, port, err := net.SplitHostPort(addr)
	n, perr := strconv.Atoi(port)
	return err == nil && perr == nil && n <= 65535 && (n >= 1 || listen && n == 0) && (host != "" || listen)
}

func (p *problems) env(path, name string, optional bool) {
	if name == "" && optional {
		return
	}
	p.check(envName.MatchString(name), path, "must name an environment variable, got %q", name)
	if _, err := secret(name); err != nil {
		p.add(path, "%v", err)
	}
}
