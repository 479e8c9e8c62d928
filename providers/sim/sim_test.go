package sim_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/paygate/paygate/providers/sim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock is a hand-driven time source.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

func post(t *testing.T, h http.Handler, key string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"id":"x"}`))
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func newSim(t *testing.T, o sim.Options) (*sim.Provider, *clock) {
	t.Helper()
	c := &clock{now: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)}
	if o.Now == nil {
		o.Now = c.Now
	}
	p, err := sim.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return p, c
}

// The acceptance sequence: 3/2s, five distinct keys, then a replay of the first.
func TestSequenceAndReplay(t *testing.T) {
	p, _ := newSim(t, sim.Options{Limits: []sim.Window{{Limit: 3, Per: 2 * time.Second}}})
	var codes []int
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		codes = append(codes, post(t, p, k).Code)
	}
	if fmt.Sprint(codes) != "[200 200 200 429 429]" {
		t.Fatalf("codes %v", codes)
	}
	first := post(t, p, "a")
	if first.Code != 200 || !strings.Contains(first.Body.String(), `"idempotency_key":"a"`) {
		t.Fatalf("replay: %d %s", first.Code, first.Body)
	}
	s := p.Stats()
	if s.Accepted != 3 || s.Duplicates != 1 || s.Violations != 2 || s.Requests != 6 || s.Windows[0].MaxInWindow != 3 {
		t.Fatalf("stats %+v", s)
	}
}

// OnAccept hears of accepted requests only: not of refusals, replays or injected failures.
func TestOnAccept(t *testing.T) {
	var heard []string
	p, c := newSim(t, sim.Options{Limits: []sim.Window{{Limit: 2, Per: time.Second}},
		OnAccept: func(key string, at time.Time) { heard = append(heard, fmt.Sprint(key, "@", at.Format("05.000"))) }})
	for _, k := range []string{"a", "b", "c", "a"} {
		post(t, p, k)
	}
	c.Advance(time.Second)
	post(t, p, "c")
	if got := fmt.Sprint(heard); got != "[a@00.000 b@00.000 c@01.000]" {
		t.Fatalf("heard %s", got)
	}
}

// GET /accepted: when each charged key arrived, once (a replay does not move it); refusals are not there.
func TestAcceptedAt(t *testing.T) {
	p, c := newSim(t, sim.Options{Limits: []sim.Window{{Limit: 2, Per: time.Second}}})
	t0 := c.Now()
	post(t, p, "a")
	c.Advance(10 * time.Millisecond)
	post(t, p, "b")
	post(t, p, "c") // over the limit
	c.Advance(time.Second)
	post(t, p, "a") // a replay
	w := httptest.NewRecorder()
	p.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/accepted", nil))
	var got map[string]time.Time
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || w.Code != 200 {
		t.Fatalf("GET /accepted: %d %s: %v", w.Code, w.Body, err)
	}
	want := map[string]time.Time{"a": t0, "b": t0.Add(10 * time.Millisecond)}
	if len(got) != len(want) || !got["a"].Equal(want["a"]) || !got["b"].Equal(want["b"]) {
		t.Fatalf("accepted at %v, want %v", got, want)
	}
}

// The window is (t-per, t], to the nanosecond, on the simulator's own clock; Retry-After is whole seconds,
// rounded up, and enough.
func TestWindowBoundaries(t *testing.T) {
	p, c := newSim(t, sim.Options{Limits: []sim.Window{{Limit: 2, Per: time.Second}, {Limit: 3, Per: 10 * time.Second}}})
	t0 := c.Now()
	mustCode(t, post(t, p, "a"), 200)
	c.Advance(100 * time.Millisecond)
	mustCode(t, post(t, p, "b"), 200)
	c.Advance(900*time.Millisecond - time.Nanosecond) // t0 + 1s - 1ns: "a" is still in the window
	w := post(t, p, "c")
	mustCode(t, w, 429)
	if got := w.Header().Get("Retry-After"); got != "1" {
		t.Fatalf("Retry-After %q at 1ns before a slot frees, want 1 (rounded up)", got)
	}
	c.Advance(time.Nanosecond) // t0 + 1s exactly: "a" has left (t-1s, t]
	mustCode(t, post(t, p, "c"), 200)
	c.Advance(time.Second) // 1s window has room; 10s window holds a, b, c
	w = post(t, p, "d")
	mustCode(t, w, 429)
	if got := w.Header().Get("Retry-After"); got != "8" { // "a" leaves the 10s window at t0+10s, now is t0+2s
		t.Fatalf("Retry-After %q from the 10s window, want 8", got)
	}
	c.Advance(8 * time.Second)
	if !c.Now().Equal(t0.Add(10 * time.Second)) {
		t.Fatal("clock arithmetic")
	}
	mustCode(t, post(t, p, "d"), 200) // the 429'd key was not stored: it is a new request
	s := p.Stats()
	if s.Accepted != 4 || s.Violations != 2 || s.Duplicates != 0 || s.Windows[0].MaxInWindow != 2 || s.Windows[1].MaxInWindow != 3 {
		t.Fatalf("stats %+v", s)
	}
	// Each refusal is on record: when, the limit it would have exceeded, how much later it would have fitted.
	want := []sim.Over{
		{At: t0.Add(time.Second - time.Nanosecond), Limit: 2, Per: "1s", Early: "1ns"},
		{At: t0.Add(2 * time.Second), Limit: 3, Per: "10s", Early: "8s"},
	}
	if len(s.Overs) != len(want) {
		t.Fatalf("overs %+v, want %+v", s.Overs, want)
	}
	for i, o := range s.Overs {
		if !o.At.Equal(want[i].At) || o.Limit != want[i].Limit || o.Per != want[i].Per || o.Early != want[i].Early {
			t.Fatalf("over %d: %+v, want %+v", i, o, want[i])
		}
	}
	if !s.FirstAccepted.Equal(t0) || !s.LastAccepted.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("first %v last %v", s.FirstAccepted, s.LastAccepted)
	}
}

func mustCode(t *testing.T, w *httptest.ResponseRecorder, code int) {
	t.Helper()
	if w.Code != code {
		t.Fatalf("got %d (%s), want %d", w.Code, w.Body, code)
	}
}

// Concurrent requests are decided exactly: a limit of 10 admits exactly 10 of 50.
func TestConcurrentExactness(t *testing.T) {
	p, _ := newSim(t, sim.Options{Limits: []sim.Window{{Limit: 10, Per: time.Hour}}, Now: time.Now})
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() { post(t, p, fmt.Sprintf("k%d", i)) })
	}
	wg.Wait()
	if s := p.Stats(); s.Accepted != 10 || s.Violations != 40 {
		t.Fatalf("stats %+v", s)
	}
}

func TestFaultsAndBadRequests(t *testing.T) {
	p, _ := newSim(t, sim.Options{Limits: []sim.Window{{Limit: 100, Per: time.Second}}, ErrorRate: 1, Seed: 7})
	mustCode(t, post(t, p, "a"), 500)
	mustCode(t, post(t, p, "a"), 500) // a failed request stored nothing: no duplicate
	mustCode(t, post(t, p, ""), 400)
	s := p.Stats()
	if s.ErrorsInjected != 2 || s.Accepted != 0 || s.Duplicates != 0 || s.BadRequests != 1 {
		t.Fatalf("stats %+v", s)
	}

	// A hung request holds until the client gives up; it is counted, never accepted.
	srv, err := sim.Start("127.0.0.1:0", sim.Options{Limits: []sim.Window{{Limit: 100, Per: time.Second}}, TimeoutRate: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL()+"/pay", strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", "h")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("hung request answered %d", resp.StatusCode)
	}
	if s := srv.Stats(); s.TimeoutsInjected != 1 || s.ErrorsInjected != 1 || s.Accepted != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// Seeded faults are reproducible, and the error rate is honoured.
func TestSeededErrorRate(t *testing.T) {
	run := func() []int {
		p, _ := newSim(t, sim.Options{Limits: []sim.Window{{Limit: 1000, Per: time.Second}}, ErrorRate: 0.2, Seed: 42})
		var codes []int
		for i := range 500 {
			codes = append(codes, post(t, p, fmt.Sprint(i)).Code)
		}
		return codes
	}
	a, b := run(), run()
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatal("same seed, different faults")
	}
	fails := strings.Count(fmt.Sprint(a), "500")
	if fails < 70 || fails > 130 { // 100 expected; 70..130 is > 3 standard deviations
		t.Fatalf("%d of 500 failed at rate 0.2", fails)
	}
}

func TestStatsEndpoint(t *testing.T) {
	srv, err := sim.Start("127.0.0.1:0", sim.Options{Limits: []sim.Window{{Limit: 1, Per: time.Minute}, {Limit: 5, Per: time.Hour}}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for _, k := range []string{"a", "b", "a"} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL()+"/v1/pay", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", k)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	resp, err := http.Get(srv.URL() + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var raw map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"accepted", "duplicates", "violations", "errors_injected", "first_accepted", "last_accepted", "windows",
		"throttled_in_flight", "in_flight", "max_in_flight_seen"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("stats lack %q: %v", k, raw)
		}
	}
	ws := raw["windows"].([]any)
	if raw["accepted"] != 1.0 || raw["duplicates"] != 1.0 || raw["violations"] != 1.0 || len(ws) != 2 || ws[0].(map[string]any)["max_in_window"] != 1.0 {
		t.Fatalf("stats %v", raw)
	}
}

func TestParseLimits(t *testing.T) {
	good, err := sim.ParseLimits("100/1s, 3000/1m,5/24h")
	if err != nil || fmt.Sprint(good) != "[100/1s 3000/1m0s 5/24h0m0s]" {
		t.Fatalf("%v %v", good, err)
	}
	for _, bad := range []string{"", "100", "0/1s", "-1/1s", "x/1s", "100/", "100/0s", "100/-1s", "100/1x", "100/1s,"} {
		if _, err := sim.ParseLimits(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// POST /faults: a 429 storm answers every request 429 with Retry-After and charges nothing; requests that
// arrive before the Retry-After ran out (after the grace) count as early; an outage cuts connections.
func TestRuntimeFaults(t *testing.T) {
	p, c := newSim(t, sim.Options{Limits: []sim.Window{{Limit: 100, Per: time.Second}}})
	setFaults := func(body string, want int) {
		t.Helper()
		w := httptest.NewRecorder()
		p.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/faults", strings.NewReader(body)))
		if w.Code != want {
			t.Fatalf("POST /faults %s: %d %s, want %d", body, w.Code, w.Body, want)
		}
	}
	setFaults(`{"throttle_for":"10s","retry_after":"2s"}`, http.StatusNoContent)
	r := post(t, p, "a")
	if r.Code != http.StatusTooManyRequests || r.Header().Get("Retry-After") != "2" {
		t.Fatalf("in a storm: %d Retry-After %q, want 429 and 2", r.Code, r.Header().Get("Retry-After"))
	}
	c.Advance(100 * time.Millisecond) // within the grace: on the wire already
	post(t, p, "b")
	c.Advance(time.Second) // inside the Retry-After, past the grace: early
	post(t, p, "c")
	if st := p.Stats(); st.ThrottledInjected != 3 || st.EarlyAfter429 != 1 || st.Accepted != 0 || st.Violations != 0 {
		t.Fatalf("storm stats %+v, want 3 throttled, 1 early, nothing charged", st)
	}
	setFaults(`{}`, http.StatusNoContent) // storm over
	c.Advance(3 * time.Second)
	if r := post(t, p, "a"); r.Code != http.StatusOK {
		t.Fatalf("after the storm: %d", r.Code)
	}
	if st := p.Stats(); st.EarlyAfter429 != 1 || st.Accepted != 1 {
		t.Fatalf("after the storm %+v", st)
	}

	for _, bad := range []string{`{"error_rate":1.5}`, `{"throttle_for":"1s"}`, `{"down_for":"-1s"}`, `{"down_for":5}`, `{"unknown":1}`} {
		setFaults(bad, http.StatusBadRequest)
	}

	srv := httptest.NewServer(p)
	defer srv.Close()
	setFaults(`{"down_for":"1m"}`, http.StatusNoContent)
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", "d")
	if resp, err := srv.Client().Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("down: answered %d, want the connection cut", resp.StatusCode)
	}
	if st := p.Stats(); st.DownRefused != 1 || st.Accepted != 1 {
		t.Fatalf("down stats %+v", st)
	}
}

// postCtx posts a payment whose request ends with ctx: a simulated latency ends when ctx does.
func postCtx(ctx context.Context, h http.Handler, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/payments", strings.NewReader(`{"id":"x"}`))
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// waitStats polls the stats until ok holds (the test's timeout bounds it).
func waitStats(t *testing.T, p *sim.Provider, what string, ok func(sim.Stats) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok(p.Stats()) {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: stats %+v", what, p.Stats())
		}
		time.Sleep(time.Millisecond)
	}
}

// inFlight fires one request per key at once, waits until the provider has seen them all (the answered
// ones answered, the others held in flight by the latency), checks the stats with check, then ends the
// held ones and returns every answer by key. The latency is an hour and the held requests end when their
// context does, so requests overlap however slow the machine is, and no timing is asserted.
func inFlight(t *testing.T, p *sim.Provider, keys []string, arrived func(sim.Stats) bool, check func(sim.Stats)) map[string]*httptest.ResponseRecorder {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	got := map[string]*httptest.ResponseRecorder{}
	var wg sync.WaitGroup
	for _, k := range keys {
		wg.Go(func() {
			w := postCtx(ctx, p, k)
			mu.Lock()
			got[k] = w
			mu.Unlock()
		})
	}
	waitStats(t, p, "the requests to arrive", arrived)
	check(p.Stats())
	cancel()
	wg.Wait()
	if s := p.Stats(); s.InFlight != 0 {
		t.Fatalf("after every answer: %d in flight", s.InFlight)
	}
	return got
}

// --max-in-flight 3: of 5 concurrent requests 3 are accepted and held, 2 are answered 429 at once with
// Retry-After, charged nothing and not stored; once the 3 end, 3 more (the 2 refused keys among them) are
// all accepted. The peak in flight is 3, and none of it is a rate-limit violation.
func TestMaxInFlight(t *testing.T) {
	p, _ := newSim(t, sim.Options{Limits: []sim.Window{{Limit: 1000, Per: time.Second}}, Now: time.Now,
		Latency: time.Hour, MaxInFlight: 3})
	got := inFlight(t, p, []string{"a", "b", "c", "d", "e"},
		func(s sim.Stats) bool { return s.Requests == 5 && s.InFlight == 3 && s.Accepted == 3 },
		func(s sim.Stats) {
			if s.ThrottledInFlight != 2 || s.MaxInFlightSeen != 3 || s.Violations != 0 || s.Duplicates != 0 {
				t.Fatalf("5 at once under a cap of 3: stats %+v", s)
			}
		})
	var refused []string
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		switch w := got[k]; w.Code {
		case http.StatusOK:
		case http.StatusTooManyRequests:
			if w.Header().Get("Retry-After") != "1" || !strings.Contains(w.Body.String(), `"max_in_flight":3`) {
				t.Fatalf("refused %s: Retry-After %q body %s", k, w.Header().Get("Retry-After"), w.Body)
			}
			refused = append(refused, k)
		default:
			t.Fatalf("%s: %d %s", k, w.Code, w.Body)
		}
	}
	if len(refused) != 2 {
		t.Fatalf("refused %v, want 2", refused)
	}

	again := append([]string{"f"}, refused...)
	got = inFlight(t, p, again,
		func(s sim.Stats) bool { return s.Requests == 8 && s.InFlight == 3 && s.Accepted == 6 },
		func(s sim.Stats) {
			if s.ThrottledInFlight != 2 || s.MaxInFlightSeen != 3 || s.Duplicates != 0 || s.Violations != 0 {
				t.Fatalf("3 more at once: stats %+v", s)
			}
		})
	for _, k := range again {
		mustCode(t, got[k], http.StatusOK)
	}
	if keys := fmt.Sprint(p.AcceptedKeys()); keys != "[a b c d e f]" {
		t.Fatalf("accepted keys %s", keys)
	}
}

// Without a cap nothing is refused for concurrency and max_in_flight_seen is the real peak.
func TestMaxInFlightSeenUncapped(t *testing.T) {
	p, _ := newSim(t, sim.Options{Limits: []sim.Window{{Limit: 1000, Per: time.Second}}, Now: time.Now, Latency: time.Hour})
	keys := []string{"a", "b", "c", "d", "e", "f", "g"}
	got := inFlight(t, p, keys,
		func(s sim.Stats) bool { return s.InFlight == 7 },
		func(s sim.Stats) {
			if s.MaxInFlightSeen != 7 || s.ThrottledInFlight != 0 {
				t.Fatalf("7 at once, no cap: stats %+v", s)
			}
		})
	for _, k := range keys {
		mustCode(t, got[k], http.StatusOK)
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	mustCode(t, postCtx(ended, p, "h"), http.StatusOK) // its latency ends at once: the peak stays
	if s := p.Stats(); s.MaxInFlightSeen != 7 || s.InFlight != 0 || s.Accepted != 8 {
		t.Fatalf("after: stats %+v", s)
	}
}

// Over HTTP, a request leaves the count before its answer reaches the client: a client that sends one
// request at a time is never refused under a cap of 1. A negative cap is refused.
func TestMaxInFlightSequential(t *testing.T) {
	if _, err := sim.New(sim.Options{Limits: []sim.Window{{Limit: 1, Per: time.Second}}, MaxInFlight: -1}); err == nil {
		t.Fatal("MaxInFlight -1 accepted")
	}
	srv, err := sim.Start("127.0.0.1:0", sim.Options{Limits: []sim.Window{{Limit: 1000, Per: time.Second}}, MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	for i := range 50 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL()+"/pay", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", fmt.Sprint("s", i))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	if s := srv.Stats(); s.Accepted != 50 || s.ThrottledInFlight != 0 || s.MaxInFlightSeen != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// Merchants' limits: each merchant (the X-Merchant header, or the one named) has its own window on top of
// the provider's; a request without a merchant counts against the provider only; a merchant's 429 is
// counted apart from the provider's violations.
func TestMerchantLimits(t *testing.T) {
	for _, header := range []string{"", "X-Account"} {
		p, c := newSim(t, sim.Options{Limits: []sim.Window{{Limit: 5, Per: time.Second}},
			MerchantLimits: []sim.Window{{Limit: 2, Per: time.Second}}, MerchantHeader: header})
		name := header
		if name == "" {
			name = "X-Merchant"
		}
		send := func(key, merchant string) *httptest.ResponseRecorder {
			r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"id":"x"}`))
			r.Header.Set("Idempotency-Key", key)
			if merchant != "" {
				r.Header.Set(name, merchant)
			}
			w := httptest.NewRecorder()
			p.ServeHTTP(w, r)
			return w
		}
		mustCode(t, send("a1", "a"), 200)
		mustCode(t, send("a2", "a"), 200)
		w := send("a3", "a")
		mustCode(t, w, 429)
		if got := w.Header().Get("Retry-After"); got != "1" {
			t.Fatalf("Retry-After %q for a merchant over its window, want 1", got)
		}
		mustCode(t, send("b1", "b"), 200)
		mustCode(t, send("n1", ""), 200)
		mustCode(t, send("n2", ""), 200)
		mustCode(t, send("b2", "b"), 429) // the provider's 5/1s is full: a provider violation
		c.Advance(time.Second)
		mustCode(t, send("a3", "a"), 200)
		s := p.Stats()
		if s.Accepted != 6 || s.Violations != 1 || s.MerchantViolations != 1 || s.Merchants != 2 ||
			len(s.MerchantWindows) != 1 || s.MerchantWindows[0].MaxInWindow != 2 {
			t.Fatalf("header %q: stats %+v", name, s)
		}
	}
	if _, err := sim.New(sim.Options{Limits: []sim.Window{{Limit: 1, Per: time.Second}}, MerchantLimits: []sim.Window{{Limit: 0, Per: time.Second}}}); err == nil {
		t.Fatal("a merchant limit of 0 was accepted")
	}
}

// Calendar windows: a window's count resets at its start (Unix time), so a limit's worth on each side of a
// boundary is accepted, and a refusal asks to come back at the next start.
func TestCalendarWindows(t *testing.T) {
	p, c := newSim(t, sim.Options{Limits: []sim.Window{{Limit: 2, Per: time.Second}}, Calendar: true})
	c.Advance(time.Second - c.Now().Sub(c.Now().Truncate(time.Second)) - 100*time.Millisecond) // 100ms before a second starts
	mustCode(t, post(t, p, "a"), 200)
	mustCode(t, post(t, p, "b"), 200)
	w := post(t, p, "c")
	mustCode(t, w, 429)
	if got := w.Header().Get("Retry-After"); got != "1" {
		t.Fatalf("Retry-After %q, want 1 (the next window, 100ms away, rounded up)", got)
	}
	c.Advance(100 * time.Millisecond) // the next calendar second: a sliding window would still hold a and b
	mustCode(t, post(t, p, "c"), 200)
	mustCode(t, post(t, p, "d"), 200)
	mustCode(t, post(t, p, "e"), 429)
	if s := p.Stats(); s.Accepted != 4 || s.Violations != 2 || s.Windows[0].MaxInWindow != 2 {
		t.Fatalf("stats %+v", s)
	}
}
