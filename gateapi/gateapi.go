// Package gateapi serves the gate over HTTP/JSON (`worker gate serve`): synchronous callers (a checkout
// service, a support tool, written in any language) draw on the same budget as the worker fleet, through
// the same decisions, batched with the others asked at the same moment. It holds no state: any number of
// instances serve behind a load balancer; Redis holds the budget. docs/gate-service.md is its reference,
// docs/gate-api.yaml its OpenAPI document.
package gateapi

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/paygate/paygate/gate"
)

// Options configure the API.
type Options struct {
	Gate *gate.Limiter
	// Tokens are the bearer tokens a call may carry (gate_service.tokens_env); empty: callers are
	// authenticated by their client certificates (gate_service.tls_client_ca_file) alone.
	Tokens []string
	// Registry gets the API's metrics and serves /metrics (nil: a registry of its own).
	Registry *prometheus.Registry
	// Ready is /readyz's check (nil: always ready).
	Ready func(context.Context) error
	Log   *zap.Logger
}

// MaxBody bounds a request's body.
const MaxBody = 16 << 10

// MaxPause bounds a pause a caller may ask for (POST …/pause): the providers' retry_after_max default.
const MaxPause = time.Hour

// Routes are the API's calls (docs/gate-api.yaml documents each).
var Routes = []string{
	"POST /v1/providers/{provider}/reserve", "POST /v1/providers/{provider}/allow", "POST /v1/providers/{provider}/release",
	"POST /v1/providers/{provider}/sent", "POST /v1/providers/{provider}/land", "POST /v1/providers/{provider}/pause",
	"POST /v1/providers/{provider}/report", "GET /v1/providers/{provider}/status",
}

// Priorities are the values a reserve's priority takes.
var Priorities = []string{"high", "normal", "low"}

type api struct {
	o        Options
	requests *prometheus.CounterVec
	seconds  *prometheus.HistogramVec
}

// New returns the API's handler: the /v1 routes behind authentication, and /healthz, /readyz and
// /metrics without.
func New(o Options) http.Handler {
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	a := &api{o: o,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "paygate_gate_api_requests_total",
			Help: "Gate API calls, by provider, operation and HTTP status."}, []string{"provider", "op", "code"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "paygate_gate_api_seconds",
			Help: "Gate API calls' duration, by operation.", Buckets: []float64{.0002, .0005, .001, .002, .005, .01, .025, .05, .1, .5}}, []string{"op"}),
	}
	o.Registry.MustRegister(a.requests, a.seconds)
	mux := http.NewServeMux()
	ops := map[string]func(context.Context, string, []byte) (any, error){
		"reserve": a.reserve, "allow": a.allow, "release": a.release, "sent": a.sent, "land": a.land, "pause": a.pause,
		"report": a.report, "status": a.status,
	}
	for _, r := range Routes {
		name := r[strings.LastIndex(r, "/")+1:]
		mux.Handle(r, a.authenticated(a.call(name, ops[name])))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", a.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(o.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{http.StatusNotFound, "path", fmt.Sprintf("no route %s %s (see docs/gate-api.yaml)", r.Method, r.URL.Path)})
	})
	return mux
}

func (a *api) readyz(w http.ResponseWriter, r *http.Request) {
	if a.o.Ready != nil {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := a.o.Ready(ctx); err != nil {
			http.Error(w, "redis: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
	}
	_, _ = io.WriteString(w, "ready\n")
}

// authenticated lets a call through with one of the tokens as its bearer token, or, without tokens, on
// its verified client certificate (the TLS layer refused the others).
func (a *api) authenticated(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(a.o.Tokens) == 0 && r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
			next.ServeHTTP(w, r)
			return
		}
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if ok && a.known(token) {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="paygate"`)
		a.requests.WithLabelValues("", "auth", "401").Inc()
		writeError(w, &apiError{http.StatusUnauthorized, "authorization", "a bearer token of gate_service.tokens_env is required"})
	})
}

// known compares token with every token in constant time.
func (a *api) known(token string) bool {
	found := 0
	for _, t := range a.o.Tokens {
		found |= subtle.ConstantTimeCompare([]byte(token), []byte(t))
	}
	return found == 1 && token != ""
}

// call reads the body, runs op for the path's provider and writes its answer or its error as JSON.
func (a *api) call(op string, run func(context.Context, string, []byte) (any, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		provider := r.PathValue("provider")
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
		var out any
		if err != nil {
			err = &apiError{http.StatusRequestEntityTooLarge, "body", fmt.Sprintf("larger than %d bytes", MaxBody)}
		} else {
			out, err = run(r.Context(), provider, body)
		}
		code := http.StatusOK
		if err != nil {
			code = a.fail(w, provider, op, err)
		} else {
			writeJSON(w, code, out)
		}
		a.seconds.WithLabelValues(op).Observe(time.Since(start).Seconds())
		if _, known := a.o.Gate.Algorithm(provider); known != nil {
			provider = "" // an unknown one names no series
		}
		a.requests.WithLabelValues(provider, op, fmt.Sprint(code)).Inc()
	})
}

// fail writes err: the caller's mistake as a 4xx naming the field, the gate's trouble as a 503.
func (a *api) fail(w http.ResponseWriter, provider, op string, err error) int {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
	case errors.Is(err, gate.ErrUnknownProvider):
		ae = &apiError{http.StatusNotFound, "provider", fmt.Sprintf("provider %q is not configured", provider)}
	case errors.Is(err, gate.ErrInvalid):
		ae = &apiError{http.StatusBadRequest, fieldOf(err.Error()), err.Error()}
	default:
		a.o.Log.Warn("gate api: the gate could not answer", zap.String("provider", provider), zap.String("op", op), zap.Error(err))
		ae = &apiError{http.StatusServiceUnavailable, "", "the gate could not answer (Redis); ask again: " + err.Error()}
	}
	writeError(w, ae)
	return ae.status
}

// fieldOf names the request's field a gate's ErrInvalid message is about.
func fieldOf(msg string) string {
	for prefix, field := range map[string]string{"gate: job id": "id", "gate: cost": "cost", "gate: merchant": "merchant", "gate: max wait": "max_wait_ms"} {
		if strings.HasPrefix(msg, prefix) {
			return field
		}
	}
	return ""
}

// apiError is an answer other than 200: its status and, as JSON, the field at fault and what is wrong.
type apiError struct {
	status int
	field  string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func writeError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.status, struct {
		Error string `json:"error"`
		Field string `json:"field,omitempty"`
	}{e.msg, e.field})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// decode reads body into v, strictly: JSON, one object, no unknown field.
func decode(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		field := "body"
		if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			field = strings.Trim(name, `"`)
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			field = te.Field
		}
		return &apiError{http.StatusBadRequest, field, "the body is not the JSON object this call takes: " + err.Error()}
	}
	if dec.More() {
		return &apiError{http.StatusBadRequest, "body", "one JSON object, nothing after it"}
	}
	return nil
}
