package main

import (
	"context"
	"errors"
	"io"
	"os"
	"os/signal"
	"reflect"
	"sync/atomic"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/ops"
	"github.com/paygate/paygate/wire"
)

// runWorker is "worker run": consume, gate, dispatch, settle, until SIGTERM/SIGINT. SIGHUP re-reads the
// configuration file: a valid one replaces the running one after the jobs in hand are finished (as at a
// shutdown, nothing is dropped), an invalid one is refused with check-config's messages and the running
// configuration stays in force.
func runWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, path, err := loadRunnable("run", args, stderr)
	if err != nil {
		return err
	}
	log, err := newLogger(c.Log, stderr)
	if err != nil {
		return configError(err)
	}
	defer func() { _ = log.Sync() }()
	wire.LogRedis(log)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := consumers.NewMetrics(reg)
	var running atomic.Pointer[wire.Parts] // what /readyz checks
	srv, err := ops.Start(c.HTTP.Listen, reg, map[string]ops.Check{
		"redis": func(ctx context.Context) error {
			if p := running.Load(); p != nil {
				return p.RedisReady(ctx)
			}
			return errors.New("starting")
		},
		"broker": func(context.Context) error {
			if p := running.Load(); p != nil {
				return p.Broker.Ready()
			}
			return errors.New("starting")
		},
	})
	if err != nil {
		return err
	}
	defer srv.Close()

	parts, err := wire.Build(ctx, c, wire.Options{Log: log})
	if err != nil {
		return err
	}
	killAfterResult(parts)
	for {
		running.Store(parts)
		gen, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- serve(gen, c, parts, log, metrics, srv.Addr()) }()
		next, nextParts, err := untilReload(ctx, path, c, log, stderr, hup, done)
		stop()
		if next != nil {
			err = <-done // the jobs in hand finish, as at a shutdown
		}
		parts.Close()
		if next == nil || err != nil || ctx.Err() != nil {
			if nextParts != nil {
				nextParts.Close()
			}
			return err
		}
		c, parts = next, nextParts
		log.Info("configuration reloaded", zap.String("config", path), zap.Strings("providers", c.ProviderNames()))
	}
}

// untilReload waits for the worker to end (its error; next nil) or for a SIGHUP with a configuration that
// is valid and whose parts could be built (next, and its parts, connected while the running ones work). A
// SIGHUP with an invalid file, or one whose parts cannot be built (its broker unreachable, say), is logged
// and refused: the running configuration stays in force.
func untilReload(ctx context.Context, path string, c *config.Config, log *zap.Logger, stderr io.Writer, hup <-chan os.Signal, done <-chan error) (*config.Config, *wire.Parts, error) {
	for {
		select {
		case err := <-done:
			return nil, nil, err
		case <-hup:
			next, err := loadConfig(path, stderr)
			if err == nil {
				err = checkHold(next)
			}
			if err != nil {
				log.Error("configuration reload refused: the running configuration stays in force", zap.String("config", path), zap.Error(err))
				continue
			}
			parts, err := wire.Build(ctx, next, wire.Options{Log: log})
			if err != nil {
				log.Error("configuration reload failed: the running configuration stays in force", zap.String("config", path), zap.Error(err))
				continue
			}
			if !reflect.DeepEqual(next.Log, c.Log) || next.HTTP != c.HTTP {
				log.Warn("configuration reload: log and http settings take a restart; the rest is reloaded", zap.String("config", path))
			}
			return next, parts, nil
		case <-ctx.Done():
			return nil, nil, <-done
		}
	}
}

// serve runs one configuration's worker until ctx ends.
func serve(ctx context.Context, c *config.Config, parts *wire.Parts, log *zap.Logger, metrics *consumers.Metrics, httpAddr string) error {
	for _, name := range c.ProviderNames() {
		metrics.Touch(name)
	}
	w, err := parts.Worker(nil, log, metrics)
	if err != nil {
		return err
	}
	if err := parts.Redis.Ping(ctx).Err(); err != nil {
		log.Warn("redis unreachable at start: jobs are deferred until it answers", zap.Error(err))
	}
	// Every worker holds a provider as soon as any of them is throttled, and gives up slots decided before a
	// loss of the gate's state or a change of its live limits (gate.Limiter.Watch), until its last job
	// settled: jobs still go out at their slots during the shutdown.
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
	log.Info("worker running", zap.String("http", httpAddr), zap.String("broker", c.Broker.Kind),
		zap.String("redis", c.Redis.String()), zap.Strings("providers", c.ProviderNames()))
	err = w.Run(ctx, parts.Broker)
	log.Info("worker stopped")
	return err
}
