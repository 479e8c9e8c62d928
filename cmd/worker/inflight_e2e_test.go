package main

import (
	"syscall"
	"testing"
	"time"

	"github.com/paygate/paygate/providers/sim"
	"github.com/paygate/paygate/wire"
)

// The in-flight cap across a fleet (providers.<name>.max_in_flight): three worker processes, a provider
// that answers in 300ms and refuses a sixth concurrent request (provider-sim --max-in-flight 5), a backlog.
// The provider sees exactly 5 in flight at most and never refuses one; a worker killed -9 while it holds
// leases costs the fleet those places only until they lapse (the provider's timeout plus
// wire.LeaseSlack); every job is charged once.
func TestInFlightCapFleet(t *testing.T) {
	windows := []sim.Window{{Limit: 100, Per: time.Second}}
	f := newFleet(t, simProvider{name: "acme", limits: windows, args: []string{"--latency", "300ms", "--max-in-flight", "5"}})
	f.env2 = append(f.env2, "PAYGATE_PROVIDERS_ACME_MAX_IN_FLIGHT=5")
	f.established()
	const jobs = 400 // about 16 a second through 5 places: a backlog for the whole test
	f.enqueue("acme", jobs, "c")
	// The victim alone first, so that it holds all five leases when it dies.
	victim := f.startWorker()
	s := f.sims["acme"]
	f.waitFor("5 in flight from the victim", time.Minute, func() bool { return s.Stats().InFlight == 5 })
	if err := victim.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	_ = victim.Wait()
	f.startWorker()
	f.startWorker()
	// The victim's leases lapse the provider's timeout (5s) and the slack after their slots, which were at
	// most a request (300ms) before the kill: the two new workers wait for them (nothing over the cap),
	// then fill all 5 places (two seconds more: a waiting job polls every 250ms, on a busy machine).
	back := killed.Add(5*time.Second + wire.LeaseSlack + 2*time.Second)
	full := time.Time{}
	for full.IsZero() && time.Now().Before(back) {
		if st := s.Stats(); st.InFlight == 5 && time.Since(killed) > 300*time.Millisecond { // past the victim's own requests
			full = time.Now()
		}
		time.Sleep(20 * time.Millisecond)
	}
	if full.IsZero() {
		f.dumpLogs()
		t.Fatalf("the fleet was not back to 5 in flight within %s of the kill: %+v", back.Sub(killed), s.Stats())
	}
	t.Logf("back to 5 in flight %s after the kill", full.Sub(killed).Round(time.Millisecond))
	if full.Sub(killed) < 5*time.Second+wire.LeaseSlack-2*time.Second {
		t.Fatalf("5 in flight again %s after the kill: the dead worker's leases did not hold their places until they lapsed", full.Sub(killed))
	}
	f.startWorker()
	f.waitFor("every job charged", 2*time.Minute, func() bool { return s.Stats().Accepted >= jobs })
	f.stopAll()
	l := f.collect()
	l.check(t, ids("c", jobs))
	st := s.Stats()
	t.Logf("accepted %d, requests %d, max in flight seen %d, refused for concurrency %d, duplicates %d",
		st.Accepted, st.Requests, st.MaxInFlightSeen, st.ThrottledInFlight, st.Duplicates)
	if st.MaxInFlightSeen != 5 || st.ThrottledInFlight != 0 || st.Violations != 0 || st.Accepted != jobs || len(l.dead) != 0 {
		f.dumpLogs()
		t.Fatalf("provider saw %+v (dead letters %v): want at most and exactly 5 in flight, none refused, every job charged once", st, l.dead)
	}
}
