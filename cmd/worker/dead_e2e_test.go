package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/providers/sim"
)

// Issue 41's acceptance for worker dead, on RabbitMQ: see deadAcceptance.
func TestDeadRabbitMQ(t *testing.T) {
	f := newFleet(t, simProvider{name: "acme", limits: []sim.Window{{Limit: 100, Per: time.Second}}})
	deadAcceptance(t, &deadFleet{fleet: f}, func(body []byte) { f.publishRaw("acme", body) })
}

// Issue 41's acceptance for worker dead, on Kafka (kfake): see deadAcceptance.
func TestDeadKafka(t *testing.T) {
	f, brokers := newKafkaFleet(t, simProvider{name: "acme", limits: []sim.Window{{Limit: 100, Per: time.Second}}})
	deadAcceptance(t, &deadFleet{fleet: f, kafka: true}, func(body []byte) { produceRaw(t, brokers, f.x+".acme", body) })
}

// deadFleet is a fleet the dead commands run against.
type deadFleet struct {
	*fleet
	kafka bool
}

// deadAcceptance: two worker processes and a strict provider. 100 jobs are dead-lettered by a phase of
// 422s, 4 by 500s (max_attempts 1), and one message that is no job; the provider is fixed. dead list shows
// the 100 with reason permanent and status 422; bad input changes nothing; --id, --max and --dry-run
// select exactly what they say; a dead replay --rate 20 killed -9 halfway and run again leaves every job
// accepted exactly once, no second of first-seen stamps (each copy's, taken as it leaves) holding more
// than 20; then dead list shows none of them (RabbitMQ) or all replayed (Kafka), and purge takes the one
// that is no job.
func deadAcceptance(t *testing.T, f *deadFleet, produceRaw func([]byte)) {
	f.env2 = append(f.env2, "PAYGATE_RESULTS_ENABLED=true", "PAYGATE_WORKER_MAX_ATTEMPTS=1")
	f.established()
	s := f.sims["acme"]
	s.setFaults(`{"reject_for":"1h"}`)
	f.startWorker()
	f.startWorker()
	if f.kafka {
		f.waitFor("the group", 30*time.Second, f.inGroup)
	}
	f.enqueue("acme", 100, "d")
	f.waitFor("100 rejected", 60*time.Second, func() bool { return s.Stats().RejectedInjected >= 100 })
	s.setFaults(`{"error_rate":1}`)
	f.enqueue("acme", 4, "e") // fewer than the breaker's 5 failures in a row
	produceRaw([]byte("not a job"))
	f.waitFor("105 dead letters", 30*time.Second, func() bool { return f.deadList().Matched == 105 })
	s.setFaults(`{}`) // the provider fixed

	permanent := f.deadList("--reason", "permanent")
	for _, l := range permanent.Letters {
		if l.Reason != "permanent" || l.Status != 422 || l.Attempts != 1 || l.State != "dead" || !strings.HasPrefix(l.ID, "d-") ||
			l.Merchant == "" || l.DeadAt == "" || l.FirstSeen == "" || !strings.Contains(l.Error, "422") {
			t.Fatalf("a dead letter of the 422 phase: %+v", l)
		}
	}
	if permanent.Matched != 100 || len(permanent.Letters) != 100 {
		t.Fatalf("dead list --reason permanent: %d matched, %d shown, want 100", permanent.Matched, len(permanent.Letters))
	}
	f.deadBadInput()
	first := f.deadSelects(permanent)
	f.deadReplayKilled(first)
	f.deadAfterReplay()
}

// deadList runs dead list --json --limit 0 with more flags.
func (f *deadFleet) deadList(args ...string) deadListReport {
	f.t.Helper()
	r := f.dead(append([]string{"list", "--json", "--limit", "0"}, args...)...)
	var rep deadListReport
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rep) != nil {
		f.t.Fatalf("dead list %v: exit %d\n%s%s", args, r.code, r.stdout, r.stderr)
	}
	return rep
}

// dead runs worker dead <sub> --provider acme, with more flags.
func (f *deadFleet) dead(args ...string) result {
	f.t.Helper()
	return worker(f.t, f.env(), append([]string{"dead", args[0], "--config", f.cfg, "--provider", "acme"}, args[1:]...)...)
}

// deadReplay runs dead replay --json with more flags and reads its report.
func (f *deadFleet) deadReplay(wantCode int, args ...string) (deadReplayReport, result) {
	f.t.Helper()
	r := f.dead(append([]string{"replay", "--json"}, args...)...)
	var rep deadReplayReport
	if r.code != wantCode || json.Unmarshal([]byte(r.stdout), &rep) != nil {
		f.t.Fatalf("dead replay %v: exit %d, want %d\n%s%s", args, r.code, wantCode, r.stdout, r.stderr)
	}
	return rep, r
}

// deadBadInput: an unknown provider, --rate 0, purge without --yes: exit 2 with a message; an id that is
// not there, a dead letter that is no job: exit 3 with a message. None of them loses a dead letter.
func (f *deadFleet) deadBadInput() {
	f.t.Helper()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"list", "--provider", "nope"}, `provider "nope" is not configured`},
		{[]string{"replay", "--rate", "0"}, "--rate: must be more than 0 a second"},
		{[]string{"purge", "--reason", "invalid"}, "add --yes"},
		{[]string{"replay", "--reason", "typo"}, `--reason "typo" is not a reason`},
		{[]string{"replay", "--id", " "}, "--id names no job id"},
	} {
		if r := f.dead(c.args...); r.code != 2 || !strings.Contains(r.stderr, c.want) {
			f.t.Fatalf("dead %v: exit %d, want 2 and %q\n%s", c.args, r.code, c.want, r.stderr)
		}
	}
	_, r := f.deadReplay(3, "--id", "nope")
	if !strings.Contains(r.stderr, "1 ids not found") {
		f.t.Fatalf("dead replay --id nope:\n%s%s", r.stdout, r.stderr)
	}
	rep, r := f.deadReplay(3, "--reason", "invalid")
	if rep.Malformed != 1 || rep.Replayed != 0 || !strings.Contains(r.stderr, "is not a job: the body is not a JSON object; left dead") {
		f.t.Fatalf("dead replay --reason invalid: %+v\n%s", rep, r.stderr)
	}
	if n := f.deadList().States["dead"]; n != 105 {
		f.t.Fatalf("after the bad input: %d dead letters, want the 105", n)
	}
}

// deadSelects: --dry-run replays nothing, --id exactly those ids, --max the oldest N of the selection. It
// returns the 12 ids replayed.
func (f *deadFleet) deadSelects(permanent deadListReport) []string {
	f.t.Helper()
	dry, _ := f.deadReplay(0, "--reason", "attempts-exhausted", "--dry-run")
	if !dry.DryRun || dry.Replayed != 4 || len(dry.Letters) != 4 || dry.Letters[0].Status != 500 {
		f.t.Fatalf("dry run: %+v", dry)
	}
	if rep, _ := f.deadReplay(0, "--id", "d-7,d-3"); rep.Replayed != 2 || rep.Matched != 2 {
		f.t.Fatalf("--id d-7,d-3: %+v", rep)
	}
	if rep, _ := f.deadReplay(0, "--reason", "permanent", "--max", "10"); rep.Replayed != 10 || rep.Left != 88 {
		f.t.Fatalf("--max 10: %+v", rep)
	}
	want := []string{"d-3", "d-7"}
	for _, l := range permanent.Letters {
		if len(want) < 12 && l.ID != "d-3" && l.ID != "d-7" {
			want = append(want, l.ID) // the oldest 10 others
		}
	}
	s := f.sims["acme"]
	f.waitFor("12 accepted", 30*time.Second, func() bool { return s.Stats().Accepted >= 12 })
	got := s.AcceptedKeys()
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		f.t.Fatalf("accepted %v, want %v", got, want)
	}
	if st := f.deadList().States; st["dead"] != 93 || (f.kafka && st["replayed"] != 12) {
		f.t.Fatalf("after 12 replayed: %v", st)
	}
	return want
}

// deadReplayKilled: dead replay --rate 20 killed -9 about halfway, then run again: the 88 left are each
// accepted exactly once, and the copies left at most 20 in any second.
func (f *deadFleet) deadReplayKilled(first []string) {
	f.t.Helper()
	s := f.sims["acme"]
	cmd := exec.Command(binary, "dead", "replay", "--config", f.cfg, "--provider", "acme", "--reason", "permanent", "--rate", "20")
	cmd.Env = f.env()
	progress, err := cmd.StderrPipe()
	if err != nil {
		f.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	// Killed once its own progress line (one a second) says 40 or more of the 88 are replayed: the
	// workers' pace, whatever it is on a busy machine, has no say in when.
	for sc, n := bufio.NewScanner(progress), 0; n < 40 && sc.Scan(); {
		_, _ = fmt.Sscanf(sc.Text(), "dead replay: %d replayed", &n)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	rep, _ := f.deadReplay(0, "--reason", "permanent", "--rate", "20")
	if rep.Replayed != rep.Matched || rep.Replayed == 0 || rep.Replayed >= 88 {
		f.t.Fatalf("the second run: %+v", rep)
	}
	f.waitFor("100 accepted", 30*time.Second, func() bool { return s.Stats().Accepted >= 100 })
	keys := s.AcceptedKeys()
	sort.Strings(keys)
	if !slices.Equal(keys, ids("d", 100)) || s.Stats().Accepted != 100 {
		f.t.Fatalf("accepted %d: %v", s.Stats().Accepted, keys)
	}
	f.t.Logf("the killed run's copies and the second run's %d: %d requests absorbed by the idempotency key", rep.Replayed, s.Stats().Duplicates)
	f.checkReplayPace(first)
}

// checkReplayPace holds the copies of the --rate 20 runs (the jobs not among the first 12) to 20 a
// second: each result's first_seen is its copy's, stamped as the copy left the replay.
func (f *deadFleet) checkReplayPace(first []string) {
	f.t.Helper()
	kind := "rabbitmq"
	if f.kafka {
		kind = "kafka"
	}
	var stamps []time.Time
	var results []consumers.Result
	f.waitFor("100 succeeded results", 30*time.Second, func() bool {
		results = results[:0]
		for _, b := range f.results(kind) {
			var r consumers.Result
			if json.Unmarshal(b, &r) == nil && r.Outcome == consumers.ResultSucceeded {
				results = append(results, r)
			}
		}
		return len(results) >= 100
	})
	for _, r := range results {
		at, err := time.Parse(deadTime, r.FirstSeen)
		if err != nil || r.Attempts != 1 {
			f.t.Fatalf("result %+v", r)
		}
		if !slices.Contains(first, r.ID) {
			stamps = append(stamps, at)
		}
	}
	sort.Slice(stamps, func(i, j int) bool { return stamps[i].Before(stamps[j]) })
	worst := 0
	for i := range stamps {
		j := sort.Search(len(stamps), func(j int) bool { return !stamps[j].Before(stamps[i].Add(999 * time.Millisecond)) })
		worst = max(worst, j-i)
	}
	f.t.Logf("the most copies stamped within a second: %d", worst)
	if worst > 20 {
		f.t.Fatalf("%d copies left the replay within a second, want at most 20", worst)
	}
}

// deadAfterReplay: the 100 are gone from dead list (RabbitMQ) or shown replayed (Kafka); the others stay;
// purge takes the one that is no job.
func (f *deadFleet) deadAfterReplay() {
	f.t.Helper()
	perm := f.deadList("--reason", "permanent")
	if (!f.kafka && perm.Matched != 0) || (f.kafka && (perm.Matched != 100 || perm.States["replayed"] != 100)) {
		f.t.Fatalf("dead list --reason permanent after the replay: matched %d, %v", perm.Matched, perm.States)
	}
	if st := f.deadList().States; st["dead"] != 5 {
		f.t.Fatalf("after the replay: %v, want the 5 others still dead", st)
	}
	r := f.dead("purge", "--reason", "invalid", "--yes", "--json")
	var rep deadPurgeReport
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rep) != nil || rep.Purged != 1 {
		f.t.Fatalf("purge: exit %d %s%s", r.code, r.stdout, r.stderr)
	}
	if st := f.deadList("--reason", "invalid").States; st["dead"] != 0 || (f.kafka && st["purged"] != 1) {
		f.t.Fatalf("after the purge: %v", st)
	}
}
