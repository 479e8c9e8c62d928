// Package providers hands payments to provider HTTP APIs and turns whatever comes back into one outcome.
//
// Dispatch returns nil when the provider accepted the payment (2xx). Otherwise the error says what to do:
//
//	var thr *providers.Throttled
//	switch {
//	case err == nil:                             // Succeeded: ack
//	case errors.As(err, &thr):                   // Throttled: pause the provider thr.RetryAfter; not an attempt
//	case errors.Is(err, providers.ErrPermanent): // Permanent: dead-letter now
//	default:                                     // Transient: retry after consumers.Backoff(attempt), up to max_attempts
//	}
//
// Every attempt of a job carries its idempotency key, so a provider that honours the header charges a
// retried or redelivered payment at most once. The auth secret is read from the environment and never
// appears in a log line or an error.
package providers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/job"
)

// ExcerptLimit caps the bytes of a response body kept in an error (and so in dead-letter headers).
const ExcerptLimit = 512

// drainLimit is how much of an unread body is drained so the connection can be reused.
const drainLimit = 64 << 10

// ErrPermanent is matched by errors that retrying cannot fix: a 4xx other than 429 (and the configured
// retry_on statuses).
var ErrPermanent = errors.New("permanent failure")

// Throttled is the provider saying "too many requests": a 429, or a 503 with Retry-After. The whole cluster
// should pause the provider for RetryAfter; it is not a failed attempt.
type Throttled struct {
	Provider   string
	Status     int
	RetryAfter time.Duration
}

func (t *Throttled) Error() string {
	return fmt.Sprintf("providers: %s throttled (%d), retry after %s", t.Provider, t.Status, t.RetryAfter)
}

// StatusError is a non-2xx answer that is not a throttle. It matches ErrPermanent unless retrying may help.
type StatusError struct {
	Provider  string
	Status    int
	Excerpt   string // the start of the body, at most ExcerptLimit bytes, secret redacted
	Permanent bool
}

func (e *StatusError) Error() string {
	kind := "transient"
	if e.Permanent {
		kind = "permanent"
	}
	return fmt.Sprintf("providers: %s answered %d (%s): %q", e.Provider, e.Status, kind, e.Excerpt)
}

// Is makes a permanent StatusError match ErrPermanent.
func (e *StatusError) Is(target error) bool { return target == ErrPermanent && e.Permanent }

// Outcome names what a dispatch came to, for logs and metrics.
type Outcome string

// The five outcomes.
const (
	Succeeded Outcome = "succeeded"
	Decline   Outcome = "declined"
	Throttle  Outcome = "throttled"
	Transient Outcome = "transient"
	Permanent Outcome = "permanent"
)

// OutcomeOf classifies Dispatch's error.
func OutcomeOf(err error) Outcome {
	var (
		thr *Throttled
		dec *Declined
	)
	switch {
	case err == nil:
		return Succeeded
	case errors.As(err, &dec):
		return Decline
	case errors.As(err, &thr):
		return Throttle
	case errors.Is(err, ErrPermanent):
		return Permanent
	default:
		return Transient
	}
}

// Answered reports whether the provider answered a Dispatch (any status: the request is no longer in
// flight there), or was never sent it (its token endpoint gave no token); a transport error or a timeout
// leaves that open.
func Answered(err error) bool {
	var (
		st  *StatusError
		thr *Throttled
		dec *Declined
		tok *TokenError
	)
	return err == nil || errors.As(err, &st) || errors.As(err, &thr) || errors.As(err, &dec) || errors.As(err, &tok)
}

// Client dispatches to one provider. It is safe for concurrent use.
type Client struct {
	spares     *spareDialer
	name       string
	url        string
	method     string
	timeout    time.Duration
	headers    http.Header
	idemHeader string
	// merchantHeader carries the job's merchant (providers.<name>.merchant_header)
	merchantHeader string
	retryOn        []int
	raDefault      time.Duration
	raMax          time.Duration
	http           *http.Client
	log            *zap.Logger
	now            func() time.Time
	onLimits       func([]Announced)
	onAnswer       func(status int, throttled bool)
	answers        answerRules

	// endpoints are the provider's by operation; base is url, parsed, that their paths join
	endpoints map[string]endpoint
	base      *url.URL
	// auth sets each request's credentials (nil: none)
	auth authenticator
}

// Options tune a Client beyond its config.
type Options struct {
	// Concurrency is the most requests in flight at once; the transport keeps that many idle connections.
	Concurrency int
	// Logger gets one debug line per attempt (never a header value). Nil: no logging.
	Logger *zap.Logger
	// Now is the clock for HTTP-date Retry-After values; nil: time.Now.
	Now func() time.Time
	// OnLimits, when set, is told the limits every answer announces in its headers (ParseLimitHeaders),
	// before Dispatch returns (providers.<name>.limits_from_headers).
	OnLimits func([]Announced)
	// OnAnswer, when set, is told every answer's status, and whether it throttles (a 429, or a 503 with
	// Retry-After), before Dispatch returns (providers.<name>.adaptive).
	OnAnswer func(status int, throttled bool)
}

// merchantHeader is the header a job's merchant goes in: merchant_header for a provider with merchants
// (per_merchant or merchants), none for the others, whose requests stay as they were.
func merchantHeader(c config.Provider) string {
	if !c.HasMerchants() {
		return ""
	}
	return c.MerchantHeader
}

// New builds the client for provider name from its config (keys left out take config's defaults). The
// auth secret is read from the environment variable the config names; an unset variable is an error
// (naming the variable, not the secret).
func New(name string, c config.Provider, o Options) (*Client, error) {
	c = c.WithDefaults()
	conc := max(o.Concurrency, 1)
	u, err := url.Parse(c.URL)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("providers: %s: url %q is not absolute", name, c.URL)
	}
	tlsc, err := c.TLSConfig(name)
	if err != nil {
		return nil, fmt.Errorf("providers: %s: %w", name, err)
	}
	auth, err := newAuth(name, c, tokenClient(c, tlsc), o.Now)
	if err != nil {
		return nil, err
	}
	spares := newSpareDialer(&net.Dialer{Timeout: min(c.Timeout, 10*time.Second), KeepAlive: 30 * time.Second}, min(conc, 4), 20*time.Second)
	transport := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           spares.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          2 * conc,
		MaxIdleConnsPerHost:   2 * conc,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   min(c.Timeout, 10*time.Second),
		ResponseHeaderTimeout: c.Timeout,
		ExpectContinueTimeout: time.Second,
		TLSClientConfig:       tlsc,
	}
	headers := http.Header{}
	for k, v := range c.Headers {
		headers.Set(k, v)
	}
	cl := &Client{
		spares:         spares,
		name:           name,
		url:            c.URL,
		method:         c.Method,
		timeout:        c.Timeout,
		headers:        headers,
		endpoints:      endpoints(c),
		base:           u,
		auth:           auth,
		idemHeader:     c.IdempotencyHeader,
		merchantHeader: merchantHeader(c),
		retryOn:        append([]int{http.StatusRequestTimeout}, c.RetryOn...),
		raDefault:      c.RetryAfterDefault,
		raMax:          c.RetryAfterMax,
		http:           &http.Client{Transport: transport, CheckRedirect: noRedirects},
		log:            o.Logger,
		now:            o.Now,
		onLimits:       o.OnLimits,
		onAnswer:       o.OnAnswer,
		answers:        answerRules{max: c.ResponseMax, headers: c.ResultHeaders, declined: c.DeclinedWhen},
	}
	cl.raMax = max(cl.raMax, cl.raDefault) // Validate refuses the opposite; a hand-built config may not
	if cl.log == nil {
		cl.log = zap.NewNop()
	}
	if cl.now == nil {
		cl.now = time.Now
	}
	if proxy, err := http.ProxyFromEnvironment(&http.Request{URL: u}); err == nil && proxy == nil {
		spares.Warm("tcp", hostPort(u)) // through a proxy, the transport dials the proxy instead
	}
	return cl, nil
}

// A payment API that redirects is misconfigured; following it could replay a charge elsewhere.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// Name is the provider's name.
func (c *Client) Name() string { return c.name }

// Close releases idle and spare connections.
func (c *Client) Close() {
	if a, ok := c.auth.(closer); ok {
		a.close()
	}
	c.http.CloseIdleConnections()
	c.spares.Close()
}

// hostPort is the address a URL dials.
func hostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	if u.Scheme == "https" {
		return net.JoinHostPort(u.Hostname(), "443")
	}
	return net.JoinHostPort(u.Hostname(), "80")
}

// Dispatch sends the payment once, and returns the provider's answer, when there is one, and its
// classification (see the package documentation). The request is bounded by the provider's timeout and
// by ctx.
func (c *Client) Dispatch(ctx context.Context, j *job.Job) (*Answer, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	start := time.Now()
	resp, err := c.do(ctx, j) // request.go: the request, its endpoint and its auth
	if err != nil {
		// A request the job cannot make (permanent); a token endpoint that gave no token, timeouts,
		// refused and reset connections: worth another attempt. url.Error names the URL, not the
		// headers, so the secret stays out.
		err = fmt.Errorf("providers: %s: %w", c.name, err)
		c.log.Debug("dispatch", zap.String("provider", c.name), zap.String("job", j.ID), zap.Duration("took", time.Since(start)), zap.String("outcome", string(OutcomeOf(err))), zap.String("error", c.redact(err.Error())))
		return nil, err
	}
	defer func() {
		_, _ = io.CopyN(io.Discard, resp.Body, drainLimit)
		resp.Body.Close()
	}()
	if c.onLimits != nil {
		if a := ParseLimitHeaders(resp.Header); a != nil {
			c.onLimits(a)
		}
	}
	answer := c.answers.read(resp, c.redact)
	err = c.authRefused(resp.StatusCode, c.classify(resp, answer))
	if c.onAnswer != nil {
		var thr *Throttled
		c.onAnswer(resp.StatusCode, errors.As(err, &thr))
	}
	c.log.Debug("dispatch", zap.String("provider", c.name), zap.String("job", j.ID), zap.Int("status", resp.StatusCode), zap.Duration("took", time.Since(start)), zap.String("outcome", string(OutcomeOf(err))))
	return answer, err
}

func (c *Client) classify(resp *http.Response, answer *Answer) error {
	st := resp.StatusCode
	why, unsure := c.answers.decline(answer)
	switch {
	case unsure != nil: // a decline taken for a success would be worse than a retry under the same key
		return &StatusError{Provider: c.name, Status: st, Excerpt: unsure.Error(), Permanent: false}
	case why != "":
		return &Declined{Provider: c.name, Status: st, Why: why}
	}
	switch {
	case st >= 200 && st < 300:
		return nil
	case st == http.StatusTooManyRequests,
		st == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "":
		return &Throttled{Provider: c.name, Status: st, RetryAfter: c.retryAfter(resp.Header.Get("Retry-After"))}
	}
	excerpt := c.excerpt(answer.Body)
	permanent := st >= 400 && st < 500 && !slices.Contains(c.retryOn, st)
	if _, renews := c.auth.(renewer); renews && st == http.StatusUnauthorized {
		permanent = false // a stale token, dropped (do): the next attempt fetches a new one
	}
	if st >= 300 && st < 400 {
		permanent = true // a redirect is a misconfiguration, not a blip
	}
	return &StatusError{Provider: c.name, Status: st, Excerpt: excerpt, Permanent: permanent}
}

// retryAfter reads delta-seconds or an HTTP-date. Missing, unparsable, negative or past values give the
// configured default; values beyond the configured maximum are capped to it.
func (c *Client) retryAfter(v string) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return c.raDefault
	}
	var d time.Duration
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return c.raDefault
		}
		if secs > int64(c.raMax/time.Second) {
			return c.raMax
		}
		d = time.Duration(secs) * time.Second
	} else if at, err := http.ParseTime(v); err == nil {
		d = at.Sub(c.now())
	} else {
		return c.raDefault
	}
	switch {
	case d <= 0:
		return c.raDefault
	case d > c.raMax:
		return c.raMax
	}
	return d
}

func (c *Client) excerpt(body []byte) string {
	b := body[:min(len(body), ExcerptLimit)]
	for len(b) > 0 && !utf8.Valid(b) { // do not cut a character in half
		b = b[:len(b)-1]
	}
	return c.redact(string(b))
}

// redact removes the auth's secrets from text that came back from the provider or the network.
func (c *Client) redact(s string) string {
	if c.auth == nil {
		return s
	}
	for _, secret := range c.auth.secrets() {
		if secret != "" {
			s = strings.ReplaceAll(s, secret, "[REDACTED]")
		}
	}
	return s
}

// RequestBody is what a dispatch sends: the job's payload object when present, else an object built from
// the job (id, amount, currency, merchant).
func RequestBody(j *job.Job) ([]byte, error) {
	if len(j.Payload) > 0 && !bytes.Equal(bytes.TrimSpace(j.Payload), []byte("null")) {
		if p := bytes.TrimSpace(j.Payload); len(p) == 0 || p[0] != '{' || !json.Valid(p) {
			return nil, errors.New("payload must be a JSON object")
		}
		return j.Payload, nil
	}
	return json.Marshal(struct {
		ID       string `json:"id"`
		Amount   int64  `json:"amount"`
		Currency string `json:"currency"`
		Merchant string `json:"merchant,omitempty"`
	}{j.ID, j.Amount, j.Currency, j.Merchant})
}
