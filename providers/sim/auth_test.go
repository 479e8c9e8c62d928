package sim_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paygate/paygate/internal/testtls"
	"github.com/paygate/paygate/providers/sim"
)

func request(t *testing.T, h http.Handler, method, target, body string, header map[string]string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	for k, v := range header {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// POST /token issues tokens to its one client (Basic or form credentials), refuses others; a payment
// request needs a token it issued, unexpired, and is counted under its path once it passes.
func TestOAuth2Sim(t *testing.T) {
	p, clock := newSim(t, sim.Options{Limits: []sim.Window{{Limit: 100, Per: time.Second}}, OAuth2: &sim.OAuth2Client{ID: "id 1", Secret: "s:ecret", TTL: 5 * time.Second}})
	form := "grant_type=client_credentials"
	ct := map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
	r := httptest.NewRequest(http.MethodPost, "/token", strings.NewReader(form))
	r.Header.Set("Content-Type", ct["Content-Type"])
	r.SetBasicAuth(url.QueryEscape("id 1"), url.QueryEscape("s:ecret"))
	w := httptest.NewRecorder()
	p.ServeHTTP(w, r)
	mustCode(t, w, http.StatusOK)
	var tok struct {
		AccessToken string `json:"access_token"`
		TokenType   string `json:"token_type"`
		ExpiresIn   int    `json:"expires_in"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &tok); err != nil || tok.AccessToken == "" || tok.TokenType != "Bearer" || tok.ExpiresIn != 5 {
		t.Fatalf("token answer %s: %v", w.Body, err)
	}
	mustCode(t, request(t, p, http.MethodPost, "/token", form+"&client_id=id+1&client_secret=s%3Aecret", ct), http.StatusOK)
	mustCode(t, request(t, p, http.MethodPost, "/token", form+"&client_id=id+1&client_secret=wrong", ct), http.StatusUnauthorized)
	mustCode(t, request(t, p, http.MethodPost, "/token", "grant_type=password", ct), http.StatusBadRequest)

	bearer := map[string]string{"Idempotency-Key": "k1", "Authorization": "Bearer " + tok.AccessToken}
	mustCode(t, request(t, p, http.MethodPost, "/v1/payouts/a%2Fb", `{}`, bearer), http.StatusOK)
	mustCode(t, request(t, p, http.MethodGet, "/v1/payouts/a%2Fb?x=1", ``, map[string]string{"Idempotency-Key": "k2", "Authorization": "Bearer nope"}), http.StatusUnauthorized)
	clock.Advance(5 * time.Second)
	bearer["Idempotency-Key"] = "k3"
	w = request(t, p, http.MethodPost, "/v1/payouts", `{}`, bearer)
	mustCode(t, w, http.StatusUnauthorized)
	if !strings.Contains(w.Body.String(), "invalid or expired bearer token") || w.Header().Get("WWW-Authenticate") == "" {
		t.Fatalf("expired token: %s %v", w.Body, w.Header())
	}
	st := p.Stats()
	if st.TokensIssued != 2 || st.TokensRefused != 1 || st.Unauthorized != 2 || st.Requests != 1 || st.Accepted != 1 ||
		len(st.Paths) != 1 || st.Paths["/v1/payouts/a%2Fb"] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// --hmac-secret: a request signed over its timestamp, method, target as sent and body (hex or base64)
// passes; a wrong key, an altered target, a replay 6 minutes on, or no timestamp is a 401 naming it.
func TestHMACSim(t *testing.T) {
	const key = "whsec_1"
	p, clock := newSim(t, sim.Options{Limits: []sim.Window{{Limit: 100, Per: time.Second}}, HMACSecret: key})
	sign := func(key, ts, method, target, body string, b64 bool) string {
		m := hmac.New(sha256.New, []byte(key))
		fmt.Fprintf(m, "%s\n%s\n%s\n%s", ts, method, target, body)
		if b64 {
			return base64.StdEncoding.EncodeToString(m.Sum(nil))
		}
		return hex.EncodeToString(m.Sum(nil))
	}
	now := strconv.FormatInt(clock.Now().Unix(), 10)
	headers := func(id, sig, ts string) map[string]string {
		return map[string]string{"Idempotency-Key": id, "X-Signature": sig, "X-Timestamp": ts}
	}
	const target, body = "/v1/refunds/r%201?m=a%2Fb", `{"amount":5}`
	mustCode(t, request(t, p, "PUT", target, body, headers("a", sign(key, now, "PUT", target, body, false), now)), http.StatusOK)
	mustCode(t, request(t, p, "PUT", target, body, headers("b", sign(key, now, "PUT", target, body, true), now)), http.StatusOK)
	for why, h := range map[string]map[string]string{
		"invalid signature in X-Signature": headers("c", sign("other", now, "PUT", target, body, false), now),
		"invalid signature":                headers("d", sign(key, now, "PUT", "/v1/refunds/r%202?m=a%2Fb", body, false), now),
		"missing or malformed X-Timestamp": headers("e", sign(key, now, "PUT", target, body, false), ""),
	} {
		if w := request(t, p, "PUT", target, body, h); w.Code != http.StatusUnauthorized || !strings.Contains(w.Body.String(), why) {
			t.Errorf("%s: %d %s", why, w.Code, w.Body)
		}
	}
	clock.Advance(6 * time.Minute)
	if w := request(t, p, "PUT", target, body, headers("f", sign(key, now, "PUT", target, body, false), now)); w.Code != http.StatusUnauthorized ||
		!strings.Contains(w.Body.String(), "stale X-Timestamp") {
		t.Errorf("replayed: %d %s", w.Code, w.Body)
	}
	if st := p.Stats(); st.Accepted != 2 || st.Unauthorized != 4 || st.Paths[target] != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// --tls-cert, --tls-key, --client-ca: served over TLS, a client certificate the CA signed required.
func TestTLSSim(t *testing.T) {
	ca := testtls.NewCA(t)
	certFile, keyFile := ca.ServerFiles(t)
	tc, err := sim.TLSConfig(certFile, keyFile, ca.File)
	if err != nil {
		t.Fatal(err)
	}
	s, err := sim.Start("127.0.0.1:0", sim.Options{Limits: []sim.Window{{Limit: 10, Per: time.Second}}, TLS: tc})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pem, _ := os.ReadFile(ca.File)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	cert, key := ca.Client(t, "paygate")
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, with := range []bool{true, false} {
		c := &tls.Config{RootCAs: roots}
		if with {
			c.Certificates = []tls.Certificate{pair}
		}
		cl := &http.Client{Transport: &http.Transport{TLSClientConfig: c}}
		resp, err := cl.Get(s.URL() + "/stats")
		if with && (err != nil || resp.StatusCode != http.StatusOK) || !with && err == nil {
			t.Errorf("with a client certificate %v: %v %v", with, resp, err)
		}
		if err == nil {
			resp.Body.Close()
		}
		cl.CloseIdleConnections()
	}
	if !strings.HasPrefix(s.URL(), "https://") {
		t.Fatalf("URL %s", s.URL())
	}
}
