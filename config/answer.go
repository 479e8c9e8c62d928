package config

import (
	"regexp"
	"strings"
)

// The defaults of what a result keeps of the provider's answer.
const (
	DefaultResponseMax = 64 << 10
	MaxResponseMax     = 1 << 20
)

// DefaultResultHeaders are the answer's headers a result keeps unless result_headers names others.
var DefaultResultHeaders = []string{"Location", "Request-Id", "X-Request-Id"}

// DeclinedWhen is providers.<name>.declined_when: an answer with one of Statuses, or a 2xx or 4xx
// answer whose JSON body holds one of JSON.Values at JSON.Field (a dot path), is a declined payment:
// final, never retried, never a dead letter.
type DeclinedWhen struct {
	Statuses []int         `mapstructure:"statuses"`
	JSON     *DeclinedJSON `mapstructure:"json"`
}

// DeclinedJSON is declined_when.json.
type DeclinedJSON struct {
	Field  string   `mapstructure:"field"`
	Values []string `mapstructure:"values"`
}

// dotPath is a field path into a JSON body: names separated by dots.
var dotPath = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)

func (pr Provider) answerDefaults() Provider {
	if pr.ResponseMax == 0 {
		pr.ResponseMax = DefaultResponseMax
	}
	if pr.ResultHeaders == nil {
		pr.ResultHeaders = DefaultResultHeaders
	}
	return pr
}

// validateAnswer checks response_max, result_headers and declined_when.
func (pr Provider) validateAnswer(p *problems, path string) {
	p.check(pr.ResponseMax >= 0 && pr.ResponseMax <= MaxResponseMax, path+".response_max",
		"must be 0..%d bytes, got %d", MaxResponseMax, pr.ResponseMax)
	for _, h := range pr.ResultHeaders {
		p.check(headerName.MatchString(h), path+".result_headers", "must be HTTP header names, got %q", h)
	}
	d := pr.DeclinedWhen
	if d == nil {
		return
	}
	p.check(len(d.Statuses) > 0 || d.JSON != nil, path+".declined_when", "needs statuses, json or both")
	for _, st := range d.Statuses {
		ok := (st >= 200 && st < 300) || (st >= 400 && st < 500 && st != 429)
		p.check(ok, path+".declined_when.statuses", "must be 2xx or 4xx statuses other than 429, got %d", st)
	}
	if j := d.JSON; j != nil {
		p.check(dotPath.MatchString(j.Field), path+".declined_when.json.field",
			"must be a dot path into the answer's JSON (status, or data.state), got %q", j.Field)
		p.check(len(j.Values) > 0, path+".declined_when.json.values", "must list the values that mean declined")
		for _, v := range j.Values {
			p.check(strings.TrimSpace(v) != "", path+".declined_when.json.values", "must not hold an empty value")
		}
	}
}
