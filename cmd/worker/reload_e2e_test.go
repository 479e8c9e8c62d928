package main

import (
	"os"
	"path/filepath"
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
// go through; an invalid file is refused with check-config's message while the worker keeps dispatching
// on the configuration in force; and the ledger finds every job charged once or still queued.
func TestReloadUnderLoad(t *testing.T) {
	acme20 := simProvider{name: "acme", limits: []sim.Window{{Limit: 20, Per: time.Second}}}
	acme10 := simProvider{name: "acme", limits: []sim.Window{{Limit: 10, Per: time.Second}}}
	beta := simProvider{name: "beta", limits: []sim.Window{{Limit: 10, Per: time.Second}}}
	f := newFleet(t, acme20, beta)
	f.established()
	f.writeConfig(acme20) // beta is not configured yet
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
	f.stopAll()

	st := acme.Stats()
	t.Logf("acme: %d accepted (%d at 10/1s), %d violations; beta: %d accepted", st.Accepted, st.Accepted-at10.Accepted, st.Violations, betaSim.Stats().Accepted)
	if st.Violations != 0 || betaSim.Stats().Violations != 0 {
		f.dumpLogs()
		t.Fatalf("violations: acme %d, beta %d", st.Violations, betaSim.Stats().Violations)
	}
	if f.logged(0, "providers.acme.limits") == 0 {
		f.dumpLogs()
		t.Fatal("the refusal does not name the bad key (providers.acme.limits), as check-config would")
	}
	l := f.collect()
	l.check(t, append(ids("a", 300), ids("b", 30)...))
}
