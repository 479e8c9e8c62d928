package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/paygate/paygate/providers/sim"
)

// Twenty jobs with a not_before 5 s ahead, through a worker process: none reaches the provider before
// it; each went on its first attempt (its result says attempts 1), having waited in the delay tiers and
// in-process, not at the gate.
func TestNotBeforeE2E(t *testing.T) {
	const n = 20
	f := newFleet(t, simProvider{name: "acme", limits: []sim.Window{{Limit: 50, Per: time.Second}}})
	f.withResults("acme")
	f.established()
	notBefore := time.Now().Add(5 * time.Second)
	var b bytes.Buffer
	for i := range n {
		fmt.Fprintf(&b, `{"id":"nb-%d","provider":"acme","amount":1,"currency":"EUR","not_before":%q}`+"\n", i, notBefore.Format(time.RFC3339Nano))
	}
	file := filepath.Join(f.dir, "scheduled.jsonl")
	if err := os.WriteFile(file, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, "enqueue", "--config", f.cfg, "--file", file)
	cmd.Env = f.env()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("enqueue: %v %s", err, out)
	}
	f.startWorker()
	s := f.sims["acme"]
	f.waitFor("every job accepted", 30*time.Second, func() bool { return s.Stats().Accepted >= n })
	f.stopAll()
	var at map[string]time.Time
	s.get("/accepted", &at)
	for id, when := range at {
		if when.Before(notBefore) {
			t.Errorf("%s reached the provider %s before its not_before", id, notBefore.Sub(when))
		}
	}
	byID, twice := resultsOf(t, f.results("rabbitmq"))
	if len(byID) != n || twice != 0 {
		t.Fatalf("%d results (%d twice), want %d", len(byID), twice, n)
	}
	for id, r := range byID {
		if r.Outcome != "succeeded" || r.Attempts != 1 {
			t.Fatalf("%s: %+v, want succeeded on its first attempt", id, r)
		}
	}
}
