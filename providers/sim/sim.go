package sim

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Window is one limit: at most Limit accepted requests in any interval of length Per.
type Window struct {
	Limit int
	Per   time.Duration
}

func (w Window) String() string { return fmt.Sprintf("%d/%s", w.Limit, w.Per) }

// ParseLimits reads "N/duration" windows separated by commas, e.g. "100/1s,3000/1m".
func ParseLimits(spec string) ([]Window, error) {
	var out []Window
	for part := range strings.SplitSeq(spec, ",") {
		part = strings.TrimSpace(part)
		n, per, ok := strings.Cut(part, "/")
		limit, err := strconv.Atoi(n)
		if !ok || err != nil || limit < 1 {
			return nil, fmt.Errorf("sim: limit %q: want N/duration with N >= 1, e.g. 100/1s", part)
		}
		d, err := time.ParseDuration(per)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("sim: limit %q: want a positive duration after the slash, e.g. 100/1s", part)
		}
		out = append(out, Window{Limit: limit, Per: d})
	}
	return out, nil
}

// Options configure a simulated provider.
type Options struct {
	Limits []Window
	// Latency is added to every answer, ± Jitter (uniform).
	Latency, Jitter time.Duration
	// ErrorRate is the share of requests answered 500 (not accepted, not charged).
	ErrorRate float64
	// TimeoutRate is the share of requests that hang until the client gives up (or HangFor passes).
	TimeoutRate float64
	HangFor     time.Duration // default 1 minute
	// MaxInFlight caps the payment requests in flight at once (0: no cap). A request is in flight from the
	// moment it is received until its answer is written (latency included, a hung request until the
	// client gives up). One that would make more than MaxInFlight in flight is answered 429 at once with
	// Retry-After: 1, is not accepted, is not stored under its key, and counts in Stats.ThrottledInFlight
	// (not in Stats.Violations, which stay the rate-limit violations).
	MaxInFlight int
	// IdempotencyHeader names the header keys are read from; default Idempotency-Key.
	IdempotencyHeader string
	// MerchantLimits are enforced per merchant, on top of Limits: a request whose merchant (the
	// MerchantHeader header; none: not counted per merchant) already had Limit accepted in the last Per
	// is answered 429 with Retry-After, is not accepted, and counts in Stats.MerchantViolations.
	MerchantLimits []Window
	// MerchantHeader names the header a request's merchant is read from; default X-Merchant.
	MerchantHeader string
	// Calendar counts every window (Limits and MerchantLimits) as calendar windows, [k*Per, (k+1)*Per) of
	// Unix time, as providers with per-minute or daily counters that reset do; otherwise windows slide:
	// any interval of length Per.
	Calendar bool
	// Headers announces the limits in every payment answer: HeadersIETF (the httpapi draft's
	// RateLimit-Policy and RateLimit), HeadersXRateLimit (X-RateLimit-Limit, -Remaining and -Reset, for the
	// shortest window), or "" / HeadersNone: nothing.
	Headers string
	// Seed makes the injected faults reproducible; 0 picks one at random.
	Seed uint64
	// Now is the clock windows are kept with; nil: time.Now.
	Now func() time.Time
	// OnAccept, when set, is told of every accepted (charged) request, in order, under the provider's
	// lock: it must be quick and must not call the provider.
	OnAccept func(key string, at time.Time)
	// EarlyGrace: a request that arrives while a Retry-After the provider gave is still running counts
	// as early (Stats.EarlyAfter429) only if it arrives more than this after the first 429 of that quiet
	// period, which lets requests already on the wire land. Default 250ms.
	EarlyGrace time.Duration
	// OAuth2 serves POST /token for this client, and requires its bearer tokens on every payment request
	// (auth.go); HMACSecret requires every payment request signed with it (X-Signature, X-Timestamp).
	// A request refused for either is answered 401 and counted in Stats.Unauthorized only.
	OAuth2     *OAuth2Client
	HMACSecret string
	// TLS, when set, is what Start serves with (TLSConfig: a certificate, and client certificates).
	TLS *tls.Config
}

// Faults are the faults injected from now on (POST /faults), replacing the earlier ones. A storm or an
// outage lasts its For from the moment it is set.
type Faults struct {
	// RejectFor: an account rejected (reject.go). Every payment request is answered RejectCode (0: 422)
	// at once, neither charged nor stored under its key.
	RejectFor   Duration `json:"reject_for"`
	RejectCode  int      `json:"reject_status"`
	ErrorRate   float64  `json:"error_rate"`   // share answered 500
	TimeoutRate float64  `json:"timeout_rate"` // share that hang until the client gives up
	Latency     Duration `json:"latency"`      // added to every answer
	// ThrottleFor: a 429 storm. Every payment request is answered 429 with Retry-After (whole seconds,
	// at least 1) and is not charged.
	ThrottleFor Duration `json:"throttle_for"`
	RetryAfter  Duration `json:"retry_after"`
	// DownFor: an outage. Every payment request has its connection closed without an answer.
	DownFor Duration `json:"down_for"`
	// RefuseFor: the provider's process down. The simulator stops listening (Start's server), so that
	// connections are refused, and listens on the same address again after it (refuse.go).
	RefuseFor Duration `json:"refuse_for"`
}

// Duration is a time.Duration written as "1.5s" in JSON.
type Duration time.Duration

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("sim: want a duration such as \"1.5s\", got %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return fmt.Errorf("sim: want a duration >= 0 such as \"1.5s\", got %q", s)
	}
	*d = Duration(v)
	return nil
}

// Provider is the simulated provider, an http.Handler.
type Provider struct {
	o       Options
	longest time.Duration
	// rejectUntil ends the rejections (Faults.RejectFor), answered rejectStatus; under mu
	rejectUntil  time.Time
	rejectStatus int

	mu       sync.Mutex
	rng      *rand.Rand
	accepted []time.Time // accepted requests, in order, trimmed to the longest window
	// merchants' accepted requests, in order, each trimmed to the longest merchant window when checked
	merchants       map[string][]time.Time
	merchantLongest time.Duration
	keys            map[string]charge // the accepted (charged) idempotency keys
	stats           Stats
	// tokens are the OAuth2 tokens issued, with their expiry
	tokens map[string]time.Time
	// Runtime faults (POST /faults) and the quiet period the provider's 429s asked for.
	throttleUntil, downUntil time.Time
	retryAfter               time.Duration
	quietFrom, quietUntil    time.Time
	// stopListening stops the server's listener for a while (Faults.RefuseFor; nil outside Start)
	stopListening func(time.Duration)
}

// Stats is what GET /stats returns.
type Stats struct {
	Requests          int64 `json:"requests"`
	Accepted          int64 `json:"accepted"`
	Duplicates        int64 `json:"duplicates"`
	Violations        int64 `json:"violations"`
	ErrorsInjected    int64 `json:"errors_injected"`    // 500s and hung requests
	TimeoutsInjected  int64 `json:"timeouts_injected"`  // the hung ones among them
	BadRequests       int64 `json:"bad_requests"`       // no idempotency key, unreadable body
	ThrottledInjected int64 `json:"throttled_injected"` // 429s of a storm (POST /faults)
	RejectedInjected  int64 `json:"rejected_injected"`  // rejections (POST /faults reject_for)
	DownRefused       int64 `json:"down_refused"`       // requests cut during an outage
	Declined          int64 `json:"declined"`           // payments declined (their body asked for it: DeclineStatus, DeclineBody)
	// ThrottledInFlight counts payment requests answered 429 because they would have made more than
	// Options.MaxInFlight in flight. They are neither accepted nor violations.
	ThrottledInFlight int64 `json:"throttled_in_flight"`
	// InFlight is the number of payment requests in flight now; MaxInFlightSeen the highest it has been
	// (kept with or without a cap; at most Options.MaxInFlight when there is one, since a request refused
	// over the cap is never in flight).
	InFlight        int64 `json:"in_flight"`
	MaxInFlightSeen int64 `json:"max_in_flight_seen"`
	// EarlyAfter429 counts payment requests that arrived while a Retry-After this provider gave was
	// still running (after Options.EarlyGrace): a client that does not pause together.
	EarlyAfter429 int64         `json:"early_after_429"`
	FirstAccepted *time.Time    `json:"first_accepted"`
	LastAccepted  *time.Time    `json:"last_accepted"`
	Windows       []WindowStats `json:"windows"`
	// MerchantViolations counts requests refused (429) for their merchant's limits (Options.
	// MerchantLimits); MerchantWindows' MaxInWindow is the most any one merchant had accepted in a window.
	MerchantViolations int64         `json:"merchant_violations"`
	MerchantWindows    []WindowStats `json:"merchant_windows,omitempty"`
	Merchants          int           `json:"merchants"` // merchants seen with an accepted request
	// Overs are the first requests refused for exceeding a limit (up to 16 of Violations), for a
	// post-mortem: when, which limit, and how much later the request would have fitted.
	Overs []Over `json:"overs,omitempty"`
	// Paths counts the payment requests that passed the auth by request target (path and query as
	// sent, escaped); Unauthorized the ones refused 401 for their token or signature. TokensIssued and
	// TokensRefused count POST /token's tokens and its refusals of the client.
	Paths         map[string]int64 `json:"paths,omitempty"`
	Unauthorized  int64            `json:"unauthorized"`
	TokensIssued  int64            `json:"tokens_issued"`
	TokensRefused int64            `json:"tokens_refused"`
}

// Over is one request refused for exceeding a limit.
type Over struct {
	At    time.Time `json:"at"`
	Limit int       `json:"limit"`
	Per   string    `json:"per"`
	Early string    `json:"early"` // how much later it would have fitted
}

// WindowStats is one window's bookkeeping.
type WindowStats struct {
	Limit int    `json:"limit"`
	Per   string `json:"per"`
	// MaxInWindow is the largest number of accepted requests seen in any interval of length Per.
	MaxInWindow int `json:"max_in_window"`
}

// New returns a simulated provider.
func New(o Options) (*Provider, error) {
	if len(o.Limits) == 0 {
		return nil, errors.New("sim: at least one limit is required")
	}
	if o.ErrorRate < 0 || o.ErrorRate > 1 || o.TimeoutRate < 0 || o.TimeoutRate > 1 || o.ErrorRate+o.TimeoutRate > 1 {
		return nil, fmt.Errorf("sim: error rate %v and timeout rate %v must be in [0,1] and sum to at most 1", o.ErrorRate, o.TimeoutRate)
	}
	if o.Latency < 0 || o.Jitter < 0 || o.Jitter > o.Latency {
		return nil, fmt.Errorf("sim: latency %s and jitter %s must be >= 0, jitter <= latency", o.Latency, o.Jitter)
	}
	if o.MaxInFlight < 0 {
		return nil, fmt.Errorf("sim: max in flight %d must be >= 0 (0: no cap)", o.MaxInFlight)
	}
	if o.Headers != "" && o.Headers != HeadersNone && o.Headers != HeadersIETF && o.Headers != HeadersXRateLimit {
		return nil, fmt.Errorf("sim: headers %q: want %s, %s or %s", o.Headers, HeadersIETF, HeadersXRateLimit, HeadersNone)
	}
	if o.HangFor <= 0 {
		o.HangFor = time.Minute
	}
	if o.IdempotencyHeader == "" {
		o.IdempotencyHeader = "Idempotency-Key"
	}
	if o.MerchantHeader == "" {
		o.MerchantHeader = "X-Merchant"
	}
	if o.EarlyGrace <= 0 {
		o.EarlyGrace = 250 * time.Millisecond
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	seed := o.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	p := &Provider{o: o, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), keys: map[string]charge{}, merchants: map[string][]time.Time{},
		tokens: map[string]time.Time{}}
	if o.OAuth2 != nil && o.OAuth2.TTL <= 0 {
		c := *o.OAuth2
		c.TTL = time.Hour
		p.o.OAuth2 = &c
	}
	for _, w := range o.Limits {
		p.longest = max(p.longest, w.Per)
		p.stats.Windows = append(p.stats.Windows, WindowStats{Limit: w.Limit, Per: w.Per.String()})
	}
	for _, w := range o.MerchantLimits {
		if w.Limit < 1 || w.Per <= 0 {
			return nil, fmt.Errorf("sim: merchant limit %s: want N >= 1 per a positive duration", w)
		}
		p.merchantLongest = max(p.merchantLongest, w.Per)
		p.stats.MerchantWindows = append(p.stats.MerchantWindows, WindowStats{Limit: w.Limit, Per: w.Per.String()})
	}
	return p, nil
}

// AcceptedKeys returns the idempotency keys the provider accepted (charged), each once.
func (p *Provider) AcceptedKeys() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	keys := make([]string, 0, len(p.keys))
	for k := range p.keys {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// AcceptedAt returns when each accepted (charged) idempotency key arrived, on the simulator's clock: for
// setting beside when the gate meant it to go.
func (p *Provider) AcceptedAt() map[string]time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	at := make(map[string]time.Time, len(p.keys))
	for k, c := range p.keys {
		at[k] = c.at
	}
	return at
}

// charge is an accepted request: its answer, which a replay gets again, and when it arrived.
type charge struct {
	answer []byte
	at     time.Time
	status int // the answer's status: 200, or a decline's
}

// Stats returns a copy of the counters.
func (p *Provider) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Windows = append([]WindowStats(nil), p.stats.Windows...)
	s.MerchantWindows = append([]WindowStats(nil), p.stats.MerchantWindows...)
	s.Overs = append([]Over(nil), p.stats.Overs...)
	s.Paths = maps.Clone(p.stats.Paths)
	s.Merchants = len(p.merchants)
	return s
}

type verdict int

const (
	accept verdict = iota
	duplicate
	declined
	violation
	fail
	hang
	throttled
	down
)

// admit decides one request at the provider's clock. It holds the lock for the whole decision, so the
// bookkeeping is exact under any concurrency.
func (p *Provider) admit(key, merchant string, body []byte) (verdict, []byte, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.o.Now()
	p.arrived(now)
	switch {
	case now.Before(p.downUntil):
		p.stats.DownRefused++
		return down, nil, 0
	case now.Before(p.throttleUntil):
		p.stats.ThrottledInjected++
		p.quiet(now, p.retryAfter)
		return throttled, nil, p.retryAfter
	}
	if stored, ok := p.keys[key]; ok {
		p.stats.Duplicates++
		if stored.status != http.StatusOK {
			return declined, stored.answer, 0
		}
		return duplicate, stored.answer, 0
	}
	switch r := p.rng.Float64(); {
	case r < p.o.TimeoutRate:
		p.stats.ErrorsInjected++
		p.stats.TimeoutsInjected++
		return hang, nil, 0
	case r < p.o.TimeoutRate+p.o.ErrorRate:
		p.stats.ErrorsInjected++
		return fail, nil, 0
	}
	p.trim(now)
	var retry time.Duration
	var over Window
	for _, w := range p.o.Limits {
		if d := p.wait(p.accepted, now, w); d > retry {
			retry, over = d, w
		}
	}
	if retry > 0 {
		p.stats.Violations++
		if len(p.stats.Overs) < 16 {
			p.stats.Overs = append(p.stats.Overs, Over{At: now, Limit: over.Limit, Per: over.Per.String(), Early: retry.String()})
		}
		p.quiet(now, retry)
		return violation, nil, retry
	}
	var mine []time.Time // the merchant's accepted requests in its longest window
	if merchant != "" && len(p.o.MerchantLimits) > 0 {
		mine = inWindow(p.merchants[merchant], now, p.merchantLongest)
		for _, w := range p.o.MerchantLimits {
			retry = max(retry, p.wait(mine, now, w))
		}
		if retry > 0 {
			p.stats.MerchantViolations++ // the merchant's own 429: others are not asked to pause
			return violation, nil, retry
		}
		mine = append(mine, now)
		p.merchants[merchant] = append(p.merchants[merchant][:0:0], mine...)
		for i, w := range p.o.MerchantLimits {
			p.stats.MerchantWindows[i].MaxInWindow = max(p.stats.MerchantWindows[i].MaxInWindow, len(p.counted(mine, now, w.Per)))
		}
	}
	p.accepted = append(p.accepted, now)
	if status, resp := declineOf(key, body); status != 0 {
		p.stats.Declined++
		p.keys[key] = charge{resp, now, status}
		return declined, resp, 0
	}
	for i, w := range p.o.Limits {
		p.stats.Windows[i].MaxInWindow = max(p.stats.Windows[i].MaxInWindow, len(p.counted(p.accepted, now, w.Per)))
	}
	p.stats.Accepted++
	if p.stats.FirstAccepted == nil {
		p.stats.FirstAccepted = &now
	}
	p.stats.LastAccepted = &now
	if p.o.OnAccept != nil {
		p.o.OnAccept(key, now)
	}
	resp, _ := json.Marshal(map[string]any{"status": "accepted", "transaction_id": "T-" + key, "idempotency_key": key,
		"accepted_at": now.UTC().Format(time.RFC3339Nano), "request_bytes": len(body)})
	p.keys[key] = charge{resp, now, http.StatusOK}
	return accept, resp, 0
}

// arrived counts a payment request, and counts it as early if it came while a Retry-After ran (past the
// grace). Under the lock.
func (p *Provider) arrived(now time.Time) {
	p.stats.Requests++
	if now.Before(p.quietUntil) && now.Sub(p.quietFrom) > p.o.EarlyGrace {
		p.stats.EarlyAfter429++
	}
}

// enter counts a payment request in flight from the moment it is received, before anything else is
// decided. It reports false when the request would make more than Options.MaxInFlight in flight: the
// request is then counted (requests, throttled_in_flight), never in flight, and must be answered 429 at
// once. Otherwise the caller calls leave once the answer is written. A concurrency 429 opens no quiet
// period: a slot frees as soon as a request ends, so other clients are not asked to pause. During an
// outage requests are neither capped nor counted in flight: their connections are cut at once.
func (p *Provider) enter() (leave func(), ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.o.Now()
	if now.Before(p.downUntil) {
		return func() {}, true
	}
	if p.o.MaxInFlight > 0 && p.stats.InFlight >= int64(p.o.MaxInFlight) {
		p.arrived(now)
		p.stats.ThrottledInFlight++
		return nil, false
	}
	p.stats.InFlight++
	p.stats.MaxInFlightSeen = max(p.stats.MaxInFlightSeen, p.stats.InFlight)
	return p.leave, true
}

func (p *Provider) leave() {
	p.mu.Lock()
	p.stats.InFlight--
	p.mu.Unlock()
}

// quiet records that a 429 told clients to come back after retry (as the Retry-After header rounds it).
func (p *Provider) quiet(now time.Time, retry time.Duration) {
	until := now.Add(retryAfterSeconds(retry) * time.Second)
	if !now.Before(p.quietUntil) {
		p.quietFrom = now
	}
	if until.After(p.quietUntil) {
		p.quietUntil = until
	}
}

// retryAfterSeconds is the Retry-After header's value: whole seconds, rounded up, at least 1.
func retryAfterSeconds(d time.Duration) time.Duration {
	return max(1, (d+time.Second-1)/time.Second)
}

// SetFaults replaces the injected faults (see Faults).
func (p *Provider) SetFaults(f Faults) error {
	if f.ErrorRate < 0 || f.ErrorRate > 1 || f.TimeoutRate < 0 || f.TimeoutRate > 1 || f.ErrorRate+f.TimeoutRate > 1 {
		return fmt.Errorf("sim: error rate %v and timeout rate %v must be in [0,1] and sum to at most 1", f.ErrorRate, f.TimeoutRate)
	}
	if f.ThrottleFor > 0 && f.RetryAfter <= 0 {
		return errors.New("sim: a 429 storm (throttle_for) needs retry_after")
	}
	if err := p.setRejections(f); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.o.Now()
	p.o.ErrorRate, p.o.TimeoutRate = f.ErrorRate, f.TimeoutRate
	p.o.Latency, p.o.Jitter = time.Duration(f.Latency), min(p.o.Jitter, time.Duration(f.Latency))
	p.throttleUntil = now.Add(time.Duration(f.ThrottleFor))
	p.retryAfter = time.Duration(f.RetryAfter)
	p.downUntil = now.Add(time.Duration(f.DownFor))
	if p.stopListening != nil {
		p.stopListening(time.Duration(f.RefuseFor))
	}
	return nil
}

// counted returns the times (ordered) window per counts at now: those in (now-per, now], or with Calendar
// those since the window's start.
func (p *Provider) counted(times []time.Time, now time.Time, per time.Duration) []time.Time {
	if p.o.Calendar {
		return inWindow(times, now, now.Sub(calendarStart(now, per))+time.Nanosecond)
	}
	return inWindow(times, now, per)
}

// calendarStart is the start of the calendar window of length per that holds now (Unix time).
func calendarStart(now time.Time, per time.Duration) time.Time {
	ns := now.UnixNano()
	return time.Unix(0, ns-ns%int64(per))
}

// wait is how long until one more request fits window w, given the accepted times (0: it fits now).
func (p *Provider) wait(times []time.Time, now time.Time, w Window) time.Duration {
	in := p.counted(times, now, w.Per)
	if len(in)+1 <= w.Limit {
		return 0
	}
	if p.o.Calendar {
		return calendarStart(now, w.Per).Add(w.Per).Sub(now)
	}
	return in[len(in)-w.Limit].Add(w.Per).Sub(now) // the oldest of those that must leave for one more to fit
}

// inWindow returns the times in (now-per, now] of an ordered list.
func inWindow(times []time.Time, now time.Time, per time.Duration) []time.Time {
	from := now.Add(-per)
	i := sort.Search(len(times), func(i int) bool { return times[i].After(from) })
	return times[i:]
}

func (p *Provider) trim(now time.Time) {
	from := now.Add(-p.longest)
	i := sort.Search(len(p.accepted), func(i int) bool { return p.accepted[i].After(from) })
	if i > 0 && i >= len(p.accepted)/2 { // compact when at least half is dead
		p.accepted = append(p.accepted[:0], p.accepted[i:]...)
	}
}

// SetLimits changes the limits the provider enforces from now on (POST /limits), as a provider that lowers
// or raises an account's limits during the day. Requests are counted against the new windows with the
// history it kept (at least the longest window it has had). Each window's MaxInWindow starts afresh.
func (p *Provider) SetLimits(limits []Window) error {
	if len(limits) == 0 {
		return errors.New("sim: at least one limit is required")
	}
	for _, w := range limits {
		if w.Limit < 1 || w.Per <= 0 {
			return fmt.Errorf("sim: limit %s: want N >= 1 per a positive duration", w)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.o.Limits = append([]Window(nil), limits...)
	p.stats.Windows = nil
	for _, w := range limits {
		p.longest = max(p.longest, w.Per)
		p.stats.Windows = append(p.stats.Windows, WindowStats{Limit: w.Limit, Per: w.Per.String()})
	}
	return nil
}

func (p *Provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/limits":
		p.serveLimits(w, r)
	case "/keys", "/accepted":
		p.serveAccepted(w, r)
	case "/faults":
		p.serveFaults(w, r)
	case "/token":
		if p.o.OAuth2 == nil {
			p.servePayment(w, r)
			return
		}
		p.serveToken(w, r)
	case "/stats":
		p.serveStats(w, r)
	default:
		p.servePayment(w, r)
	}
}

// serveLimits is POST /limits, {"limits": "50/1s,1000/1m"}: enforce these from now on.
func (p *Provider) serveLimits(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST /limits", http.StatusMethodNotAllowed)
		return
	}
	var body struct {
		Limits string `json:"limits"`
	}
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		http.Error(w, "limits: "+err.Error(), http.StatusBadRequest)
		return
	}
	ws, err := ParseLimits(body.Limits)
	if err == nil {
		err = p.SetLimits(ws)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// serveAccepted is GET /keys, the idempotency keys accepted (charged), for ledgers, and GET /accepted, when
// each arrived.
func (p *Provider) serveAccepted(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		http.Error(w, "GET "+r.URL.Path, http.StatusMethodNotAllowed)
		return
	}
	var v any = p.AcceptedKeys()
	if r.URL.Path == "/accepted" {
		v = p.AcceptedAt()
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// serveFaults is POST /faults: replace the injected faults.
func (p *Provider) serveFaults(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST /faults", http.StatusMethodNotAllowed)
		return
	}
	var f Faults
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		http.Error(w, "faults: "+err.Error(), http.StatusBadRequest)
		return
	}
	if err := p.SetFaults(f); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// serveStats is GET /stats.
func (p *Provider) serveStats(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		http.Error(w, "GET /stats", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(p.Stats())
}

// servePayment is a payment request (POST, PUT or PATCH to any other path): counted in flight, admitted
// against the limits and the injected faults, and answered as the verdict says.
func (p *Provider) servePayment(w http.ResponseWriter, r *http.Request) {
	if !slices.Contains([]string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}, r.Method) {
		http.Error(w, "payments are GET, POST, PUT, PATCH or DELETE", http.StatusMethodNotAllowed)
		return
	}
	if p.rejecting(w) {
		return
	}
	leave, ok := p.enter()
	if !ok {
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusTooManyRequests, fmt.Sprintf(`{"error":"concurrency limit exceeded","max_in_flight":%d}`, p.o.MaxInFlight))
		return
	}
	// Runs before net/http sends the buffered answer, so a client never sees its answer while the
	// request still counts here.
	defer leave()
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	key := r.Header.Get(p.o.IdempotencyHeader)
	if err != nil || key == "" {
		p.mu.Lock()
		p.stats.Requests++
		p.stats.BadRequests++
		p.mu.Unlock()
		writeJSON(w, http.StatusBadRequest, fmt.Sprintf(`{"error":"missing %s header"}`, p.o.IdempotencyHeader))
		return
	}
	if why := p.authenticate(r, body); why != "" {
		p.refuseAuth(w, why)
		return
	}
	p.countPath(r.RequestURI)
	v, resp, retry := p.admit(key, r.Header.Get(p.o.MerchantHeader), body)
	p.announce(w.Header())
	p.answer(w, r, v, resp, retry)
}

// answer answers an admitted payment request as its verdict says: resp after the latency when accepted
// (or a duplicate), a 429 with Retry-After (retry) when over a limit, or the injected fault.
func (p *Provider) answer(w http.ResponseWriter, r *http.Request, v verdict, resp []byte, retry time.Duration) {
	switch v {
	case down:
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				_ = conn.Close() // an outage: the connection dies without an answer
				return
			}
		}
		writeJSON(w, http.StatusBadGateway, `{"error":"provider down"}`)
	case hang:
		select {
		case <-r.Context().Done():
		case <-time.After(p.o.HangFor):
			writeJSON(w, http.StatusInternalServerError, `{"error":"hung request gave up"}`)
		}
	case fail:
		p.sleep(r.Context())
		writeJSON(w, http.StatusInternalServerError, `{"error":"injected failure"}`)
	case violation, throttled:
		w.Header().Set("Retry-After", strconv.FormatInt(int64(retryAfterSeconds(retry)), 10))
		writeJSON(w, http.StatusTooManyRequests, `{"error":"rate limit exceeded"}`)
	case declined:
		p.sleep(r.Context())
		status := p.statusOf(r.Header.Get(p.o.IdempotencyHeader))
		w.Header().Set("Request-Id", "req-"+strconv.FormatInt(time.Now().UnixNano(), 36))
		writeJSON(w, status, string(resp))
	default: // accept, duplicate
		p.sleep(r.Context())
		w.Header().Set("Request-Id", "req-"+strconv.FormatInt(time.Now().UnixNano(), 36))
		writeJSON(w, http.StatusOK, string(resp))
	}
}

// The ways Options.Headers announces the limits.
const (
	HeadersNone       = "none"
	HeadersIETF       = "ietf"
	HeadersXRateLimit = "x-ratelimit"
)

// announce sets the rate-limit headers Options.Headers asks for, from the limits in force and what the
// windows hold now. Windows are announced in whole seconds (rounded up).
func (p *Provider) announce(h http.Header) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.o.Headers == "" || p.o.Headers == HeadersNone {
		return
	}
	now := p.o.Now()
	secs := func(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }
	remaining := func(w Window) (int, int64) {
		in := p.counted(p.accepted, now, w.Per)
		reset := int64(0)
		switch {
		case len(in) > 0 && p.o.Calendar: // the window's count resets at its end
			reset = secs(calendarStart(now, w.Per).Add(w.Per).Sub(now))
		case len(in) > 0:
			reset = secs(in[0].Add(w.Per).Sub(now))
		}
		return max(0, w.Limit-len(in)), reset
	}
	switch p.o.Headers {
	case HeadersIETF:
		var policy, state []string
		for i, w := range p.o.Limits {
			r, t := remaining(w)
			policy = append(policy, fmt.Sprintf(`"w%d";q=%d;w=%d`, i, w.Limit, secs(w.Per)))
			state = append(state, fmt.Sprintf(`"w%d";r=%d;t=%d`, i, r, t))
		}
		h.Set("RateLimit-Policy", strings.Join(policy, ", "))
		h.Set("RateLimit", strings.Join(state, ", "))
	case HeadersXRateLimit:
		shortest := p.o.Limits[0]
		for _, w := range p.o.Limits {
			if w.Per < shortest.Per {
				shortest = w
			}
		}
		r, t := remaining(shortest)
		h.Set("X-RateLimit-Limit", strconv.Itoa(shortest.Limit))
		h.Set("X-RateLimit-Remaining", strconv.Itoa(r))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(t, 10))
	}
}

func (p *Provider) sleep(ctx context.Context) {
	p.mu.Lock()
	d := p.o.Latency
	if p.o.Jitter > 0 {
		d += time.Duration(p.rng.Int64N(int64(2*p.o.Jitter)+1)) - p.o.Jitter
	}
	p.mu.Unlock()
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func writeJSON(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

// Server is a simulated provider listening on a TCP address.
type Server struct {
	*Provider
	srv *http.Server
	ln  net.Listener
}

// Start serves a simulated provider on addr (e.g. 127.0.0.1:0) until Close.
func Start(addr string, o Options) (*Server, error) {
	p, err := New(o)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("sim: listen %s: %w", addr, err)
	}
	refusing := newRefusing(ln)
	ln, p.stopListening = refusing, refusing.refuse
	if o.TLS != nil {
		ln = tls.NewListener(ln, o.TLS)
	}
	s := &Server{Provider: p, ln: ln, srv: &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second, ConnState: refusing.connState}}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// URL is the base URL, e.g. http://127.0.0.1:41234.
func (s *Server) URL() string {
	if s.o.TLS != nil {
		return "https://" + s.ln.Addr().String()
	}
	return "http://" + s.ln.Addr().String()
}

// Addr is the listening address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops listening and ends requests in flight.
func (s *Server) Close() error { return s.srv.Close() }

// Shutdown stops listening and waits for requests in flight, until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }
