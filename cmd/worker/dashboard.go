package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/paygate/paygate/dashboard"
	"github.com/paygate/paygate/wire"
)

// dashboardCmd is "worker dashboard": one live page of every configured provider's budget, read from Redis
// by this process once a second, until SIGTERM.
func dashboardCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, path := newFlags("dashboard", stderr)
	listen := fs.String("listen", "127.0.0.1:8080", "address to serve the page on (loopback by default)")
	if err := parse(fs, args); err != nil {
		return err
	}
	c, err := loadConfig(*path, stderr)
	if err != nil {
		return err
	}
	l, rdb, err := wire.CheckedGate(ctx, c, wire.Tool)
	if err != nil {
		return err
	}
	defer rdb.Close()
	names := c.ProviderNames()
	src := dashboard.GateSource(l, names)
	backlog, closeBacklog, err := wire.Backlog(c, wire.Options{})
	if err != nil {
		return err
	}
	defer closeBacklog()
	if backlog != nil {
		if err := refusedAtStart(ctx, backlog); err != nil {
			return err
		}
		src = dashboard.WithBacklog(src, backlog)
	} else {
		fmt.Fprintf(stderr, "dashboard: $%s is not set: queue depths are not shown\n", c.Broker.RabbitMQ.URLEnv)
	}
	srv := dashboard.New(src, time.Second, 300)
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return usageError{fmt.Errorf("dashboard: --listen %s: %w", *listen, err)}
	}
	fmt.Fprintf(stdout, "dashboard of %d providers listening on %s (http://%s/)\n", len(names), ln.Addr(), ln.Addr())
	go srv.Run(ctx)
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// refusedAtStart reads the backlog once: the broker's refusal (credentials, a certificate) stops the
// dashboard at once with status 2; any other failure it shows on the page, as it comes and goes.
func refusedAtStart(ctx context.Context, backlog dashboard.Backlog) error {
	ctx, cancel := context.WithTimeout(ctx, 4*time.Second)
	defer cancel()
	_, err := backlog(ctx)
	if errors.As(err, new(wire.ConfigError)) {
		return err
	}
	return nil
}
