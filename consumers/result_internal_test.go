package consumers

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paygate/paygate/job"
	"github.com/paygate/paygate/providers"
)

// events records, in order, what a handling did with its delivery and with the results.
type events struct {
	mu  sync.Mutex
	log []string
	// results' bodies, in order
	results []Result
	// failPublish fails every publish; failAck fails every ack (the connection lost under it)
	failPublish, failAck bool
}

func (e *events) add(s string) { e.mu.Lock(); e.log = append(e.log, s); e.mu.Unlock() }

func (e *events) PublishResult(_ context.Context, provider, outcome, id string, body []byte) error {
	if e.failPublish {
		e.add("result failed")
		return errors.New("broker: publish not confirmed")
	}
	var r Result
	if err := json.Unmarshal(body, &r); err != nil || r.Provider != provider || r.Outcome != outcome || r.ID != id {
		e.add("result malformed")
		return nil
	}
	e.mu.Lock()
	e.results = append(e.results, r)
	e.mu.Unlock()
	e.add("result " + outcome)
	return nil
}

// eventDelivery is a valid job's delivery that records how it was settled.
type eventDelivery struct{ e *events }

func (d eventDelivery) Body() []byte {
	return []byte(`{"id":"pay-1","provider":"acme","amount":1,"currency":"EUR","merchant":"m1","idempotency_key":"k-1"}`)
}
func (eventDelivery) Attempt() int         { return 0 }
func (eventDelivery) FirstSeen() time.Time { return time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC) }
func (d eventDelivery) Ack(context.Context) error {
	if d.e.failAck {
		d.e.add("ack lost")
		return errors.New("channel closed")
	}
	d.e.add("ack")
	return nil
}
func (d eventDelivery) Requeue(context.Context) error { d.e.add("requeue"); return nil }
func (d eventDelivery) Defer(context.Context, time.Duration, int, error) error {
	d.e.add("defer")
	return nil
}
func (d eventDelivery) DeadLetter(_ context.Context, r Reason, _ int, _ error) error {
	d.e.add("dead " + string(r))
	return nil
}

// resultGate admits every job now; it counts nothing and marks nothing.
type resultGate struct{ clockGate }

func (*resultGate) CountEvent(context.Context, string, string) error { return nil }
func (*resultGate) Sent(context.Context, string, string) error       { return nil }
func (*resultGate) Land(context.Context, string, string) error       { return nil }

// answering answers every request with answer and err.
type answering struct {
	answer *providers.Answer
	err    error
}

func (a answering) Dispatch(context.Context, *job.Job) (*providers.Answer, error) {
	return a.answer, a.err
}

// Every end of a job publishes its result first and settles its delivery after: succeeded and declined
// acked, refused dead-lettered; a result the broker does not take leaves the delivery unacknowledged
// (back to its queue); an ack lost after the result brings the job back, and its second handling
// publishes a second result with the same id: twice, never none.
func TestResultsBeforeSettlement(t *testing.T) {
	ok := &providers.Answer{Status: 201, Headers: map[string]string{"Request-Id": "req-9"}, Body: []byte(`{"transaction_id":"T-1"}`)}
	declined := &providers.Answer{Status: 402, Body: []byte(`{"status":"declined"}`)}
	refused := &providers.Answer{Status: 422, Body: []byte("bad iban \xff")}
	tests := []struct {
		name                 string
		answer               answering
		failPublish, failAck bool
		handlings            int
		want                 string
		status               int
		body                 string // the result's response body, as JSON
		encoding, reason     string
	}{
		{name: "succeeded", answer: answering{answer: ok}, handlings: 1, want: "result succeeded, ack", status: 201, body: `{"transaction_id":"T-1"}`},
		{name: "declined: an answer, final", answer: answering{answer: declined, err: &providers.Declined{Provider: "acme", Status: 402, Why: "status 402"}},
			handlings: 1, want: "result declined, ack", status: 402, body: `{"status":"declined"}`},
		{name: "refused: dead, its answer not UTF-8", answer: answering{answer: refused, err: &providers.StatusError{Provider: "acme", Status: 422, Permanent: true}},
			handlings: 1, want: "result dead, dead permanent", status: 422, body: `"YmFkIGliYW4g/w=="`, encoding: "base64", reason: "permanent"},
		{name: "the broker does not take the result", answer: answering{answer: ok}, failPublish: true, handlings: 1, want: "result failed, defer"},
		{name: "the ack lost after the result: a second result", answer: answering{answer: ok}, failAck: true, handlings: 2,
			want: "result succeeded, ack lost, result succeeded, ack lost", status: 201, body: `{"transaction_id":"T-1"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &events{failPublish: tt.failPublish, failAck: tt.failAck}
			w, err := New(Config{Concurrency: 1, MaxInlineWait: time.Second, MaxAttempts: 3, MaxDeferralAge: 1 << 62,
				ShutdownTimeout: time.Second, BackoffBase: time.Second, BackoffMax: time.Minute, RedisRetry: time.Second,
				Providers: map[string]int64{"acme": 10}, Results: e},
				&resultGate{}, map[string]Dispatcher{"acme": tt.answer}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			for range tt.handlings {
				w.Handle(context.Background(), "acme", eventDelivery{e})
				w.settling.Wait() // a success's result and ack run in the background
			}
			if got := strings.Join(e.log, ", "); got != tt.want {
				t.Fatalf("%s, want %s", got, tt.want)
			}
			for _, r := range e.results {
				if r.ID != "pay-1" || r.Merchant != "m1" || r.IdempotencyKey != "k-1" || r.Status != tt.status || r.Reason != tt.reason ||
					r.Response == nil || string(r.Response.Body) != tt.body || r.Response.BodyEncoding != tt.encoding ||
					r.FirstSeen != "2026-11-27T12:00:00.000Z" || r.SentAt == "" || r.SettledAt == "" || r.Attempts != 1 {
					b, _ := json.Marshal(r)
					t.Fatalf("result %s", b)
				}
			}
		})
	}
}

// A job without an answer (its decoding failed) gets no result: there is no id to give it.
func TestNoResultWithoutAJob(t *testing.T) {
	e := &events{}
	w, err := New(Config{Concurrency: 1, MaxInlineWait: time.Second, MaxAttempts: 3, MaxDeferralAge: 1 << 62,
		ShutdownTimeout: time.Second, BackoffBase: time.Second, BackoffMax: time.Minute, RedisRetry: time.Second,
		Providers: map[string]int64{"acme": 10}, Results: e}, &resultGate{}, map[string]Dispatcher{"acme": answering{}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	w.Handle(context.Background(), "acme", badDelivery{eventDelivery{e}})
	if got := strings.Join(e.log, ", "); got != "dead invalid" {
		t.Fatalf("%s, want only the dead letter", got)
	}
}

type badDelivery struct{ eventDelivery }

func (badDelivery) Body() []byte { return []byte(`{"id":`) }
