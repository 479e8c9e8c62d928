package main

import (
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paygate/paygate/providers/sim"
)

// Priority classes, the first acceptance: three worker processes with config's defaults
// (concurrency 16, prefetch 32, max_inline_wait 5s, low_horizon 500ms), a strict provider at 100/1s; a
// backlog of 5000 low jobs, then 200 high. Every high job reaches the provider within 4.5 s of being
// enqueued (behind at most low_horizon of low reservations, then at the provider's rate: 2 s for 200), 0
// requests over the limit, and while only low jobs exist the budget is used (≥ 0.97 of what the gate could
// admit from the first low acceptance on, measured until the high jobs are enqueued).
func TestPriorityClasses(t *testing.T) {
	f := newPriorityFleet(t, "rabbitmq")
	f.run(func(class string, n int, prefix string) time.Time {
		began := time.Now() // every job is enqueued after this: the bound counts from here, conservatively
		cmd := exec.Command(binary, "enqueue", "--config", f.cfg, "--provider", "acme", "--count", fmt.Sprint(n), "--id-prefix", prefix, "--priority", class)
		cmd.Env = f.env()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("enqueue: %v %s", err, out)
		}
		return began
	})
}

// TestPriorityClassesKafka is TestPriorityClasses on Kafka (kfake): the jobs are produced to T.acme.low and
// T.acme.high, each backlog in one batch.
func TestPriorityClassesKafka(t *testing.T) {
	f := newPriorityFleet(t, "kafka")
	f.run(func(class string, n int, prefix string) time.Time {
		var values [][]byte
		for i := range n {
			values = append(values, fmt.Appendf(nil, `{"id":"%s-%d","provider":"acme","amount":%d,"currency":"EUR","priority":%q}`, prefix, i, 100+i, class))
		}
		began := time.Now()
		produceRaw(t, f.brokers, f.x+".acme."+class, values...)
		return began
	})
}

type priorityFleet struct {
	*fleet
	kind    string
	brokers string // Kafka's
	windows []sim.Window
}

func newPriorityFleet(t *testing.T, kind string) *priorityFleet {
	windows := []sim.Window{{Limit: 100, Per: time.Second}}
	pf := &priorityFleet{kind: kind, windows: windows}
	if kind == "kafka" {
		pf.fleet, pf.brokers = newKafkaFleet(t, simProvider{name: "acme", limits: windows})
	} else {
		pf.fleet = newFleet(t, simProvider{name: "acme", limits: windows})
	}
	pf.margin = 30 * time.Millisecond // seven busy processes on two cores, as TestFairShares
	// config's defaults, which the fleet's own configuration lowers
	pf.env2 = append(pf.env2, "PAYGATE_WORKER_CONCURRENCY=16", "PAYGATE_BROKER_RABBITMQ_PREFETCH=32", "PAYGATE_WORKER_MAX_INLINE_WAIT=5s")
	return pf
}

// run starts three workers, enqueues the low backlog, then the high jobs (enqueue returns when the jobs
// were enqueued, the moment before the first), and checks the bounds.
func (f *priorityFleet) run(enqueue func(class string, n int, prefix string) time.Time) {
	t := f.t
	const lows, highs = 5000, 200
	f.established()
	for range 3 {
		f.startWorker()
	}
	if f.kind == "kafka" {
		f.waitFor("three workers in the group", 30*time.Second, f.inGroup)
		time.Sleep(time.Second) // let the group settle
	}
	s := f.sims["acme"]
	enqueue("low", lows, "lo")
	f.waitFor("low jobs flowing", 30*time.Second, func() bool { return s.Stats().Accepted >= 50 })
	time.Sleep(3 * time.Second) // low jobs alone
	began := enqueue("high", highs, "hi")
	f.waitFor("every high job charged", 30*time.Second, func() bool { return countPrefix(s.AcceptedKeys(), "hi-") == highs })
	st := s.Stats()
	var at map[string]time.Time
	s.get("/accepted", &at)
	var calls, settled float64 // the low jobs' gate calls and the low jobs settled, over the fleet
	for i := range f.workers {
		m := f.metrics(i)
		calls += counted(m, "paygate_priority_gate_calls_total", "priority", "low", "acme")
		if g := regexp.MustCompile(`paygate_priority_jobs_total\{outcome="succeeded",priority="low",provider="acme"\} (\S+)`).FindStringSubmatch(m); g != nil {
			n, _ := strconv.ParseFloat(g[1], 64)
			settled += n
		}
	}
	f.stopAll()

	var first, lastLow time.Time
	lowsAccepted := 0
	var earliest, latest time.Duration = time.Hour, 0
	for key, when := range at {
		switch {
		case strings.HasPrefix(key, "lo-") && when.Before(began):
			lowsAccepted++
			if first.IsZero() || when.Before(first) {
				first = when
			}
			if when.After(lastLow) {
				lastLow = when
			}
		case strings.HasPrefix(key, "hi-"):
			earliest, latest = min(earliest, when.Sub(began)), max(latest, when.Sub(began))
		}
	}
	lowsBetween := 0
	for key, when := range at {
		if strings.HasPrefix(key, "lo-") && when.After(began.Add(earliest)) && when.Before(began.Add(latest)) {
			lowsBetween++
		}
	}
	t.Logf("%d low jobs charged between the first high and the last", lowsBetween)
	u := float64(lowsAccepted) / float64(optimum(lastLow.Sub(first), f.windows, f.margin))
	t.Logf("%s: %d low jobs charged alone in %v, utilisation %.3f; %d high jobs from %v to %v after they were enqueued; %d charged, violations %d",
		f.kind, lowsAccepted, lastLow.Sub(first).Round(time.Millisecond), u, highs, earliest.Round(time.Millisecond), latest.Round(time.Millisecond), st.Accepted, st.Violations)
	perJob := calls / max(settled, 1)
	t.Logf("%s: %.0f gate calls for the %.0f low jobs settled: %.2f a job", f.kind, calls, settled, perJob)
	if perJob > 1.3 || settled < 300 {
		t.Errorf("low jobs under a backlog took %.2f gate calls each (%.0f settled), want ≤ 1.3", perJob, settled)
	}
	if latest > 4500*time.Millisecond {
		f.dumpLogs()
		t.Errorf("the last high job reached the provider %v after being enqueued, want within 4.5s", latest)
	}
	if st.Violations != 0 || st.BadRequests != 0 || u < 0.97 {
		f.dumpLogs()
		t.Fatalf("provider saw %+v, low jobs alone used %.3f of the budget: want 0 over the limit and ≥ 0.97", st, u)
	}
}
