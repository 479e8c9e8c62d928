package main

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/internal/report"
	"github.com/paygate/paygate/providers/sim"
)

// breakerOpenMax is the breakers' open_max in these tests (the default is 5m): it bounds how long after the
// provider recovers its next probe comes, and so how long the tests run.
const breakerOpenMax = 30 * time.Second

// breakerFleet is a fleet of three `worker run` processes in front of one strict provider at 20/1s, with
// the default breaker but for open_max (breakerOpenMax), and jobs enqueued; traffic flows (jobs/5
// accepted) before it returns.
func breakerFleet(t *testing.T, jobs int) (*fleet, *simProc) {
	return breakerFleetOn(t, "rabbitmq", jobs)
}

// breakerFleetOn is breakerFleet on either broker (kind rabbitmq or kafka: kfake).
func breakerFleetOn(t *testing.T, kind string, jobs int) (*fleet, *simProc) {
	t.Helper()
	acme := simProvider{name: "acme", limits: []sim.Window{{Limit: 20, Per: time.Second}}}
	var f *fleet
	if kind == "kafka" {
		f, _ = newKafkaFleet(t, acme)
	} else {
		f = newFleet(t, acme)
	}
	f.env2 = append(f.env2, "PAYGATE_PROVIDERS_ACME_BREAKER_OPEN_MAX="+breakerOpenMax.String())
	f.enqueue("acme", jobs, "j")
	f.margin = 30 * time.Millisecond // five busy processes on two cores: the fleet tests' margin
	for range 3 {
		f.startWorker()
	}
	f.waitAccepted("acme", int64(jobs/5), 2*time.Minute)
	return f, f.sims["acme"]
}

// readBreaker reads the provider's breaker as the fleet's workers name it.
func (f *fleet) readBreaker(provider string) gate.BreakerState {
	f.t.Helper()
	st, err := f.gate().ReadBreaker(context.Background(), provider)
	if err != nil {
		f.t.Fatal(err)
	}
	return st
}

// waitBreaker waits until the provider's breaker is as cond wants it, and returns it.
func (f *fleet) waitBreaker(provider, what string, timeout time.Duration, cond func(gate.BreakerState) bool) gate.BreakerState {
	f.t.Helper()
	l := f.gate()
	var st gate.BreakerState
	f.waitFor(what, timeout, func() bool {
		var err error
		st, err = l.ReadBreaker(context.Background(), provider)
		return err == nil && cond(st)
	})
	return st
}

// sentLine is a worker's settled line of a job whose request went to the provider.
type sentLine struct {
	TS      string `json:"ts"`
	Msg     string `json:"msg"`
	Outcome string `json:"outcome"`
	Job     string `json:"job"`
	at      time.Time
}

// sent reads, from every worker's log, the jobs whose requests went to the provider, in the order their
// answers came: their settled lines (one per request: the outcomes of an answer, or of its failure).
func (f *fleet) sent() []sentLine {
	var out []sentLine
	for line := range strings.SplitSeq(f.logs(), "\n") {
		var l sentLine
		if json.Unmarshal([]byte(line), &l) != nil || l.Msg != "job settled" {
			continue
		}
		switch l.Outcome {
		case "succeeded", "declined", "transient", "probe_failed", "exhausted", "permanent", "throttled":
		default:
			continue
		}
		at, err := time.Parse("2006-01-02T15:04:05.000Z0700", l.TS)
		if err != nil {
			f.t.Fatalf("settled line's ts %q: %v", l.TS, err)
		}
		l.at = at
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b sentLine) int { return a.at.Compare(b.at) })
	return out
}

// between are the lines in [from, to).
func between(lines []sentLine, from, to time.Time) []sentLine {
	var out []sentLine
	for _, l := range lines {
		if !l.at.Before(from) && l.at.Before(to) {
			out = append(out, l)
		}
	}
	return out
}

// breakerGrace is how long after the breaker opened a request may still go: one decided before it, sent
// by a worker that had not heard of it yet (the announcement's trip), answered and logged.
const breakerGrace = 500 * time.Millisecond

// onePerInterval checks that the requests sent while the breaker was open (after its opening at opened,
// plus breakerGrace, until `until`) came one per open interval at most: no more than its reopenings
// meanwhile and the probe that closed it, each at least the first open interval (1s, less a trip's
// jitter) after the one before.
func onePerInterval(t *testing.T, lines []sentLine, opened, until time.Time, reopenings int64) {
	t.Helper()
	during := between(lines, opened.Add(breakerGrace), until)
	var at []string
	for _, l := range during {
		at = append(at, l.at.Format("15:04:05.000")+" "+l.Outcome)
	}
	t.Logf("requests sent while the breaker was open (%s..%s), reopened %d times: %d %v", opened.Format("15:04:05.000"),
		until.Format("15:04:05.000"), reopenings, len(during), at)
	if int64(len(during)) > reopenings+1 {
		t.Errorf("%d requests sent while the breaker was open, reopened %d times: more than one per open interval", len(during), reopenings)
	}
	for i := 1; i < len(during); i++ {
		if gap := during[i].at.Sub(during[i-1].at); gap < time.Second-250*time.Millisecond {
			t.Errorf("requests %s and %s %s apart: less than the shortest open interval (1s)", during[i-1].Job, during[i].Job, gap)
		}
	}
}

// The acceptance for outages (issue 40): three worker processes, 300 jobs at 20/1s; the provider
// refuses connections for 90s (its process down: provider-sim's refuse_for), then answers 500 for 90s,
// then recovers. The breaker opens after five
// failures in a row and holds the fleet: the provider gets at most one request per open interval (the
// probe; counted at the provider in the 500s, and in the workers' settled lines throughout), the
// intervals doubling from 1s to open_max (30s here). No job spends its attempts waiting: 0 dead letters,
// every job accepted once, within 300/20 s + open_max + 5 s of the recovery, and 0 requests over the limit.
func TestFaultBreakerOutage(t *testing.T) { breakerOutage(t, "rabbitmq") }

// The same on Kafka (kfake): three members of the group, the jobs held in the retry topics while the
// breaker is open.
func TestFaultBreakerOutageKafka(t *testing.T) { breakerOutage(t, "kafka") }

func breakerOutage(t *testing.T, kind string) {
	const jobs = 300
	f, s := breakerFleetOn(t, kind, jobs)
	before := s.Stats()
	outage := time.Now()
	// Refused for 90s (the simulator's own endpoints too), then listening again and answering 500.
	s.setFaults(`{"refuse_for":"90s","error_rate":1}`)
	opened := f.waitBreaker("acme", "the breaker to open", 30*time.Second, func(st gate.BreakerState) bool { return st.Phase != gate.BreakerClosed })
	t.Logf("breaker opened %s after the outage began (%d accepted before it)", opened.Since.Sub(outage).Round(time.Millisecond), before.Accepted)
	if st := f.statusText(); !strings.Contains(st, "breaker: open") && !strings.Contains(st, "breaker: probing") {
		t.Errorf("gate status during the outage:\n%s", st)
	}
	time.Sleep(time.Until(outage.Add(90 * time.Second)))
	at500, open500 := s.statsOnceListening(), f.readBreaker("acme")
	time.Sleep(time.Until(outage.Add(180 * time.Second)))
	atEnd, openEnd := s.Stats(), f.readBreaker("acme")
	s.setFaults(`{}`)
	recovered := time.Now()
	bound := time.Duration(jobs/20)*time.Second + breakerOpenMax + 5*time.Second
	f.waitAccepted("acme", jobs, bound+time.Minute)
	st := s.Stats()
	f.stopAll()

	done := st.LastAccepted.Sub(recovered)
	t.Logf("every job accepted %s after the recovery (bound %s); the breaker opened %d times in the outage, last open for %s",
		done.Round(time.Millisecond), bound, openEnd.Opened, openEnd.OpenFor)
	if done > bound {
		t.Errorf("the last job was accepted %s after the recovery, more than %s", done, bound)
	}
	// At the provider: in the 500s, only probes reached it.
	inFives := atEnd.Requests - at500.Requests
	if reopened := openEnd.Opened - open500.Opened; inFives > reopened+1 {
		t.Errorf("the provider got %d requests in the 90s of 500s, while the breaker reopened %d times", inFives, reopened)
	}
	// At the workers: throughout the outage, the refusals included.
	onePerInterval(t, f.sent(), opened.Since, recovered, openEnd.Opened-opened.Opened)
	if openEnd.OpenFor != breakerOpenMax {
		t.Errorf("open for %s at the end of a 3-minute outage, want open_max %s (doubling from 1s)", openEnd.OpenFor, breakerOpenMax)
	}
	f.exactlyOnceOn(kind, "acme", jobs)
	logs := f.logs()
	for _, change := range []string{"breaker opened", "breaker reopened", "breaker probing", "breaker closed"} {
		if !strings.Contains(logs, change) {
			t.Errorf("no worker logged %q", change)
		}
	}
	t.Logf("provider: %d requests in all, %d in the 500s, accepted %d, violations %d", st.Requests, inFives, st.Accepted, st.Violations)
}

// exactlyOnceOn is exactlyOnce on either broker: on Kafka, every job accepted once at the provider, none
// over the limit, and nothing in T.dead.
func (f *fleet) exactlyOnceOn(kind, provider string, jobs int) {
	f.t.Helper()
	if kind != "kafka" {
		f.exactlyOnce(provider, jobs)
		return
	}
	st := f.sims[provider].Stats()
	keys := map[string]bool{}
	for _, k := range f.sims[provider].AcceptedKeys() {
		keys[k] = true
	}
	brokers := strings.Trim(regexp.MustCompile(`brokers: \[("[^"]+")\]`).FindStringSubmatch(f.readConfig())[1], `"`)
	if dead := readTopic(f.t, brokers, f.x+".dead"); st.Accepted != int64(jobs) || len(keys) != jobs || st.Violations != 0 || len(dead) != 0 {
		f.t.Errorf("provider %+v, %d distinct keys, %d dead letters: want %d accepted once, 0 violations, none dead", st, len(keys), len(dead), jobs)
	}
}

// statsOnceListening reads the simulator's stats as soon as it listens again (after a refusal).
func (s *simProc) statsOnceListening() sim.Stats {
	s.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(s.url + "/stats")
		if err == nil {
			defer resp.Body.Close()
			var st sim.Stats
			if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
				s.t.Fatal(err)
			}
			return st
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("the simulator is not listening again 10s after its refusal: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// statusText is `worker gate status` for acme, as an operator reads it.
func (f *fleet) statusText() string {
	f.t.Helper()
	r := worker(f.t, f.env(), "gate", "status", "--config", f.cfg, "--provider", "acme")
	if r.code != 0 {
		f.t.Fatalf("gate status: %d %s", r.code, r.stderr)
	}
	return r.stdout
}

// A restart of every worker mid-outage (each killed -9, one of them perhaps holding the probe) keeps the
// breaker: it lives in Redis. The new fleet finds it open with the interval it had reached, sends nothing
// but its probes (the next reopening doubles that interval, not the first), and after the recovery every
// job is accepted once, none dead-lettered.
func TestFaultBreakerRestart(t *testing.T) {
	const jobs = 100
	f, s := breakerFleet(t, jobs)
	s.setFaults(`{"error_rate":1}`)
	before := f.waitBreaker("acme", "the breaker to reopen twice", time.Minute, func(st gate.BreakerState) bool { return st.OpenFor >= 4*time.Second })
	for _, w := range f.workers {
		if w.ProcessState == nil {
			_ = w.Process.Signal(syscall.SIGKILL)
			_ = w.Wait()
		}
	}
	killed, atKill := time.Now(), s.Stats().Requests
	for range 3 {
		f.startWorker()
	}
	after := f.readBreaker("acme")
	t.Logf("before the restart %s open for %s (opened %d times); after it %s open for %s (opened %d times)",
		before.Phase, before.OpenFor, before.Opened, after.Phase, after.OpenFor, after.Opened)
	if after.Phase == gate.BreakerClosed || after.OpenFor < before.OpenFor || after.Opened < before.Opened {
		t.Fatalf("the breaker after every worker restarted: %+v, before %+v", after, before)
	}
	var js report.Status
	r := worker(t, f.env(), "gate", "status", "--config", f.cfg, "--provider", "acme", "--json")
	if err := json.Unmarshal([]byte(r.stdout), &js); err != nil || js.Breaker == nil || js.Breaker.State == "closed" || js.Breaker.Threshold != 5 {
		t.Fatalf("gate status --json: %v %s %s", err, r.stdout, r.stderr)
	}
	// The new fleet's first reopening doubles the interval the old one reached.
	next := f.waitBreaker("acme", "the new fleet's probe to fail", time.Minute, func(st gate.BreakerState) bool { return st.Opened > after.Opened })
	if want := min(2*after.OpenFor, breakerOpenMax); next.OpenFor != want {
		t.Errorf("reopened by the new fleet for %s, want %s (twice %s)", next.OpenFor, want, after.OpenFor)
	}
	if m := f.metrics(len(f.workers) - 1); !strings.Contains(m, `paygate_breaker_state{provider="acme"}`) {
		t.Errorf("no paygate_breaker_state in a new worker's metrics")
	}
	sinceKill, reopened := s.Stats().Requests-atKill, next.Opened-after.Opened
	t.Logf("requests since the restart %s ago: %d, the breaker reopened %d times", time.Since(killed).Round(time.Millisecond), sinceKill, reopened)
	if sinceKill > reopened+1 {
		t.Errorf("the restarted fleet sent %d requests into the outage while the breaker reopened %d times", sinceKill, reopened)
	}
	s.setFaults(`{}`)
	f.waitAccepted("acme", jobs, breakerOpenMax+time.Minute)
	f.stopAll()
	f.exactlyOnce("acme", jobs)
}
