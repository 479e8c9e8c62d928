package providers

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/paygate/paygate/config"
)

// hmacAuth signs every request (auth type hmac): HMAC-SHA256, keyed with the secret, over
//
//	<unix seconds>\n<METHOD>\n<path and query exactly as sent, escaped>\n<body>
//
// in the signature header (hex or base64), the seconds in the timestamp header. Each attempt is signed
// anew, as it is sent.
type hmacAuth struct {
	key                  []byte
	signature, timestamp string
	base64               bool
	now                  func() time.Time
}

func newHMAC(a *config.Auth, secret string, now func() time.Time) *hmacAuth {
	return &hmacAuth{key: []byte(secret), signature: a.SignatureHeader, timestamp: a.TimestampHeader,
		base64: a.Encoding == config.EncodingBase64, now: now}
}

func (h *hmacAuth) authorize(_ context.Context, req *http.Request, body []byte) error {
	ts := strconv.FormatInt(h.now().Unix(), 10)
	req.Header.Set(h.timestamp, ts)
	req.Header.Set(h.signature, signature(h.key, ts, req.Method, req.URL.RequestURI(), body, h.base64))
	return nil
}

// signature is the HMAC-SHA256 signature of a request, keyed with key, over
// "<ts>\n<method>\n<requestURI>\n<body>", hex-encoded (base64: standard base64).
func signature(key []byte, ts, method, requestURI string, body []byte, base64Encoded bool) string {
	m := hmac.New(sha256.New, key)
	fmt.Fprintf(m, "%s\n%s\n%s\n", ts, method, requestURI)
	m.Write(body)
	sum := m.Sum(nil)
	if base64Encoded {
		return base64.StdEncoding.EncodeToString(sum)
	}
	return hex.EncodeToString(sum)
}

func (h *hmacAuth) secrets() []string { return []string{string(h.key)} }

func (h *hmacAuth) refusal() string {
	return fmt.Sprintf("the provider refused the request's HMAC-SHA256 signature in %s (timestamp in %s): check auth.secret_env's key and this host's clock", h.signature, h.timestamp)
}
