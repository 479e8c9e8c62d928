package job

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Limits of the job contract.
const (
	MaxBody     = 64 << 10 // bytes
	MaxIDLen    = 128      // characters
	MaxKeyLen   = 255      // characters, idempotency_key
	MaxMerchant = 128      // characters
	maxAmount   = 1<<53 - 1
)

// InvalidError says why a message is not a valid job. Its text is the reason a dead letter carries.
type InvalidError struct {
	Field string // empty for the body as a whole
	Msg   string
}

func (e *InvalidError) Error() string {
	if e.Field == "" {
		return e.Msg
	}
	return e.Field + ": " + e.Msg
}

func invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Decode parses and validates one message body. maxCost maps each configured provider to the largest cost
// a job may have there (its smallest limit). Every problem is an *InvalidError naming the field. No
// provider has endpoints: a job with an operation is refused (DecodeFor knows them).
func Decode(body []byte, maxCost map[string]int64) (*Job, error) {
	return DecodeFor(body, maxCost, nil)
}

// DecodeFor is Decode with the providers' endpoints: a job's operation must name one of its provider's,
// whose path's placeholders the job must fill (Job.Field), and whose cost is the job's when it gives
// none (a job's own cost wins).
func DecodeFor(body []byte, maxCost map[string]int64, endpoints Endpoints) (*Job, error) {
	switch {
	case len(body) == 0:
		return nil, invalid("", "empty body")
	case len(body) > MaxBody:
		return nil, invalid("", "body is %d bytes, more than the %d allowed", len(body), MaxBody)
	case !utf8.Valid(body):
		return nil, invalid("", "body is not valid UTF-8")
	}
	fields, err := objectFields(body)
	if err != nil {
		return nil, err
	}
	var j Job
	_, costGiven := fields["cost"]
	for _, f := range []struct {
		name     string
		required bool
		decode   func(json.RawMessage) error
	}{
		{"id", true, func(r json.RawMessage) error { return text(r, "id", 1, MaxIDLen, &j.ID) }},
		{"provider", true, func(r json.RawMessage) error { return text(r, "provider", 1, 200, &j.Provider) }},
		{"operation", false, func(r json.RawMessage) error { return text(r, "operation", 1, 200, &j.Operation) }},
		{"amount", true, func(r json.RawMessage) error { return integer(r, "amount", &j.Amount) }},
		{"currency", true, func(r json.RawMessage) error { return text(r, "currency", 0, 100, &j.Currency) }},
		{"merchant", false, func(r json.RawMessage) error {
			if err := text(r, "merchant", 0, MaxMerchant, &j.Merchant); err != nil {
				return err
			}
			if !ValidMerchant(j.Merchant) { // it travels in a header (merchant_header), and is shown by gate status
				return invalid("merchant", "must not contain control or format characters")
			}
			return nil
		}},
		{"idempotency_key", false, func(r json.RawMessage) error { return text(r, "idempotency_key", 1, MaxKeyLen, &j.IdempotencyKey) }},
		{"cost", false, func(r json.RawMessage) error { return integer(r, "cost", &j.Cost) }},
		{"not_before", false, func(r json.RawMessage) error { return moment(r, "not_before", &j.NotBefore) }},
		{"priority", false, func(r json.RawMessage) error {
			var p string
			if string(r) == "null" || text(r, "priority", 0, 16, &p) != nil {
				return invalid("priority", "must be high, normal or low, got %s", excerpt(r))
			}
			if !ValidPriority(Priority(p)) {
				return invalid("priority", "must be high, normal or low, got %q", p)
			}
			j.Priority = Priority(p)
			return nil
		}},
		{"payload", false, func(r json.RawMessage) error {
			if t := bytes.TrimSpace(r); len(t) == 0 || t[0] != '{' {
				return invalid("payload", "must be an object, got %s", excerpt(t))
			}
			j.Payload = append(json.RawMessage(nil), r...)
			return nil
		}},
	} {
		raw, ok := fields[f.name]
		if !ok {
			if f.required {
				return nil, invalid(f.name, "required")
			}
			continue
		}
		delete(fields, f.name)
		if err := f.decode(raw); err != nil {
			return nil, err
		}
	}
	if len(fields) > 0 { // the first in order, so that a body gets the same reason every time
		return nil, invalid(slices.Min(slices.Collect(maps.Keys(fields))), "unknown field (the job contract has id, provider, operation, amount, currency, merchant, idempotency_key, cost, not_before, priority, payload)")
	}

	switch {
	case strings.ContainsFunc(j.ID, unicode.IsControl):
		return nil, invalid("id", "must not contain control characters")
	case !ValidProvider(j.Provider):
		return nil, invalid("provider", "must match %s, got %q", ProviderPattern, j.Provider)
	case j.Operation != "" && !ValidOperation(j.Operation):
		return nil, invalid("operation", "must match %s, got %q", OperationPattern, j.Operation)
	case j.Amount <= 0:
		return nil, invalid("amount", "must be > 0 (minor units), got %d", j.Amount)
	case !currencyCode(j.Currency):
		return nil, invalid("currency", "must be three upper-case letters (ISO 4217), got %q", j.Currency)
	case strings.ContainsFunc(j.IdempotencyKey, unicode.IsControl):
		return nil, invalid("idempotency_key", "must not contain control characters")
	}
	limit, ok := maxCost[j.Provider]
	if !ok {
		return nil, invalid("provider", "%q is not configured", j.Provider)
	}
	ep, err := j.checkEndpoint(endpoints)
	if err != nil {
		return nil, err
	}
	if !costGiven {
		j.Cost = max(ep.Cost, 1)
	}
	if j.Cost < 1 || j.Cost > limit {
		return nil, invalid("cost", "must be 1..%d for provider %s (its smallest limit), got %d", limit, j.Provider, j.Cost)
	}
	return &j, nil
}

// objectFields reads the top-level object's members, refusing duplicate keys (which encoding/json would
// silently resolve to the last one). A valid document, as nearly every body is, is split in one pass over
// it (members); any other goes through encoding/json's decoder, whose error names what is wrong.
func objectFields(body []byte) (map[string]json.RawMessage, error) {
	if json.Valid(body) {
		return members(body)
	}
	return decodeFields(body)
}

// members splits a valid JSON document's top-level object into its members, each value as decodeFields
// would read it (TestMembersAsDecoded; FuzzMembers). It relies on the document being valid: every
// string is closed, every bracket matched, and nothing follows the value but whitespace.
func members(body []byte) (map[string]json.RawMessage, error) {
	i := skipSpace(body, 0)
	if body[i] != '{' {
		return nil, invalid("", "body must be a JSON object, got %s", excerpt(bytes.TrimSpace(body)))
	}
	fields := make(map[string]json.RawMessage, 8)
	i = skipSpace(body, i+1)
	for body[i] != '}' {
		end := stringEnd(body, i)
		key, err := unquote(body[i:end])
		if err != nil {
			return nil, notJSON(err)
		}
		i = skipSpace(body, skipSpace(body, end)+1) // past the ':'
		end = valueEnd(body, i)
		if _, dup := fields[key]; dup {
			return nil, invalid(key, "duplicate key")
		}
		fields[key] = body[i:end:end]
		if i = skipSpace(body, end); body[i] == ',' {
			i = skipSpace(body, i+1)
		}
	}
	return fields, nil
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd is the index just past the string that opens at b[i].
func stringEnd(b []byte, i int) int {
	for i++; b[i] != '"'; i++ {
		if b[i] == '\\' {
			i++
		}
	}
	return i + 1
}

// valueEnd is the index just past the value that starts at b[i].
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for {
			switch b[i] {
			case '"':
				i = stringEnd(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
	default: // a number, true, false or null
		for i < len(b) && !strings.ContainsRune(",}] \t\n\r", rune(b[i])) {
			i++
		}
		return i
	}
}

// unquote is a JSON string's text: its bytes as they are when it holds no escape.
func unquote(raw []byte) (string, error) {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1 : len(raw)-1]), nil
	}
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err
}

// decodeFields is objectFields through encoding/json's decoder.
func decodeFields(body []byte) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil {
		return nil, notJSON(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, invalid("", "body must be a JSON object, got %s", excerpt(bytes.TrimSpace(body)))
	}
	fields := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, notJSON(err)
		}
		key := tok.(string) // inside an object, a token before a value is always its key
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, notJSON(err)
		}
		if _, dup := fields[key]; dup {
			return nil, invalid(key, "duplicate key")
		}
		fields[key] = raw
	}
	if _, err := dec.Token(); err != nil {
		return nil, notJSON(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, invalid("", "body has data after the JSON object")
	}
	return fields, nil
}

func notJSON(err error) error {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return invalid("", "body is not JSON: %v", err)
}

// text reads a string field; null reads as "", as encoding/json reads it into a string (an optional
// field given as null is absent: "merchant": null is no merchant).
// moment reads an RFC 3339 time (a string with its offset, fractions of a second allowed) into dst;
// null is no time, as encoding/json reads it.
func moment(raw json.RawMessage, field string, dst *time.Time) error {
	if string(raw) == "null" {
		return nil
	}
	var s string
	if err := text(raw, field, 1, 64, &s); err != nil {
		return err
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return invalid(field, "must be an RFC 3339 time such as 2026-11-27T18:00:00Z, got %q", s)
	}
	*dst = t
	return nil
}

func text(raw json.RawMessage, field string, minLen, maxLen int, dst *string) error {
	var s string
	switch {
	case string(raw) == "null":
	case len(raw) > 0 && raw[0] == '"':
		var err error
		if s, err = unquote(raw); err != nil {
			return invalid(field, "must be a string, got %s", excerpt(raw))
		}
	default:
		return invalid(field, "must be a string, got %s", excerpt(raw))
	}
	if n := utf8.RuneCountInString(s); n < minLen || n > maxLen {
		return invalid(field, "must be %d..%d characters, got %d", minLen, maxLen, n)
	}
	*dst = s
	return nil
}

func integer(raw json.RawMessage, field string, dst *int64) error {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || (t[0] != '-' && (t[0] < '0' || t[0] > '9')) { // a string, true, false, null, {…}, […]
		return invalid(field, "must be an integer, got %s", excerpt(t))
	}
	v, err := strconv.ParseInt(string(t), 10, 64)
	if err != nil {
		if bytes.ContainsAny(t, ".eE") {
			return invalid(field, "must be an integer, got %s", t)
		}
		return invalid(field, "out of range, got %s", t)
	}
	if v > maxAmount || v < -maxAmount {
		return invalid(field, "out of range, got %s", t)
	}
	*dst = v
	return nil
}

// currencyCode reports whether c is three upper-case ASCII letters, as ISO 4217 codes are.
func currencyCode(c string) bool {
	return len(c) == 3 && c[0] >= 'A' && c[0] <= 'Z' && c[1] >= 'A' && c[1] <= 'Z' && c[2] >= 'A' && c[2] <= 'Z'
}

// excerpt shows a short, printable start of a bad value.
func excerpt(b []byte) string {
	const n = 40
	s := string(b)
	if utf8.RuneCountInString(s) > n {
		s = string([]rune(s)[:n]) + "…"
	}
	return fmt.Sprintf("%q", s)
}

// ValidMerchant reports whether a merchant has no control or format characters (a newline would break its
// header, a right-to-left mark would disguise it in gate status).
func ValidMerchant(m string) bool {
	return !strings.ContainsFunc(m, func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) })
}

// The merchant label values of paygate_merchant_jobs_total for merchants a provider's configuration does
// not name, and for jobs without a merchant; the configuration may not name a merchant so.
const (
	MerchantOther = "_other"
	MerchantNone  = "_none"
)
