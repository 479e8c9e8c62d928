package job

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// OperationPattern is the rule for a job's operation, and for the name of a provider's endpoint
// (providers.<name>.endpoints.<operation>): as for a provider name, 1 to 64 characters, each a lower-case
// ASCII letter, a digit, '_' or '-'.
const OperationPattern = ProviderPattern

// ValidOperation reports whether name matches OperationPattern whole.
func ValidOperation(name string) bool { return ValidProvider(name) }

// Endpoint is what the decoder knows of one of a provider's endpoints: the cost of its jobs that give none,
// and the job fields its path takes (PathFields).
type Endpoint struct {
	Cost   int64    // 0: 1
	Fields []string // id, merchant, idempotency_key, payload.<field>
}

// Endpoints are the configured providers' endpoints: provider -> operation -> endpoint. A provider that
// has none is absent.
type Endpoints map[string]map[string]Endpoint

// The job fields a path's placeholders name, {payload.<field>} aside.
const (
	FieldID             = "id"
	FieldMerchant       = "merchant"
	FieldIdempotencyKey = "idempotency_key"
	PayloadPrefix       = "payload."
)

// PathFields returns the job fields the placeholders of an endpoint's path name, in order, each once:
// {id}, {merchant}, {idempotency_key} and {payload.<field>} (a member of the payload object; the field is
// 1..64 of [A-Za-z0-9_-]). A brace that opens no such placeholder, or closes none, is an error naming it.
func PathFields(path string) ([]string, error) {
	var fields []string
	for rest := path; rest != ""; {
		open, close := strings.IndexByte(rest, '{'), strings.IndexByte(rest, '}')
		switch {
		case open < 0 && close < 0:
			return fields, nil
		case open < 0 || (close >= 0 && close < open):
			return nil, errors.New("a '}' closes no placeholder")
		case close < 0:
			return nil, fmt.Errorf("placeholder %q is not closed", rest[open:])
		}
		name := rest[open+1 : close]
		if !validField(name) {
			return nil, fmt.Errorf("unknown placeholder {%s} (want {id}, {merchant}, {idempotency_key} or {payload.<field>})", name)
		}
		if !slices.Contains(fields, name) {
			fields = append(fields, name)
		}
		rest = rest[close+1:]
	}
	return fields, nil
}

// validField reports whether name is a field a placeholder may name.
func validField(name string) bool {
	switch name {
	case FieldID, FieldMerchant, FieldIdempotencyKey:
		return true
	}
	f, ok := strings.CutPrefix(name, PayloadPrefix)
	if !ok || len(f) < 1 || len(f) > 64 {
		return false
	}
	for i := range len(f) {
		if c := f[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Field is the text a placeholder of field (one PathFields returns) fills in for this job, unescaped:
// its id, its merchant, its idempotency key (or id), or a string or integer member of its payload. The
// error, when the job cannot fill it, says why without quoting the payload.
func (j *Job) Field(field string) (string, error) {
	switch field {
	case FieldID:
		return j.ID, nil
	case FieldIdempotencyKey:
		return j.Key(), nil
	case FieldMerchant:
		if j.Merchant == "" {
			return "", errors.New("the job has no merchant")
		}
		return j.Merchant, nil
	}
	name, ok := strings.CutPrefix(field, PayloadPrefix)
	if !ok {
		return "", fmt.Errorf("unknown field %q", field)
	}
	return j.payloadField(name)
}

// payloadField is a top-level member of the payload: a non-empty string, or an integer as written.
func (j *Job) payloadField(name string) (string, error) {
	var obj map[string]json.RawMessage
	if p := bytes.TrimSpace(j.Payload); len(p) == 0 || string(p) == "null" {
		return "", errors.New("the job has no payload")
	}
	if err := json.Unmarshal(j.Payload, &obj); err != nil {
		return "", errors.New("the payload is not a JSON object")
	}
	raw, ok := obj[name]
	if !ok {
		return "", fmt.Errorf("the payload has no field %s", name)
	}
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) > 0 && raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil || s == "" {
			return "", fmt.Errorf("the payload's %s is an empty string", name)
		}
		return s, nil
	case len(raw) > 0 && (raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9') && !bytes.ContainsAny(raw, ".eE"):
		return string(raw), nil
	}
	return "", fmt.Errorf("the payload's %s must be a string or an integer, got %s", name, kindOf(raw))
}

// kindOf names a JSON value's kind, never its content (a payload may hold what no log should).
func kindOf(raw json.RawMessage) string {
	switch {
	case len(raw) == 0:
		return "nothing"
	case raw[0] == '{':
		return "an object"
	case raw[0] == '[':
		return "an array"
	case raw[0] == 't' || raw[0] == 'f':
		return "a boolean"
	case raw[0] == 'n':
		return "null"
	}
	return "a fraction"
}

// checkEndpoint checks the job's operation against its provider's endpoints, and the placeholders of
// its endpoint's path against the job; it returns the endpoint (zero for a job without an operation).
func (j *Job) checkEndpoint(endpoints Endpoints) (Endpoint, error) {
	if j.Operation == "" {
		return Endpoint{}, nil
	}
	ops := endpoints[j.Provider]
	ep, ok := ops[j.Operation]
	if !ok {
		if len(ops) == 0 {
			return ep, invalid("operation", "%q: provider %s has no endpoints", j.Operation, j.Provider)
		}
		names := make([]string, 0, len(ops))
		for n := range ops {
			names = append(names, n)
		}
		slices.Sort(names)
		return ep, invalid("operation", "%q is not an endpoint of provider %s (its endpoints: %s)", j.Operation, j.Provider, strings.Join(names, ", "))
	}
	for _, f := range ep.Fields {
		if _, err := j.Field(f); err != nil {
			return ep, invalid(fieldOf(f), "{%s} in the path of operation %s: %v", f, j.Operation, err)
		}
	}
	return ep, nil
}

// fieldOf is the job field a placeholder's field is in: payload for payload.<field>.
func fieldOf(f string) string {
	if strings.HasPrefix(f, PayloadPrefix) {
		return "payload"
	}
	return f
}
