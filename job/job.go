// Package job defines a payment job, the message workers consume: its JSON form is a public contract.
package job

import "encoding/json"

// Job is one payment to dispatch to one provider.
type Job struct {
	ID             string          `json:"id"`
	Provider       string          `json:"provider"`
	Amount         int64           `json:"amount"` // minor units, > 0
	Currency       string          `json:"currency"`
	Merchant       string          `json:"merchant,omitempty"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"` // defaults to ID
	Cost           int64           `json:"cost,omitempty"`            // units of budget, defaults to 1
	Payload        json.RawMessage `json:"payload,omitempty"`         // object passed to the provider as is
}

// Key is the idempotency key every attempt of the job carries: IdempotencyKey, or the id.
func (j *Job) Key() string {
	if j.IdempotencyKey != "" {
		return j.IdempotencyKey
	}
	return j.ID
}
