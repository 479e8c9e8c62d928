// Package grafana holds paygate's Grafana dashboard (paygate.json, provisioned by docker compose --profile
// observability) and reads what it queries, so that tests can hold it to the metrics a worker serves.
package grafana

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Dashboard is paygate.json.
//
//go:embed paygate.json
var Dashboard []byte

// Query is one panel target's PromQL.
type Query struct {
	Panel, Expr string
}

// Queries are the dashboard's panel targets, in panel order.
func Queries() ([]Query, error) {
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(Dashboard, &d); err != nil {
		return nil, fmt.Errorf("grafana: paygate.json: %w", err)
	}
	var qs []Query
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			return nil, fmt.Errorf("grafana: panel %q has no query", p.Title)
		}
		for _, t := range p.Targets {
			if strings.TrimSpace(t.Expr) == "" {
				return nil, fmt.Errorf("grafana: panel %q has an empty query", p.Title)
			}
			qs = append(qs, Query{Panel: p.Title, Expr: t.Expr})
		}
	}
	return qs, nil
}

var (
	metricName = regexp.MustCompile(`\bpaygate_[a-z_]+`)
	grouping   = regexp.MustCompile(`\bby \(([^)]*)\)`)
	matcher    = regexp.MustCompile(`([a-z_]+)\s*(?:=~|!~|!=|=)\s*"`)
)

// Metrics are the metric families the queries read (a histogram's _bucket, _count and _sum are its family),
// sorted, with the labels the queries group or match on (le aside).
func Metrics(qs []Query) map[string][]string {
	labels := map[string]map[string]bool{}
	for _, q := range qs {
		var used []string
		for _, g := range grouping.FindAllStringSubmatch(q.Expr, -1) {
			for _, l := range strings.Split(g[1], ",") {
				used = append(used, strings.TrimSpace(l))
			}
		}
		for _, m := range matcher.FindAllStringSubmatch(q.Expr, -1) {
			used = append(used, m[1])
		}
		for _, name := range metricName.FindAllString(q.Expr, -1) {
			for _, suffix := range []string{"_bucket", "_count", "_sum"} {
				name = strings.TrimSuffix(name, suffix)
			}
			if labels[name] == nil {
				labels[name] = map[string]bool{}
			}
			for _, l := range used {
				if l != "le" && l != "" {
					labels[name][l] = true
				}
			}
		}
	}
	out := make(map[string][]string, len(labels))
	for name, set := range labels {
		for l := range set {
			out[name] = append(out[name], l)
		}
		sort.Strings(out[name])
	}
	return out
}
