package providers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/paygate/paygate/job"
)

// do sends the job's request and returns the provider's response. When the auth renews its credentials
// (OAuth2's token) and the provider answers 401, the token is dropped: the answer is a transient failure
// (classify), and the next attempt, on a slot of its own from the gate, fetches a new one. (Sent again at
// once, the request would go without a slot: one more than the gate counted.)
func (c *Client) do(ctx context.Context, j *job.Job) (*http.Response, error) {
	req, err := c.newRequest(ctx, j)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if ren, renews := c.auth.(renewer); renews && err == nil && resp.StatusCode == http.StatusUnauthorized {
		ren.refused(req)
	}
	return resp, err
}

// newRequest builds the job's request: its endpoint's method and URL (target), the body (none for GET
// and DELETE), the provider's headers, the idempotency key, the merchant, and the auth's credentials,
// set last (an HMAC signs the request as it is sent). A request the job cannot make is a permanent
// error; a token endpoint that fails, a transient one (TokenError).
func (c *Client) newRequest(ctx context.Context, j *job.Job) (*http.Request, error) {
	method, target, err := c.target(j)
	if err != nil {
		return nil, fmt.Errorf("job %s: %w: %w", j.ID, err, ErrPermanent)
	}
	var body []byte
	if method != http.MethodGet && method != http.MethodDelete {
		if body, err = RequestBody(j); err != nil {
			return nil, fmt.Errorf("job %s: %w", j.ID, errors.Join(ErrPermanent, err))
		}
	}
	req, err := http.NewRequestWithContext(ctx, method, target, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("job %s: %w: %w", j.ID, err, ErrPermanent)
	}
	req.Header = c.headers.Clone()
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set(c.idemHeader, j.Key())
	if j.Merchant != "" && c.merchantHeader != "" {
		req.Header.Set(c.merchantHeader, j.Merchant)
	}
	if c.auth != nil {
		if err := c.auth.authorize(ctx, req, body); err != nil {
			return nil, err
		}
	}
	return req, nil
}

// authRefused adds to the error of a 401 what the auth sent that the provider refused.
func (c *Client) authRefused(status int, err error) error {
	if c.auth == nil || status != http.StatusUnauthorized || err == nil {
		return err
	}
	return fmt.Errorf("%w (%s)", err, c.auth.refusal())
}
