package sim

import (
	"encoding/json"
	"net/http"
)

// A payment whose body asks for it is declined, as a payment API declines one (the request counts
// against the limits, the provider charges nothing): "simulate": "decline_status" is answered 402
// {"status":"declined"}; "simulate": "decline_body" is answered 200 {"status":"declined"}. A repeat of
// its idempotency key gets the same answer.
const (
	DeclineStatus = "decline_status"
	DeclineBody   = "decline_body"
)

// declineOf reads the body's "simulate" field: the status and answer of a decline, or 0.
func declineOf(key string, body []byte) (int, []byte) {
	var req struct {
		Simulate string `json:"simulate"`
	}
	if json.Unmarshal(body, &req) != nil {
		return 0, nil
	}
	switch req.Simulate {
	case DeclineStatus:
		resp, _ := json.Marshal(map[string]string{"status": "declined", "reason": "insufficient_funds", "idempotency_key": key})
		return http.StatusPaymentRequired, resp
	case DeclineBody:
		resp, _ := json.Marshal(map[string]string{"status": "declined", "transaction_id": "T-" + key, "idempotency_key": key})
		return http.StatusOK, resp
	}
	return 0, nil
}

// statusOf is the status the answer to key was given.
func (p *Provider) statusOf(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.keys[key].status
}
