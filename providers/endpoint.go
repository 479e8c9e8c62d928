package providers

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/job"
)

// endpoint is one of the provider's endpoints (providers.<name>.endpoints.<operation>).
type endpoint struct {
	method string
	path   string // as configured: placeholders, and a query after '?'
}

// endpoints reads the provider's endpoints (valid: config.Validate checked them).
func endpoints(c config.Provider) map[string]endpoint {
	out := make(map[string]endpoint, len(c.Endpoints))
	for op, ep := range c.Endpoints {
		out[op] = endpoint{method: ep.Method, path: ep.Path}
	}
	return out
}

// target is the method and URL of the job's request: url with method for a job without an operation,
// else its endpoint's method, and url joined with its endpoint's path, the placeholders filled. An
// operation the provider has no endpoint for, or a placeholder the job cannot fill, is a permanent error
// naming it.
func (c *Client) target(j *job.Job) (method, target string, err error) {
	if j.Operation == "" {
		return c.method, c.url, nil
	}
	ep, ok := c.endpoints[j.Operation]
	if !ok {
		return "", "", fmt.Errorf("operation %q: no endpoint of that name", j.Operation)
	}
	path, err := fill(ep.path, j)
	if err != nil {
		return "", "", fmt.Errorf("operation %s: %w", j.Operation, err)
	}
	return ep.method, joinURL(c.base, path), nil
}

// fill puts the job's fields in the path's placeholders, each escaped: as a path segment (a '/' becomes
// %2F) before the '?', as a query value after it (a space is %20 in both).
func fill(path string, j *job.Job) (string, error) {
	var b strings.Builder
	query := false
	for i := 0; i < len(path); i++ {
		switch path[i] {
		case '{':
			end := strings.IndexByte(path[i:], '}')
			if end < 0 {
				return "", errors.New("unclosed placeholder") // config.Validate refuses it
			}
			field := path[i+1 : i+end]
			v, err := j.Field(field)
			if err != nil {
				return "", fmt.Errorf("cannot fill {%s}: %w", field, err)
			}
			if query {
				b.WriteString(strings.ReplaceAll(url.QueryEscape(v), "+", "%20"))
			} else {
				b.WriteString(url.PathEscape(v))
			}
			i += end
		case '?':
			query = true
			b.WriteByte('?')
		default:
			b.WriteByte(path[i])
		}
	}
	return b.String(), nil
}

// joinURL appends a filled path (and its query) to the base URL's path, and its query to the base's.
func joinURL(base *url.URL, path string) string {
	p, q, _ := strings.Cut(path, "?")
	s := base.Scheme + "://" + base.Host + strings.TrimSuffix(base.EscapedPath(), "/") + p
	switch {
	case base.RawQuery != "" && q != "":
		s += "?" + base.RawQuery + "&" + q
	case base.RawQuery != "" || q != "":
		s += "?" + base.RawQuery + q
	}
	return s
}
