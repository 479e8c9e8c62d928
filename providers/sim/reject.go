package sim

import (
	"fmt"
	"net/http"
	"time"
)

// An account the provider rejects for a while (Faults.RejectFor), as it rejects a misconfigured one:
// every payment request is answered RejectCode (reject_status, default 422) at once, before the limits, and is neither
// charged nor stored under its idempotency key, so that the same key is charged once the account is
// fixed (the rejections end). Counted in Stats.RejectedInjected and Stats.Requests.

// defaultRejectStatus is the status of a rejection when Faults.RejectCode is 0.
const defaultRejectStatus = http.StatusUnprocessableEntity

// setRejections arms the rejections f asks for, or ends them (RejectFor 0).
func (p *Provider) setRejections(f Faults) error {
	status := f.RejectCode
	if status == 0 {
		status = defaultRejectStatus
	}
	if status < 400 || status > 499 || status == http.StatusTooManyRequests {
		return fmt.Errorf("sim: reject_status must be a 4xx other than 429, got %d", f.RejectCode)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rejectUntil, p.rejectStatus = p.o.Now().Add(time.Duration(f.RejectFor)), status
	return nil
}

// rejecting answers a payment request with the rejection while one lasts; true when it did.
func (p *Provider) rejecting(w http.ResponseWriter) bool {
	p.mu.Lock()
	on, status := p.o.Now().Before(p.rejectUntil), p.rejectStatus
	if on {
		p.stats.Requests++
		p.stats.RejectedInjected++
	}
	p.mu.Unlock()
	if on {
		writeJSON(w, status, `{"error":"the account is not enabled for this operation","code":"account_rejected"}`)
	}
	return on
}
