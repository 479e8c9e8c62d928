package providers

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/paygate/paygate/config"
)

// authenticator sets a request's credentials (providers.<name>.auth).
type authenticator interface {
	// authorize sets the auth's headers on req, whose body is body, just before it is sent.
	authorize(ctx context.Context, req *http.Request, body []byte) error
	// secrets are the values no log line, error or result may show.
	secrets() []string
	// refusal says what a 401 answer refused, for its error.
	refusal() string
}

// renewer is an authenticator whose credentials a 401 may have found stale (OAuth2's token): refused
// drops the one req carried, and the 401 is a transient failure: the next attempt goes with new ones.
type renewer interface {
	refused(req *http.Request)
}

// closer is an authenticator with goroutines of its own, ended by close.
type closer interface {
	close()
}

// newAuth builds the provider's authenticator from its config (nil: no auth). Secrets come from their
// variables; an unset one is an error naming the key and the variable, never a value.
func newAuth(name string, c config.Provider, tokenHTTP *http.Client, now func() time.Time) (authenticator, error) {
	a := c.Authentication()
	if a == nil {
		return nil, nil
	}
	if now == nil {
		now = time.Now
	}
	values := map[string]string{}
	for _, s := range c.AuthSecrets() {
		v := config.Secret(s.Env)
		if v == "" {
			return nil, fmt.Errorf("providers: %s: environment variable %s (%s) is not set", name, s.Env, s.Key)
		}
		values[s.Key] = v
	}
	switch a.Type {
	case config.AuthTypeOAuth2:
		return newOAuth2(a, values["auth.client_id_env"], values["auth.client_secret_env"], tokenHTTP), nil
	case config.AuthTypeHMAC:
		return newHMAC(a, values["auth.secret_env"], now), nil
	}
	secret := values["auth_env"] + values["auth.secret_env"] // the shorthand's, or auth's
	return &headerAuth{header: a.Header, prefix: strings.TrimSpace(a.Prefix), secret: secret}, nil
}

// headerAuth sends a static secret in a header, after a prefix and a space when it has one.
type headerAuth struct {
	header, prefix, secret string
}

func (h *headerAuth) authorize(_ context.Context, req *http.Request, _ []byte) error {
	v := h.secret
	if h.prefix != "" {
		v = h.prefix + " " + v
	}
	req.Header.Set(h.header, v)
	return nil
}

func (h *headerAuth) secrets() []string { return []string{h.secret} }

func (h *headerAuth) refusal() string {
	return fmt.Sprintf("the provider refused the credentials in %s", h.header)
}

// tokenClient is the HTTP client of an oauth2 provider's token endpoint: the provider's TLS settings
// (its client certificate, its CAs) and timeout, no redirects; nil for another auth.
func tokenClient(c config.Provider, tlsc *tls.Config) *http.Client {
	if a := c.Authentication(); a == nil || a.Type != config.AuthTypeOAuth2 {
		return nil
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = tlsc
	return &http.Client{Transport: t, Timeout: c.Timeout, CheckRedirect: noRedirects}
}
