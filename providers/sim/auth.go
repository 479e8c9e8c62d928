package sim

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// OAuth2Client is the one client the simulator's token endpoint (POST /token) knows: the client
// credentials grant, the client authenticated by HTTP Basic or by client_id and client_secret in the
// form. Each token it issues is valid for TTL (default 1h) on the simulator's clock; with it set,
// every payment request must carry one as a bearer token.
type OAuth2Client struct {
	ID, Secret string
	TTL        time.Duration
}

// The headers of a signed request (Options.HMACSecret), as paygate's auth type hmac sends them by
// default, and how far a timestamp may be from the simulator's clock.
const (
	SignatureHeader = "X-Signature"
	TimestampHeader = "X-Timestamp"
	MaxSkew         = 5 * time.Minute
)

// authenticate checks a payment request's credentials: its bearer token (OAuth2), its signature (HMAC).
// It returns why it refuses the request ("" to accept), for the 401's body. Under no lock.
func (p *Provider) authenticate(r *http.Request, body []byte) string {
	if p.o.OAuth2 != nil {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		p.mu.Lock()
		exp, known := p.tokens[tok]
		valid := ok && known && p.o.Now().Before(exp)
		p.mu.Unlock()
		if !valid {
			return "invalid or expired bearer token"
		}
	}
	if p.o.HMACSecret != "" {
		return p.checkSignature(r, body)
	}
	return ""
}

// checkSignature checks X-Signature, HMAC-SHA256 keyed with the secret over
// "<X-Timestamp>\n<method>\n<request-target as sent>\n<body>", hex or base64, and that X-Timestamp is
// within MaxSkew of the simulator's clock.
func (p *Provider) checkSignature(r *http.Request, body []byte) string {
	ts := r.Header.Get(TimestampHeader)
	secs, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return "missing or malformed " + TimestampHeader
	}
	if skew := p.o.Now().Sub(time.Unix(secs, 0)); skew > MaxSkew || skew < -MaxSkew {
		return fmt.Sprintf("stale %s (%s off this clock)", TimestampHeader, skew.Round(time.Second))
	}
	m := hmac.New(sha256.New, []byte(p.o.HMACSecret))
	fmt.Fprintf(m, "%s\n%s\n%s\n", ts, r.Method, r.RequestURI)
	m.Write(body)
	want := m.Sum(nil)
	sig := r.Header.Get(SignatureHeader)
	got, err := hex.DecodeString(sig)
	if err != nil || len(got) != len(want) {
		got, _ = base64.StdEncoding.DecodeString(sig)
	}
	if !hmac.Equal(got, want) {
		return "invalid signature in " + SignatureHeader
	}
	return ""
}

// refuseAuth answers 401 and counts it (Stats.Unauthorized): not a request the account's limits count.
func (p *Provider) refuseAuth(w http.ResponseWriter, why string) {
	p.mu.Lock()
	p.stats.Unauthorized++
	p.mu.Unlock()
	if p.o.OAuth2 != nil {
		w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
	}
	b, _ := json.Marshal(map[string]string{"error": why})
	writeJSON(w, http.StatusUnauthorized, string(b))
}

// serveToken is POST /token: the client credentials grant for Options.OAuth2's client.
func (p *Provider) serveToken(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST /token", http.StatusMethodNotAllowed)
		return
	}
	if err := r.ParseForm(); err != nil || r.PostForm.Get("grant_type") != "client_credentials" {
		writeJSON(w, http.StatusBadRequest, `{"error":"unsupported_grant_type"}`)
		return
	}
	id, secret, basic := r.BasicAuth()
	if basic {
		id, _ = url.QueryUnescape(id)
		secret, _ = url.QueryUnescape(secret)
	} else {
		id, secret = r.PostForm.Get("client_id"), r.PostForm.Get("client_secret")
	}
	c := p.o.OAuth2
	if !hmac.Equal([]byte(id), []byte(c.ID)) || !hmac.Equal([]byte(secret), []byte(c.Secret)) {
		p.mu.Lock()
		p.stats.TokensRefused++
		p.mu.Unlock()
		writeJSON(w, http.StatusUnauthorized, `{"error":"invalid_client","error_description":"client authentication failed"}`)
		return
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	tok := hex.EncodeToString(b[:])
	p.mu.Lock()
	now := p.o.Now()
	for t, exp := range p.tokens {
		if !now.Before(exp) {
			delete(p.tokens, t)
		}
	}
	p.tokens[tok] = now.Add(c.TTL)
	p.stats.TokensIssued++
	p.mu.Unlock()
	resp, _ := json.Marshal(map[string]any{"access_token": tok, "token_type": "Bearer", "expires_in": int64(c.TTL / time.Second)})
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, string(resp))
}

// TLSConfig is the simulator's TLS: its certificate and key (PEM files), and with clientCA, a file of the
// CAs whose client certificates it requires (mutual TLS).
func TLSConfig(certFile, keyFile, clientCA string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("sim: certificate: %w", err)
	}
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCA != "" {
		pem, err := os.ReadFile(clientCA)
		if err != nil {
			return nil, fmt.Errorf("sim: client CA: %w", err)
		}
		c.ClientCAs = x509.NewCertPool()
		if !c.ClientCAs.AppendCertsFromPEM(pem) {
			return nil, errors.New("sim: client CA: no PEM certificate in " + clientCA)
		}
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return c, nil
}

// countPath counts a payment request that passed the auth under its request target (Stats.Paths).
func (p *Provider) countPath(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stats.Paths == nil {
		p.stats.Paths = map[string]int64{}
	}
	p.stats.Paths[target]++
}
