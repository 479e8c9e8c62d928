package consumers

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/paygate/paygate/providers"
)

// ResultSink publishes a job's result, and returns only once the broker has it (RabbitMQ's publisher
// confirms, Kafka's acks): a delivery is acknowledged after its result, so a result is never lost; a
// crash between the two publishes it again when the job comes back, with the same id.
type ResultSink interface {
	PublishResult(ctx context.Context, provider, outcome, id string, body []byte) error
}

// The outcomes a result names: the ends of a job.
const (
	ResultSucceeded = "succeeded"
	ResultDeclined  = "declined"
	ResultDead      = "dead"
	ResultCancelled = "cancelled"
)

// Result is the body of a result message (docs/results.md): JSON, its keys a public contract.
type Result struct {
	ID             string    `json:"id"`
	Provider       string    `json:"provider"`
	Merchant       string    `json:"merchant,omitempty"`
	IdempotencyKey string    `json:"idempotency_key"`
	Outcome        string    `json:"outcome"`
	Reason         string    `json:"reason,omitempty"`
	Status         int       `json:"status,omitempty"`
	Response       *Response `json:"response,omitempty"`
	Attempts       int       `json:"attempts"`
	FirstSeen      string    `json:"first_seen"`
	SentAt         string    `json:"sent_at,omitempty"`
	SettledAt      string    `json:"settled_at"`
}

// Response is what a result keeps of the provider's answer.
type Response struct {
	Headers map[string]string `json:"headers,omitempty"`
	// Body is the answer's JSON value when it is JSON, else a string: the text when it is UTF-8, else
	// base64 with BodyEncoding "base64".
	Body         json.RawMessage `json:"body"`
	BodyEncoding string          `json:"body_encoding,omitempty"`
	Truncated    bool            `json:"truncated"`
}

// resultTime is the results' time format: RFC 3339, milliseconds, UTC.
const resultTime = "2006-01-02T15:04:05.000Z07:00"

// responseOf is a result's response for answer (nil for none).
func responseOf(a *providers.Answer) *Response {
	if a == nil {
		return nil
	}
	r := &Response{Headers: a.Headers, Truncated: a.Truncated}
	switch {
	case !a.Truncated && len(a.Body) > 0 && json.Valid(a.Body):
		r.Body = a.Body
	case utf8.Valid(a.Body):
		r.Body, _ = json.Marshal(string(a.Body))
	default:
		r.Body, _ = json.Marshal(base64.StdEncoding.EncodeToString(a.Body))
		r.BodyEncoding = "base64"
	}
	return r
}

// record publishes the settlement's result when results are on and the job has an id: true when there
// is nothing to publish or the broker has it. On false the delivery must not be acknowledged.
func (s *settlement) record(ctx context.Context, outcome, reason string, attempts int) bool {
	sink := s.w.cfg.Results
	if sink == nil || s.job == nil {
		return true
	}
	r := Result{ID: s.job.ID, Provider: s.provider, Merchant: s.job.Merchant, IdempotencyKey: s.job.Key(),
		Outcome: outcome, Reason: reason, Response: responseOf(s.answer), Attempts: attempts,
		FirstSeen: s.d.FirstSeen().UTC().Format(resultTime), SettledAt: s.w.now().UTC().Format(resultTime)}
	if s.answer != nil {
		r.Status = s.answer.Status
	}
	if a := s.admission; a != nil && !a.sent.IsZero() {
		r.SentAt = a.sent.UTC().Format(resultTime)
	}
	body, _ := json.Marshal(r) // plain values: cannot fail
	if err := sink.PublishResult(ctx, s.provider, outcome, s.job.ID, body); err != nil {
		s.w.resultLog.Warn(s.w.log, s.w.now(), "result not published: the job goes back to its queue", zap.String("provider", s.provider), zap.String("job", s.job.ID), zap.Error(err))
		return false
	}
	s.w.metrics.results.WithLabelValues(s.provider, outcome).Inc()
	return true
}

// errUnrecorded is why a job whose result the broker did not take is deferred.
var errUnrecorded = errors.New("its result was not published")

// unrecorded settles a delivery whose result the broker did not take: deferred for the first delay tier,
// not an attempt, to be sent again under its idempotency key and its result published then. A request
// that was sent (gid, the admission's entry; "" for none) is marked sent at the gate first, so that its
// next try is a duplicate there rather than a new unit. (Requeued, it would come back at once on
// RabbitMQ, and on Kafka not before a rebalance, holding back its partition's commits.)
func (s *settlement) unrecorded(ctx context.Context, gid string) {
	if gid != "" {
		_ = s.w.gate.Sent(ctx, s.provider, gid)
	}
	s.deferFor(ctx, s.w.cfg.RedisRetry, OutcomeUnrecorded, errUnrecorded)
}

// inBackground runs a settlement on a goroutine of its own, at most settleSlots at once (a handler waits
// for a slot: the broker's confirms pace the worker when they cannot keep up); Run waits for every one
// before it returns.
func (w *Worker) inBackground(settle func()) {
	w.settleSlots <- struct{}{}
	w.settling.Add(1)
	go func() {
		defer func() { <-w.settleSlots; w.settling.Done() }()
		settle()
	}()
}
