package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/paygate/paygate/dashboard"
	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/internal/report"
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
	rdb, err := wire.Redis(c)
	if err != nil {
		return err
	}
	defer rdb.Close()
	l, err := wire.Gate(c, rdb, wire.Tool)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(c.Providers))
	for name := range c.Providers {
		names = append(names, name)
	}
	slices.Sort(names)
	srv := dashboard.New(statusSource(l, names), time.Second, 300)
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

// statusSource reads each provider's status as gate status --json prints it; a provider that cannot be
// read carries the error.
func statusSource(l *gate.Limiter, names []string) dashboard.Source {
	return func(ctx context.Context) []dashboard.Entry {
		out := make([]dashboard.Entry, 0, len(names))
		for _, name := range names {
			rep, err := report.Of(ctx, l, name)
			e := dashboard.Entry{Status: rep}
			if err != nil {
				e = dashboard.Entry{Status: report.Status{Provider: name}, Error: err.Error()}
			}
			out = append(out, e)
		}
		return out
	}
}
