package gateapi_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/gateapi"
	"github.com/paygate/paygate/internal/report"
	"github.com/paygate/paygate/internal/testenv"
)

const token = "test-token-0123456789abcdef"

// serve starts the API over a gate of its own on the test Redis: acme at 3 a minute, flight capped at
// 2 in flight.
func serve(t *testing.T) (*httptest.Server, *gate.Limiter) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	t.Cleanup(func() { rdb.Close() })
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "gateapi-" + hex.EncodeToString(b[:])
	l, err := gate.New(rdb, gate.Options{Prefix: prefix, Providers: map[string]gate.Provider{
		"acme":   {Policies: []gate.Policy{{Limit: 3, Window: time.Minute}}},
		"flight": {Policies: []gate.Policy{{Limit: 100, Window: time.Second}}, MaxInFlight: 2, Lease: 10 * time.Second},
		"fragile": {Policies: []gate.Policy{{Limit: 100, Window: time.Second}},
			Breaker: gate.Breaker{Failures: 2, OpenFor: time.Minute, OpenMax: time.Minute, Probe: 10 * time.Second, Reach: time.Second}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		for _, k := range rdb.Keys(ctx, prefix+":*").Val() {
			rdb.Del(ctx, k)
		}
	})
	srv := httptest.NewServer(gateapi.New(gateapi.Options{Gate: l, Tokens: []string{"another-token-0123456789", token},
		Ready: func(ctx context.Context) error { return rdb.Ping(ctx).Err() }}))
	t.Cleanup(srv.Close)
	return srv, l
}

// call sends body to path with the token (auth "" : none) and returns the status and the decoded answer.
func call(t *testing.T, srv *httptest.Server, method, path, body, auth string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", "Bearer "+auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	out := map[string]any{}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s: %d, not JSON: %q", method, path, resp.StatusCode, raw)
	}
	return resp.StatusCode, out
}

// Bad input gets a clear 4xx naming the field at fault, and charges nothing.
func TestBadInput(t *testing.T) {
	srv, l := serve(t)
	tests := []struct {
		name, method, path, body, auth string
		status                         int
		field                          string
	}{
		{"no token", "POST", "/v1/providers/acme/reserve", `{"id":"a"}`, "", 401, "authorization"},
		{"a wrong token", "POST", "/v1/providers/acme/reserve", `{"id":"a"}`, "test-token-0123456789abcdeX", 401, "authorization"},
		{"an unknown provider", "POST", "/v1/providers/nope/reserve", `{"id":"a"}`, token, 404, "provider"},
		{"a cost above the smallest limit", "POST", "/v1/providers/acme/reserve", `{"id":"a","cost":4}`, token, 400, "cost"},
		{"a cost of 0", "POST", "/v1/providers/acme/allow", `{"id":"a","cost":0}`, token, 400, "cost"},
		{"an id with a NUL", "POST", "/v1/providers/acme/reserve", `{"id":"a\u0000b"}`, token, 400, "id"},
		{"no id", "POST", "/v1/providers/acme/reserve", `{"cost":1}`, token, 400, "id"},
		{"a body that is not JSON", "POST", "/v1/providers/acme/reserve", `id=a`, token, 400, "body"},
		{"an unknown field", "POST", "/v1/providers/acme/reserve", `{"id":"a","max_wait":5}`, token, 400, "max_wait"},
		{"a string for a number", "POST", "/v1/providers/acme/reserve", `{"id":"a","cost":"1"}`, token, 400, "cost"},
		{"a negative wait", "POST", "/v1/providers/acme/reserve", `{"id":"a","max_wait_ms":-1}`, token, 400, "max_wait_ms"},
		{"an unknown priority", "POST", "/v1/providers/acme/reserve", `{"id":"a","priority":"urgent"}`, token, 400, "priority"},
		{"a pause of 0", "POST", "/v1/providers/acme/pause", `{"retry_after_ms":0}`, token, 400, "retry_after_ms"},
		{"a release without a slot", "POST", "/v1/providers/acme/release", `{"id":"a"}`, token, 400, "slot"},
		{"a land without a lease", "POST", "/v1/providers/flight/land", `{}`, token, 400, "lease"},
		{"an unknown route", "POST", "/v1/providers/acme/charge", `{}`, token, 404, "path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, out := call(t, srv, tt.method, tt.path, tt.body, tt.auth)
			if status != tt.status || out["field"] != tt.field || out["error"] == "" {
				t.Fatalf("%d %v, want %d naming %q", status, out, tt.status, tt.field)
			}
		})
	}
	st, err := report.Of(context.Background(), l, "acme")
	if err != nil || st.Policies[0].Used != 0 || st.Policies[0].Reserved != 0 {
		t.Fatalf("after bad input: %+v %v, want nothing charged", st.Policies, err)
	}
}

// The calls do what the workers' do: three admissions of a 3-a-minute budget, a fourth denied with when
// to ask again, a duplicate id admitted again without a second unit, a release giving one back, a pause
// and the status saying so; a capped provider's lease landed.
func TestCalls(t *testing.T) {
	srv, _ := serve(t)
	slots := map[string]string{}
	for i, id := range []string{"a", "b", "c"} {
		status, v := call(t, srv, "POST", "/v1/providers/acme/reserve", `{"id":"`+id+`","max_wait_ms":100}`, token)
		if status != 200 || v["allowed"] != true || v["remaining"] != float64(2-i) || v["releasable"] != true || v["slot"] == "" {
			t.Fatalf("%s: %d %v", id, status, v)
		}
		slots[id], _ = v["slot"].(string)
	}
	if _, v := call(t, srv, "POST", "/v1/providers/acme/allow", `{"id":"d"}`, token); v["allowed"] != false || v["retry_after_ms"].(float64) <= 0 {
		t.Fatalf("a fourth: %v, want denied with retry_after_ms", v)
	}
	_, dup := call(t, srv, "POST", "/v1/providers/acme/allow", `{"id":"a"}`, token)
	if dup["allowed"] != true || dup["duplicate"] != true || dup["releasable"] != false {
		t.Fatalf("a again: %v, want an admitted duplicate, not releasable", dup)
	}
	status, rel := call(t, srv, "POST", "/v1/providers/acme/release", `{"id":"c","slot":"`+slots["c"]+`"}`, token)
	if status != 200 || rel["released"] != float64(1) {
		t.Fatalf("release: %d %v", status, rel)
	}
	if _, v := call(t, srv, "POST", "/v1/providers/acme/allow", `{"id":"e"}`, token); v["allowed"] != true {
		t.Fatalf("after a release: %v, want the unit given back taken", v)
	}
	if status, v := call(t, srv, "POST", "/v1/providers/acme/sent", `{"id":"e"}`, token); status != 200 || v["sent"] != true {
		t.Fatalf("sent: %d %v", status, v)
	}
	if status, v := call(t, srv, "POST", "/v1/providers/acme/pause", `{"retry_after_ms":30000}`, token); status != 200 || v["paused_ms"] != float64(30000) {
		t.Fatalf("pause: %d %v", status, v)
	}
	if status, st := call(t, srv, "GET", "/v1/providers/acme/status", "", token); status != 200 || st["paused_until"] == nil || st["provider"] != "acme" {
		t.Fatalf("status: %d %v", status, st)
	}
	_, f := call(t, srv, "POST", "/v1/providers/flight/allow", `{"id":"f"}`, token)
	lease, _ := f["lease"].(string)
	if status, v := call(t, srv, "POST", "/v1/providers/flight/land", `{"lease":`+strings.TrimSpace(mustJSON(lease))+`}`, token); lease == "" || status != 200 || v["landed"] != true {
		t.Fatalf("land %q: %d %v", lease, status, v)
	}
}

func mustJSON(s string) string { b, _ := json.Marshal(s); return string(b) }

// /healthz, /readyz and /metrics answer without a token; /metrics counts the calls.
func TestOps(t *testing.T) {
	srv, _ := serve(t)
	call(t, srv, "POST", "/v1/providers/acme/allow", `{"id":"a"}`, token)
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || (path == "/metrics" && !strings.Contains(string(body), `paygate_gate_api_requests_total{code="200",op="allow",provider="acme"} 1`)) {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, body)
		}
	}
}

// A caller's answers feed the provider's breaker as the workers' do: two failures in a row open it, and
// the next caller is held (denied, paused) like every worker; an answer ends a run; without a breaker,
// a report changes nothing.
func TestReportsFeedTheBreaker(t *testing.T) {
	srv, _ := serve(t)
	_, v := call(t, srv, "POST", "/v1/providers/fragile/allow", `{"id":"f-1"}`, token)
	slot, _ := v["slot"].(string)
	report := func(id string, failed bool) map[string]any {
		_, r := call(t, srv, "POST", "/v1/providers/fragile/report", fmt.Sprintf(`{"id":%q,"slot":%q,"failed":%v}`, id, slot, failed), token)
		return r
	}
	if r := report("f-1", true); r["breaker"] != "closed" || r["failures"] != float64(1) {
		t.Fatalf("one failure: %v", r)
	}
	if r := report("f-1", false); r["failures"] != float64(0) {
		t.Fatalf("an answer after it: %v, want the run ended", r)
	}
	report("f-1", true)
	if r := report("f-2", true); r["breaker"] != "open" {
		t.Fatalf("two failures in a row: %v, want open", r)
	}
	if _, v := call(t, srv, "POST", "/v1/providers/fragile/reserve", `{"id":"f-3","max_wait_ms":500}`, token); v["allowed"] != false || v["paused"] != true {
		t.Fatalf("a reserve while open: %v, want denied by the hold", v)
	}
	if status, r := call(t, srv, "POST", "/v1/providers/acme/report", `{"id":"a","failed":true}`, token); status != 200 || r["breaker"] != "none" {
		t.Fatalf("without a breaker: %d %v", status, r)
	}
}
