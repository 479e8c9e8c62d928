package config

import (
	"errors"
	"fmt"
	"math"
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

	"github.com/paygate/paygate/job"
)

// envKey turns a key into its variable's suffix: PAYGATE_PROVIDERS_ACME_PAY_TIMEOUT reaches
// providers.acme-pay.timeout.
var envKey = strings.NewReplacer(".", "_", "-", "_")

// decodeHooks read what strict decoding does not: durations, comma lists, and strings from the
// environment.
var decodeHooks = viper.DecodeHook(mapstructure.ComposeDecodeHookFunc(durationHook, commaListHook, integerHook, boolHook))

// Default returns the documented defaults, without providers and without reading the file or the
// environment: for programs that build a configuration in code (the demo, the benchmarks, tests) and
// set only what differs. Validate it once the providers are in.
func Default() *Config {
	v := viper.New()
	for k, d := range defaults {
		v.SetDefault(k, d)
	}
	var c Config
	if err := v.Unmarshal(&c, decodeHooks); err != nil {
		panic("config: the defaults do not decode: " + err.Error()) // a programming error, caught by TestDefault
	}
	c.Providers = map[string]Provider{}
	return &c
}

// Load reads the YAML file at path (empty: defaults only), overlays PAYGATE_<PATH> environment variables,
// and validates. A *ValidationError lists every problem found.
func Load(path string) (*Config, error) {
	v := viper.New()
	for k, d := range defaults {
		v.SetDefault(k, d)
	}
	v.SetEnvPrefix(EnvPrefix)
	v.SetEnvKeyReplacer(envKey)
	v.AllowEmptyEnv(true) // PAYGATE_REDIS_MASTER_NAME= clears a value the file sets
	v.AutomaticEnv()
	var p problems
	var merchantNames map[string]map[string][]string // per provider: lowercased name -> the file's
	if path != "" {
		v.SetConfigFile(path)
		v.SetConfigType("yaml")
		if err := v.ReadInConfig(); err != nil {
			return nil, fmt.Errorf("config: read %s: %w", path, err)
		}
		upper, names := upperCaseKeys(path)
		p = append(p, upper...)
		merchantNames = names
		// Provider keys the file leaves out can still come from the environment.
		for name := range v.GetStringMap("providers") {
			for _, key := range providerEnvKeys {
				_ = v.BindEnv("providers." + name + "." + key) // cannot fail with a key given
			}
		}
	}
	// Strict: no weak typing, which would read 1.9 as 1 and 1 as true. The hooks read what strict decoding
	// does not: durations, comma lists, and strings from the environment.
	hooks := decodeHooks
	strict := func(dc *mapstructure.DecoderConfig) { dc.WeaklyTypedInput = false }
	// Decoded exactly, the file's unknown keys are errors; but mapstructure drops a provider (a map
	// element) with any error in it, so the values come from a decode that lets unknown keys be.
	unknown, _ := decodeProblems(v.UnmarshalExact(&Config{}, hooks, strict))
	var c Config
	_, undecoded := decodeProblems(v.Unmarshal(&c, hooks, strict))
	p = append(p, unknown...)
	p = append(p, undecoded...)
	for name, pr := range c.Providers {
		pr, problems := withMerchantNames(name, pr, merchantNames[name])
		p = append(p, problems...)
		c.Providers[name] = pr.WithDefaults()
	}
	if !v.InConfig("gate.margin_max") && os.Getenv(EnvPrefix+"_GATE_MARGIN_MAX") == "" {
		c.Gate.MarginMax = max(c.Gate.MarginMax, c.Gate.Margin) // a margin raised alone takes the ceiling along
	}
	if err := c.Validate(); err != nil {
		// A field that did not decode is zero; do not report it twice.
		for _, problem := range err.(*ValidationError).Problems {
			path, _, _ := strings.Cut(problem, ": ")
			if !slices.ContainsFunc(undecoded, func(u string) bool {
				u, _, _ = strings.Cut(u, ": ")
				return within(problem, u) || within(u, path)
			}) {
				p = append(p, problem)
			}
		}
	}
	if len(p) > 0 {
		return nil, &ValidationError{Problems: p}
	}
	return &c, nil
}

// within reports whether a problem line (or a path) is about path or a field under it.
func within(problem, path string) bool {
	rest, ok := strings.CutPrefix(problem, path)
	return ok && (rest == "" || strings.HasPrefix(rest, ":") || strings.HasPrefix(rest, ".") || strings.HasPrefix(rest, "["))
}

// providerEnvKeys are the provider keys an environment variable can set: the scalars and plain lists
// (PAYGATE_PROVIDERS_ACME_RETRY_ON=409,425), not limits or headers. mapstructure lists them from the tags.
var providerEnvKeys = func() []string {
	var fields map[string]any
	if err := mapstructure.Decode(Provider{}, &fields); err != nil {
		panic(err) // a struct always decodes into a map
	}
	var keys []string
	for key, zero := range fields {
		if key == "breaker" { // its keys, one by one: PAYGATE_PROVIDERS_ACME_BREAKER_FAILURES=0
			keys = append(keys, "breaker.failures", "breaker.open_for", "breaker.open_max")
			continue
		}
		switch zero.(type) {
		case []Limit, map[string]string:
		default:
			keys = append(keys, key)
		}
	}
	sort.Strings(keys)
	return keys
}()

// envVar is the variable that overrides a key: PAYGATE_REDIS_ADDRS for redis.addrs.
func envVar(key string) string {
	return EnvPrefix + "_" + strings.ToUpper(envKey.Replace(key))
}

// EnvNames returns every environment variable c reads: PAYGATE_<PATH> for each key, its providers' keys
// included, and the variables its *_env keys name (the secrets).
func (c *Config) EnvNames() map[string]bool {
	names := map[string]bool{}
	for k := range defaults {
		names[envVar(k)] = true
	}
	for name, p := range c.Providers {
		for _, key := range providerEnvKeys {
			names[envVar("providers."+name+"."+key)] = true
		}
		for h := range p.Headers { // viper reads an override of a header the file sets
			names[envVar("providers."+name+".headers."+strings.ToLower(h))] = true
		}
		for _, s := range p.AuthSecrets() {
			if s.Env != "" {
				names[s.Env] = true
				names[s.Env+FileSuffix] = true // each secret may come from a file instead
			}
		}
	}
	for _, secret := range []string{c.Redis.PasswordEnv, c.Broker.RabbitMQ.URLEnv, c.Broker.Kafka.SASL.PasswordEnv, c.GateService.TokensEnv} {
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

// upperCaseKeys names keys written with capitals: viper lowercases keys, so "Acme" would silently become
// "acme" while jobs keep saying "Acme", and "Providers:" would pass for "providers:". Header names, which
// are case-insensitive, may use capitals. viper keeps no trace of the case it folded (it has no
// case-sensitive mode), so this one check reads the file's keys again. Merchant names keep their case
// (a job's merchant is matched exactly): merchants maps each provider's lowercased names to the file's.
func upperCaseKeys(path string) (out []string, merchants map[string]map[string][]string) {
	raw, err := os.ReadFile(path)
	var doc map[string]any
	if err != nil || yaml.Unmarshal(raw, &doc) != nil {
		return nil, nil // ReadInConfig just read and parsed it; nothing new to report
	}
	merchants = map[string]map[string][]string{}
	var walk func(v any, path string)
	walk = func(v any, path string) {
		switch v := v.(type) {
		case map[string]any:
			for k, sub := range v {
				kp, lower := join(path, k), strings.ToLower(k)
				provider, isMerchants := strings.CutSuffix(strings.TrimPrefix(path, "providers."), ".merchants")
				switch {
				case strings.HasPrefix(path, "providers.") && strings.HasSuffix(path, ".headers"):
					continue
				case strings.HasPrefix(path, "providers.") && isMerchants && !strings.Contains(provider, "."):
					if merchants[provider] == nil {
						merchants[provider] = map[string][]string{}
					}
					merchants[provider][lower] = append(merchants[provider][lower], k)
				case k == lower:
				case path == "providers" && job.ValidProvider(lower):
					out = append(out, fmt.Sprintf("%s: provider name must match %s, got %q", kp, job.ProviderPattern, k))
				case path != "providers":
					out = append(out, fmt.Sprintf("%s: keys are lower case (%s)", kp, lower))
				}
				walk(sub, join(path, lower))
			}
		case []any:
			for i, sub := range v {
				walk(sub, fmt.Sprintf("%s[%d]", path, i))
			}
		}
	}
	walk(doc, "")
	sort.Strings(out)
	return out, merchants
}

// withMerchantNames gives a provider's merchants back the names the file wrote (names: upperCaseKeys').
func withMerchantNames(provider string, pr Provider, names map[string][]string) (Provider, []string) {
	if len(pr.Merchants) == 0 {
		return pr, nil
	}
	var problems []string
	renamed := make(map[string]Merchant, len(pr.Merchants))
	for lower, m := range pr.Merchants {
		file := names[lower]
		switch {
		case len(file) > 1:
			slices.Sort(file)
			problems = append(problems, fmt.Sprintf("providers.%s.merchants: %s differ only in case; the loader folds keys' case, so name each merchant once",
				provider, strings.Join(file, ", ")))
		case len(file) == 1:
			lower = file[0]
		}
		renamed[lower] = m
	}
	pr.Merchants = renamed
	return pr, problems
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

var durationType = reflect.TypeFor[time.Duration]()

// durationHook decodes "1s"-style strings into durations and refuses bare numbers, which mapstructure would
// otherwise read as nanoseconds.
func durationHook(from, to reflect.Type, data any) (any, error) {
	if to != durationType {
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

func isInt(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return t != durationType
	}
	return false
}

// integerHook reads a base-10 string (an environment variable) and a whole number written as a float
// (100.0) into an integer, and refuses a fraction, which mapstructure would truncate. Anything else it
// leaves to mapstructure, which refuses what is not an integer already (see typeProblem).
func integerHook(from, to reflect.Type, data any) (any, error) {
	if !isInt(to) {
		return data, nil
	}
	switch d := data.(type) {
	case string:
		if n, err := strconv.ParseInt(strings.TrimSpace(d), 10, 64); err == nil {
			return n, nil
		}
	case float64:
		if d != math.Trunc(d) || math.Abs(d) > 1<<53 {
			return nil, errors.New(typeProblem(to, d))
		}
		return int64(d), nil
	}
	return data, nil
}

// boolHook reads "true" or "false" (an environment variable) into a bool; mapstructure refuses the rest.
func boolHook(from, to reflect.Type, data any) (any, error) {
	if s, ok := data.(string); ok && to.Kind() == reflect.Bool {
		if b, err := strconv.ParseBool(strings.TrimSpace(s)); err == nil {
			return b, nil
		}
	}
	return data, nil
}

// typeProblem words mapstructure's refusal of value for a field of type t; "" keeps mapstructure's own
// words (for a list or a map where a scalar goes, and for anything refused as a duration).
func typeProblem(t reflect.Type, value any) string {
	got := fmt.Sprint(value)
	if s, ok := value.(string); ok {
		got = strconv.Quote(s)
	}
	switch {
	case isInt(t):
		switch value.(type) {
		case string, bool, float64:
			return "want an integer, got " + got
		}
	case t.Kind() == reflect.Bool:
		return "want true or false, got " + got
	case t.Kind() == reflect.String:
		switch value.(type) {
		case int, int64, float64, bool, uint64:
			return "want a string, got " + got + " (quote it)"
		}
	}
	return ""
}

// unusedKeys starts mapstructure's error for the keys of a map that no field of the struct takes (with
// DecoderConfig.ErrorUnused, which viper's UnmarshalExact sets): "has invalid keys: a, b".
const unusedKeys = "has invalid keys: "

// decodeProblems turns mapstructure's error tree into one line per unknown key and one per field that did
// not decode, each list sorted, with config paths.
func decodeProblems(err error) (unknown, undecoded []string) {
	for _, e := range leaves(err) {
		var de *mapstructure.DecodeError
		if !errors.As(e, &de) {
			undecoded = append(undecoded, e.Error())
			continue
		}
		path, inner := fieldPath(de.Name()), de.Unwrap()
		var refused *mapstructure.UnconvertibleTypeError
		switch keys, isUnused := strings.CutPrefix(inner.Error(), unusedKeys); {
		case isUnused:
			for key := range strings.SplitSeq(keys, ", ") {
				unknown = append(unknown, join(path, key)+": unknown key"+secretHint(path, key))
			}
		case errors.As(inner, &refused) && typeProblem(refused.Expected.Type(), refused.Value) != "":
			undecoded = append(undecoded, path+": "+typeProblem(refused.Expected.Type(), refused.Value))
		default:
			undecoded = append(undecoded, fmt.Sprintf("%s: %v", path, inner))
		}
	}
	sort.Strings(unknown)
	sort.Strings(undecoded)
	return unknown, undecoded
}

// leaves lists the errors in mapstructure's tree: an errors.Join per struct, map and list that had any,
// wrapped once at the top.
func leaves(err error) []error {
	switch e := err.(type) {
	case nil:
		return nil
	case *mapstructure.DecodeError:
		return []error{e}
	case interface{ Unwrap() []error }:
		var out []error
		for _, e := range e.Unwrap() {
			out = append(out, leaves(e)...)
		}
		return out
	}
	if inner := errors.Unwrap(err); inner != nil {
		return leaves(inner)
	}
	return []error{err}
}

// fieldPath rewrites mapstructure's "providers[acme].limits[0].per" as "providers.acme.limits[0].per".
var mapIndex = regexp.MustCompile(`\[([^\]0-9][^\]]*)\]`)

func fieldPath(name string) string { return mapIndex.ReplaceAllString(name, ".$1") }
