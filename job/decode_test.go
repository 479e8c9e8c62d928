package job_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/paygate/paygate/job"
)

var maxCost = map[string]int64{"acme": 100, "globex": 5}

func TestDecodeValid(t *testing.T) {
	j, err := job.Decode([]byte(`{"id":"pay-1","provider":"acme","amount":1250,"currency":"EUR","merchant":"m_42","idempotency_key":"k-1","cost":3,"payload":{"iban":"DE89"}}`), maxCost)
	if err != nil {
		t.Fatal(err)
	}
	if j.ID != "pay-1" || j.Provider != "acme" || j.Amount != 1250 || j.Currency != "EUR" || j.Merchant != "m_42" ||
		j.Key() != "k-1" || j.Cost != 3 || string(j.Payload) != `{"iban":"DE89"}` {
		t.Fatalf("%+v", j)
	}
	j, err = job.Decode([]byte(` {"id":"é-ü","provider":"globex","amount":1,"currency":"USD"} `), maxCost)
	if err != nil || j.Cost != 1 || j.Key() != "é-ü" {
		t.Fatalf("%+v %v", j, err)
	}
	j, err = job.Decode([]byte(`{"id":"b","provider":"acme","amount":1,"currency":"EUR","not_before":"2026-11-27T19:00:00.5+01:00"}`), maxCost)
	if want := time.Date(2026, 11, 27, 18, 0, 0, 5e8, time.UTC); err != nil || !j.NotBefore.Equal(want) {
		t.Fatalf("not_before %v (%v), want %v", j.NotBefore, err, want)
	}
	if j, err := job.Decode([]byte(`{"id":"c","provider":"acme","amount":1,"currency":"EUR","not_before":null}`), maxCost); err != nil || !j.NotBefore.IsZero() {
		t.Fatalf("not_before null: %v %v, want none", j, err)
	}
	for body, want := range map[string]job.Priority{
		`{"id":"p","provider":"acme","amount":1,"currency":"EUR"}`:                     job.Normal,
		`{"id":"p","provider":"acme","amount":1,"currency":"EUR","priority":"normal"}`: job.Normal,
		`{"id":"p","provider":"acme","amount":1,"currency":"EUR","priority":"high"}`:   job.High,
		`{"id":"p","provider":"acme","amount":1,"currency":"EUR","priority":"low"}`:    job.Low,
	} {
		if j, err := job.Decode([]byte(body), maxCost); err != nil || j.Class() != want {
			t.Fatalf("%s: class %v (%v), want %s", body, j, err, want)
		}
	}
	// An optional string given as null is absent, as encoding/json reads it.
	j, err = job.Decode([]byte(`{"id":"a\"b\\","provider":"acme","amount":1,"currency":"EUR","merchant":null}`), maxCost)
	if err != nil || j.Merchant != "" || j.ID != `a"b\` {
		t.Fatalf("%+v %v", j, err)
	}
}

// Every bad message gets one exact reason; none panics.
func TestDecodeInvalid(t *testing.T) {
	long := strings.Repeat("x", 129)
	tests := []struct {
		name, body, want string
	}{
		{"empty body", ``, "empty body"},
		{"not JSON", `hello`, "body is not JSON: invalid character 'h' looking for beginning of value"},
		{"truncated", `{"id":"a"`, "body is not JSON: unexpected EOF"},
		{"array", `[1,2]`, `body must be a JSON object, got "[1,2]"`},
		{"null", `null`, `body must be a JSON object, got "null"`},
		{"trailing data", `{"id":"a","provider":"acme","amount":1,"currency":"EUR"} {}`, "body has data after the JSON object"},
		{"invalid UTF-8", "{\"id\":\"\xff\",\"provider\":\"acme\",\"amount\":1,\"currency\":\"EUR\"}", "body is not valid UTF-8"},
		{"too big", `{"id":"a","payload":{"x":"` + strings.Repeat("y", 70000) + `"}}`, "body is 70029 bytes, more than the 65536 allowed"},
		{"10 MB body", `{"id":"a","payload":{"x":"` + strings.Repeat("y", 10<<20) + `"}}`, "body is 10485789 bytes, more than the 65536 allowed"},
		{"duplicate key", `{"id":"a","id":"b","provider":"acme","amount":1,"currency":"EUR"}`, "id: duplicate key"},
		{"missing id", `{"provider":"acme","amount":1,"currency":"EUR"}`, "id: required"},
		{"empty id", `{"id":"","provider":"acme","amount":1,"currency":"EUR"}`, "id: must be 1..128 characters, got 0"},
		{"id too long", `{"id":"` + long + `","provider":"acme","amount":1,"currency":"EUR"}`, "id: must be 1..128 characters, got 129"},
		{"id not a string", `{"id":42,"provider":"acme","amount":1,"currency":"EUR"}`, `id: must be a string, got "42"`},
		{"id with NUL", `{"id":"a\u0000b","provider":"acme","amount":1,"currency":"EUR"}`, "id: must not contain control characters"},
		{"missing provider", `{"id":"a","amount":1,"currency":"EUR"}`, "provider: required"},
		{"unknown provider", `{"id":"a","provider":"nope","amount":1,"currency":"EUR"}`, `provider: "nope" is not configured`},
		{"provider with brace", `{"id":"a","provider":"ac{me}","amount":1,"currency":"EUR"}`, `provider: must match [a-z0-9_-]{1,64}, got "ac{me}"`},
		{"provider with colon", `{"id":"a","provider":"ac:me","amount":1,"currency":"EUR"}`, `provider: must match [a-z0-9_-]{1,64}, got "ac:me"`},
		{"provider with space", `{"id":"a","provider":"ac me","amount":1,"currency":"EUR"}`, `provider: must match [a-z0-9_-]{1,64}, got "ac me"`},
		{"provider star", `{"id":"a","provider":"*","amount":1,"currency":"EUR"}`, `provider: must match [a-z0-9_-]{1,64}, got "*"`},
		{"missing amount", `{"id":"a","provider":"acme","currency":"EUR"}`, "amount: required"},
		{"negative amount", `{"id":"a","provider":"acme","amount":-5,"currency":"EUR"}`, "amount: must be > 0 (minor units), got -5"},
		{"zero amount", `{"id":"a","provider":"acme","amount":0,"currency":"EUR"}`, "amount: must be > 0 (minor units), got 0"},
		{"fractional amount", `{"id":"a","provider":"acme","amount":12.5,"currency":"EUR"}`, "amount: must be an integer, got 12.5"},
		{"amount as string", `{"id":"a","provider":"acme","amount":"12","currency":"EUR"}`, `amount: must be an integer, got "\"12\""`},
		{"null id", `{"id":null,"provider":"acme","amount":1,"currency":"EUR"}`, "id: must be 1..128 characters, got 0"},
		{"null currency", `{"id":"a","provider":"acme","amount":1,"currency":null}`, `currency: must be three upper-case letters (ISO 4217), got ""`},
		{"null idempotency key", `{"id":"a","provider":"acme","amount":1,"currency":"EUR","idempotency_key":null}`, "idempotency_key: must be 1..255 characters, got 0"},
		{"null cost", `{"id":"a","provider":"acme","amount":1,"currency":"EUR","cost":null}`, `cost: must be an integer, got "null"`},
		{"several unknown fields", `{"id":"a","provider":"acme","amount":1,"currency":"EUR","zz":1,"amout":5,"b":2}`, "amout: unknown field (the job contract has id, provider, operation, amount, currency, merchant, idempotency_key, cost, not_before, priority, payload)"},
		{"null amount", `{"id":"a","provider":"acme","amount":null,"currency":"EUR"}`, `amount: must be an integer, got "null"`},
		{"not_before not a time", `{"id":"a","provider":"acme","amount":1,"currency":"EUR","not_before":"tomorrow"}`, `not_before: must be an RFC 3339 time such as 2026-11-27T18:00:00Z, got "tomorrow"`},
		{"not_before without an offset", `{"id":"a","provider":"acme","amount":1,"currency":"EUR","not_before":"2026-11-27T18:00:00"}`, `not_before: must be an RFC 3339 time such as 2026-11-27T18:00:00Z, got "2026-11-27T18:00:00"`},
		{"not_before a number", `{"id":"a","provider":"acme","amount":1,"currency":"EUR","not_before":1764266400}`, `not_before: must be a string, got "1764266400"`},
		{"amount as object", `{"id":"a","provider":"acme","amount":{"v":1},"currency":"EUR"}`, `amount: must be an integer, got "{\"v\":1}"`},
		{"amount in exponent form", `{"id":"a","provider":"acme","amount":1e3,"currency":"EUR"}`, "amount: must be an integer, got 1e3"},
		{"id escaped", `{"i\u0064":"a\u0062","provider":"acme","amount":1,"currency":"EUR","id":"b"}`, "id: duplicate key"},
		{"huge amount", `{"id":"a","provider":"acme","amount":99999999999999999999,"currency":"EUR"}`, "amount: out of range, got 99999999999999999999"},
		{"lower-case currency", `{"id":"a","provider":"acme","amount":1,"currency":"eur"}`, `currency: must be three upper-case letters (ISO 4217), got "eur"`},
		{"4-letter currency", `{"id":"a","provider":"acme","amount":1,"currency":"EURO"}`, `currency: must be three upper-case letters (ISO 4217), got "EURO"`},
		{"cost 0", `{"id":"a","provider":"acme","amount":1,"currency":"EUR","cost":0}`, "cost: must be 1..100 for provider acme (its smallest limit), got 0"},
		{"cost above limit", `{"id":"a","provider":"globex","amount":1,"currency":"EUR","cost":6}`, "cost: must be 1..5 for provider globex (its smallest limit), got 6"},
		{"payload array", `{"id":"a","provider":"acme","amount":1,"currency":"EUR","payload":[1]}`, `payload: must be an object, got "[1]"`},
		{"payload string", `{"id":"a","provider":"acme","amount":1,"currency":"EUR","payload":"x"}`, `payload: must be an object, got "\"x\""`},
		{"merchant with a control character", `{"id":"a","provider":"acme","amount":1,"currency":"EUR","merchant":"m\n1"}`, "merchant: must not contain control or format characters"},
		{"unknown priority", `{"id":"a","provider":"acme","amount":1,"currency":"EUR","priority":"urgent"}`, `priority: must be high, normal or low, got "urgent"`},
		{"priority upper-case", `{"id":"a","provider":"acme","amount":1,"currency":"EUR","priority":"HIGH"}`, `priority: must be high, normal or low, got "HIGH"`},
		{"priority null", `{"id":"a","provider":"acme","amount":1,"currency":"EUR","priority":null}`, `priority: must be high, normal or low, got "null"`},
		{"priority a number", `{"id":"a","provider":"acme","amount":1,"currency":"EUR","priority":1}`, `priority: must be high, normal or low, got "1"`},
		{"priority empty", `{"id":"a","provider":"acme","amount":1,"currency":"EUR","priority":""}`, `priority: must be high, normal or low, got ""`},
		{"unknown field", `{"id":"a","provider":"acme","amount":1,"currency":"EUR","amout":5}`, "amout: unknown field (the job contract has id, provider, operation, amount, currency, merchant, idempotency_key, cost, not_before, priority, payload)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, err := job.Decode([]byte(tt.body), maxCost)
			var ie *job.InvalidError
			if j != nil || !errors.As(err, &ie) || err.Error() != tt.want {
				t.Fatalf("got %v (%v), want %q", err, j, tt.want)
			}
		})
	}
}

// FuzzDecode: any input either decodes to a job that honours the contract or is refused with a reason;
// nothing panics.
func FuzzDecode(f *testing.F) {
	for _, seed := range []string{
		`{"id":"pay-1","provider":"acme","amount":1250,"currency":"EUR"}`,
		`{"id":"a","provider":"globex","amount":1,"currency":"USD","cost":5,"payload":{"a":[1,{"b":null}]}}`,
		`{"id":"a","id":"a"}`, `[]`, `{`, `""`, "\xff", `{"amount":1e3}`,
		`{"id":"a/b c","provider":"acme","operation":"refunds","amount":1,"currency":"EUR","payload":{"payment_id":7}}`,
		`{"id":"a","provider":"acme","operation":"payouts","amount":1,"currency":"EUR","merchant":"m"}`,
		`{"id":"a","provider":"acme","amount":1,"currency":"EUR","priority":"low"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		j, err := job.DecodeFor(body, maxCost, endpoints)
		if err != nil {
			var ie *job.InvalidError
			if !errors.As(err, &ie) || err.Error() == "" || j != nil {
				t.Fatalf("error %v is not a reason", err)
			}
			return
		}
		if j.ID == "" || j.Amount <= 0 || len(j.Currency) != 3 || j.Cost < 1 || j.Cost > maxCost[j.Provider] {
			t.Fatalf("accepted a job outside the contract: %+v", j)
		}
		if !job.ValidPriority(j.Class()) {
			t.Fatalf("accepted a priority outside the contract: %q", j.Priority)
		}
		if j.Payload != nil && !json.Valid(j.Payload) {
			t.Fatalf("payload is not JSON: %q", j.Payload)
		}
		if j.Operation != "" {
			ep, ok := endpoints[j.Provider][j.Operation]
			if !ok {
				t.Fatalf("accepted an unknown operation: %+v", j)
			}
			for _, f := range ep.Fields {
				if v, err := j.Field(f); err != nil || v == "" {
					t.Fatalf("accepted a job that cannot fill {%s}: %q %v", f, v, err)
				}
			}
		}
	})
}

// BenchmarkDecode decodes a typical job, as every delivery is (go test -bench Decode ./job).
func BenchmarkDecode(b *testing.B) {
	body := []byte(`{"id":"3f1c9a2e-5b7d-4e8f-9a0b-1c2d3e4f5a6b","provider":"acme","amount":1250,"currency":"EUR","merchant":"m_42","payload":{"iban":"DE89370400440532013000"}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := job.Decode(body, maxCost); err != nil {
			b.Fatal(err)
		}
	}
}

// ValidProvider is ProviderPattern, the rule messages quote, matched whole.
func TestValidProviderIsItsPattern(t *testing.T) {
	pattern := regexp.MustCompile("^" + job.ProviderPattern + "$")
	for _, name := range []string{"", "a", "acme", "a-b_c9", strings.Repeat("z", 64), strings.Repeat("z", 65),
		"Acme", "ac me", "ac:me", "ac{me}", "*", "é", "a\n", "a.b", "0", "-", "_", "acme\x00"} {
		if got, want := job.ValidProvider(name), pattern.MatchString(name); got != want {
			t.Errorf("ValidProvider(%q) = %v, the pattern says %v", name, got, want)
		}
	}
}

// Currencies are three upper-case letters, nothing else.
func TestDecodeCurrency(t *testing.T) {
	for cur, ok := range map[string]bool{"EUR": true, "USD": true, "AAA": true, "ZZZ": true, "EU": false, "EURO": false,
		"eur": false, "Eur": false, "E1R": false, "@UR": false, "[UR": false, "ÉUR": false, "": false} {
		_, err := job.Decode(fmt.Appendf(nil, `{"id":"a","provider":"acme","amount":1,"currency":%q}`, cur), maxCost)
		if (err == nil) != ok {
			t.Errorf("currency %q: %v", cur, err)
		}
	}
}
