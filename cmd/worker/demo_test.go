package main

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/paygate/paygate/demo"
	"github.com/paygate/paygate/internal/testenv"
)

// demoRun runs "worker demo --json" with args and checks the promise: exit 0, nothing lost, at
// least two providers, no violations, utilisation >= minUtil each, and something dispatched and
// dead-lettered (every 200th job is invalid on purpose).
func demoRun(t *testing.T, minUtil float64, args ...string) *demo.Summary {
	t.Helper()
	r := worker(t, nil, append([]string{"demo", "--json", "--verbose"}, args...)...)
	defer func() {
		if t.Failed() { // the progress lines and the workers' warnings: when dispatching began, and why not
			t.Logf("stderr:\n%s", r.stderr)
		}
	}()
	if r.code != 0 {
		t.Fatalf("demo exited %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	var s demo.Summary
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, r.stdout)
	}
	if s.Lost != 0 || s.Enqueued == 0 || s.Settled+s.Pending != s.Enqueued {
		t.Fatalf("ledger: %d enqueued, %d settled, %d pending, %d lost %v", s.Enqueued, s.Settled, s.Pending, s.Lost, s.LostIDs)
	}
	if len(s.Providers) < 2 {
		t.Fatalf("%d providers, want at least 2", len(s.Providers))
	}
	dead := 0
	for _, p := range s.Providers {
		if p.Violations != 0 || p.Utilization < minUtil || p.Dispatched == 0 {
			t.Errorf("%s: %d violations, utilisation %.3f, %d dispatched", p.Name, p.Violations, p.Utilization, p.Dispatched)
		}
		dead += p.DeadLettered
	}
	if dead == 0 && s.Enqueued >= 200 {
		t.Error("no dead letters, though the producer sends invalid jobs")
	}
	return &s
}

// The "done when": no servers needed, 20 seconds, within the time asked.
func TestDemoAcceptance(t *testing.T) {
	s := demoRun(t, 0.95, "--duration", "20s")
	if s.Seconds > 21 || !strings.Contains(s.Broker, "embedded") || !strings.Contains(s.Redis, "embedded") {
		t.Fatalf("ran %.1fs on broker %q, redis %q; want <= 21s, both embedded", s.Seconds, s.Broker, s.Redis)
	}
}

// The same on real RabbitMQ and Redis; the demo deletes its topology afterwards. 18 s gives about ten
// seconds of dispatching to measure (the rest is the warm-up and the drain): at the five that 12 s gave,
// each unit initech's injected 500s spend is 0.8 % of its measured budget.
func TestDemoOnRabbitMQ(t *testing.T) {
	s := demoRun(t, 0.95, "--duration", "18s", "--workers", "2", "--rabbitmq", testenv.AMQPURL(), "--redis", testenv.RedisAddr())
	if s.Broker != "rabbitmq" || s.Redis != testenv.RedisAddr() {
		t.Fatalf("broker %q, redis %q", s.Broker, s.Redis)
	}
	out, err := exec.Command("rabbitmqctl", "list_queues", "-q", "name").Output()
	if err == nil && strings.Contains(string(out), "paygate-demo-") {
		t.Fatalf("demo queues left behind:\n%s", out)
	}
}

// --jobs alone runs until every job is settled: nothing pending. (A provider whose jobs run out within a
// window is not busy for a whole window: its utilisation says so and is not checked.)
func TestDemoJobs(t *testing.T) {
	s := demoRun(t, 0, "--jobs", "150", "--workers", "2")
	if s.Enqueued != 150 || s.Pending != 0 || s.Settled != 150 {
		t.Fatalf("%d enqueued, %d settled, %d pending; want 150 settled", s.Enqueued, s.Settled, s.Pending)
	}
}

func TestDemoBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"demo", "--workers", "0"},
		{"demo", "--rabbitmq", "amqp://x", "--kafka", "127.0.0.1:9092"},
		{"demo", "--duration", "fast"},
	} {
		r := worker(t, nil, args...)
		if r.code != 2 || !strings.Contains(r.stderr, "demo") {
			t.Errorf("%v: exit %d, stderr %q; want 2 and a message", args, r.code, r.stderr)
		}
	}
}

// The progress bars redraw in place only on a terminal: /dev/null is a character device, not one.
func TestIsTerminal(t *testing.T) {
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	if isTerminal(null) {
		t.Error("/dev/null taken for a terminal")
	}
	if isTerminal(io.Discard) {
		t.Error("a non-file writer taken for a terminal")
	}
}
