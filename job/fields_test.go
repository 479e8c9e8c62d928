package job_test

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/paygate/paygate/job"
)

// endpoints are acme's: payouts (cost 1 by default, no placeholder) and refunds (cost 2, a payload field
// and the merchant in its path).
var endpoints = job.Endpoints{"acme": {
	"payouts": {},
	"refunds": {Cost: 2, Fields: []string{"payload.payment_id", "merchant"}},
}}

func TestPathFields(t *testing.T) {
	tests := []struct {
		path string
		want []string
		err  string
	}{
		{"/v1/payouts", nil, ""},
		{"/v1/{merchant}/payments/{payload.payment_id}/refunds?key={idempotency_key}&again={merchant}", []string{"merchant", "payload.payment_id", "idempotency_key"}, ""},
		{"/v1/payouts/{id}", []string{"id"}, ""},
		{"/v1/{payload.a-B_9}", []string{"payload.a-B_9"}, ""},
		{"/v1/{amount}", nil, "unknown placeholder {amount} (want {id}, {merchant}, {idempotency_key} or {payload.<field>})"},
		{"/v1/{payload.}", nil, "unknown placeholder {payload.} (want {id}, {merchant}, {idempotency_key} or {payload.<field>})"},
		{"/v1/{payload.a.b}", nil, "unknown placeholder {payload.a.b} (want {id}, {merchant}, {idempotency_key} or {payload.<field>})"},
		{"/v1/{id", nil, `placeholder "{id" is not closed`},
		{"/v1/id}", nil, "a '}' closes no placeholder"},
		{"/v1/{{id}}", nil, "unknown placeholder {{id} (want {id}, {merchant}, {idempotency_key} or {payload.<field>})"},
	}
	for _, tt := range tests {
		got, err := job.PathFields(tt.path)
		if (err == nil) != (tt.err == "") || (err != nil && err.Error() != tt.err) || !slices.Equal(got, tt.want) {
			t.Errorf("PathFields(%q) = %v, %v; want %v, %q", tt.path, got, err, tt.want, tt.err)
		}
	}
}

// A placeholder's text: the job's fields as they are, a payload member that is a string or an integer as
// written; anything else an error that names the field, never the payload's content.
func TestField(t *testing.T) {
	j := &job.Job{ID: "pay 7/a", Merchant: "m 1", Payload: json.RawMessage(`{"s":"x/y z","n":-1200,"big":123456789012345678901,"f":1.5,"e":1e3,"b":true,"o":{"k":"secret"},"a":[1],"z":null,"empty":""}`)}
	for field, want := range map[string]string{"id": "pay 7/a", "idempotency_key": "pay 7/a", "merchant": "m 1",
		"payload.s": "x/y z", "payload.n": "-1200", "payload.big": "123456789012345678901"} {
		if got, err := j.Field(field); err != nil || got != want {
			t.Errorf("Field(%s) = %q, %v; want %q", field, got, err, want)
		}
	}
	for field, want := range map[string]string{
		"payload.f":       "the payload's f must be a string or an integer, got a fraction",
		"payload.e":       "the payload's e must be a string or an integer, got a fraction",
		"payload.b":       "the payload's b must be a string or an integer, got a boolean",
		"payload.o":       "the payload's o must be a string or an integer, got an object",
		"payload.a":       "the payload's a must be a string or an integer, got an array",
		"payload.z":       "the payload's z must be a string or an integer, got null",
		"payload.empty":   "the payload's empty is an empty string",
		"payload.missing": "the payload has no field missing",
	} {
		if got, err := j.Field(field); err == nil || err.Error() != want {
			t.Errorf("Field(%s) = %q, %v; want the error %q", field, got, err, want)
		}
	}
	bare := &job.Job{ID: "a", IdempotencyKey: "k/1"}
	if got, _ := bare.Field("idempotency_key"); got != "k/1" {
		t.Errorf("idempotency_key: %q", got)
	}
	if _, err := bare.Field("merchant"); err == nil || err.Error() != "the job has no merchant" {
		t.Errorf("no merchant: %v", err)
	}
	if _, err := bare.Field("payload.x"); err == nil || err.Error() != "the job has no payload" {
		t.Errorf("no payload: %v", err)
	}
}

// The decoder checks the operation and the placeholders its path needs; the endpoint's cost is the
// default, and a job's own cost wins.
func TestDecodeOperation(t *testing.T) {
	const base = `"provider":"acme","amount":1,"currency":"EUR"`
	tests := []struct {
		name, body string
		cost       int64
		err        string
	}{
		{"no operation", `{"id":"a",` + base + `}`, 1, ""},
		{"payouts, cost 1 by default", `{"id":"a","operation":"payouts",` + base + `}`, 1, ""},
		{"refunds' cost", `{"id":"a","operation":"refunds","merchant":"m",` + base + `,"payload":{"payment_id":"p/1"}}`, 2, ""},
		{"the job's own cost wins", `{"id":"a","operation":"refunds","merchant":"m","cost":1,` + base + `,"payload":{"payment_id":7}}`, 1, ""},
		{"unknown operation", `{"id":"a","operation":"captures",` + base + `}`, 0,
			`operation: "captures" is not an endpoint of provider acme (its endpoints: payouts, refunds)`},
		{"no endpoints", `{"id":"a","operation":"payouts","provider":"globex","amount":1,"currency":"EUR"}`, 0,
			`operation: "payouts": provider globex has no endpoints`},
		{"bad operation", `{"id":"a","operation":"Pay outs",` + base + `}`, 0, `operation: must match [a-z0-9_-]{1,64}, got "Pay outs"`},
		{"empty operation", `{"id":"a","operation":"",` + base + `}`, 0, `operation: must be 1..200 characters, got 0`},
		{"missing payload field", `{"id":"a","operation":"refunds","merchant":"m",` + base + `,"payload":{"id":1}}`, 0,
			"payload: {payload.payment_id} in the path of operation refunds: the payload has no field payment_id"},
		{"missing merchant", `{"id":"a","operation":"refunds",` + base + `,"payload":{"payment_id":1}}`, 0,
			"merchant: {merchant} in the path of operation refunds: the job has no merchant"},
		{"a fraction", `{"id":"a","operation":"refunds","merchant":"m",` + base + `,"payload":{"payment_id":1.5}}`, 0,
			"payload: {payload.payment_id} in the path of operation refunds: the payload's payment_id must be a string or an integer, got a fraction"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, err := job.DecodeFor([]byte(tt.body), maxCost, endpoints)
			var ie *job.InvalidError
			switch {
			case tt.err == "" && (err != nil || j.Cost != tt.cost):
				t.Fatalf("got %+v, %v; want cost %d", j, err, tt.cost)
			case tt.err != "" && (!errors.As(err, &ie) || err.Error() != tt.err):
				t.Fatalf("got %v, want %q", err, tt.err)
			}
		})
	}
	if _, err := job.Decode([]byte(`{"id":"a","operation":"payouts",`+base+`}`), maxCost); err == nil ||
		err.Error() != `operation: "payouts": provider acme has no endpoints` {
		t.Fatalf("Decode, which knows no endpoints: %v", err)
	}
}
