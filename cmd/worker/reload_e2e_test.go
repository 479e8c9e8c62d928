package main

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/paygate/paygate/providers/sim"
)

// logged counts the lines of worker i's log that contain s.
func (f *fleet) logged(i int, s string) int {
	b, _ := os.ReadFile(filepath.Join(f.dir, "worker-"+strconv.Itoa(i)+".log"))
	return strings.Count(string(b), s)
}

// SIGHUP under load (issue 18): a worker at acme's 20/1s gets a file with acme at 10/1s and a new provider,
// beta. After the reload the provider, then holding the fleet to 10/1s, sees nothing over it; beta's jobs
// go through; an invalid file is refused with check-config's message, and a valid one whose broker
// cannot be connected is refused too, while the worker keeps dispatching on the configuration in force;
// and the ledger finds every job charged once or still queued.
func TestReloadUnderLoad(t *testing.T) {
	acme20 := simProvider{name: "acme", limits: []sim.Window{{Limit: 20, Per: time.Second}}}
	acme10 := simProvider{name: "acme", limits: []sim.Window{{Limit: 10, Per: time.Second}}}
	beta := simProvider{name: "beta", limits: []sim.Window{{Limit: 10, Per: time.Second}}}
	f := newFleet(t, acme20, beta)
	f.established()
	f.writeConfig(acme20) // beta is not configured yet
	afterSlot := f.watchSlots("acme")
	f.enqueue("acme", 300, "a")
	w := f.startWorker()
	acme, betaSim := f.sims["acme"], f.sims["beta"]
	f.waitFor("acme dispatching", time.Minute, func() bool { return acme.Stats().Accepted >= 40 })

	f.writeConfig(acme10, beta)
	if err := w.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the reload", 30*time.Second, func() bool { return f.logged(0, "configuration reloaded") == 1 })
	time.Sleep(time.Second)
	acme.post("/limits", `{"limits":"10/1s"}`) // from a second after the reload, the referee holds acme to 10/1s
	at10 := acme.Stats()
	f.enqueue("beta", 30, "b")
	f.waitFor("beta's jobs charged", time.Minute, func() bool { return betaSim.Stats().Accepted >= 30 })

	if err := os.WriteFile(f.cfg, []byte("providers: {acme: {url: 'http://127.0.0.1:1/pay', limits: []}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := w.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the refusal", 30*time.Second, func() bool { return f.logged(0, "configuration reload refused") == 1 })
	refused := acme.Stats().Accepted
	f.waitFor("acme still dispatching", 30*time.Second, func() bool { return acme.Stats().Accepted >= refused+10 })

	// A valid file whose parts cannot be built (its broker URL's variable is not set) is refused too.
	f.writeConfig(acme10, beta)
	raw, _ := os.ReadFile(f.cfg)
	unbuildable := strings.Replace(string(raw), "prefetch: 16}", "prefetch: 16, url_env: PAYGATE_TEST_UNSET_AMQP_URL}", 1)
	if err := os.WriteFile(f.cfg, []byte(unbuildable), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := w.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the failed reload", 30*time.Second, func() bool { return f.logged(0, "configuration reload failed") == 1 })
	failed := acme.Stats().Accepted
	f.waitFor("acme still dispatching after it", 30*time.Second, func() bool { return acme.Stats().Accepted >= failed+10 })
	f.stopAll()

	st := acme.Stats()
	t.Logf("acme: %d accepted (%d at 10/1s), %d violations; beta: %d accepted", st.Accepted, st.Accepted-at10.Accepted, st.Violations, betaSim.Stats().Accepted)
	if st.Violations != 0 || betaSim.Stats().Violations != 0 {
		f.dumpLogs()
		// When each arrived against the reload and the referee's switch to 10/1s, and how early.
		t.Logf("last acceptance before the referee held acme to 10/1s: %v; acme's overs %+v, beta's %+v", at10.LastAccepted, st.Overs, betaSim.Stats().Overs)
		logAfterSlot(t, afterSlot().afters(), f.margin)
		t.Fatalf("violations: acme %d, beta %d", st.Violations, betaSim.Stats().Violations)
	}
	if f.logged(0, "providers.acme.limits") == 0 {
		f.dumpLogs()
		t.Fatal("the refusal does not name the bad key (providers.acme.limits), as check-config would")
	}
	l := f.collect()
	l.check(t, append(ids("a", 300), ids("b", 30)...))
}

// httpAddr is worker i's operations address, from its "worker running" log line.
func (f *fleet) httpAddr(i int) string {
	f.t.Helper()
	raw, _ := os.ReadFile(filepath.Join(f.dir, "worker-"+strconv.Itoa(i)+".log"))
	m := regexp.MustCompile(`"http":"([^"]+)"`).FindSubmatch(raw)
	if m == nil {
		f.t.Fatalf("worker %d logged no http address", i)
	}
	return string(m[1])
}

// metrics reads worker i's /metrics.
func (f *fleet) metrics(i int) string {
	f.t.Helper()
	resp, err := http.Get("http://" + f.httpAddr(i) + "/metrics")
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// decisions reads the count of one gate decision for a provider from a worker's /metrics text (0 when
// the worker has counted none).
func decisions(metrics, provider, decision string) float64 {
	return counted(metrics, "paygate_gate_decisions_total", "decision", decision, provider)
}

// counted reads a counter of one provider from /metrics text: family{<label>="<value>",provider="…"} (0
// when the worker has counted none).
func counted(metrics, family, label, value, provider string) float64 {
	re := regexp.MustCompile(regexp.QuoteMeta(family) + `\{` + label + `="` + regexp.QuoteMeta(value) + `",provider="` + regexp.QuoteMeta(provider) + `"\} (\S+)`)
	if m := re.FindStringSubmatch(metrics); m != nil {
		n, _ := strconv.ParseFloat(m[1], 64)
		return n
	}
	return 0
}

// Shadow mode (issue 18): a worker in front of a provider at 10/1s with a backlog of 60 holds nothing back:
// every job goes within a few seconds (the provider refuses what is over its limit, as it did before
// paygate), and the gate's counts say what enforce mode would have done (would_delay, would_deny).
func TestShadowMode(t *testing.T) {
	acme := simProvider{name: "acme", limits: []sim.Window{{Limit: 10, Per: time.Second}}}
	f := newFleet(t, acme)
	f.established()
	f.env2 = append(f.env2, "PAYGATE_PROVIDERS_ACME_MODE=shadow")
	f.enqueue("acme", 60, "s")
	f.startWorker()
	s := f.sims["acme"]
	// Enforced, 60 jobs at 10/1s take 6 s; sent regardless, their first requests all arrive within about one.
	f.waitFor("every job's first request", 30*time.Second, func() bool { return s.Stats().Requests >= 60 })
	first := s.Stats()
	m := f.metrics(0)
	f.waitFor("every job charged", time.Minute, func() bool { return s.Stats().Accepted >= 60 })
	f.stopAll()
	count := func(decision string) float64 { return decisions(m, "acme", decision) }
	t.Logf("first requests: %d (%d refused over the limit, %d accepted); decisions: allowed %.0f, would_delay %.0f, would_deny %.0f",
		first.Requests, first.Violations, first.Accepted, count("allowed"), count("would_delay"), count("would_deny"))
	if first.Violations == 0 {
		t.Fatalf("the provider refused nothing: shadow mode held jobs back (%+v)", first)
	}
	if count("would_delay")+count("would_deny") == 0 {
		t.Fatalf("no would_delay or would_deny decision counted:\n%s", m)
	}
	l := f.collect()
	l.check(t, ids("s", 60))
}
