package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/consumers/kafka"
	"github.com/paygate/paygate/consumers/rabbitmq"
	"github.com/paygate/paygate/job"
	"github.com/paygate/paygate/ops"
	"github.com/paygate/paygate/providers"
)

// runWorker is "worker run": consume, gate, dispatch, settle, until SIGTERM/SIGINT.
func runWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, path := newFlags("run", stderr)
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
	log, err := newLogger(c.Log, stderr)
	if err != nil {
		return configError{err}
	}
	defer func() { _ = log.Sync() }()

	limiter, rdb, err := newGate(c, true)
	if err != nil {
		return err
	}
	defer rdb.Close()
	dispatchers := map[string]consumers.Dispatcher{}
	for _, name := range c.ProviderNames() {
		cl, err := providers.New(name, c.Providers[name], providers.Options{Concurrency: c.Worker.Concurrency, Logger: log.Named("dispatch")})
		if err != nil {
			return configError{err}
		}
		defer cl.Close()
		dispatchers[name] = cl
	}
	b, err := openBroker(ctx, c, log)
	if err != nil {
		return err
	}
	defer b.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := consumers.NewMetrics(reg)
	for _, name := range c.ProviderNames() {
		metrics.Touch(name)
	}
	srv, err := ops.Start(c.HTTP.Listen, reg, map[string]ops.Check{
		"redis":  func(ctx context.Context) error { return rdb.Ping(ctx).Err() },
		"broker": func(context.Context) error { return b.Ready() },
	})
	if err != nil {
		return err
	}
	defer srv.Close()

	w, err := consumers.New(workerConfig(c), limiter, dispatchers, log, metrics)
	if err != nil {
		return err
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		log.Warn("redis unreachable at start: jobs are deferred until it answers", zap.Error(err))
	}
	// Every worker holds a provider as soon as any of them is throttled (gate.Limiter.WatchPauses), until
	// its last job settled: jobs still go out at their slots during the shutdown.
	watch, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		if err := limiter.Watch(watch, rdb, w); err != nil {
			log.Warn("pause announcements stopped: pauses still bind new gate decisions", zap.Error(err))
		}
	}()
	defer func() { stopWatch(); <-watched }()
	lines, warn := capacity(c)
	for _, l := range lines {
		log.Info("capacity: " + l)
	}
	for _, w := range warn {
		log.Warn("capacity: " + w)
	}
	log.Info("worker running", zap.String("http", srv.Addr()), zap.String("broker", c.Broker.Kind),
		zap.String("redis", c.Redis.String()), zap.Strings("providers", c.ProviderNames()))
	err = w.Run(ctx, b)
	log.Info("worker stopped")
	return err
}

func workerConfig(c *config.Config) consumers.Config {
	maxCost := map[string]int64{}
	for name, p := range c.Providers {
		m := p.Limits[0].Requests
		for _, l := range p.Limits {
			m = min(m, l.Requests)
		}
		maxCost[name] = m
	}
	tiers := c.Worker.DelayTiers
	return consumers.Config{
		Concurrency:     c.Worker.Concurrency,
		MaxInlineWait:   c.Worker.MaxInlineWait,
		MaxAttempts:     c.Worker.MaxAttempts,
		MaxDeferralAge:  c.Worker.MaxDeferralAge,
		ShutdownTimeout: c.Worker.ShutdownTimeout,
		BackoffBase:     tiers[0],
		BackoffMax:      tiers[len(tiers)-1],
		RedisRetry:      tiers[0],
		LateLimit:       c.Gate.Margin / 2,
		Providers:       maxCost,
	}
}

// broker is what the commands need of a broker adapter.
type broker interface {
	consumers.Broker
	Publish(ctx context.Context, provider string, body []byte) error
	Ready() error
	Close() error
}

func openBroker(ctx context.Context, c *config.Config, log *zap.Logger) (broker, error) {
	switch c.Broker.Kind {
	case "rabbitmq":
		r := c.Broker.RabbitMQ
		url := config.Secret(r.URLEnv)
		if url == "" {
			return nil, configError{fmt.Errorf("broker.rabbitmq.url_env: environment variable %s is not set (amqp://user:pass@host:5672/vhost, or amqps://…:5671/… for TLS)", r.URLEnv)}
		}
		tlsc, err := r.TLSConfig()
		if err != nil {
			return nil, configError{err}
		}
		if tlsc != nil && !strings.HasPrefix(strings.ToLower(url), "amqps://") {
			return nil, configError{fmt.Errorf("broker.rabbitmq.tls_ca_file: is set, but $%s is not an amqps:// URL", r.URLEnv)}
		}
		return rabbitmq.Open(ctx, rabbitmq.Options{URL: url, TLS: tlsc, Exchange: r.Exchange, Prefetch: r.Prefetch,
			Providers: c.ProviderNames(), DelayTiers: c.Worker.DelayTiers, Log: log.Named("rabbitmq")})
	case "kafka":
		k := c.Broker.Kafka
		return kafka.Open(ctx, kafka.Options{Brokers: k.Brokers, Group: k.Group, TopicPrefix: k.TopicPrefix,
			Partitions: k.Partitions, ReplicationFactor: k.ReplicationFactor, Providers: c.ProviderNames(),
			DelayTiers: c.Worker.DelayTiers, Log: log.Named("kafka")})
	default:
		return nil, configError{fmt.Errorf("broker.kind: %s is not supported", c.Broker.Kind)}
	}
}

// enqueue is "worker enqueue": publish synthetic jobs, or the jobs of a JSON-lines file, with confirms.
func enqueue(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, path := newFlags("enqueue", stderr)
	provider := fs.String("provider", "", "provider of the synthetic jobs")
	count := fs.Int("count", 0, "number of synthetic jobs")
	cost := fs.Int64("cost", 1, "cost of each synthetic job")
	rate := fs.Float64("rate", 0, "jobs per second (0: as fast as confirms allow)")
	prefix := fs.String("id-prefix", "", "synthetic job ids are <prefix>-<n> (default: a random prefix)")
	file := fs.String("file", "", "JSON-lines file of jobs to publish instead ('-': stdin)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if (*file == "") == (*provider == "" || *count <= 0) {
		return usageError{errors.New("enqueue: give either --provider NAME --count N, or --file jobs.jsonl")}
	}
	c, err := loadConfig(*path, stderr)
	if err != nil {
		return err
	}
	maxCost := workerConfig(c).Providers
	log, err := newLogger(c.Log, stderr)
	if err != nil {
		return configError{err}
	}
	type item struct {
		line int
		j    *job.Job
		body []byte
	}
	var items []item
	refused := 0
	if *file != "" {
		in := io.Reader(os.Stdin)
		if *file != "-" {
			f, err := os.Open(*file)
			if err != nil {
				return usageError{fmt.Errorf("enqueue: %w", err)}
			}
			defer f.Close()
			in = f
		}
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 0, 64<<10), job.MaxBody+1)
		for n := 1; sc.Scan(); n++ {
			line := strings.TrimSpace(sc.Text())
			if line == "" {
				continue
			}
			j, err := job.Decode([]byte(line), maxCost)
			if err != nil {
				fmt.Fprintf(stderr, "enqueue: %s line %d: %v\n", *file, n, err)
				refused++
				continue
			}
			items = append(items, item{n, j, []byte(line)})
		}
		if err := sc.Err(); err != nil {
			return usageError{fmt.Errorf("enqueue: %s: %w", *file, err)}
		}
	} else {
		if _, ok := maxCost[*provider]; !ok {
			return usageError{fmt.Errorf("enqueue: provider %q is not configured in %s", *provider, *path)}
		}
		if *prefix == "" {
			*prefix = "job-" + randomID()[4:14]
		}
		for i := range *count {
			body := fmt.Appendf(nil, `{"id":%q,"provider":%q,"amount":%d,"currency":"EUR","merchant":"m_%d","cost":%d}`,
				fmt.Sprintf("%s-%d", *prefix, i), *provider, 100+i%9900, i%50, *cost)
			j, err := job.Decode(body, maxCost)
			if err != nil {
				return usageError{fmt.Errorf("enqueue: %w", err)}
			}
			items = append(items, item{i + 1, j, body})
		}
	}
	b, err := openBroker(ctx, c, log)
	if err != nil {
		return err
	}
	defer b.Close()
	var tick <-chan time.Time
	if *rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / *rate))
		defer t.Stop()
		tick = t.C
	}
	for i, it := range items {
		if tick != nil && i > 0 {
			select {
			case <-tick:
			case <-ctx.Done():
				return fmt.Errorf("enqueue: interrupted after %d of %d jobs", i, len(items))
			}
		}
		if err := b.Publish(ctx, it.j.Provider, it.body); err != nil {
			return fmt.Errorf("enqueue: job %s (line %d): %w; %d of %d published", it.j.ID, it.line, err, i, len(items))
		}
	}
	fmt.Fprintf(stdout, "published %d jobs\n", len(items))
	if refused > 0 {
		return usageError{fmt.Errorf("enqueue: refused %d invalid lines", refused)}
	}
	return nil
}
