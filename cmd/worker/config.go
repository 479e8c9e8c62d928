package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/wire"
)

// The configuration, as every command that takes --config loads and checks it.

// configError marks an invalid or unreadable configuration: exit status 2. The parts wire builds mark
// theirs with the same type.
func configError(err error) error { return wire.ConfigError{Err: err} }

func loadConfig(path string, stderr io.Writer) (*config.Config, error) {
	c, err := config.Load(path)
	if err != nil {
		return nil, configError(err)
	}
	if _, err := newLogger(c.Log, stderr); err != nil {
		return nil, configError(err)
	}
	for _, name := range c.UnknownEnv(os.Environ(), "PAYGATE_CONFIG") {
		fmt.Fprintf(stderr, "worker: warning: environment variable %s sets no configuration key (a typo?); it is ignored\n", name)
	}
	return c, nil
}

// loadRunnable parses a command's flags (--config alone) and loads the configuration a worker can run
// with: valid, and holding no delivery past the broker's consumer timeout. It returns the file's path.
func loadRunnable(name string, args []string, stderr io.Writer) (*config.Config, string, error) {
	fs, path := newFlags(name, stderr)
	if err := parse(fs, args); err != nil {
		return nil, "", err
	}
	c, err := loadConfig(*path, stderr)
	if err != nil {
		return nil, "", err
	}
	if err := checkHold(c); err != nil {
		return nil, "", configError(err)
	}
	return c, *path, nil
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
	hold := consumers.HoldBound(wire.Core(c), r.Prefetch, slowest)
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
	for _, name := range c.ProviderNames() {
		if !c.Providers[name].HasMerchants() || c.Broker.Kind != "rabbitmq" {
			continue
		}
		// The handlers hold their jobs while they wait for a slot: fair shares reorder what is read ahead
		// beyond them.
		if ahead := c.Broker.RabbitMQ.Prefetch - c.Worker.Concurrency; ahead > 0 {
			lines = append(lines, fmt.Sprintf("%s: fair shares between merchants over %d deliveries per process waiting their turn (prefetch %d - concurrency %d)",
				name, ahead, c.Broker.RabbitMQ.Prefetch, c.Worker.Concurrency))
		} else {
			warn = append(warn, fmt.Sprintf("%s has fair shares between merchants, but broker.rabbitmq.prefetch %d leaves no delivery waiting its turn beyond worker.concurrency %d: raise prefetch well above the concurrency",
				name, c.Broker.RabbitMQ.Prefetch, c.Worker.Concurrency))
		}
	}
	return lines, warn
}
