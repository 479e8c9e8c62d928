package config

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"unicode"

	"github.com/paygate/paygate/job"
)

// Endpoint is one of a provider's endpoints (providers.<name>.endpoints.<operation>): a job whose
// operation names it goes to url + Path with Method. Every endpoint shares the provider's limits,
// merchants and in-flight cap.
type Endpoint struct {
	// Method is GET, POST, PUT, PATCH or DELETE; default the provider's method. GET and DELETE send no body.
	Method string `mapstructure:"method"`
	// Path is appended to the provider's url: it starts with '/', may end with a query, and may hold the
	// placeholders {id}, {merchant}, {idempotency_key} and {payload.<field>}, each filled from the job
	// and escaped (job.PathFields).
	Path string `mapstructure:"path"`
	// Cost is the cost of the endpoint's jobs that give none (0: 1); a job's own cost wins.
	Cost int64 `mapstructure:"cost"`
}

// EndpointMethods are the methods an endpoint may use.
var EndpointMethods = []string{"GET", "POST", "PUT", "PATCH", "DELETE"}

// endpointDefaults gives each endpoint the provider's method when it names none (a copy: the caller's
// map is left as it is).
func (pr Provider) endpointDefaults() Provider {
	if len(pr.Endpoints) == 0 {
		return pr
	}
	eps := make(map[string]Endpoint, len(pr.Endpoints))
	for op, ep := range pr.Endpoints {
		if ep.Method == "" {
			ep.Method = pr.Method
		}
		ep.Method = strings.ToUpper(ep.Method)
		eps[op] = ep
	}
	pr.Endpoints = eps
	return pr
}

// validateEndpoints checks each endpoint's operation, method, path and cost.
func (pr Provider) validateEndpoints(p *problems, path string) {
	smallest := int64(0)
	for i, l := range pr.Limits {
		if i == 0 || l.Requests < smallest {
			smallest = l.Requests
		}
	}
	for _, op := range slices.Sorted(maps.Keys(pr.Endpoints)) {
		ep, epPath := pr.Endpoints[op], path+".endpoints."+op
		p.check(job.ValidOperation(op), epPath, "an operation must match %s (the job's operation)", job.OperationPattern)
		p.check(slices.Contains(EndpointMethods, ep.Method), epPath+".method", "must be %s, got %q", strings.Join(EndpointMethods, ", "), ep.Method)
		if err := checkEndpointPath(ep.Path); err != nil {
			p.add(epPath+".path", "%v, got %q", err, ep.Path)
		}
		p.check(ep.Cost >= 0 && (smallest < 1 || ep.Cost <= smallest), epPath+".cost",
			"must be 1..%d (the provider's smallest limit; 0 or left out: 1), got %d", smallest, ep.Cost)
	}
	if len(pr.Endpoints) > 0 {
		if u, err := url.Parse(pr.URL); err == nil && u.Fragment != "" {
			p.add(path+".url", "has a fragment, which no endpoint's path could follow, got %q", pr.URL)
		}
	}
}

// checkEndpointPath checks an endpoint's path: '/' first, placeholders job.PathFields knows, and with them
// filled in, a valid path and query without spaces, control characters or a fragment.
func checkEndpointPath(path string) error {
	if !strings.HasPrefix(path, "/") {
		return fmt.Errorf("must start with '/'")
	}
	if strings.ContainsFunc(path, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) || r == '#' }) {
		return fmt.Errorf("must hold no space, control character or '#' (escape them)")
	}
	fields, err := job.PathFields(path)
	if err != nil {
		return err
	}
	filled := path
	for _, f := range fields {
		filled = strings.ReplaceAll(filled, "{"+f+"}", "x")
	}
	if _, err := url.ParseRequestURI(filled); err != nil {
		return fmt.Errorf("is not a path and query: %v", err)
	}
	return nil
}

// JobEndpoints are the provider's endpoints as the job decoder checks a job against them (nil when it
// has none): each one's cost and the job fields its path takes.
func (pr Provider) JobEndpoints() map[string]job.Endpoint {
	if len(pr.Endpoints) == 0 {
		return nil
	}
	out := make(map[string]job.Endpoint, len(pr.Endpoints))
	for op, ep := range pr.Endpoints {
		fields, _ := job.PathFields(ep.Path) // valid: Validate checked it
		out[op] = job.Endpoint{Cost: ep.Cost, Fields: fields}
	}
	return out
}

// JobEndpoints are every provider's endpoints, for job.DecodeFor.
func (c *Config) JobEndpoints() job.Endpoints {
	out := job.Endpoints{}
	for name, p := range c.Providers {
		if eps := p.JobEndpoints(); eps != nil {
			out[name] = eps
		}
	}
	return out
}
