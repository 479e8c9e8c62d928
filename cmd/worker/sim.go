package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/paygate/paygate/providers/sim"
)

// providerSim serves one simulated provider until the context ends (SIGINT/SIGTERM).
func providerSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("provider-sim", stderr)
	listen := fs.String("listen", "127.0.0.1:8081", "address to serve on")
	limits := fs.String("limits", "", "comma-separated N/duration windows, e.g. 100/1s,3000/1m (required)")
	latency := fs.Duration("latency", 0, "added to every answer")
	jitter := fs.Duration("jitter", 0, "latency varies by ± this (uniform)")
	errorRate := fs.Float64("error-rate", 0, "share of requests answered 500")
	timeoutRate := fs.Float64("timeout-rate", 0, "share of requests that hang until the client gives up")
	header := fs.String("idempotency-header", "Idempotency-Key", "header the idempotency key is read from")
	seed := fs.Uint64("seed", 0, "seed for the injected faults (0: random)")
	maxInFlight := fs.Int("max-in-flight", 0, "answer 429 to a request beyond N in flight at once (0: no cap)")
	merchantLimits := fs.String("merchant-limits", "", "N/duration windows enforced per merchant on top of --limits, e.g. 10/1s (none: no per-merchant limits)")
	calendar := fs.Bool("calendar", false, "count windows as calendar windows of Unix time (a per-minute counter that resets at :00), not sliding ones")
	merchantHeader := fs.String("merchant-header", "X-Merchant", "header a request's merchant is read from (providers.<name>.merchant_header)")
	headers := fs.String("headers", "none", "announce the limits in every answer: ietf (RateLimit-Policy, RateLimit), x-ratelimit (X-RateLimit-*) or none")
	var auth simAuth
	auth.flags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if *limits == "" {
		return usageError{errors.New("provider-sim: --limits is required, e.g. --limits 100/1s,3000/1m")}
	}
	if *maxInFlight < 0 {
		return usageError{fmt.Errorf("provider-sim: --max-in-flight %d: want N >= 0 (0: no cap)", *maxInFlight)}
	}
	windows, err := sim.ParseLimits(*limits)
	if err != nil {
		return usageError{err}
	}
	var perMerchant []sim.Window
	if *merchantLimits != "" {
		if perMerchant, err = sim.ParseLimits(*merchantLimits); err != nil {
			return usageError{fmt.Errorf("provider-sim: --merchant-limits: %w", err)}
		}
	}
	opts := sim.Options{Limits: windows, Latency: *latency, Jitter: *jitter, ErrorRate: *errorRate,
		TimeoutRate: *timeoutRate, IdempotencyHeader: *header, Seed: *seed, MaxInFlight: *maxInFlight, Headers: *headers,
		MerchantLimits: perMerchant, MerchantHeader: *merchantHeader, Calendar: *calendar}
	if err := auth.apply(&opts); err != nil {
		return usageError{err}
	}
	if _, err := sim.New(opts); err != nil {
		return usageError{err}
	}
	s, err := sim.Start(*listen, opts)
	if err != nil {
		return err
	}
	capped := ""
	if *maxInFlight > 0 {
		capped = fmt.Sprintf(" max-in-flight %d", *maxInFlight)
	}
	fmt.Fprintf(stdout, "provider-sim listening on %s limits %s%s%s (GET %s/stats)\n", s.Addr(), *limits, capped, auth, s.URL())
	<-ctx.Done()
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.Shutdown(shutdown)
}

// simAuth is provider-sim's auth flags: an OAuth2 client (--oauth2 id:secret, --token-ttl), an HMAC
// secret (--hmac-secret), and TLS (--tls-cert, --tls-key, --client-ca).
type simAuth struct {
	oauth2, hmac        *string
	ttl                 *time.Duration
	cert, key, clientCA *string
}

func (a *simAuth) flags(fs *flag.FlagSet) {
	a.oauth2 = fs.String("oauth2", "", "id:secret: serve POST /token (client credentials) for this client and require its bearer tokens")
	a.ttl = fs.Duration("token-ttl", time.Hour, "how long each token of --oauth2 is valid")
	a.hmac = fs.String("hmac-secret", "", "require every payment request signed with this key (HMAC-SHA256 in X-Signature, X-Timestamp within 5m)")
	a.cert = fs.String("tls-cert", "", "serve TLS with this PEM certificate (needs --tls-key)")
	a.key = fs.String("tls-key", "", "the PEM private key of --tls-cert")
	a.clientCA = fs.String("client-ca", "", "require client certificates signed by the CAs in this PEM file (needs --tls-cert)")
}

// apply puts the flags in opts.
func (a *simAuth) apply(opts *sim.Options) error {
	if *a.oauth2 != "" {
		id, secret, ok := strings.Cut(*a.oauth2, ":")
		if !ok || id == "" || secret == "" || *a.ttl < time.Second {
			return errors.New("provider-sim: --oauth2 wants id:secret, and --token-ttl at least 1s")
		}
		opts.OAuth2 = &sim.OAuth2Client{ID: id, Secret: secret, TTL: *a.ttl}
	}
	opts.HMACSecret = *a.hmac
	switch {
	case *a.cert == "" && *a.key == "" && *a.clientCA == "":
		return nil
	case *a.cert == "" || *a.key == "":
		return errors.New("provider-sim: --tls-cert and --tls-key go together (and --client-ca needs them)")
	}
	c, err := sim.TLSConfig(*a.cert, *a.key, *a.clientCA)
	opts.TLS = c
	return err
}

// String is what the banner says of the auth, never a secret.
func (a simAuth) String() string {
	var s []string
	if *a.oauth2 != "" {
		s = append(s, fmt.Sprintf("oauth2 (POST /token, tokens for %s)", *a.ttl))
	}
	if *a.hmac != "" {
		s = append(s, "hmac")
	}
	if *a.cert != "" {
		s = append(s, "tls")
	}
	if *a.clientCA != "" {
		s = append(s, "client certificates required")
	}
	if len(s) == 0 {
		return ""
	}
	return " " + strings.Join(s, ", ")
}
