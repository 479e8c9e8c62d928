package providers_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/job"
	"github.com/paygate/paygate/providers"
)

var fixedNow = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func providerConfig(url string) config.Provider {
	return config.Provider{
		URL: url, Timeout: 2 * time.Second, Method: "POST", IdempotencyHeader: "Idempotency-Key",
		RetryAfterDefault: 2 * time.Second, RetryAfterMax: time.Hour,
	}
}

func newClient(t *testing.T, c config.Provider, o providers.Options) *providers.Client {
	t.Helper()
	if o.Now == nil {
		o.Now = func() time.Time { return fixedNow }
	}
	cl, err := providers.New("acme", c, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func payment(id string) *job.Job {
	return &job.Job{ID: id, Provider: "acme", Amount: 1250, Currency: "EUR", Merchant: "m_42"}
}

func TestClassification(t *testing.T) {
	big := strings.Repeat("é", 100_000) // 200 KB of two-byte characters
	tests := []struct {
		name       string
		status     int
		retryAfter string
		body       string
		retryOn    []int
		want       providers.Outcome
		wantRetry  time.Duration // for Throttled
		wantInErr  string
	}{
		{name: "200", status: 200, want: providers.Succeeded},
		{name: "201", status: 201, want: providers.Succeeded},
		{name: "204", status: 204, want: providers.Succeeded},
		{name: "429 delta-seconds", status: 429, retryAfter: "3", want: providers.Throttle, wantRetry: 3 * time.Second},
		{name: "429 HTTP-date", status: 429, retryAfter: fixedNow.Add(5 * time.Second).Format(http.TimeFormat), want: providers.Throttle, wantRetry: 5 * time.Second},
		{name: "429 without header", status: 429, want: providers.Throttle, wantRetry: 2 * time.Second},
		{name: "429 garbage header", status: 429, retryAfter: "soon", want: providers.Throttle, wantRetry: 2 * time.Second},
		{name: "429 negative", status: 429, retryAfter: "-5", want: providers.Throttle, wantRetry: 2 * time.Second},
		{name: "429 zero", status: 429, retryAfter: "0", want: providers.Throttle, wantRetry: 2 * time.Second},
		{name: "429 date in the past", status: 429, retryAfter: fixedNow.Add(-time.Minute).Format(http.TimeFormat), want: providers.Throttle, wantRetry: 2 * time.Second},
		{name: "429 absurdly long", status: 429, retryAfter: "99999999999", want: providers.Throttle, wantRetry: time.Hour},
		{name: "429 date years ahead", status: 429, retryAfter: fixedNow.AddDate(5, 0, 0).Format(http.TimeFormat), want: providers.Throttle, wantRetry: time.Hour},
		{name: "503 with Retry-After", status: 503, retryAfter: "7", want: providers.Throttle, wantRetry: 7 * time.Second},
		{name: "503 without Retry-After", status: 503, want: providers.Transient, wantInErr: "503"},
		{name: "500", status: 500, body: "boom", want: providers.Transient, wantInErr: `answered 500 (transient): "boom"`},
		{name: "502", status: 502, want: providers.Transient},
		{name: "504", status: 504, want: providers.Transient},
		{name: "408 is retried", status: 408, want: providers.Transient},
		{name: "400", status: 400, body: `{"error":"bad iban"}`, want: providers.Permanent, wantInErr: `answered 400 (permanent): "{\"error\":\"bad iban\"}"`},
		{name: "401", status: 401, want: providers.Permanent},
		{name: "402", status: 402, want: providers.Permanent},
		{name: "404", status: 404, want: providers.Permanent},
		{name: "409", status: 409, want: providers.Permanent},
		{name: "409 in retry_on", status: 409, retryOn: []int{409}, want: providers.Transient},
		{name: "422", status: 422, want: providers.Permanent},
		{name: "302 is not followed", status: 302, want: providers.Permanent},
		{name: "huge body is cut", status: 422, body: big, want: providers.Permanent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tt.retryAfter != "" {
					w.Header().Set("Retry-After", tt.retryAfter)
				}
				if tt.status == 302 {
					w.Header().Set("Location", "http://127.0.0.1:1/elsewhere")
				}
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			c := providerConfig(srv.URL)
			c.RetryOn = tt.retryOn
			_, err := newClient(t, c, providers.Options{}).Dispatch(context.Background(), payment("p1"))
			if got := providers.OutcomeOf(err); got != tt.want {
				t.Fatalf("outcome %s (%v), want %s", got, err, tt.want)
			}
			var thr *providers.Throttled
			if errors.As(err, &thr) && (thr.RetryAfter != tt.wantRetry || thr.Status != tt.status) {
				t.Fatalf("throttled %+v, want retry after %v", thr, tt.wantRetry)
			}
			if tt.wantInErr != "" && !strings.Contains(err.Error(), tt.wantInErr) {
				t.Fatalf("error %q, want it to contain %q", err, tt.wantInErr)
			}
			var se *providers.StatusError
			if errors.As(err, &se) {
				if se.Status != tt.status || len(se.Excerpt) > providers.ExcerptLimit || !strings.HasPrefix(tt.body, se.Excerpt) {
					t.Fatalf("status error: status %d, excerpt of %d bytes", se.Status, len(se.Excerpt))
				}
				if len(tt.body) > providers.ExcerptLimit && len(se.Excerpt) < providers.ExcerptLimit-4 {
					t.Fatalf("excerpt of %d bytes: cut far below the cap", len(se.Excerpt))
				}
			}
		})
	}
}

func TestNetworkFailuresAreTransient(t *testing.T) {
	t.Run("timeout", func(t *testing.T) {
		release := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}))
		defer srv.Close()
		defer close(release)
		c := providerConfig(srv.URL)
		c.Timeout = 100 * time.Millisecond
		_, err := newClient(t, c, providers.Options{}).Dispatch(context.Background(), payment("p1"))
		if providers.OutcomeOf(err) != providers.Transient || !strings.Contains(err.Error(), "acme") {
			t.Fatalf("hung server: %v", err)
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("want a timeout error, got %v", err)
		}
	})
	t.Run("connection refused", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		_, err = newClient(t, providerConfig("http://"+addr+"/pay"), providers.Options{}).Dispatch(context.Background(), payment("p1"))
		if providers.OutcomeOf(err) != providers.Transient || !strings.Contains(err.Error(), "refused") {
			t.Fatalf("refused: %v", err)
		}
	})
	t.Run("connection reset", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			_ = conn.(*net.TCPConn).SetLinger(0) // RST instead of FIN
			conn.Close()
		}))
		defer srv.Close()
		_, err := newClient(t, providerConfig(srv.URL), providers.Options{}).Dispatch(context.Background(), payment("p1"))
		if providers.OutcomeOf(err) != providers.Transient {
			t.Fatalf("reset: %v", err)
		}
	})
	t.Run("caller cancels", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body) // the server notices a hang-up only once the body is read
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		}))
		defer srv.Close()
		ctx, cancel := context.WithCancel(context.Background())
		go func() { time.Sleep(50 * time.Millisecond); cancel() }()
		_, err := newClient(t, providerConfig(srv.URL), providers.Options{}).Dispatch(ctx, payment("p1"))
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("want context.Canceled, got %v", err)
		}
	})
}

// recorder is a provider that fails twice, then accepts, and remembers every request.
type recorder struct {
	mu       sync.Mutex
	requests []*http.Request
	bodies   []string
	answers  []int
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	b, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	r.requests = append(r.requests, req)
	r.bodies = append(r.bodies, string(b))
	status := 200
	if len(r.answers) > 0 {
		status, r.answers = r.answers[0], r.answers[1:]
	}
	r.mu.Unlock()
	w.WriteHeader(status)
}

func TestIdempotencyKeyOnEveryAttempt(t *testing.T) {
	tests := []struct {
		name, header, key string
		want              string
	}{
		{"defaults to the id", "", "", "pay-7"},
		{"explicit key", "", "order-99/payout-1", "order-99/payout-1"},
		{"custom header", "X-Request-Id", "", "pay-7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{answers: []int{500, 503, 502, 200}}
			srv := httptest.NewServer(rec)
			defer srv.Close()
			c := providerConfig(srv.URL)
			if tt.header != "" {
				c.IdempotencyHeader = tt.header
			}
			cl := newClient(t, c, providers.Options{})
			j := payment("pay-7")
			j.IdempotencyKey = tt.key
			for attempt := 1; ; attempt++ {
				_, err := cl.Dispatch(context.Background(), j)
				if err == nil {
					break
				}
				if providers.OutcomeOf(err) != providers.Transient || attempt > 4 {
					t.Fatalf("attempt %d: %v", attempt, err)
				}
			}
			name := tt.header
			if name == "" {
				name = "Idempotency-Key"
			}
			if len(rec.requests) != 4 {
				t.Fatalf("%d requests, want 4", len(rec.requests))
			}
			for i, r := range rec.requests {
				if got := r.Header.Get(name); got != tt.want {
					t.Fatalf("attempt %d carried %s %q, want %q", i+1, name, got, tt.want)
				}
			}
		})
	}
}

func TestRequest(t *testing.T) {
	rec := &recorder{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	c := providerConfig(srv.URL + "/v1/payouts")
	c.Method = "PUT"
	c.Headers = map[string]string{"x-api-version": "2026-01-01"}
	cl := newClient(t, c, providers.Options{})
	withPayload := payment("a")
	withPayload.Payload = json.RawMessage(`{"iban":"DE89370400440532013000","amount":{"value":1250}}`)
	for _, j := range []*job.Job{payment("b"), withPayload} {
		if _, err := cl.Dispatch(context.Background(), j); err != nil {
			t.Fatal(err)
		}
	}
	r := rec.requests[0]
	if r.Method != "PUT" || r.URL.Path != "/v1/payouts" || r.Header.Get("Content-Type") != "application/json" || r.Header.Get("X-Api-Version") != "2026-01-01" {
		t.Fatalf("request %s %s headers %v", r.Method, r.URL.Path, r.Header)
	}
	if rec.bodies[0] != `{"id":"b","amount":1250,"currency":"EUR","merchant":"m_42"}` {
		t.Fatalf("built body %s", rec.bodies[0])
	}
	if rec.bodies[1] != string(withPayload.Payload) {
		t.Fatalf("payload body %s", rec.bodies[1])
	}
	bad := payment("c")
	bad.Payload = json.RawMessage(`[1,2]`)
	if _, err := cl.Dispatch(context.Background(), bad); !errors.Is(err, providers.ErrPermanent) || len(rec.requests) != 2 {
		t.Fatalf("payload not an object: %v (%d requests)", err, len(rec.requests))
	}
}

// With the auth secret set, it reaches the provider and nothing else: no log line, no error, no excerpt of a
// body that echoes it.
func TestSecretNeverLeaks(t *testing.T) {
	const secret = "sk_live_8f2a0c9d1e"
	t.Setenv("ACME_TOKEN", secret)
	var got []string
	var mu sync.Mutex
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("Authorization"))
		mu.Unlock()
		switch r.URL.Path {
		case "/ok":
			w.WriteHeader(200)
		case "/slow":
			time.Sleep(300 * time.Millisecond)
		default:
			w.WriteHeader(401)
			_, _ = io.WriteString(w, "invalid token "+r.Header.Get("Authorization"))
		}
	}))
	defer echo.Close()
	core, logs := observer.New(zapcore.DebugLevel)
	var errs []string
	for _, path := range []string{"/ok", "/echo", "/slow"} {
		c := providerConfig(echo.URL + path)
		c.AuthHeader, c.AuthEnv = "Authorization", "ACME_TOKEN"
		c.Timeout = 100 * time.Millisecond
		cl := newClient(t, c, providers.Options{Logger: zap.New(core)})
		if _, err := cl.Dispatch(context.Background(), payment("p")); err != nil {
			errs = append(errs, err.Error())
		}
	}
	refused := providerConfig("http://127.0.0.1:1/pay")
	refused.AuthHeader, refused.AuthEnv = "Authorization", "ACME_TOKEN"
	if _, err := newClient(t, refused, providers.Options{Logger: zap.New(core)}).Dispatch(context.Background(), payment("p")); err != nil {
		errs = append(errs, err.Error())
	}
	mu.Lock()
	if len(got) != 3 || got[0] != secret || got[1] != secret || got[2] != secret {
		t.Fatalf("the provider got %d requests, want 3 carrying the secret", len(got))
	}
	mu.Unlock()
	if len(errs) != 3 || logs.Len() < 4 {
		t.Fatalf("want 3 errors and a log line per attempt, got %d errors, %d lines", len(errs), logs.Len())
	}
	for _, e := range errs {
		if strings.Contains(e, secret) {
			t.Fatalf("error leaks the secret: %s", e)
		}
	}
	if !strings.Contains(errs[0], "[REDACTED]") {
		t.Fatalf("echoed secret not redacted: %s", errs[0])
	}
	for _, entry := range logs.All() {
		line, _ := json.Marshal(entry.ContextMap())
		if strings.Contains(entry.Message, secret) || strings.Contains(string(line), secret) {
			t.Fatalf("log line leaks the secret: %s %s", entry.Message, line)
		}
	}
	t.Setenv("ACME_TOKEN", "")
	_, err := providers.New("acme", refused, providers.Options{})
	if err == nil || !strings.Contains(err.Error(), "ACME_TOKEN") {
		t.Fatalf("unset secret: %v", err)
	}
}

// The transport keeps connections alive: a burst of concurrent requests opens at most Concurrency
// connections (plus the spare dialer's few), and every request of a later burst reuses one.
//
// A connection goes back to the idle pool just after its response is read, on the transport's own
// goroutine. Each burst therefore waits until the transport reports every connection back in the pool
// (httptrace PutIdleConn) before the next one starts: with a fixed sleep instead, a loaded machine
// (make test runs packages side by side) sometimes started the next burst first, and the transport
// dialled a new connection that the test took for a keep-alive failure.
func TestConnectionPooling(t *testing.T) {
	var mu sync.Mutex
	var opened int
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(5 * time.Millisecond)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			opened++
			mu.Unlock()
		}
	}
	srv.Start()
	defer srv.Close()
	const conc, bursts = 16, 5
	cl := newClient(t, providerConfig(srv.URL), providers.Options{Concurrency: conc})
	var fresh, pooled atomic.Int64 // requests on a connection never used before; connections back in the pool
	var refused atomic.Value
	trace := &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			if !info.Reused {
				fresh.Add(1)
			}
		},
		PutIdleConn: func(err error) {
			if err != nil {
				refused.Store(err)
				return
			}
			pooled.Add(1)
		},
	}
	ctx := httptrace.WithClientTrace(context.Background(), trace)
	for burst := range bursts {
		var wg sync.WaitGroup
		for i := range conc {
			wg.Go(func() {
				if _, err := cl.Dispatch(ctx, payment(fmt.Sprint(burst, "-", i))); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		want := int64((burst + 1) * conc)
		for deadline := time.Now().Add(10 * time.Second); pooled.Load() < want && refused.Load() == nil; {
			if time.Now().After(deadline) {
				t.Fatalf("burst %d: %d of %d connections back in the idle pool after 10s", burst, pooled.Load(), want)
			}
			time.Sleep(time.Millisecond)
		}
		if err := refused.Load(); err != nil {
			t.Fatalf("burst %d: the transport refused a connection to its idle pool: %v", burst, err)
		}
		if burst == 0 {
			fresh.Store(0)
		}
	}
	// A keep-alive not reused shows as a new connection for most of the 64 later requests. A few stray new
	// connections are net/http's own choice: a request that finds an idle connection closing, or that
	// dials while the pool is being handed out, does not wait (CI saw 1 once, and 5 once under -race with
	// every connection back in the idle pool). A quarter of a burst stays far below what no reuse shows.
	if n := fresh.Load(); n > conc/4 {
		t.Fatalf("later bursts took %d connections never used before: keep-alive not reused", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if opened > conc+4 {
		t.Fatalf("%d connections for %d concurrent requests (plus 4 spares)", opened, conc)
	}
}

// Spare connections are dialed before the first request, so it does not pay a dial at its slot; and a
// spare the server closed meanwhile costs a retry, not a failed payment.
func TestSpareConnections(t *testing.T) {
	var mu sync.Mutex
	var states []http.ConnState
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		mu.Lock()
		states = append(states, s)
		mu.Unlock()
	}
	srv.Start()
	defer srv.Close()
	cl := newClient(t, providerConfig(srv.URL), providers.Options{Concurrency: 4})
	count := func(want http.ConnState) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, s := range states {
			if s == want {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(5 * time.Second)
	for count(http.StateNew) < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("%d spare connections dialed before any request, want 4", count(http.StateNew))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if count(http.StateActive) != 0 {
		t.Fatal("a request was sent to warm up; spares must be bare connections")
	}
	if _, err := cl.Dispatch(context.Background(), payment("a")); err != nil {
		t.Fatal(err)
	}
	// Close every connection server-side: the stale spares must not fail a payment.
	srv.CloseClientConnections()
	for i := range 8 {
		if _, err := cl.Dispatch(context.Background(), payment(fmt.Sprint("b", i))); err != nil {
			t.Fatalf("dispatch over a closed spare: %v", err)
		}
	}
}

// Answered: a status of any kind is an answer; a transport error or a timeout is not (the request may
// still be in flight at the provider).
func TestAnswered(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{nil, true},
		{&providers.StatusError{Provider: "acme", Status: 503}, true},
		{fmt.Errorf("wrapped: %w", &providers.Throttled{Provider: "acme", Status: 429}), true},
		{context.DeadlineExceeded, false},
		{errors.New("read tcp: connection reset by peer"), false},
	} {
		if got := providers.Answered(tt.err); got != tt.want {
			t.Errorf("Answered(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// The job's merchant travels in merchant_header (X-Merchant by default), and only when it has one, to a
// provider with merchants (per_merchant or merchants); other providers' requests carry no merchant.
func TestMerchantHeader(t *testing.T) {
	for _, header := range []string{"", "X-Account"} {
		rec := &recorder{}
		srv := httptest.NewServer(rec)
		c := providerConfig(srv.URL)
		c.MerchantHeader = header
		c.PerMerchant = &config.PerMerchant{}
		cl := newClient(t, c, providers.Options{})
		without := payment("pay-2")
		without.Merchant = ""
		for _, j := range []*job.Job{payment("pay-1"), without} {
			if _, err := cl.Dispatch(context.Background(), j); err != nil {
				t.Fatal(err)
			}
		}
		srv.Close()
		name := header
		if name == "" {
			name = config.DefaultMerchantHeader
		}
		if got := rec.requests[0].Header.Get(name); got != "m_42" {
			t.Errorf("%s on a job of merchant m_42: %q", name, got)
		}
		if got, ok := rec.requests[1].Header[http.CanonicalHeaderKey(name)]; ok {
			t.Errorf("%s on a job without a merchant: %q, want none", name, got)
		}
	}
}

func TestNoMerchantHeaderWithoutMerchants(t *testing.T) {
	rec := &recorder{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	cl := newClient(t, providerConfig(srv.URL), providers.Options{})
	if _, err := cl.Dispatch(context.Background(), payment("pay-1")); err != nil {
		t.Fatal(err)
	}
	if got, ok := rec.requests[0].Header["X-Merchant"]; ok {
		t.Fatalf("X-Merchant %q to a provider without merchants, want none", got)
	}
}
