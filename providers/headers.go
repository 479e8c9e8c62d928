package providers

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Announced is a limit a provider states in its response headers: Limit requests per Window. Window 0:
// the header does not say (X-RateLimit-Limit).
type Announced struct {
	Limit  int64
	Window time.Duration
}

// ParseLimitHeaders reads the limits a response announces, in this order of preference:
//
//   - RateLimit-Policy, the IETF httpapi draft's: items `"name";q=100;w=60` (draft 07 on), or `100;w=60`
//     (earlier drafts), comma-separated; w in seconds;
//   - RateLimit-Limit (earlier drafts), with its window from RateLimit-Policy's first item if any;
//   - X-RateLimit-Limit, whose window no header states.
//
// Malformed items are skipped; nil when nothing is announced.
func ParseLimitHeaders(h http.Header) []Announced {
	if v := h.Values("RateLimit-Policy"); len(v) > 0 {
		if out := parsePolicies(strings.Join(v, ",")); len(out) > 0 {
			return out
		}
	}
	for _, name := range []string{"RateLimit-Limit", "X-RateLimit-Limit"} {
		if v := strings.TrimSpace(h.Get(name)); v != "" {
			// Some servers list a limit per policy ("100, 100;w=60"): the first number is the one in force.
			first, _, _ := strings.Cut(v, ",")
			first, _, _ = strings.Cut(first, ";")
			if n, err := strconv.ParseInt(strings.TrimSpace(first), 10, 64); err == nil && n > 0 {
				return []Announced{{Limit: n}}
			}
		}
	}
	return nil
}

// parsePolicies reads RateLimit-Policy items: a quota (q=, or a leading integer) and a window (w=, seconds).
func parsePolicies(v string) []Announced {
	var out []Announced
	for item := range strings.SplitSeq(v, ",") {
		var a Announced
		params := strings.Split(item, ";")
		if n, err := strconv.ParseInt(strings.TrimSpace(params[0]), 10, 64); err == nil {
			a.Limit = n // "100;w=60"
		}
		for _, p := range params[1:] {
			k, val, ok := strings.Cut(strings.TrimSpace(p), "=")
			if !ok {
				continue
			}
			n, err := strconv.ParseInt(strings.Trim(strings.TrimSpace(val), `"`), 10, 64)
			if err != nil || n <= 0 {
				continue
			}
			switch strings.ToLower(strings.TrimSpace(k)) {
			case "q":
				a.Limit = n
			case "w":
				a.Window = time.Duration(n) * time.Second
			}
		}
		if a.Limit > 0 && a.Window > 0 {
			out = append(out, a)
		}
	}
	return out
}
