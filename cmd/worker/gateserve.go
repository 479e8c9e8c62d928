package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"

	"github.com/paygate/paygate/wire"
)

// gateServe is "worker gate serve": the gate's HTTP API (docs/gate-service.md) until SIGTERM/SIGINT.
func gateServe(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs, path := newFlags("gate serve", stderr)
	listen := fs.String("listen", "", "address to serve on (default gate_service.listen, loopback)")
	if err := parse(fs, args); err != nil {
		return err
	}
	c, err := loadConfig(*path, stderr)
	if err != nil {
		return err
	}
	if *listen == "" {
		*listen = c.GateService.Listen
	}
	log, err := newLogger(c.Log, stderr)
	if err != nil {
		return configError(err)
	}
	defer func() { _ = log.Sync() }()
	wire.LogRedis(log)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	svc, err := wire.BuildGateService(ctx, c, reg, wire.Options{Log: log})
	if err != nil {
		return err
	}
	defer svc.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return usageError{fmt.Errorf("gate serve: --listen %s: %w", *listen, err)}
	}
	hs := &http.Server{Handler: svc.Handler, TLSConfig: svc.TLS, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute,
		Protocols: new(http.Protocols)}
	// HTTP/1.1, and HTTP/2: over TLS by ALPN, without it as h2c (prior knowledge): one connection carries a
	// caller's calls side by side, the lowest latency (BENCHMARKS.md, "The gate as a service").
	hs.Protocols.SetHTTP1(true)
	hs.Protocols.SetHTTP2(true)
	hs.Protocols.SetUnencryptedHTTP2(true)
	shutDown := make(chan struct{})
	go func() {
		defer close(shutDown)
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(shut) // the calls in hand finish, on the Redis client still open
	}()
	scheme := "http"
	if svc.TLS != nil {
		scheme = "https"
	}
	log.Info("gate service listening", zap.String("url", scheme+"://"+ln.Addr().String()), zap.String("redis", c.Redis.String()),
		zap.Strings("providers", c.ProviderNames()), zap.Bool("client_certificates", c.GateService.TLSClientCAFile != ""))
	if svc.TLS != nil {
		err = hs.ServeTLS(ln, "", "")
	} else {
		err = hs.Serve(ln)
	}
	if !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	<-shutDown
	return nil
}
