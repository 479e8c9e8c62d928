package config_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/paygate/paygate/config"
)

func TestLoadValid(t *testing.T) {
	c, err := config.Load("../testdata/config/valid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.ProviderNames(); !reflect.DeepEqual(got, []string{"acme", "globex"}) {
		t.Fatalf("providers %v", got)
	}
	want := []config.Limit{{Requests: 100, Per: time.Second}, {Requests: 3000, Per: time.Minute}}
	if !reflect.DeepEqual(c.Providers["acme"].Limits, want) {
		t.Fatalf("acme limits %+v", c.Providers["acme"].Limits)
	}
	if c.Redis.Mode() != "cluster" {
		t.Fatalf("two addrs: mode %s, want cluster", c.Redis.Mode())
	}
	// Defaults fill what the file leaves out; /metrics and health listen on loopback only.
	if c.HTTP.Listen != "127.0.0.1:9090" {
		t.Fatalf("http.listen defaults to %q, want 127.0.0.1:9090", c.HTTP.Listen)
	}
	if c.Worker.MaxInlineWait != 5*time.Second || c.Worker.LowHorizon != 500*time.Millisecond || c.Gate.Margin != 20*time.Millisecond || c.Gate.MarginMax != 100*time.Millisecond ||
		c.Broker.RabbitMQ.Exchange != "payments" || c.Redis.KeyPrefix != "paygate" ||
		!reflect.DeepEqual(c.Worker.DelayTiers, []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute, 10 * time.Minute, time.Hour}) {
		t.Fatalf("defaults not applied: %+v", c)
	}
}

// The shipped config.yaml is valid and says what the defaults say.
func TestShippedConfig(t *testing.T) {
	c, err := config.Load("../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	d, err := config.Load(writeFile(t, "providers: {acme: {url: 'http://127.0.0.1:8081/payments', timeout: 10s, limits: [{requests: 100, per: 1s}, {requests: 3000, per: 1m}]}}"))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, d) {
		t.Fatalf("config.yaml and the built-in defaults disagree:\nfile     %+v\ndefaults %+v", c, d)
	}
}

// Values that need no unit or quoting are accepted as written.
func TestLoadLenient(t *testing.T) {
	c, err := config.Load(writeFile(t, "gate: {margin: 0}\nredis: {db: '3'}\nproviders: {acme: {url: 'http://x:1', timeout: 1s, limits: [{requests: 100.0, per: 1s}], headers: {X-Api-Version: '2'}}}"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Gate.Margin != 0 || c.Redis.DB != 3 || c.Providers["acme"].Limits[0].Requests != 100 || c.Providers["acme"].Headers["x-api-version"] != "2" {
		t.Fatalf("%+v", c)
	}
}

func TestLoadUnreadable(t *testing.T) {
	for _, f := range []string{"../testdata/config/not_yaml.yaml", "../testdata/config/missing.yaml"} {
		_, err := config.Load(f)
		if err == nil || !strings.Contains(err.Error(), "config: read "+f) {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func TestEnvOverrides(t *testing.T) {
	t.Setenv("PAYGATE_REDIS_ADDRS", "10.0.0.1:6379,10.0.0.2:6379")
	t.Setenv("PAYGATE_BROKER_KIND", "kafka")
	t.Setenv("PAYGATE_WORKER_MAX_INLINE_WAIT", "2s")
	t.Setenv("PAYGATE_WORKER_DELAY_TIERS", "2s,1m")
	t.Setenv("PAYGATE_PROVIDERS_ACME_TIMEOUT", "3s")
	t.Setenv("PAYGATE_GATE_MARGIN", "1ms")
	c, err := config.Load("../testdata/config/valid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.Redis.Addrs, []string{"10.0.0.1:6379", "10.0.0.2:6379"}) || c.Broker.Kind != "kafka" ||
		c.Worker.MaxInlineWait != 2*time.Second || c.Providers["acme"].Timeout != 3*time.Second ||
		c.Gate.Margin != time.Millisecond || !reflect.DeepEqual(c.Worker.DelayTiers, []time.Duration{2 * time.Second, time.Minute}) {
		t.Fatalf("env not applied: %+v", c)
	}
	// A provider key the file leaves out, a provider name with a dash, and clearing a value.
	t.Setenv("PAYGATE_PROVIDERS_GLOBEX_RETRY_ON", "409,425")
	t.Setenv("PAYGATE_PROVIDERS_GLOBEX_AUTH_HEADER", "Authorization")
	t.Setenv("PAYGATE_PROVIDERS_GLOBEX_AUTH_ENV", "GLOBEX_TOKEN")
	t.Setenv("PAYGATE_REDIS_MASTER_NAME", "")
	_, err = config.Load(writeFile(t, "redis: {master_name: mymaster}\nproviders:\n  globex: {url: 'http://x:1', timeout: 1s, limits: [{requests: 1, per: 1s}]}\n  acme-pay: {url: 'http://x:1', limits: [{requests: 1, per: 1s}]}\n"))
	if err == nil || !strings.Contains(err.Error(), "providers.acme-pay.timeout: must be > 0, got 0s") {
		t.Fatalf("acme-pay without timeout: %v", err)
	}
	t.Setenv("PAYGATE_PROVIDERS_ACME_PAY_TIMEOUT", "4s")
	c, err = config.Load(writeFile(t, "redis: {master_name: mymaster}\nproviders:\n  globex: {url: 'http://x:1', timeout: 1s, limits: [{requests: 1, per: 1s}]}\n  acme-pay: {url: 'http://x:1', limits: [{requests: 1, per: 1s}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	g := c.Providers["globex"]
	if c.Providers["acme-pay"].Timeout != 4*time.Second || !reflect.DeepEqual(g.RetryOn, []int{409, 425}) ||
		g.AuthHeader != "Authorization" || g.AuthEnv != "GLOBEX_TOKEN" || c.Redis.MasterName != "" {
		t.Fatalf("env not applied: %+v %+v master %q", c.Providers["acme-pay"], g, c.Redis.MasterName)
	}
	t.Setenv("PAYGATE_WORKER_CONCURRENCY", "2.5")
	if _, err := config.Load("../testdata/config/valid.yaml"); err == nil || !strings.Contains(err.Error(), `worker.concurrency: want an integer, got "2.5"`) {
		t.Fatalf("fractional env value: %v", err)
	}
	t.Setenv("PAYGATE_WORKER_CONCURRENCY", "")
	t.Setenv("PAYGATE_BROKER_KIND", "carrier-pigeon")
	if _, err := config.Load("../testdata/config/valid.yaml"); err == nil || !strings.Contains(err.Error(), `broker.kind: must be rabbitmq or kafka, got "carrier-pigeon"`) {
		t.Fatalf("bad env value: %v", err)
	}
}

func TestRedisSecretFromEnv(t *testing.T) {
	const secret = "s3cr3t-redis-pass"
	t.Setenv("PAYGATE_REDIS_PASSWORD", secret)
	c, err := config.Load("../testdata/config/valid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if o, err := c.Redis.Options(); err != nil || o.Password != secret || len(o.Addrs) != 2 || o.TLSConfig != nil {
		t.Fatalf("options %+v %v", o, err)
	}
	if s := c.Redis.String(); strings.Contains(s, secret) || !strings.Contains(s, "$PAYGATE_REDIS_PASSWORD") {
		t.Fatalf("description %q", s)
	}
	// A password written into the file is an unknown key, not a silently used secret.
	_, err = config.Load(writeFile(t, "redis: {password: hunter2}\nproviders: {a: {url: 'http://x:1', timeout: 1s, limits: [{requests: 1, per: 1s}]}}"))
	if err == nil || !strings.Contains(err.Error(), "redis.password: unknown key") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("password in file: %v", err)
	}
}

// A secret may come from the file that <VAR>_FILE names (Docker and Kubernetes secrets), without its
// trailing newline; the variable itself wins; an unreadable file is an error naming the variable and the
// path, never the secret. <VAR>_FILE is a known variable, not a typo.
func TestSecretFromFile(t *testing.T) {
	const secret = "s3cr3t-from-file"
	path := filepath.Join(t.TempDir(), "redis-password")
	if err := os.WriteFile(path, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PAYGATE_REDIS_PASSWORD", "")
	t.Setenv("PAYGATE_REDIS_PASSWORD_FILE", path)
	c, err := config.Load("../testdata/config/valid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if o, err := c.Redis.Options(); err != nil || o.Password != secret {
		t.Fatalf("password from the file: %q %v", o.Password, err)
	}
	if got := c.UnknownEnv([]string{"PAYGATE_REDIS_PASSWORD_FILE=" + path, "PAYGATE_AMQP_URL_FILE=/x", "PAYGATE_GATE_TOKENS=t", "PAYGATE_GATE_TOKENS_FILE=/x", "PAYGATE_LOG_LEVEL_FILE=/x"}); fmt.Sprint(got) != "[PAYGATE_LOG_LEVEL_FILE]" {
		t.Fatalf("unknown %v, want only PAYGATE_LOG_LEVEL_FILE (not a secret)", got)
	}
	t.Setenv("PAYGATE_REDIS_PASSWORD", "from-env")
	if o, _ := c.Redis.Options(); o.Password != "from-env" {
		t.Fatalf("the variable must win over the file: %q", o.Password)
	}
	t.Setenv("PAYGATE_REDIS_PASSWORD", "")
	t.Setenv("PAYGATE_REDIS_PASSWORD_FILE", path+".missing")
	_, err = config.Load("../testdata/config/valid.yaml")
	want := "redis.password_env: $PAYGATE_REDIS_PASSWORD_FILE: cannot read the secret file " + path + ".missing: no such file or directory"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("unreadable secret file: %v, want %q", err, want)
	}
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A PAYGATE_ variable that sets no key is reported (viper would ignore it); keys, provider keys and the
// secrets the file names are not.
func TestUnknownEnv(t *testing.T) {
	c, err := config.Load("../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c.Providers["acme"] = config.Provider{Headers: map[string]string{"x-api-version": "1"}}
	got := c.UnknownEnv([]string{"PAYGATE_PROVIDERS_ACME_HEADERS_X_API_VERSION=2",
		"PAYGATE_REDIS_ADDRS=r:6379", "PAYGATE_REDIS_ADRS=typo:6379", "PAYGATE_PROVIDERS_ACME_URL=http://x",
		"PAYGATE_PROVIDERS_ACME_TIMEOUT=1s", "PAYGATE_PROVIDERS_ACMEE_URL=http://typo", "PAYGATE_AMQP_URL=amqp://u:p@h",
		"PAYGATE_REDIS_PASSWORD=s", "PAYGATE_CONFIG=/etc/paygate.yaml", "PAYGATE_BROKER_KAFKA_TOPIC_PREFIX=p", "HOME=/root",
	}, "PAYGATE_CONFIG")
	if fmt.Sprint(got) != "[PAYGATE_PROVIDERS_ACMEE_URL PAYGATE_REDIS_ADRS]" {
		t.Fatalf("unknown %v, want the two typos", got)
	}
}

// The configuration fixtures, in testdata/config at the repository root: each one with an .err file beside
// it must fail with exactly that error, and the others must load. An .err file lists a *ValidationError's
// problems one per line, in order; for any other error it holds the text after "config: ", with {file}
// standing for the fixture's path.
func TestFixtures(t *testing.T) {
	files, err := filepath.Glob("../testdata/config/*.yaml")
	if err != nil || len(files) < 20 {
		t.Fatalf("fixtures: %v %v", files, err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			raw, readErr := os.ReadFile(strings.TrimSuffix(f, ".yaml") + ".err")
			_, err := config.Load(f)
			switch {
			case errors.Is(readErr, os.ErrNotExist):
				if err != nil {
					t.Fatalf("a fixture without an .err file must load: %v", err)
				}
				return
			case readErr != nil:
				t.Fatal(readErr)
			case err == nil:
				t.Fatal("loaded without an error")
			}
			want := strings.ReplaceAll(strings.TrimSpace(string(raw)), "{file}", f)
			var ve *config.ValidationError
			if errors.As(err, &ve) {
				if got := strings.Join(ve.Problems, "\n"); got != want {
					t.Fatalf("problems\n%s\nwant\n%s", got, want)
				}
				want = strings.ReplaceAll(want, "\n", "\nconfig: ")
			}
			if got := err.Error(); got != "config: "+want {
				t.Fatalf("error\n%s\nwant\nconfig: %s", got, want)
			}
		})
	}
}

// Every gate algorithm is accepted by name; sliding_window gets its default bucket count, and buckets can
// come from the environment like any provider key.
func TestAlgorithms(t *testing.T) {
	for _, a := range config.Algorithms {
		c, err := config.Load(writeFile(t, "providers: {acme: {url: 'http://x:1', timeout: 1s, algorithm: "+a+", limits: [{requests: 5, per: 3s}]}}"))
		if err != nil {
			t.Fatalf("%s: %v", a, err)
		}
		want := 0
		if a == "sliding_window" {
			want = config.DefaultBuckets
		}
		if p := c.Providers["acme"]; p.Algorithm != a || p.Buckets != want {
			t.Fatalf("%s: loaded %q with %d buckets, want %d", a, p.Algorithm, p.Buckets, want)
		}
	}
	t.Setenv("PAYGATE_PROVIDERS_ACME_BUCKETS", "20")
	c, err := config.Load(writeFile(t, "providers: {acme: {url: 'http://x:1', timeout: 1s, algorithm: sliding_window, limits: [{requests: 5, per: 3s}]}}"))
	if err != nil || c.Providers["acme"].Buckets != 20 {
		t.Fatalf("buckets from the environment: %v %+v", err, c)
	}
}

// gate.margin_max follows a margin raised alone (an older config with a margin above the default ceiling
// stays valid); set, it must be at least the margin.
func TestMarginCeiling(t *testing.T) {
	const prov = "providers: {acme: {url: 'http://x:1', timeout: 1s, limits: [{requests: 10, per: 1s}]}}\n"
	c, err := config.Load(writeFile(t, "gate: {margin: 200ms}\n"+prov))
	if err != nil || c.Gate.MarginMax != 200*time.Millisecond {
		t.Fatalf("margin 200ms alone: %+v %v, want the ceiling 200ms too", c, err)
	}
	if _, err := config.Load(writeFile(t, "gate: {margin: 200ms, margin_max: 150ms}\n"+prov)); err == nil ||
		!strings.Contains(err.Error(), "gate.margin_max: must be gate.margin (200ms)..1s, got 150ms") {
		t.Fatalf("a ceiling below the margin: %v", err)
	}
}

// Default is what Load gives for a file that names only a provider: the defaults, nothing else.
func TestDefault(t *testing.T) {
	path := filepath.Join(t.TempDir(), "one.yaml")
	if err := os.WriteFile(path, []byte("providers:\n  acme:\n    url: http://127.0.0.1:1/pay\n    timeout: 1s\n    limits: [{requests: 5, per: 1s}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, k := range os.Environ() { // Load reads the environment; Default does not
		if strings.HasPrefix(k, config.EnvPrefix+"_") && !strings.HasPrefix(k, config.EnvPrefix+"_TEST_") {
			t.Skipf("%s is set", strings.SplitN(k, "=", 2)[0])
		}
	}
	loaded, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	d := config.Default()
	d.Providers = loaded.Providers
	if !reflect.DeepEqual(d, loaded) {
		t.Fatalf("Default()\n%+v\nLoad of a file with a provider only\n%+v", d, loaded)
	}
}

// Merchants' limits: per_merchant for every merchant, named merchants with their own, names kept as the
// file writes them (the loader folds keys' case; a job's merchant is matched exactly).
func TestMerchantLimits(t *testing.T) {
	c, err := config.Load(writeFile(t, `providers:
  acme:
    url: http://127.0.0.1:8081/pay
    timeout: 5s
    algorithm: sliding_window
    limits: [{requests: 100, per: 1s}]
    per_merchant: {limits: [{requests: 10, per: 1s}]}
    merchants:
      acct_1AbC: {limits: [{requests: 30, per: 1s}, {requests: 500, per: 1m}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	pr := c.Providers["acme"]
	per, named := pr.MerchantPolicies()
	if pr.MerchantHeader != "X-Merchant" || len(per) != 1 || per[0].Limit != 10 || len(named) != 1 ||
		len(named["acct_1AbC"].Policies) != 2 || named["acct_1AbC"].Policies[1].Window != time.Minute {
		t.Fatalf("merchant_header %q, per_merchant %v, merchants %+v", pr.MerchantHeader, per, named)
	}
}

// Fair shares without merchants' limits: per_merchant: {} or merchants with weights only, under any
// algorithm (the shares are the worker's; only limits need the gate's counters).
func TestMerchantWeightsOnly(t *testing.T) {
	c, err := config.Load(writeFile(t, `providers:
  acme:
    url: http://127.0.0.1:8081/pay
    timeout: 5s
    algorithm: token_bucket
    limits: [{requests: 100, per: 1s}]
    merchants: {Big: {weight: 3}}
  globex:
    url: http://127.0.0.1:8082/pay
    timeout: 5s
    limits: [{requests: 100, per: 1s}]
    per_merchant: {}
  initech:
    url: http://127.0.0.1:8083/pay
    timeout: 5s
    limits: [{requests: 100, per: 1s}]
`))
	if err != nil {
		t.Fatal(err)
	}
	if a, g, i := c.Providers["acme"], c.Providers["globex"], c.Providers["initech"]; !a.HasMerchants() || a.Merchants["Big"].Weight != 3 || !g.HasMerchants() || i.HasMerchants() {
		t.Fatalf("acme %+v, globex %+v, initech %+v: want fair shares for acme (Big weighs 3) and globex only", a.Merchants, g.PerMerchant, i.PerMerchant)
	}
}

// worker.low_horizon: a duration >= 0 (0: low jobs ask as the others do).
func TestLowHorizon(t *testing.T) {
	t.Setenv("PAYGATE_WORKER_LOW_HORIZON", "-1s")
	_, err := config.Load("../testdata/config/valid.yaml")
	if err == nil || !strings.Contains(err.Error(), "worker.low_horizon: must be >= 0, got -1s") {
		t.Fatalf("low_horizon -1s: %v", err)
	}
	t.Setenv("PAYGATE_WORKER_LOW_HORIZON", "0s")
	if c, err := config.Load("../testdata/config/valid.yaml"); err != nil || c.Worker.LowHorizon != 0 {
		t.Fatalf("low_horizon 0s: %v", err)
	}
}
