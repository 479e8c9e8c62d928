package main

import (
	"context"
	"io"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/ops"
	"github.com/paygate/paygate/wire"
)

// runWorker is "worker run": consume, gate, dispatch, settle, until SIGTERM/SIGINT.
func runWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, _, err := loadRunnable("run", args, stderr)
	if err != nil {
		return err
	}
	log, err := newLogger(c.Log, stderr)
	if err != nil {
		return configError(err)
	}
	defer func() { _ = log.Sync() }()

	parts, err := wire.Build(ctx, c, wire.Options{Log: log})
	if err != nil {
		return err
	}
	defer parts.Close()
	rdb, b := parts.Redis, parts.Broker

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

	w, err := parts.Worker(nil, log, metrics)
	if err != nil {
		return err
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		log.Warn("redis unreachable at start: jobs are deferred until it answers", zap.Error(err))
	}
	// Every worker holds a provider as soon as any of them is throttled, and gives up slots decided before a
	// loss of the gate's state (gate.Limiter.Watch), until its last job settled: jobs still go out at their
	// slots during the shutdown.
	watch, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		if err := parts.Watch(watch, w); err != nil {
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
