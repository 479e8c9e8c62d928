// Package job defines a payment job, the message workers consume: its JSON form is a public contract.
package job

import (
	"encoding/json"
	"time"
)

// Job is one payment to dispatch to one provider.
type Job struct {
	ID             string          `json:"id"`
	Provider       string          `json:"provider"`
	Operation      string          `json:"operation,omitempty"` // one of the provider's endpoints; "": its url
	Amount         int64           `json:"amount"`              // minor units, > 0
	Currency       string          `json:"currency"`
	Merchant       string          `json:"merchant,omitempty"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"` // defaults to ID
	Cost           int64           `json:"cost,omitempty"`            // units of budget, defaults to 1
	Payload        json.RawMessage `json:"payload,omitempty"`         // object passed to the provider as is
	// NotBefore is when the job may go at the earliest (RFC 3339; zero: now): until then it waits in the
	// delay tiers and in-process, asks the gate nothing and spends no attempt.
	NotBefore time.Time `json:"not_before,omitzero"`
	// Priority is the job's class: High, Normal (also "") or Low. It must match the queue or topic the job
	// arrives on (Route); a worker takes its waiting deliveries high first, then normal, then low.
	Priority Priority `json:"priority,omitempty"`
}

// Priority is a job's class.
type Priority string

// The classes, and the order a worker takes waiting deliveries in (Priorities).
const (
	High   Priority = "high"
	Normal Priority = "normal" // the default: a job without a priority
	Low    Priority = "low"
)

// Priorities are the classes, highest first.
var Priorities = []Priority{High, Normal, Low}

// ValidPriority reports whether p is one of the classes.
func ValidPriority(p Priority) bool { return p == High || p == Normal || p == Low }

// Class is the job's priority: Normal when it gives none.
func (j *Job) Class() Priority {
	if j.Priority == "" {
		return Normal
	}
	return j.Priority
}

// ProviderPattern is the rule for a provider name, in a job and in the configuration alike: 1 to 64
// characters, each a lower-case ASCII letter, a digit, '_' or '-'. It is the name's whole text, so
// messages quote it as is.
const ProviderPattern = "[a-z0-9_-]{1,64}"

// ValidProvider reports whether name is a valid provider name: it matches ProviderPattern
// ([a-z0-9_-]{1,64}) whole. The job decoder, the configuration and the gate all apply this one rule.
func ValidProvider(name string) bool {
	if len(name) < 1 || len(name) > 64 {
		return false
	}
	for i := range len(name) {
		if c := name[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// Key is the idempotency key every attempt of the job carries: IdempotencyKey, or the id.
func (j *Job) Key() string {
	if j.IdempotencyKey != "" {
		return j.IdempotencyKey
	}
	return j.ID
}
