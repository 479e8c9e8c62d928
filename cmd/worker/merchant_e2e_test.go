package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/paygate/paygate/ops/grafana"
	"github.com/paygate/paygate/providers/sim"
)

// dashboardMetricsServed checks that every metric family the Grafana dashboard (ops/grafana/paygate.json)
// queries is in a running worker's /metrics, after a run with fair shares (whose series exist only then).
func dashboardMetricsServed(t *testing.T, metrics string) {
	t.Helper()
	qs, err := grafana.Queries()
	if err != nil {
		t.Fatal(err)
	}
	for name := range grafana.Metrics(qs) {
		if !strings.Contains(metrics, "# TYPE "+name+" ") {
			t.Errorf("the dashboard queries %s; the worker's /metrics has no such family", name)
		}
	}
}

// Merchants' limits across a fleet (providers.<name>.per_merchant, merchants): three worker processes, a
// provider at 20/1s that also enforces 4/1s per merchant (provider-sim --merchant-limits, read from the
// X-Merchant header the workers send), and a backlog of three merchants at 4/1s each and one, "slow",
// named with 2/1s of its own. Under every algorithm that counts merchants (sliding_log, sliding_window;
// fixed_window against a simulator counting calendar windows, as such a provider does): no request over
// either level, every merchant's limit used (each merchant binds, not the provider), every job charged
// once.
func TestMerchantLimitsFleet(t *testing.T) {
	for _, algo := range []string{"sliding_log", "sliding_window", "fixed_window"} {
		t.Run(algo, func(t *testing.T) {
			windows := []sim.Window{{Limit: 20, Per: time.Second}}
			args := []string{"--merchant-limits", "4/1s"}
			if algo == "fixed_window" {
				args = append(args, "--calendar")
			}
			f := newFleet(t, simProvider{name: "acme", limits: windows, args: args})
			f.margin = 30 * time.Millisecond // seven busy processes on two cores
			fh, err := os.OpenFile(f.cfg, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			_, err = fmt.Fprintf(fh, "    algorithm: %s\n    per_merchant: {limits: [{requests: 4, per: 1s}]}\n    merchants: {slow: {limits: [{requests: 2, per: 1s}]}}\n", algo)
			fh.Close()
			if err != nil {
				t.Fatal(err)
			}
			f.established()
			// 28 for each of m1..m3 and 14 for slow: 7s for each at its own limit, 14 units a second together.
			const jobs = 98
			f.enqueueFor("acme", jobs, "mer", "m1,m2,m3,slow,m1,m2,m3")
			for range 3 {
				f.startWorker()
			}
			s := f.sims["acme"]
			f.waitFor("every job charged", 90*time.Second, func() bool { return s.Stats().Accepted >= jobs })
			// gate status shows the merchants, busiest first (all at their limit within the window: by newest).
			r := worker(t, f.env()[len(os.Environ()):], "gate", "status", "--config", f.cfg, "--provider", "acme", "--json")
			var rep struct {
				Merchants struct {
					Seen int64
					Top  []struct{ Merchant, Limit string }
				}
			}
			if err := json.Unmarshal([]byte(r.stdout), &rep); r.code != 0 || err != nil || rep.Merchants.Seen != 4 || len(rep.Merchants.Top) != 4 {
				t.Fatalf("gate status: exit %d, %v\n%s%s", r.code, err, r.stdout, r.stderr)
			}
			for _, m := range rep.Merchants.Top {
				if want := map[string]string{"slow": "2/1s"}[m.Merchant]; m.Limit != cmp.Or(want, "4/1s") {
					t.Errorf("gate status: merchant %s with limit %q", m.Merchant, m.Limit)
				}
			}
			if algo == "sliding_log" {
				dashboardMetricsServed(t, f.metrics(0))
			}
			f.stopAll()
			l := f.collect()
			l.check(t, ids("mer", jobs))
			st := s.Stats()
			span := st.LastAccepted.Sub(*st.FirstAccepted)
			t.Logf("accepted %d in %s; provider max in 1s %d, a merchant's max in 1s %d; merchants %d; duplicates %d",
				st.Accepted, span.Round(time.Millisecond), st.Windows[0].MaxInWindow, st.MerchantWindows[0].MaxInWindow, st.Merchants, st.Duplicates)
			// Merchants bind: at 4/1s (slow 2/1s) the 98 jobs take about 7s; had only the provider's 20/1s held
			// them, 5s.
			if st.Violations != 0 || st.MerchantViolations != 0 || st.Accepted != jobs || st.Merchants != 4 || len(l.dead) != 0 ||
				st.MerchantWindows[0].MaxInWindow != 4 || span < 6*time.Second || span > 12*time.Second {
				f.dumpLogs()
				t.Fatalf("provider saw %+v over %s (dead letters %v): want nothing over either level, each merchant at its limit",
					st, span, l.dead)
			}
		})
	}
}

// Fair shares on real RabbitMQ (the acceptance): three worker processes, a provider at 100/1s,
// merchant A enqueues 3000 jobs, then B, C and D 100 each. B, C and D each finish within 6s of being
// enqueued while A goes on; the provider is never over 100/1s and the budget is used (utilisation from the
// first acceptance to the last, against the margin's optimum). The read-ahead (broker.rabbitmq.prefetch
// 1100, times three processes) holds A's backlog, so the workers see B, C and D as soon as they are
// published (docs/configuration.md, "Fair shares").
func TestFairShares(t *testing.T) {
	windows := []sim.Window{{Limit: 100, Per: time.Second}}
	f := newFleet(t, simProvider{name: "acme", limits: windows})
	f.margin = 30 * time.Millisecond // seven busy processes on two cores
	// Prefetch 1100 with concurrency 16 keeps the longest a delivery can be held under RabbitMQ's consumer
	// timeout (30m; run checks it).
	f.env2 = append(f.env2, "PAYGATE_BROKER_RABBITMQ_PREFETCH=1100", "PAYGATE_WORKER_CONCURRENCY=16")
	fh, err := os.OpenFile(f.cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = fh.WriteString("    per_merchant: {}\n")
		fh.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	f.established()
	for range 3 {
		f.startWorker()
	}
	s := f.sims["acme"]
	f.enqueueFor("acme", 3000, "fa", "A")
	type merchant struct {
		name, prefix string
		enqueued     time.Time
		done         time.Duration
	}
	others := []*merchant{{name: "B", prefix: "fb"}, {name: "C", prefix: "fc"}, {name: "D", prefix: "fd"}}
	var aBefore int
	for i, m := range others {
		if i == 0 {
			aBefore = countPrefix(s.AcceptedKeys(), "fa-")
		}
		m.enqueued = time.Now()
		f.enqueueFor("acme", 100, m.prefix, m.name)
	}
	f.waitFor("B, C and D charged", time.Minute, func() bool {
		keys := s.AcceptedKeys()
		for _, m := range others {
			if m.done == 0 && countPrefix(keys, m.prefix+"-") == 100 {
				m.done = time.Since(m.enqueued)
			}
		}
		return others[0].done > 0 && others[1].done > 0 && others[2].done > 0
	})
	aDuring := countPrefix(s.AcceptedKeys(), "fa-") - aBefore
	f.waitFor("every job charged", 2*time.Minute, func() bool { return s.Stats().Accepted >= 3300 })
	f.stopAll()
	l := f.collect()
	l.check(t, append(append(append(ids("fa", 3000), ids("fb", 100)...), ids("fc", 100)...), ids("fd", 100)...))
	st := s.Stats()
	u := utilisation(st, windows, f.margin)
	outcomes := map[string]int{}
	for _, l := range f.settled() {
		outcomes[l.Outcome+"/"+l.Admission]++
	}
	t.Logf("settled: %v", outcomes)
	t.Logf("B, C, D done %s, %s, %s after being enqueued; A charged %d meanwhile; %d accepted, utilisation %.3f, violations %d",
		others[0].done.Round(time.Millisecond), others[1].done.Round(time.Millisecond), others[2].done.Round(time.Millisecond), aDuring, st.Accepted, u, st.Violations)
	for _, m := range others {
		if m.done > 6*time.Second {
			f.dumpLogs()
			t.Errorf("%s finished %s after being enqueued, want within 6s", m.name, m.done)
		}
	}
	if st.Violations != 0 || st.Accepted != 3300 || u < 0.99 || aDuring < 50 {
		f.dumpLogs()
		t.Fatalf("provider saw %+v, utilisation %.3f, A charged %d while B, C, D went: want 0 over the limit, >= 0.99, A going on", st, u, aDuring)
	}
}

func countPrefix(keys []string, prefix string) int {
	n := 0
	for _, k := range keys {
		if strings.HasPrefix(k, prefix) {
			n++
		}
	}
	return n
}

// check-config says what fair shares reorder: the deliveries read ahead beyond the handlers, and warns
// when the prefetch leaves none.
func TestCheckConfigFairShares(t *testing.T) {
	cfg := testConfig(t, fivePer3s+"    per_merchant: {limits: [{requests: 2, per: 3s}]}\n    merchants: {Big: {weight: 3}}\n")
	r := worker(t, nil, "check-config", "--config", cfg)
	if r.code != 0 || !strings.Contains(r.stdout, "per merchant 2/3s,1 named merchants") || !strings.Contains(r.stdout, "fair shares between merchants") ||
		!strings.Contains(r.stdout, "acme: fair shares between merchants over 16 deliveries per process waiting their turn (prefetch 32 - concurrency 16)") ||
		strings.Contains(r.stdout, "warning") {
		t.Fatalf("check-config: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = worker(t, []string{"PAYGATE_BROKER_RABBITMQ_PREFETCH=16"}, "check-config", "--config", cfg)
	if want := "warning: acme has fair shares between merchants, but broker.rabbitmq.prefetch 16 leaves no delivery waiting its turn"; r.code != 0 || !strings.Contains(r.stdout, want) {
		t.Fatalf("check-config with prefetch 16: exit %d, want %q\n%s%s", r.code, want, r.stdout, r.stderr)
	}
}
