package providers_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/providers"
)

// What Dispatch hands back of an answer, and how declined_when tells a decline from a failure: each
// answer a provider may give, with the answer kept and the outcome.
func TestAnswers(t *testing.T) {
	gz := func(s string) []byte {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		_, _ = zw.Write([]byte(s))
		_ = zw.Close()
		return b.Bytes()
	}
	declined := &config.DeclinedWhen{Statuses: []int{402}, JSON: &config.DeclinedJSON{Field: "result.status", Values: []string{"declined", "failed"}}}
	tests := []struct {
		name      string
		status    int
		headers   map[string]string
		body      []byte
		max       int
		declined  *config.DeclinedWhen
		outcome   providers.Outcome
		body2     string // the answer's body as kept
		truncated bool
		kept      map[string]string
	}{
		{name: "201 with a transaction id and a request id", status: 201, headers: map[string]string{"Request-Id": "req-1", "X-Other": "x"},
			body: []byte(`{"transaction_id":"T-c-ok"}`), outcome: providers.Succeeded, body2: `{"transaction_id":"T-c-ok"}`,
			kept: map[string]string{"Request-Id": "req-1"}},
		{name: "larger than response_max: cut there, marked truncated", status: 200, body: []byte(strings.Repeat("a", 100)), max: 64,
			outcome: providers.Succeeded, body2: strings.Repeat("a", 64), truncated: true},
		{name: "not UTF-8: kept as bytes", status: 200, body: []byte{0xff, 0xfe, 'o', 'k'}, outcome: providers.Succeeded, body2: "\xff\xfeok"},
		{name: "gzip-encoded: decoded", status: 200, headers: map[string]string{"Content-Encoding": "gzip"}, body: gz(`{"status":"accepted"}`),
			outcome: providers.Succeeded, body2: `{"status":"accepted"}`},
		{name: "a declined status", status: 402, body: []byte(`{"error":"card declined"}`), declined: declined,
			outcome: providers.Decline, body2: `{"error":"card declined"}`},
		{name: "a 200 whose field says declined", status: 200, body: []byte(`{"result":{"status":"declined"}}`), declined: declined,
			outcome: providers.Decline, body2: `{"result":{"status":"declined"}}`},
		{name: "a 422 whose field says failed", status: 422, body: []byte(`{"result":{"status":"failed"}}`), declined: declined,
			outcome: providers.Decline, body2: `{"result":{"status":"failed"}}`},
		{name: "the field path leads nowhere: not a decline", status: 200, body: []byte(`{"status":"declined"}`), declined: declined,
			outcome: providers.Succeeded, body2: `{"status":"declined"}`},
		{name: "a 500 is never a decline", status: 500, body: []byte(`{"result":{"status":"declined"}}`), declined: declined,
			outcome: providers.Transient, body2: `{"result":{"status":"declined"}}`},
		{name: "a decline's field past response_max: told from the whole body, the result cut", status: 200,
			body: []byte(`{"pad":"` + strings.Repeat("x", 40) + `","result":{"status":"declined"}}`), max: 16, declined: declined,
			outcome: providers.Decline, body2: `{"pad":"xxxxxxxx`, truncated: true},
		{name: "text cut inside a character: cut before it", status: 200, body: []byte("ab" + strings.Repeat("é", 10)), max: 5,
			outcome: providers.Succeeded, body2: "abé", truncated: true},
		{name: "another value: a permanent failure", status: 422, body: []byte(`{"result":{"status":"invalid"}}`), declined: declined,
			outcome: providers.Permanent, body2: `{"result":{"status":"invalid"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				for k, v := range tt.headers {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tt.status)
				_, _ = w.Write(tt.body)
			}))
			defer srv.Close()
			c := providerConfig(srv.URL)
			c.ResponseMax, c.DeclinedWhen = tt.max, tt.declined
			c = c.WithDefaults()
			a, err := newClient(t, c, providers.Options{}).Dispatch(context.Background(), payment("p1"))
			if got := providers.OutcomeOf(err); got != tt.outcome || !providers.Answered(err) {
				t.Fatalf("outcome %s (answered %v), want %s: %v", got, providers.Answered(err), tt.outcome, err)
			}
			if a == nil || a.Status != tt.status || string(a.Body) != tt.body2 || a.Truncated != tt.truncated {
				t.Fatalf("answer %+v, want status %d, body %q, truncated %v", a, tt.status, tt.body2, tt.truncated)
			}
			for k, v := range tt.kept {
				if a.Headers[k] != v {
					t.Errorf("header %s: %q, want %q", k, a.Headers[k], v)
				}
			}
			if _, ok := a.Headers["X-Other"]; ok {
				t.Error("a header result_headers does not name was kept")
			}
			var dec *providers.Declined
			if errors.As(err, &dec) && (dec.Status != tt.status || dec.Why == "") {
				t.Errorf("declined %+v: want its status and why", dec)
			}
		})
	}
}

// No answer, no Answer: a refused connection returns nil and a transient error.
func TestNoAnswer(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	a, err := newClient(t, providerConfig(url).WithDefaults(), providers.Options{}).Dispatch(context.Background(), payment("p1"))
	if a != nil || providers.OutcomeOf(err) != providers.Transient || providers.Answered(err) {
		t.Fatalf("answer %+v, err %v: want none, transient, unanswered", a, err)
	}
}
