package providers

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"

	"github.com/paygate/paygate/config"
)

// TokenError is a token endpoint that gave no token (auth type oauth2): the request was not sent. It is
// a transient failure of the provider, retried as a 5xx is; its text names the token endpoint and
// carries the endpoint's answer (its status and error, or the start of its body), the client's secret
// redacted.
type TokenError struct {
	URL string // the token endpoint
	Msg string
}

func (e *TokenError) Error() string { return fmt.Sprintf("token endpoint %s: %s", e.URL, e.Msg) }

// oauth2Auth is auth type oauth2: a bearer token from the client credentials grant
// (golang.org/x/oauth2/clientcredentials), one per provider per process, reused until it nears its
// expiry. It keeps ReuseTokenSource's semantics with two changes: the refresh comes a fifth of the
// token's life before it expires (at most 10s: x/oauth2's fixed 10s would fetch a 5s token for every
// request), in the background while the old one still serves; and a token the provider refused (a 401)
// is dropped (refused), which ReuseTokenSource cannot do.
type oauth2Auth struct {
	conf     *clientcredentials.Config
	client   *http.Client // the token endpoint's: the provider's TLS settings, its timeout
	hidden   []string     // the client secret, and the Basic credentials that carry it
	fetching sync.Mutex   // one token request at a time

	mu         sync.Mutex
	tok        *oauth2.Token
	fetched    time.Time // when the request for tok left
	refreshing bool
	retryAt    time.Time // after a failed background refresh, none before this
	recent     []string  // the tokens this process used last, redacted from answers
	closed     bool
	wg         sync.WaitGroup
}

// The most a token is renewed ahead of its expiry, and the least time left for a request to use it.
const (
	refreshAhead = 10 * time.Second
	useAhead     = time.Second
	refreshPause = time.Second // after a failed background refresh
)

func newOAuth2(a *config.Auth, id, secret string, client *http.Client) *oauth2Auth {
	params := url.Values{}
	for k, v := range a.Params {
		params.Set(k, v)
	}
	basic := base64.StdEncoding.EncodeToString([]byte(url.QueryEscape(id) + ":" + url.QueryEscape(secret)))
	return &oauth2Auth{
		conf: &clientcredentials.Config{ClientID: id, ClientSecret: secret, TokenURL: a.TokenURL, Scopes: a.Scopes,
			EndpointParams: params},
		client: client,
		hidden: []string{secret, basic},
	}
}

func (a *oauth2Auth) authorize(ctx context.Context, req *http.Request, _ []byte) error {
	t, err := a.token(ctx)
	if err != nil {
		return err
	}
	t.SetAuthHeader(req)
	return nil
}

// token is the token in force, renewed in the background once stale; without one usable, a new one.
func (a *oauth2Auth) token(ctx context.Context) (*oauth2.Token, error) {
	a.mu.Lock()
	t, now := a.tok, time.Now()
	if t != nil && a.usable(now) {
		if a.stale(now) {
			a.refreshLocked(now)
		}
		a.mu.Unlock()
		return t, nil
	}
	a.mu.Unlock()
	return a.fetch(ctx)
}

// usable: the token has more than a tenth of its life (at most useAhead) left; one without an expiry
// always has. Under mu.
func (a *oauth2Auth) usable(now time.Time) bool {
	e := a.tok.Expiry
	return e.IsZero() || now.Before(e.Add(-min(useAhead, e.Sub(a.fetched)/10)))
}

// stale: the token has less than a fifth of its life (at most refreshAhead) left. Under mu.
func (a *oauth2Auth) stale(now time.Time) bool {
	e := a.tok.Expiry
	return !e.IsZero() && !now.Before(e.Add(-min(refreshAhead, e.Sub(a.fetched)/5)))
}

// fetch gets a new token now, unless another fetch, which this one waited for, got one.
func (a *oauth2Auth) fetch(ctx context.Context) (*oauth2.Token, error) {
	a.fetching.Lock()
	defer a.fetching.Unlock()
	a.mu.Lock()
	if t := a.tok; t != nil && a.usable(time.Now()) {
		a.mu.Unlock()
		return t, nil
	}
	a.mu.Unlock()
	return a.retrieve(ctx)
}

// retrieve asks the token endpoint for a token and keeps it. Under fetching.
func (a *oauth2Auth) retrieve(ctx context.Context) (*oauth2.Token, error) {
	start := time.Now()
	t, err := a.conf.Token(context.WithValue(ctx, oauth2.HTTPClient, a.client))
	if err != nil {
		return nil, a.tokenError(err)
	}
	a.mu.Lock()
	a.tok, a.fetched = t, start
	a.recent = append(a.recent[max(0, len(a.recent)-3):], t.AccessToken)
	a.mu.Unlock()
	return t, nil
}

// refreshLocked starts a background refresh, unless one runs, one failed within refreshPause, or the
// client is closed. Under mu.
func (a *oauth2Auth) refreshLocked(now time.Time) {
	if a.refreshing || a.closed || now.Before(a.retryAt) {
		return
	}
	a.refreshing = true
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), a.client.Timeout)
		defer cancel()
		a.fetching.Lock()
		a.mu.Lock()
		fresh := a.tok != nil && !a.stale(time.Now()) // a fetch got a new one meanwhile
		a.mu.Unlock()
		var err error
		if !fresh {
			_, err = a.retrieve(ctx)
		}
		a.fetching.Unlock()
		a.mu.Lock()
		a.refreshing = false
		if err != nil {
			a.retryAt = time.Now().Add(refreshPause) // the next request that needs a token reports it
		}
		a.mu.Unlock()
	}()
}

// refused drops the token req carried, if it is still the one in force: the next request fetches anew.
func (a *oauth2Auth) refused(req *http.Request) {
	sent := req.Header.Get("Authorization")
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.tok != nil && sent != "" && strings.HasSuffix(sent, " "+a.tok.AccessToken) {
		a.tok = nil
	}
}

func (a *oauth2Auth) secrets() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append(append([]string(nil), a.hidden...), a.recent...)
}

func (a *oauth2Auth) refusal() string {
	return fmt.Sprintf("the provider refused a bearer token from %s: dropped, the next attempt fetches a new one", a.conf.TokenURL)
}

// close waits for a background refresh and drops the token endpoint's idle connections.
func (a *oauth2Auth) close() {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	a.wg.Wait()
	a.client.CloseIdleConnections()
}

// tokenError turns the token request's error into a TokenError: the endpoint's status and RFC 6749
// error (or the start of its body), or the transport's error; the client's secret redacted.
func (a *oauth2Auth) tokenError(err error) error {
	msg := err.Error()
	var re *oauth2.RetrieveError
	if errors.As(err, &re) {
		status := 0
		if re.Response != nil {
			status = re.Response.StatusCode
		}
		detail := re.ErrorCode
		if re.ErrorDescription != "" {
			detail += " " + strconv.Quote(re.ErrorDescription)
		}
		if detail == "" {
			b := re.Body[:min(len(re.Body), ExcerptLimit)]
			for len(b) > 0 && !utf8.Valid(b) {
				b = b[:len(b)-1]
			}
			detail = strconv.Quote(string(b))
		}
		msg = fmt.Sprintf("answered %d: %s", status, detail)
	}
	for _, s := range a.hidden {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, "[REDACTED]")
		}
	}
	return &TokenError{URL: a.conf.TokenURL, Msg: msg}
}
