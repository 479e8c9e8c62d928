package main

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/paygate/paygate/providers/sim"
)

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
