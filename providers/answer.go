package providers

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/paygate/paygate/config"
)

// Answer is the provider's answer to one request, as far as a result keeps it: the status, the headers
// named in result_headers that it carried, and its body, decoded (gzip), up to response_max bytes.
type Answer struct {
	Status    int
	Headers   map[string]string
	Body      []byte
	Truncated bool // the body went on past response_max
}

// Declined is the provider's answer that the payment is declined (providers.<name>.declined_when): an
// answer, final; not a failure to retry, nor a dead letter.
type Declined struct {
	Provider string
	Status   int
	Why      string // what in the answer said so
}

func (d *Declined) Error() string {
	return fmt.Sprintf("providers: %s declined the payment (%d, %s)", d.Provider, d.Status, d.Why)
}

// answerRules are what a client keeps of an answer and how it tells a decline.
type answerRules struct {
	max      int
	headers  []string
	declined *config.DeclinedWhen
}

// read reads resp into an Answer: the body up to max bytes (one more tells truncation), gunzipped when
// the transport left it encoded, the secret redacted.
func (r answerRules) read(resp *http.Response, redact func(string) string) *Answer {
	a := &Answer{Status: resp.StatusCode}
	for _, h := range r.headers {
		if v := resp.Header.Get(h); v != "" {
			if a.Headers == nil {
				a.Headers = map[string]string{}
			}
			a.Headers[h] = redact(v)
		}
	}
	body := io.Reader(resp.Body)
	if strings.EqualFold(resp.Header.Get("Content-Encoding"), "gzip") && !resp.Uncompressed {
		if zr, err := gzip.NewReader(resp.Body); err == nil {
			defer zr.Close()
			body = zr
		}
	}
	b, _ := io.ReadAll(io.LimitReader(body, int64(r.max)+1))
	if len(b) > r.max {
		b, a.Truncated = b[:r.max], true
	}
	if redacted := redact(string(b)); redacted != string(b) {
		b = []byte(redacted)
	}
	a.Body = b
	return a
}

// decline returns why the answer is a decline under declined_when, or "".
func (r answerRules) decline(a *Answer) string {
	d := r.declined
	if d == nil || a.Status == http.StatusTooManyRequests || (a.Status < 200 || a.Status >= 500) || (a.Status >= 300 && a.Status < 400) {
		return ""
	}
	if slices.Contains(d.Statuses, a.Status) {
		return fmt.Sprintf("status %d", a.Status)
	}
	if d.JSON == nil || a.Truncated {
		return ""
	}
	v, ok := jsonField(a.Body, d.JSON.Field)
	if ok && slices.Contains(d.JSON.Values, v) {
		return fmt.Sprintf("%s %q", d.JSON.Field, v)
	}
	return ""
}

// jsonField reads the string (or number, or boolean, as written) at a dot path of a JSON object; false
// when the body is no JSON object or the path leads nowhere.
func jsonField(body []byte, path string) (string, bool) {
	var v any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if dec.Decode(&v) != nil {
		return "", false
	}
	for name := range strings.SplitSeq(path, ".") {
		obj, ok := v.(map[string]any)
		if !ok {
			return "", false
		}
		if v, ok = obj[name]; !ok {
			return "", false
		}
	}
	switch x := v.(type) {
	case string:
		return x, true
	case json.Number:
		return x.String(), true
	case bool:
		return fmt.Sprint(x), true
	}
	return "", false
}
