package providers_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/internal/testtls"
	"github.com/paygate/paygate/job"
	"github.com/paygate/paygate/providers"
)

// seen is one request as the server got it.
type seen struct {
	method, target string // the request line's target, exactly as sent
	header         http.Header
	body           string
}

// capture is a provider that records every request and answers with status (default 200).
type capture struct {
	mu     sync.Mutex
	got    []seen
	status func(r *http.Request) int
}

func (c *capture) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	c.mu.Lock()
	c.got = append(c.got, seen{r.Method, r.RequestURI, r.Header.Clone(), string(b)})
	c.mu.Unlock()
	st := http.StatusOK
	if c.status != nil {
		st = c.status(r)
	}
	w.WriteHeader(st)
	_, _ = io.WriteString(w, `{"error":"as you like"}`)
}

func (c *capture) requests() []seen {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]seen(nil), c.got...)
}

// Each operation goes to its endpoint: its method, url's path joined with its own, the placeholders
// filled and escaped (a '/' and spaces in an id, an integer in the payload, a value in the query); GET
// sends no body. A job without an operation goes to url with method, as before.
func TestEndpointRequests(t *testing.T) {
	rec := &capture{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	c := providerConfig(srv.URL + "/v1/?account=a%201")
	c.Endpoints = map[string]config.Endpoint{
		"payouts": {Method: "POST", Path: "/payouts"},
		"refunds": {Method: "POST", Path: "/payments/{payload.payment_id}/refunds/{id}?merchant={merchant}&key={idempotency_key}"},
		"status":  {Method: "GET", Path: "/payouts/{id}"},
	}
	cl := newClient(t, c, providers.Options{})
	refund := payment("r 1/2")
	refund.Operation, refund.IdempotencyKey, refund.Merchant = "refunds", "k&=+ /", "m 42"
	refund.Payload = json.RawMessage(`{"payment_id":12345678901234567890}`)
	status := payment("pay 7/a b")
	status.Operation = "status"
	payout := payment("p-1")
	payout.Operation = "payouts"
	for _, j := range []*job.Job{payment("plain"), payout, refund, status} {
		if _, err := cl.Dispatch(context.Background(), j); err != nil {
			t.Fatalf("%s: %v", j.ID, err)
		}
	}
	want := []seen{
		{method: "POST", target: "/v1/?account=a%201"},
		{method: "POST", target: "/v1/payouts?account=a%201"},
		{method: "POST", target: "/v1/payments/12345678901234567890/refunds/r%201%2F2?account=a%201&merchant=m%2042&key=k%26%3D%2B%20%2F"},
		{method: "GET", target: "/v1/payouts/pay%207%2Fa%20b?account=a%201"},
	}
	got := rec.requests()
	for i, w := range want {
		if got[i].method != w.method || got[i].target != w.target {
			t.Errorf("request %d: %s %s, want %s %s", i, got[i].method, got[i].target, w.method, w.target)
		}
	}
	if got[3].body != "" || got[3].header.Get("Content-Type") != "" || got[2].body == "" || got[3].header.Get("Idempotency-Key") != "pay 7/a b" {
		t.Errorf("GET: body %q, Content-Type %q; POST body %q", got[3].body, got[3].header.Get("Content-Type"), got[2].body)
	}
}

// A job the endpoint cannot be filled from, or an operation with no endpoint, is a permanent failure
// naming it, and no request is sent.
func TestEndpointRefusals(t *testing.T) {
	rec := &capture{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	c := providerConfig(srv.URL)
	c.Endpoints = map[string]config.Endpoint{"refunds": {Method: "POST", Path: "/payments/{payload.payment_id}/refunds"}}
	cl := newClient(t, c, providers.Options{})
	tests := []struct {
		op, payload, want string
	}{
		{"refunds", `{"other":1}`, "operation refunds: cannot fill {payload.payment_id}: the payload has no field payment_id"},
		{"refunds", `{"payment_id":1.5}`, "cannot fill {payload.payment_id}: the payload's payment_id must be a string or an integer, got a fraction"},
		{"refunds", `{"payment_id":{"id":"secret-ish"}}`, "the payload's payment_id must be a string or an integer, got an object"},
		{"captures", ``, `operation "captures": no endpoint of that name`},
	}
	for _, tt := range tests {
		j := payment("x")
		j.Operation = tt.op
		if tt.payload != "" {
			j.Payload = json.RawMessage(tt.payload)
		}
		_, err := cl.Dispatch(context.Background(), j)
		if !errors.Is(err, providers.ErrPermanent) || providers.OutcomeOf(err) != providers.Permanent || !strings.Contains(err.Error(), tt.want) ||
			strings.Contains(err.Error(), "secret-ish") {
			t.Errorf("%s %s: %v, want permanent naming %q", tt.op, tt.payload, err, tt.want)
		}
	}
	if n := len(rec.requests()); n != 0 {
		t.Fatalf("%d requests sent", n)
	}
}

// auth {type: header}: the secret after the prefix and a space, in the header named.
func TestHeaderAuth(t *testing.T) {
	t.Setenv("ACME_KEY", "sk_test_1")
	rec := &capture{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	for _, a := range []*config.Auth{{Type: "header", SecretEnv: "ACME_KEY", Prefix: "Bearer"}, {Type: "header", Header: "X-Api-Key", SecretEnv: "ACME_KEY"}} {
		c := providerConfig(srv.URL)
		c.Auth = a
		if _, err := newClient(t, c, providers.Options{}).Dispatch(context.Background(), payment("h")); err != nil {
			t.Fatal(err)
		}
	}
	got := rec.requests()
	if got[0].header.Get("Authorization") != "Bearer sk_test_1" || got[1].header.Get("X-Api-Key") != "sk_test_1" || got[1].header.Get("Authorization") != "" {
		t.Fatalf("headers: %v / %v", got[0].header, got[1].header)
	}
}

// auth {type: hmac}: every attempt signed over "<unix seconds>\n<METHOD>\n<path and query as sent>\n<body>",
// hex or base64, the seconds in the timestamp header; a 401 names the signature.
func TestHMACAuth(t *testing.T) {
	const key = "whsec_0123"
	t.Setenv("ACME_HMAC", key)
	rec := &capture{status: func(r *http.Request) int {
		if r.URL.Path == "/refused" {
			return http.StatusUnauthorized
		}
		return http.StatusOK
	}}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	for _, enc := range []string{"hex", "base64"} {
		c := providerConfig(srv.URL + "/base")
		c.Endpoints = map[string]config.Endpoint{"refunds": {Method: "PUT", Path: "/r/{id}?q={merchant}"}}
		c.Auth = &config.Auth{Type: "hmac", SecretEnv: "ACME_HMAC", Encoding: enc}
		j := payment("a b/c")
		j.Operation = "refunds"
		if _, err := newClient(t, c, providers.Options{}).Dispatch(context.Background(), j); err != nil {
			t.Fatal(err)
		}
	}
	for i, r := range rec.requests() {
		ts := r.header.Get("X-Timestamp")
		m := hmac.New(sha256.New, []byte(key))
		fmt.Fprintf(m, "%s\n%s\n%s\n%s", ts, r.method, r.target, r.body)
		want := hex.EncodeToString(m.Sum(nil))
		if i == 1 {
			want = base64.StdEncoding.EncodeToString(m.Sum(nil))
		}
		if ts != strconv.FormatInt(fixedNow.Unix(), 10) || r.header.Get("X-Signature") != want || r.target != "/base/r/a%20b%2Fc?q=m_42" || r.body == "" {
			t.Errorf("request %d: %s %s ts %s signature %q, want %q", i, r.method, r.target, ts, r.header.Get("X-Signature"), want)
		}
	}
	c := providerConfig(srv.URL + "/refused")
	c.Auth = &config.Auth{Type: "hmac", SecretEnv: "ACME_HMAC", SignatureHeader: "Signature", TimestampHeader: "Signature-Time"}
	_, err := newClient(t, c, providers.Options{}).Dispatch(context.Background(), payment("x"))
	if !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), "HMAC-SHA256 signature in Signature") || strings.Contains(err.Error(), key) {
		t.Fatalf("a refused signature: %v", err)
	}
}

// tokenServer is a client credentials token endpoint: tokens "tok-<n>" valid for ttl, for client
// id:secret; refuse answers every request 401 with a body that echoes the secret.
type tokenServer struct {
	ttl     time.Duration
	refuse  bool
	fetches atomic.Int64
}

func (s *tokenServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, secret, basic := r.BasicAuth()
	if !basic {
		id, secret = r.FormValue("client_id"), r.FormValue("client_secret")
	}
	if s.refuse || id != "client-1" || secret != "cs_live_77" || r.FormValue("grant_type") != "client_credentials" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprintf(w, `{"error":"invalid_client","error_description":"no client with secret %s"}`, secret)
		return
	}
	n := s.fetches.Add(1)
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"access_token":"tok-%d","token_type":"bearer","expires_in":%d,"scope":%q}`, n, int(s.ttl/time.Second), r.FormValue("scope"))
}

func oauth2Config(url, tokenURL string) config.Provider {
	c := providerConfig(url)
	c.Auth = &config.Auth{Type: "oauth2", TokenURL: tokenURL, ClientIDEnv: "ACME_CLIENT_ID", ClientSecretEnv: "ACME_CLIENT_SECRET",
		Scopes: []string{"payouts", "refunds"}, Params: map[string]string{"audience": "payments"}}
	return c
}

// auth {type: oauth2}: one token for many requests, as a bearer token; refreshed (in the background)
// before it expires, not per request; a 401 drops it and is a transient failure (never sent again
// without a slot of its own): the next attempt goes with a new one.
func TestOAuth2Auth(t *testing.T) {
	t.Setenv("ACME_CLIENT_ID", "client-1")
	t.Setenv("ACME_CLIENT_SECRET", "cs_live_77")
	ts := &tokenServer{ttl: 2 * time.Second}
	tokens := httptest.NewServer(ts)
	defer tokens.Close()
	var stale atomic.Bool // the provider refuses tok-1 once told to
	rec := &capture{status: func(r *http.Request) int {
		if stale.Load() && r.Header.Get("Authorization") == "Bearer tok-1" {
			return http.StatusUnauthorized
		}
		return http.StatusOK
	}}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	cl := newClient(t, oauth2Config(srv.URL, tokens.URL), providers.Options{})
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			if _, err := cl.Dispatch(context.Background(), payment(fmt.Sprint("c", i))); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := ts.fetches.Load(); n != 1 {
		t.Fatalf("%d token fetches for 20 concurrent requests, want 1", n)
	}
	stale.Store(true)
	sent := len(rec.requests())
	_, err := cl.Dispatch(context.Background(), payment("after-401"))
	var se *providers.StatusError
	if !errors.As(err, &se) || se.Status != http.StatusUnauthorized || se.Permanent || providers.OutcomeOf(err) != providers.Transient {
		t.Fatalf("a stale token's 401: %v, want a transient failure", err)
	}
	if n := len(rec.requests()) - sent; n != 1 {
		t.Fatalf("a stale token's 401 sent %d requests, want 1 (the next attempt takes a slot of its own)", n)
	}
	if _, err := cl.Dispatch(context.Background(), payment("after-401")); err != nil {
		t.Fatalf("the next attempt: %v", err)
	}
	got := rec.requests()
	last := got[len(got)-2:]
	if ts.fetches.Load() != 2 || last[0].header.Get("Authorization") != "Bearer tok-1" || last[1].header.Get("Authorization") != "Bearer tok-2" ||
		last[0].header.Get("Idempotency-Key") != "after-401" || last[1].header.Get("Idempotency-Key") != "after-401" {
		t.Fatalf("after a 401: %d fetches, requests %v then %v", ts.fetches.Load(), last[0].header, last[1].header)
	}
	// 2s tokens are renewed 0.4s before they expire, while the old one serves: over 3s, about two more.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if _, err := cl.Dispatch(context.Background(), payment("steady")); err != nil {
			t.Fatal(err)
		}
	}
	if n := ts.fetches.Load(); n < 3 || n > 5 {
		t.Fatalf("%d token fetches over 3s of requests with 2s tokens, want about 2 more than 2", n)
	}
}

// A token endpoint that refuses the client: a transient failure (the request is not sent) whose error
// names the token endpoint and carries its answer, the client's secret redacted.
func TestOAuth2TokenRefused(t *testing.T) {
	t.Setenv("ACME_CLIENT_ID", "client-1")
	t.Setenv("ACME_CLIENT_SECRET", "cs_live_77")
	tokens := httptest.NewServer(&tokenServer{refuse: true})
	defer tokens.Close()
	rec := &capture{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	core, logs := observer.New(zapcore.DebugLevel)
	_, err := newClient(t, oauth2Config(srv.URL, tokens.URL+"/token"), providers.Options{Logger: zap.New(core)}).Dispatch(context.Background(), payment("t"))
	var te *providers.TokenError
	if !errors.As(err, &te) || providers.OutcomeOf(err) != providers.Transient || !providers.Answered(err) ||
		!strings.Contains(err.Error(), "token endpoint "+tokens.URL+"/token: answered 401: invalid_client") || strings.Contains(err.Error(), "cs_live_77") ||
		!strings.Contains(err.Error(), "[REDACTED]") {
		t.Fatalf("token refused: %v", err)
	}
	if len(rec.requests()) != 0 {
		t.Fatal("the request went without a token")
	}
	for _, e := range logs.All() {
		if line, _ := json.Marshal(e.ContextMap()); strings.Contains(string(line), "cs_live_77") {
			t.Fatalf("a log line shows the secret: %s", line)
		}
	}
	tokens.Close()
	_, err = newClient(t, oauth2Config(srv.URL, tokens.URL+"/token"), providers.Options{}).Dispatch(context.Background(), payment("t"))
	if !errors.As(err, &te) || providers.OutcomeOf(err) != providers.Transient || !strings.Contains(err.Error(), "token endpoint "+tokens.URL+"/token: ") {
		t.Fatalf("token endpoint down: %v", err)
	}
}

// A client certificate (tls_cert_file, tls_key_file) and the provider's CA (tls_ca_file): accepted by a
// server that requires one; without it, the handshake fails (transient, naming the certificate).
func TestClientCertificate(t *testing.T) {
	ca := testtls.NewCA(t)
	srv := httptest.NewUnstartedServer(&capture{})
	srv.TLS = ca.RequireClients()
	srv.StartTLS()
	defer srv.Close()
	cert, key := ca.Client(t, "paygate")
	c := providerConfig(srv.URL)
	c.TLSCAFile, c.TLSCertFile, c.TLSKeyFile = ca.File, cert, key
	if _, err := newClient(t, c, providers.Options{}).Dispatch(context.Background(), payment("m")); err != nil {
		t.Fatalf("with the certificate: %v", err)
	}
	c.TLSCertFile, c.TLSKeyFile = "", ""
	_, err := newClient(t, c, providers.Options{}).Dispatch(context.Background(), payment("m"))
	if err == nil || providers.OutcomeOf(err) != providers.Transient || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("without the certificate: %v", err)
	}
	c.TLSCertFile = "/nonexistent.pem"
	c.TLSKeyFile = key
	if _, err := providers.New("acme", c, providers.Options{}); err == nil || !strings.Contains(err.Error(), "providers.acme.tls_cert_file") {
		t.Fatalf("an unreadable certificate: %v", err)
	}
}

// The secrets of every auth type stay out of errors, log lines and answers: a provider that echoes the
// bearer token it refuses has it redacted (the token dropped), as the client's secret.
func TestAuthSecretsNeverLeak(t *testing.T) {
	t.Setenv("ACME_CLIENT_ID", "client-1")
	t.Setenv("ACME_CLIENT_SECRET", "cs_live_77")
	t.Setenv("ACME_HMAC", "whsec_0123")
	ts := &tokenServer{ttl: time.Hour}
	tokens := httptest.NewServer(ts)
	defer tokens.Close()
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		if r.URL.Path == "/oauth2" { // a provider that echoes what it knows of its client
			fmt.Fprintf(w, "refused %s; client_secret=cs_live_77", r.Header.Get("Authorization"))
		} else {
			fmt.Fprintf(w, "refused %s; key=whsec_0123", r.Header.Get("X-Signature"))
		}
	}))
	defer echo.Close()
	core, logs := observer.New(zapcore.DebugLevel)
	hmacConfig := providerConfig(echo.URL + "/hmac")
	hmacConfig.Auth = &config.Auth{Type: "hmac", SecretEnv: "ACME_HMAC"}
	var errs []string
	for _, c := range []config.Provider{oauth2Config(echo.URL+"/oauth2", tokens.URL), hmacConfig} {
		answer, err := newClient(t, c, providers.Options{Logger: zap.New(core)}).Dispatch(context.Background(), payment("s"))
		if err == nil || answer == nil {
			t.Fatalf("want a 401 with its answer, got %v", err)
		}
		errs = append(errs, err.Error(), string(answer.Body))
	}
	for _, e := range logs.All() {
		line, _ := json.Marshal(e.ContextMap())
		errs = append(errs, e.Message, string(line))
	}
	all := strings.Join(errs, "\n")
	for _, secret := range []string{"tok-1", "tok-2", "cs_live_77", "whsec_0123"} {
		if strings.Contains(all, secret) {
			t.Errorf("%s shows: %s", secret, all)
		}
	}
	if ts.fetches.Load() != 1 || !strings.Contains(all, "refused Bearer [REDACTED]") {
		t.Fatalf("%d token fetches (want 1: the 401 drops it, no request goes again); output:\n%s", ts.fetches.Load(), all)
	}
}
