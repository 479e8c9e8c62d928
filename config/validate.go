package config

import (
	"fmt"
	"maps"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/job"
)

// ValidationError lists every problem in a configuration, one per line, each starting with its field path.
type ValidationError struct {
	Problems []string
}

func (e *ValidationError) Error() string {
	return "config: " + strings.Join(e.Problems, "\nconfig: ")
}

var (
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
	c.GateService.validate(&p)

	c.Redis.validate(&p)
	p.env("redis.password_env", c.Redis.PasswordEnv, true)
	p.check(c.Redis.DB >= 0, "redis.db", "must be >= 0, got %d", c.Redis.DB)
	p.check(c.Redis.DB == 0 || len(c.Redis.Addrs) < 2 || c.Redis.MasterName != "",
		"redis.db", "must be 0 with Redis Cluster (several addrs), got %d", c.Redis.DB)
	p.check(c.Redis.MinReplicasAcked >= 0, "redis.min_replicas_acked", "must be >= 0, got %d", c.Redis.MinReplicasAcked)
	p.check(c.Redis.ReplicasAckTimeout >= time.Millisecond && c.Redis.ReplicasAckTimeout <= gate.MaxAckTimeout,
		"redis.replicas_ack_timeout", "must be 1ms..%s, got %s", gate.MaxAckTimeout, c.Redis.ReplicasAckTimeout)
	p.check(c.Redis.KeyPrefix != "" && !strings.ContainsAny(c.Redis.KeyPrefix, "{} \t\n"),
		"redis.key_prefix", "must be non-empty, without braces or whitespace, got %q", c.Redis.KeyPrefix)

	p.check(c.Gate.Margin >= 0, "gate.margin", "must be >= 0, got %s", c.Gate.Margin)
	p.check(c.Gate.MarginMax >= c.Gate.Margin && c.Gate.MarginMax <= time.Second, "gate.margin_max",
		"must be gate.margin (%s)..1s, got %s", c.Gate.Margin, c.Gate.MarginMax)
	p.check(c.Gate.WarmUpMax > 0, "gate.warmup_max", "must be > 0, got %s", c.Gate.WarmUpMax)
	p.check(c.Gate.Batch >= 1 && c.Gate.Batch <= gate.MaxBatch, "gate.batch", "must be 1..%d, got %d", gate.MaxBatch, c.Gate.Batch)
	p.check(c.Gate.BatchLinger >= 0 && c.Gate.BatchLinger <= gate.MaxBatchLinger, "gate.batch_linger", "must be 0s..%s, got %s",
		gate.MaxBatchLinger, c.Gate.BatchLinger)
	p.check(c.Gate.Journal >= 0, "gate.journal", "must be >= 0s, got %s", c.Gate.Journal)
	p.check(c.Gate.BatchCalls >= 1 && c.Gate.BatchCalls <= gate.MaxBatchCalls, "gate.batch_calls", "must be 1..%d, got %d",
		gate.MaxBatchCalls, c.Gate.BatchCalls)

	switch c.Broker.Kind {
	case "rabbitmq":
		r := c.Broker.RabbitMQ
		p.env("broker.rabbitmq.url_env", r.URLEnv, false)
		p.check(resourceName.MatchString(r.Exchange), "broker.rabbitmq.exchange",
			"must be 1..200 of [A-Za-z0-9._-], got %q", r.Exchange)
		p.check(r.Prefetch >= 1, "broker.rabbitmq.prefetch", "must be >= 1, got %d", r.Prefetch)
		p.check(r.ConsumerTimeout > 0, "broker.rabbitmq.consumer_timeout", "must be > 0 (the broker's consumer_timeout), got %s", r.ConsumerTimeout)
		r.tlsFiles().validate(&p)
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
		k.validateSecurity(&p)
	default:
		p.add("broker.kind", "must be rabbitmq or kafka, got %q", c.Broker.Kind)
	}

	w := c.Worker
	p.check(w.Concurrency >= 1, "worker.concurrency", "must be >= 1, got %d", w.Concurrency)
	p.check(w.MaxInlineWait >= 0, "worker.max_inline_wait", "must be >= 0, got %s", w.MaxInlineWait)
	p.check(w.LowHorizon >= 0, "worker.low_horizon", "must be >= 0, got %s", w.LowHorizon)
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
	p.check(job.ValidProvider(name), path, "provider name must match %s, got %q", job.ProviderPattern, name)
	p.check(name != "dead" && name != "results", path, "provider name %q is taken: the broker's %s queue or topic has it", name, name)
	pr.validateEndpoint(p, path)
	pr.validateAnswer(p, path)
	pr.validateAlgorithm(p, path)
	if pr.Adaptive != nil {
		pr.validateAdaptive(p, path)
	}
	p.limits(path, pr.Algorithm, pr.Limits, margin)
	p.merchants(path, pr, margin)
	pr.validateBurst(p, path)
	p.check(pr.MaxInFlight >= 0 && pr.MaxInFlight <= MaxInFlight, path+".max_in_flight",
		"must be 0 (no cap)..%d, got %d", MaxInFlight, pr.MaxInFlight)
	// A lease outlives the slot by the timeout and a slack; a worker sends no later than margin/2 after
	// its slot, so with no margin a late request could outlive its lease.
	p.check(pr.MaxInFlight <= 0 || margin > 0, path+".max_in_flight",
		"needs gate.margin > 0 (a worker with no late limit could send after its lease lapsed), got %d with gate.margin 0", pr.MaxInFlight)
	pr.validateRequest(p, path)
	pr.validateEndpoints(p, path)
	pr.validateAuth(p, path)
	pr.validateRetries(p, path)
	pr.validateBreaker(p, path)
}

// validateEndpoint checks where the provider's requests go (url) and how long they may take (timeout).
func (pr Provider) validateEndpoint(p *problems, path string) {
	if u, err := url.Parse(pr.URL); pr.URL == "" {
		p.add(path+".url", "required: the provider's API, an absolute http or https URL")
	} else {
		p.check(err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "",
			path+".url", "must be an absolute http or https URL, got %q", pr.URL)
	}
	p.check(pr.Timeout > 0, path+".timeout", "must be > 0, got %s", pr.Timeout)
}

// validateAlgorithm checks the gate's algorithm, its mode and the buckets of a sliding window.
func (pr Provider) validateAlgorithm(p *problems, path string) {
	p.check(slices.Contains(Algorithms, pr.Algorithm), path+".algorithm", "unknown algorithm %q (supported: %s)", pr.Algorithm, strings.Join(Algorithms, ", "))
	p.check(pr.Mode == ModeEnforce || pr.Mode == ModeShadow, path+".mode", "must be %s or %s, got %q", ModeEnforce, ModeShadow, pr.Mode)
	switch {
	case pr.Buckets != 0 && pr.Algorithm != string(gate.SlidingWindow):
		p.add(path+".buckets", "only for algorithm sliding_window (this provider uses %s), got %d", pr.Algorithm, pr.Buckets)
	case pr.Buckets != 0 && (pr.Buckets < 1 || pr.Buckets > gate.MaxBuckets):
		p.add(path+".buckets", "must be 1..%d, got %d", gate.MaxBuckets, pr.Buckets)
	}
}

// validateAdaptive checks an adaptive limit (pr.Adaptive is set) against the rest of the provider's settings.
func (pr Provider) validateAdaptive(p *problems, path string) {
	lo, _, err := pr.Adaptive.Range()
	if err != nil {
		p.add(path+".adaptive", "%v", err)
	} else if len(pr.Limits) != 1 || pr.Limits[0].Requests != lo.Limit || pr.Limits[0].Per != lo.Window {
		p.add(path+".limits", "leave out with adaptive: the limit is learned from adaptive.min (%s) up to adaptive.max", lo)
	}
	p.check(!pr.LimitsFromHeaders, path+".limits_from_headers", "is for a provider that announces its limits; adaptive is for one that does not: pick one")
	p.check(pr.Mode != ModeShadow, path+".mode", "shadow sends whatever the gate says: there is nothing to learn from; leave out adaptive or shadow")
	p.check(pr.Algorithm == string(gate.SlidingLog) || pr.Algorithm == string(gate.SlidingWindow) || pr.Algorithm == string(gate.FixedWindow),
		path+".adaptive", "needs an algorithm that keeps a history (sliding_log, sliding_window, fixed_window): %s starts afresh, with a warm-up, at every change of its limits", pr.Algorithm)
	if _, hi, err := pr.Adaptive.Range(); err == nil && pr.Algorithm == string(gate.SlidingLog) && hi.Limit > gate.MaxSlidingLogLimit {
		p.add(path+".adaptive", "max must be <= %d under sliding_log, which keeps one entry per unit of cost (use sliding_window), got %d", gate.MaxSlidingLogLimit, hi.Limit)
	}
}

// validateBurst checks the burst against the shortest limit, once every limit is valid.
func (pr Provider) validateBurst(p *problems, path string) {
	if valid := !slices.ContainsFunc(pr.Limits, func(l Limit) bool { return l.Requests < 1 || l.Per <= 0 }); valid && len(pr.Limits) > 0 {
		shortest := gate.ShortestPolicy(pr.Policies()) // the limit the gate paces by
		p.check(pr.Burst >= 1 && pr.Burst <= shortest.Limit, path+".burst",
			"must be 1..%d (the requests of the shortest limit, %d per %s), got %d", shortest.Limit, shortest.Limit, shortest.Window, pr.Burst)
	}
}

// validateRequest checks what a request to the provider carries: its method, headers, credentials and
// idempotency key.
func (pr Provider) validateRequest(p *problems, path string) {
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
}

// validateRetries checks which answers are retried and how long a 429 waits without a Retry-After.
func (pr Provider) validateRetries(p *problems, path string) {
	for i, st := range pr.RetryOn {
		p.check(st >= 400 && st <= 499 && st != 429, fmt.Sprintf("%s.retry_on[%d]", path, i), "must be a 4xx status other than 429, got %d", st)
	}
	p.check(pr.RetryAfterDefault > 0, path+".retry_after_default", "must be > 0, got %s", pr.RetryAfterDefault)
	p.check(pr.RetryAfterMax >= pr.RetryAfterDefault, path+".retry_after_max", "must be >= retry_after_default (%s), got %s", pr.RetryAfterDefault, pr.RetryAfterMax)
}

// limits checks a list of limits: a provider's (path.limits), or a merchant's within it.
func (p *problems) limits(path, algo string, limits []Limit, margin time.Duration) {
	p.check(len(limits) > 0, path+".limits", "must list at least one {requests, per}")
	seen := map[time.Duration]int{} // by the µs, as the gate counts windows
	for i, l := range limits {
		lp := fmt.Sprintf("%s.limits[%d]", path, i)
		p.check(l.Requests >= 1, lp+".requests", "must be >= 1, got %d", l.Requests)
		p.check(algo != string(gate.SlidingLog) || l.Requests <= gate.MaxSlidingLogLimit, lp+".requests",
			"must be <= %d under sliding_log, which keeps one entry per unit of cost (use sliding_window or gcra for larger budgets), got %d", gate.MaxSlidingLogLimit, l.Requests)
		switch {
		case l.Per <= 0:
			p.add(lp+".per", "must be > 0, got %s", l.Per)
		case l.Per < time.Millisecond:
			p.add(lp+".per", "must be >= 1ms, got %s", l.Per)
		case l.Per > gate.MaxWindow:
			p.add(lp+".per", "must be <= %s (366 days), got %s", gate.MaxWindow, l.Per)
		case margin >= l.Per:
			p.add(lp+".per", "must be longer than gate.margin (%s), got %s", margin, l.Per)
		}
		µs := (l.Per + time.Microsecond - 1).Truncate(time.Microsecond)
		if j, dup := seen[µs]; dup && l.Per > 0 {
			p.add(lp+".per", "repeats the window of limits[%d] (%s, to the µs); keep the tighter one", j, limits[j].Per)
		}
		seen[µs] = i
	}
}

// merchants checks a provider's merchants' limits (per_merchant, merchants) and merchant_header.
func (p *problems) merchants(path string, pr Provider, margin time.Duration) {
	p.check(headerName.MatchString(pr.MerchantHeader), path+".merchant_header", "must be an HTTP header name, got %q", pr.MerchantHeader)
	for _, other := range [][2]string{{"idempotency_header", pr.IdempotencyHeader}, {"auth_header", pr.AuthHeader}} {
		p.check(!strings.EqualFold(pr.MerchantHeader, other[1]), path+".merchant_header", "must differ from %s (%s): the merchant would overwrite it", other[0], other[1])
	}
	if pr.PerMerchant == nil && len(pr.Merchants) == 0 {
		return
	}
	algos := make([]string, 0, len(gate.MerchantAlgorithms))
	for _, a := range gate.MerchantAlgorithms {
		algos = append(algos, string(a))
	}
	limited := pr.PerMerchant != nil && len(pr.PerMerchant.Limits) > 0
	for _, ms := range pr.Merchants {
		limited = limited || len(ms.Limits) > 0
	}
	if limited && !slices.Contains(algos, pr.Algorithm) {
		what := ".per_merchant"
		if pr.PerMerchant == nil || len(pr.PerMerchant.Limits) == 0 {
			what = ".merchants"
		}
		p.add(path+what, "algorithm %s keeps one level for all of a provider's limits and cannot count a merchant's beside them; use %s",
			pr.Algorithm, strings.Join(algos, ", "))
		return
	}
	if pr.PerMerchant != nil && len(pr.PerMerchant.Limits) > 0 {
		p.limits(path+".per_merchant", pr.Algorithm, pr.PerMerchant.Limits, margin)
	}
	names := slices.Sorted(maps.Keys(pr.Merchants))
	for _, m := range names {
		mp := path + ".merchants." + m
		p.check(m != "" && utf8.RuneCountInString(m) <= job.MaxMerchant && job.ValidMerchant(m), mp,
			"a merchant name is 1..%d characters without control or format characters (the job's merchant)", job.MaxMerchant)
		p.check(m != job.MerchantOther && m != job.MerchantNone, mp, "%s and %s name the merchants left out of the metrics' labels; rename it", job.MerchantOther, job.MerchantNone)
		ms := pr.Merchants[m]
		if len(ms.Limits) > 0 {
			p.limits(mp, pr.Algorithm, ms.Limits, margin)
		}
		p.check(ms.Weight >= 0 && ms.Weight <= MaxWeight, mp+".weight", "must be 1..%d (default 1), got %d", MaxWeight, ms.Weight)
	}
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
