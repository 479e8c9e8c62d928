package providers

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/paygate/paygate/config"
)

// Answer is the provider's answer to one request, as far as a result keeps it: the status, the headers
// named in result_headers that it carried, and its body, decoded (gzip), up to response_max bytes.
type Answer struct {
	Status    int
	Headers   map[string]string
	Body      []byte
	Truncated bool // the body went on past response_max

	full  []byte // the body as read for declined_when (up to declineReadMax), when whole
	whole bool   // the body was read to its end
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

// declineReadMax is how much of a body is read to look at declined_when's field, beyond response_max.
const declineReadMax = 1 << 20

// read reads resp into an Answer: the body up to max bytes (one more tells truncation; a text body is cut
// at a character's boundary), gunzipped when the transport left it encoded, the secret redacted. With a
// declined_when field to look at, it reads up to declineReadMax, so that the decline is told from the
// whole body even when the result keeps less.
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
	br := bufio.NewReader(resp.Body)
	body := io.Reader(br)
	if magic, _ := br.Peek(2); strings.EqualFold(resp.Header.Get("Content-Encoding"), "gzip") && !resp.Uncompressed &&
		len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		if zr, err := gzip.NewReader(br); err == nil {
			defer zr.Close()
			body = zr
		}
	}
	limit := r.max
	if r.declined != nil && r.declined.JSON != nil {
		limit = max(limit, declineReadMax)
	}
	full, err := io.ReadAll(io.LimitReader(body, int64(limit)+1))
	a.whole = err == nil && len(full) <= limit
	if a.whole {
		a.full = full
	}
	b := full
	if len(b) > r.max {
		b, a.Truncated = cutText(b[:r.max]), true
	}
	if redacted := redact(string(b)); redacted != string(b) {
		b = []byte(redacted)
	}
	a.Body = b
	return a
}

// cutText ends a cut body at a character's boundary when it was UTF-8 text cut inside a character.
func cutText(b []byte) []byte {
	for i := 1; i < utf8.UTFMax && len(b) > i; i++ {
		if !utf8.Valid(b) && utf8.Valid(b[:len(b)-i]) {
			return b[:len(b)-i]
		}
	}
	return b
}

// decline returns why the answer is a decline under declined_when, or "". errUnsure when it cannot tell:
// declined_when has a field to look at, and the body could not be read whole (cut short, or over 1 MiB).
func (r answerRules) decline(a *Answer) (string, error) {
	d := r.declined
	if d == nil || a.Status == http.StatusTooManyRequests || (a.Status < 200 || a.Status >= 500) || (a.Status >= 300 && a.Status < 400) {
		return "", nil
	}
	if slices.Contains(d.Statuses, a.Status) {
		return fmt.Sprintf("status %d", a.Status), nil
	}
	if d.JSON == nil {
		return "", nil
	}
	if !a.whole {
		return "", errUnsure
	}
	v, ok := jsonField(a.full, d.JSON.Field)
	if ok && slices.Contains(d.JSON.Values, v) {
		return fmt.Sprintf("%s %q", d.JSON.Field, v), nil
	}
	return "", nil
}

// errUnsure: the body could not be read whole to look at declined_when's field.
var errUnsure = errors.New("the body could not be read whole to check declined_when's field")

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
