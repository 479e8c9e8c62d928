package grafana_test

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/ops/grafana"
)

// described records what a collector registered with it describes: metric name -> variable labels.
type described map[string][]string

var descRE = regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)

func (d described) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		m := descRE.FindStringSubmatch(desc.String())
		if m == nil {
			continue
		}
		d[m[1]] = strings.Fields(strings.ReplaceAll(m[2], ",", " "))
	}
	return nil
}

func (d described) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = d.Register(c)
	}
}

func (d described) Unregister(prometheus.Collector) bool { return false }

// Every metric the dashboard queries is one the worker registers (consumers.NewMetrics), and every label
// it groups or matches on is one of that metric's labels: a renamed metric or label fails here, not on an
// operator's empty panel.
func TestDashboardQueriesTheWorkersMetrics(t *testing.T) {
	qs, err := grafana.Queries()
	if err != nil {
		t.Fatal(err)
	}
	if len(qs) < 8 {
		t.Fatalf("%d queries: the dashboard lost its panels", len(qs))
	}
	registered := described{}
	consumers.NewMetrics(registered)
	if len(registered) < 8 {
		t.Fatalf("read %d metrics from consumers.NewMetrics: the descriptor format changed?", len(registered))
	}
	queried := grafana.Metrics(qs)
	for name, labels := range queried {
		have, ok := registered[name]
		if !ok {
			t.Errorf("the dashboard queries %s, which the worker does not register", name)
			continue
		}
		for _, l := range labels {
			if !slices.Contains(have, l) {
				t.Errorf("the dashboard uses label %q of %s, which has only %v", l, name, have)
			}
		}
	}
	for name := range registered {
		if _, ok := queried[name]; !ok {
			t.Errorf("the worker exports %s, which no panel shows", name)
		}
	}
}
