// Package ops serves the operations endpoint: Prometheus /metrics, /healthz (the process is alive) and
// /readyz (every dependency answers).
package ops

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Check reports whether one dependency is usable; nil means ready.
type Check func(ctx context.Context) error

// Server is a running operations endpoint.
type Server struct {
	srv *http.Server
	ln  net.Listener
}

// Start listens on addr (port 0 picks a free port; Addr tells which) and serves until Close.
func Start(addr string, gatherer prometheus.Gatherer, checks map[string]Check) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("ops: listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		var errs []error
		for name, check := range checks {
			if err := check(ctx); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			}
		}
		if err := errors.Join(errs...); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	s := &Server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, ln: ln}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// Addr is the address actually listened on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops serving.
func (s *Server) Close() error { return s.srv.Close() }
