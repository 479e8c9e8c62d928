package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// probeCmd is "worker probe": a health check for images without an HTTP client (the distroless one). It
// asks a worker's /readyz (or any URL) and exits 0 on a 2xx answer, 1 otherwise with the answer's first
// line (readyz names what is down).
func probeCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("probe", stderr)
	target := fs.String("url", "http://127.0.0.1:9090/readyz", "the URL to ask (a worker's /readyz or /healthz)")
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for the answer")
	if err := parse(fs, args); err != nil {
		return err
	}
	u, err := url.Parse(*target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usageError{fmt.Errorf("probe: --url %q: want an http:// or https:// URL", *target)}
	}
	if *timeout <= 0 {
		return usageError{fmt.Errorf("probe: --timeout must be more than 0, got %s", *timeout)}
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return usageError{fmt.Errorf("probe: %w", err)}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("probe: %s: %w", u.Redacted(), err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	line, _, _ := strings.Cut(strings.TrimSpace(string(body)), "\n")
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("probe: %s answered %d: %s", u.Redacted(), resp.StatusCode, line)
	}
	_, err = fmt.Fprintf(stdout, "%s: %d %s\n", u.Redacted(), resp.StatusCode, line)
	return err
}
