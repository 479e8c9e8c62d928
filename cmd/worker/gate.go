package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/gate"
)

// configError marks an invalid or unreadable configuration: exit status 2.
type configError struct{ err error }

func (e configError) Error() string { return e.err.Error() }
func (e configError) Unwrap() error { return e.err }

func loadConfig(path string, stderr io.Writer) (*config.Config, error) {
	c, err := config.Load(path)
	if err != nil {
		return nil, configError{err}
	}
	if _, err := newLogger(c.Log, stderr); err != nil {
		return nil, configError{err}
	}
	for _, name := range c.UnknownEnv(os.Environ(), "PAYGATE_CONFIG") {
		fmt.Fprintf(stderr, "worker: warning: environment variable %s sets no configuration key (a typo?); it is ignored\n", name)
	}
	return c, nil
}

// checkHold refuses a configuration under which a worker could hold a RabbitMQ delivery past the
// broker's consumer_timeout: the broker would close the channel and redeliver everything on it.
func checkHold(c *config.Config) error {
	if c.Broker.Kind != "rabbitmq" {
		return nil
	}
	var slowest time.Duration
	for _, p := range c.Providers {
		slowest = max(slowest, p.Timeout)
	}
	r := c.Broker.RabbitMQ
	hold := consumers.HoldBound(workerConfig(c), r.Prefetch, slowest)
	if hold < r.ConsumerTimeout {
		return nil
	}
	return &config.ValidationError{Problems: []string{fmt.Sprintf("broker.rabbitmq.consumer_timeout: %s is not more than the longest a worker can hold a delivery, %s "+
		"(ceil(prefetch %d / concurrency %d) x (%d x max_inline_wait %s + slowest provider timeout %s + %s to settle)): "+
		"raise consumer_timeout on the broker and here, or lower prefetch, max_inline_wait or the timeouts",
		r.ConsumerTimeout, hold, r.Prefetch, c.Worker.Concurrency, consumers.InlineWaits, c.Worker.MaxInlineWait, slowest, consumers.SettleTimeout)}}
}

// capacity says, per provider, what one worker process can keep in flight against its paced budget, so that
// a fleet too small for it is not a silent cap: handlers are worker.concurrency, and under RabbitMQ no more
// than its prefetch (deliveries the broker hands a consumer before any is settled). One process fills a
// budget of R per second while a request (with its settling) takes under handlers / R; a slower provider
// needs more processes (they add up) or a higher concurrency. warn is set when the configuration caps
// itself: a prefetch below the concurrency leaves handlers idle whatever the provider.
func capacity(c *config.Config) (lines []string, warn []string) {
	handlers := c.Worker.Concurrency
	if c.Broker.Kind == "rabbitmq" && c.Broker.RabbitMQ.Prefetch < handlers {
		handlers = c.Broker.RabbitMQ.Prefetch
		warn = append(warn, fmt.Sprintf("broker.rabbitmq.prefetch %d is below worker.concurrency %d: only %d handlers per provider ever work; raise prefetch to at least the concurrency",
			c.Broker.RabbitMQ.Prefetch, c.Worker.Concurrency, handlers))
	}
	for _, name := range c.ProviderNames() {
		ps := c.Providers[name].Policies()
		pace := gate.PaceOf(ps, c.Gate.Margin)
		if pace == 0 {
			lines = append(lines, fmt.Sprintf("%s: quotas only (no window of a minute or less): %d handlers per process", name, handlers))
			continue
		}
		rate := float64(time.Second) / float64(pace)
		fill := time.Duration(float64(handlers) / rate * float64(time.Second)).Round(time.Millisecond)
		lines = append(lines, fmt.Sprintf("%s: %.4g/s paced; one process's %d handlers fill it while a request takes under %s; more processes add up", name, rate, handlers, fill))
	}
	return lines, warn
}

func checkConfig(args []string, stdout, stderr io.Writer) error {
	fs, path := newFlags("check-config", stderr)
	if err := parse(fs, args); err != nil {
		return err
	}
	c, err := loadConfig(*path, stderr)
	if err != nil {
		return err
	}
	if err := checkHold(c); err != nil {
		return configError{err}
	}
	fmt.Fprintf(stdout, "%s: valid\n", *path)
	fmt.Fprintf(stdout, "redis:  %s, key prefix %q\n", c.Redis, c.Redis.KeyPrefix)
	switch c.Broker.Kind {
	case "rabbitmq":
		fmt.Fprintf(stdout, "broker: rabbitmq, exchange %q, url from $%s\n", c.Broker.RabbitMQ.Exchange, c.Broker.RabbitMQ.URLEnv)
	case "kafka":
		fmt.Fprintf(stdout, "broker: kafka %s, group %q, topic prefix %q\n", strings.Join(c.Broker.Kafka.Brokers, ","), c.Broker.Kafka.Group, c.Broker.Kafka.TopicPrefix)
	}
	if c.Gate.MarginMax > c.Gate.Margin {
		fmt.Fprintf(stdout, "gate:   margin %s, following the fleet's lateness up to %s\n", c.Gate.Margin, c.Gate.MarginMax)
	} else {
		fmt.Fprintf(stdout, "gate:   margin %s\n", c.Gate.Margin)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROVIDER\tLIMITS\tALGORITHM\tPACE\tTIMEOUT\tURL")
	for _, name := range c.ProviderNames() {
		p := c.Providers[name]
		var limits []string
		for _, pol := range p.Policies() {
			limits = append(limits, pol.String())
		}
		algo := p.Algorithm
		if p.Buckets != 0 {
			algo = fmt.Sprintf("%s (%d buckets)", algo, p.Buckets)
		}
		pace := "none (quotas only)"
		if every := gate.PaceOf(p.Policies(), c.Gate.Margin); every > 0 {
			pace = "every " + every.String()
			if p.Burst > 1 {
				pace += fmt.Sprintf(", burst %d", p.Burst)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", name, strings.Join(limits, ","), algo, pace, p.Timeout, p.URL)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	lines, warn := capacity(c)
	fmt.Fprintln(stdout, "capacity:")
	for _, l := range lines {
		fmt.Fprintln(stdout, "  "+l)
	}
	for _, w := range warn {
		fmt.Fprintln(stdout, "warning: "+w)
	}
	return nil
}

// newGate connects to Redis as configured and builds the gate over every configured provider. A worker
// passes true: StaleAfter is margin/2 and the warm-up is as configured; the operator tools ask plainly
// (no staleness, no warm-up: a "gate try" on a lost state does not hold the provider).
func newGate(c *config.Config, worker bool) (*gate.Limiter, redis.UniversalClient, error) {
	opts, err := c.Redis.Options()
	if err != nil {
		return nil, nil, configError{err}
	}
	rdb := redis.NewUniversalClient(opts)
	ps := make(map[string]gate.Provider, len(c.Providers))
	for name, p := range c.Providers {
		ps[name] = gate.Provider{Policies: p.Policies(), Algorithm: gate.Algorithm(p.Algorithm), Buckets: p.Buckets, Burst: p.Burst}
	}
	o := gate.Options{Prefix: c.Redis.KeyPrefix, Margin: c.Gate.Margin, MarginMax: c.Gate.MarginMax, Providers: ps}
	if worker {
		o.StaleAfter, o.WarmUp, o.WarmUpCap, o.Horizon = c.Gate.Margin/2, c.Gate.WarmUp, c.Gate.WarmUpMax, consumers.LossNotice
		if c.Redis.Mode() == "cluster" {
			// A node restarted empty need not break the watch's connection (it may be to another node), and
			// its announcement crosses the cluster bus, which it may not have rejoined yet: the warm-up
			// covers the reservations workers hold, as without the watch.
			o.Horizon = c.Worker.MaxInlineWait
		}
	}
	l, err := gate.New(rdb, o)
	if err != nil {
		rdb.Close()
		return nil, nil, err
	}
	return l, rdb, nil
}

// openGate loads the config at path and connects the gate, for a command about one provider.
func openGate(cmd, path, provider string, stderr io.Writer) (*gate.Limiter, func(), error) {
	if provider == "" {
		return nil, nil, usageError{fmt.Errorf("%s: --provider is required", cmd)}
	}
	c, err := loadConfig(path, stderr)
	if err != nil {
		return nil, nil, err
	}
	if _, ok := c.Providers[provider]; !ok {
		return nil, nil, usageError{fmt.Errorf("%s: provider %q is not configured in %s", cmd, provider, path)}
	}
	l, rdb, err := newGate(c, false)
	if err != nil {
		return nil, nil, err
	}
	return l, func() { rdb.Close() }, nil
}

// tryVerdict is the JSON "worker gate try" prints; its keys are a public contract (add, never rename).
type tryVerdict struct {
	Provider     string  `json:"provider"`
	ID           string  `json:"id"`
	Cost         int64   `json:"cost"`
	Allowed      bool    `json:"allowed"`
	Duplicate    bool    `json:"duplicate"`
	Paused       bool    `json:"paused"`
	DelayMs      float64 `json:"delay_ms"`
	RetryAfterMs int64   `json:"retry_after_ms"`
	Remaining    int64   `json:"remaining"`
	Policy       int     `json:"policy"`
	Limit        string  `json:"limit"`
	Now          string  `json:"now"`
	ResetAfterMs int64   `json:"reset_after_ms"`
	Algorithm    string  `json:"algorithm"`
	Forced       bool    `json:"forced"`
}

func gateTry(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, path := newFlags("gate try", stderr)
	provider := fs.String("provider", "", "provider name (required)")
	id := fs.String("id", "", "job id (default: a random id)")
	cost := fs.Int64("cost", 1, "units of budget the job costs")
	maxWait := fs.Duration("max-wait", 0, "accept a reserved slot up to this far ahead (0: now or denied)")
	force := fs.Bool("force", false, "admit now even from an empty bucket, draining it to zero (token_bucket only)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *id == "" {
		*id = randomID()
	}
	l, closeGate, err := openGate("gate try", *path, *provider, stderr)
	if err != nil {
		return err
	}
	defer closeGate()
	algo, err := l.Algorithm(*provider)
	if err != nil {
		return err
	}
	var v gate.Verdict
	switch {
	case *force && algo != gate.TokenBucket:
		return usageError{fmt.Errorf("gate try: --force needs algorithm %s; provider %s uses %s", gate.TokenBucket, *provider, algo)}
	case *force && *maxWait != 0:
		return usageError{errors.New("gate try: --force goes now; it takes no --max-wait")}
	case *force:
		v, err = l.Force(ctx, *provider, *id, *cost)
	default:
		v, err = l.Reserve(ctx, *provider, *id, *cost, *maxWait)
	}
	if err != nil {
		if errors.Is(err, gate.ErrInvalid) {
			return usageError{err} // a bad --cost or --id
		}
		return err
	}
	return writeJSON(stdout, tryVerdict{
		Provider:     *provider,
		ID:           *id,
		Cost:         *cost,
		Allowed:      v.Allowed,
		Duplicate:    v.Duplicate,
		Paused:       v.Paused,
		DelayMs:      float64(v.Delay.Microseconds()) / 1000,
		RetryAfterMs: v.RetryAfter.Milliseconds(),
		Remaining:    v.Remaining,
		Policy:       v.Policy,
		Limit:        v.Limit.String(),
		Now:          v.Now.UTC().Format(time.RFC3339Nano),
		ResetAfterMs: ceilMs(v.ResetAfter),
		Algorithm:    string(algo),
		Forced:       *force,
	})
}

type statusPolicy struct {
	Policy       int    `json:"policy"`
	Limit        string `json:"limit"`
	Used         int64  `json:"used"`
	Reserved     int64  `json:"reserved"`
	Remaining    int64  `json:"remaining"`
	ResetAfterMs int64  `json:"reset_after_ms"`
}

type statusReport struct {
	Provider    string         `json:"provider"`
	Algorithm   string         `json:"algorithm"`
	Now         string         `json:"now"`
	PausedUntil string         `json:"paused_until,omitempty"`
	Units       int64          `json:"units"`
	Policies    []statusPolicy `json:"policies"`
	// The margin in force (gate.margin .. gate.margin_max), and why it is what it is.
	MarginMs      float64 `json:"margin_ms"`
	MarginFloorMs float64 `json:"margin_floor_ms"`
	MarginMaxMs   float64 `json:"margin_max_ms"`
	MarginWhy     string  `json:"margin_why"`
}

func gateStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, path := newFlags("gate status", stderr)
	provider := fs.String("provider", "", "provider name (required)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of a table")
	if err := parse(fs, args); err != nil {
		return err
	}
	l, closeGate, err := openGate("gate status", *path, *provider, stderr)
	if err != nil {
		return err
	}
	defer closeGate()
	m, err := l.ReadMargin(ctx, *provider) // first: the status then counts under the margin in force
	if err != nil {
		return err
	}
	st, err := l.Status(ctx, *provider)
	if err != nil {
		return err
	}
	algo, err := l.Algorithm(*provider)
	if err != nil {
		return err
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	rep := statusReport{Provider: st.Provider, Algorithm: string(algo), Now: st.Now.UTC().Format(time.RFC3339Nano), Units: st.Units,
		MarginMs: ms(m.Margin), MarginFloorMs: ms(m.Floor), MarginMaxMs: ms(m.Ceiling), MarginWhy: m.Why}
	if !st.PausedUntil.IsZero() {
		rep.PausedUntil = st.PausedUntil.UTC().Format(time.RFC3339Nano)
	}
	for i, p := range st.Policies {
		rep.Policies = append(rep.Policies, statusPolicy{
			Policy: i, Limit: p.Policy.String(), Used: p.Used, Reserved: p.Reserved,
			Remaining: p.Remaining, ResetAfterMs: ceilMs(p.ResetAfter),
		})
	}
	if *asJSON {
		return writeJSON(stdout, rep)
	}
	paused := "no"
	if rep.PausedUntil != "" {
		paused = fmt.Sprintf("until %s (%s from now)", rep.PausedUntil, st.PausedUntil.Sub(st.Now).Round(time.Millisecond))
	}
	record := "in the log"
	if algo != gate.SlidingLog {
		record = "in the id record"
	}
	fmt.Fprintf(stdout, "provider %s (%s) at %s (Redis clock), %d units %s, paused: %s\n", rep.Provider, rep.Algorithm, rep.Now, rep.Units, record, paused)
	fmt.Fprintf(stdout, "margin in force %s (gate.margin %s, gate.margin_max %s): %s\n", m.Margin, m.Floor, m.Ceiling, m.Why)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POLICY\tLIMIT\tUSED\tRESERVED\tREMAINING\tRESET IN")
	for _, p := range rep.Policies {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%dms\n", p.Policy, p.Limit, p.Used, p.Reserved, p.Remaining, p.ResetAfterMs)
	}
	return tw.Flush()
}

func ceilMs(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	return enc.Encode(v)
}

func randomID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return "try-" + hex.EncodeToString(b[:])
}
