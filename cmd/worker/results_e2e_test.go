package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/providers/sim"
)

// withResults turns results on for the fleet's workers and tools, and makes the provider's declines
// answers: a 402, or a body whose status says declined.
func (f *fleet) withResults(provider string) {
	f.t.Helper()
	f.env2 = append(f.env2, "PAYGATE_RESULTS_ENABLED=true")
	fh, err := os.OpenFile(f.cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = fh.WriteString("    declined_when: {statuses: [402], json: {field: status, values: [declined]}}\n")
		fh.Close()
	}
	if err != nil {
		f.t.Fatal(err)
	}
	if !strings.HasSuffix(strings.TrimSpace(f.readConfig()), "values: [declined]}}") || !strings.Contains(f.readConfig(), "  "+provider+":") {
		f.t.Fatalf("the provider %s is not the config's last:\n%s", provider, f.readConfig())
	}
}

func (f *fleet) readConfig() string {
	b, err := os.ReadFile(f.cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	return string(b)
}

// mixedJobs writes n plain jobs (ids <prefix>-<i>) and declines ones of each kind (<prefix>-ds-<i>,
// declined by status; <prefix>-db-<i>, by the body), as a JSON-lines file, and enqueues it.
func (f *fleet) mixedJobs(provider, prefix string, n, declines int) {
	f.t.Helper()
	var b bytes.Buffer
	for i := range n {
		fmt.Fprintf(&b, `{"id":"%s-%d","provider":%q,"amount":%d,"currency":"EUR"}`+"\n", prefix, i, provider, 100+i)
	}
	for i := range declines {
		fmt.Fprintf(&b, `{"id":"%s-ds-%d","provider":%q,"amount":1,"currency":"EUR","payload":{"simulate":%q}}`+"\n", prefix, i, provider, sim.DeclineStatus)
		fmt.Fprintf(&b, `{"id":"%s-db-%d","provider":%q,"amount":1,"currency":"EUR","payload":{"simulate":%q}}`+"\n", prefix, i, provider, sim.DeclineBody)
	}
	file := filepath.Join(f.dir, prefix+".jsonl")
	if err := os.WriteFile(file, b.Bytes(), 0o600); err != nil {
		f.t.Fatal(err)
	}
	cmd := exec.Command(binary, "enqueue", "--config", f.cfg, "--file", file)
	cmd.Env = f.env()
	if out, err := cmd.CombinedOutput(); err != nil {
		f.t.Fatalf("enqueue: %v %s", err, out)
	}
}

// resultsOf parses results, one JSON body each, by id; a second result of an id is counted in twice.
func resultsOf(t *testing.T, bodies [][]byte) (byID map[string]consumers.Result, twice int) {
	t.Helper()
	byID = map[string]consumers.Result{}
	for _, b := range bodies {
		var r consumers.Result
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("a result that is not JSON: %q", b)
		}
		if _, ok := byID[r.ID]; ok {
			twice++
		}
		byID[r.ID] = r
	}
	return byID, twice
}

// checkResults holds each result to its job: n succeeded with the provider's transaction id and status
// 200, declines declined (by a 402, or by the body), none dead, none twice.
func checkResults(t *testing.T, byID map[string]consumers.Result, twice int, prefix string, n, declines int) {
	t.Helper()
	if len(byID) != n+2*declines || twice != 0 {
		t.Fatalf("%d results (%d twice), want %d, each once", len(byID), twice, n+2*declines)
	}
	for id, r := range byID {
		var body struct {
			Status        string `json:"status"`
			TransactionID string `json:"transaction_id"`
		}
		if r.Response == nil || json.Unmarshal(r.Response.Body, &body) != nil {
			t.Fatalf("%s: no JSON answer in %+v", id, r)
		}
		want, status := "succeeded", 200
		switch {
		case strings.HasPrefix(id, prefix+"-ds-"):
			want, status = "declined", 402
		case strings.HasPrefix(id, prefix+"-db-"):
			want = "declined"
		}
		if r.Outcome != want || r.Status != status || r.Provider != "acme" || r.Attempts != 1 || r.SentAt == "" ||
			(want == "succeeded" && body.TransactionID != "T-"+id) || r.Response.Headers["Request-Id"] == "" {
			t.Fatalf("%s: %+v (body %+v), want %s with status %d", id, r, body, want, status)
		}
	}
}

// lines collects a process's output lines as they come.
type lines struct {
	mu  sync.Mutex
	all [][]byte
}

func (l *lines) read(t *testing.T, cmd *exec.Cmd) {
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			l.mu.Lock()
			l.all = append(l.all, bytes.Clone(sc.Bytes()))
			l.mu.Unlock()
		}
	}()
}

func (l *lines) get() [][]byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([][]byte(nil), l.all...)
}

// On RabbitMQ: two worker processes, 200 payments and 6 declines. Every job has one result in X.results
// (routing key <provider>.<outcome>), with the provider's status, headers and body; the declines are
// results, not dead letters, and were sent once each; `worker results --follow --json` saw each as it
// came, on a queue of its own.
func TestResultsRabbitMQ(t *testing.T) {
	const n, declines = 200, 3
	f := newFleet(t, simProvider{name: "acme", limits: []sim.Window{{Limit: 50, Per: time.Second}}})
	f.withResults("acme")
	f.established()
	follower := exec.Command(binary, "results", "--config", f.cfg, "--follow", "--json")
	follower.Env = f.env()
	var stderr bytes.Buffer
	var mu sync.Mutex
	follower.Stderr = writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return stderr.Write(p) })
	var seen lines
	seen.read(t, follower)
	if err := follower.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = follower.Process.Kill(); _ = follower.Wait() })
	f.waitFor("the follower bound", 20*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(stderr.String(), "results: following exchange "+f.x+".results (#) from now on")
	})
	f.mixedJobs("acme", "r", n, declines)
	f.startWorker()
	f.startWorker()
	s := f.sims["acme"]
	f.waitFor("every job answered", 60*time.Second, func() bool {
		st := s.Stats()
		return st.Accepted >= n && st.Declined >= 2*declines
	})
	f.waitFor("the follower's results", 20*time.Second, func() bool { return len(seen.get()) >= n+2*declines })
	f.stopAll()

	var bodies [][]byte
	for _, m := range f.drain(f.x + ".results") {
		var r consumers.Result
		_ = json.Unmarshal(m.Body, &r)
		if m.RoutingKey != "acme."+r.Outcome || m.MessageId != r.ID {
			t.Fatalf("routing key %q, message id %q for %s", m.RoutingKey, m.MessageId, m.Body)
		}
		bodies = append(bodies, m.Body)
	}
	byID, twice := resultsOf(t, bodies)
	checkResults(t, byID, twice, "r", n, declines)
	followed, twice := resultsOf(t, seen.get())
	checkResults(t, followed, twice, "r", n, declines)
	st := s.Stats()
	if dead := f.drain(f.x + ".dead"); len(dead) != 0 || st.Requests != n+2*declines || st.Violations != 0 {
		t.Fatalf("%d dead letters, %d requests (want %d: a decline is never retried), stats %+v", len(dead), st.Requests, n+2*declines, st)
	}
}

type writerFunc func([]byte) (int, error)

func (w writerFunc) Write(p []byte) (int, error) { return w(p) }

// On Kafka: the same mix through two workers; every job has one result in T.results (key the job id), and
// `worker results --json` without --follow prints them all, from the oldest, then stops.
func TestResultsKafka(t *testing.T) {
	const n, declines = 100, 2
	f, _ := newKafkaFleet(t, simProvider{name: "acme", limits: []sim.Window{{Limit: 50, Per: time.Second}}})
	f.withResults("acme")
	f.established()
	f.startWorker()
	f.startWorker()
	f.waitFor("both workers in the group", 30*time.Second, f.inGroup)
	f.mixedJobs("acme", "k", n, declines)
	s := f.sims["acme"]
	f.waitFor("every job answered", 60*time.Second, func() bool {
		st := s.Stats()
		return st.Accepted >= n && st.Declined >= 2*declines
	})
	f.stopAll()
	r := worker(t, f.env(), "results", "--config", f.cfg, "--json")
	if r.code != 0 {
		t.Fatalf("worker results: status %d\n%s", r.code, r.stderr)
	}
	var bodies [][]byte
	for l := range strings.SplitSeq(strings.TrimSpace(r.stdout), "\n") {
		bodies = append(bodies, []byte(l))
	}
	byID, twice := resultsOf(t, bodies)
	checkResults(t, byID, twice, "k", n, declines)
	if st := s.Stats(); st.Requests != n+2*declines || st.Violations != 0 {
		t.Fatalf("%d requests, want %d (a decline is never retried): %+v", st.Requests, n+2*declines, st)
	}
}

// A worker killed -9 right after a job's result was confirmed and before its delivery was acknowledged
// (the fault FaultKillAfterResult injects): the job comes back to another worker, is sent again under its
// idempotency key (the provider answers the same), and gets a second result with the same id. Every job
// has a result; none has none. On both brokers.
func TestResultsKilledBeforeTheAck(t *testing.T) {
	for _, kind := range []string{"rabbitmq", "kafka"} {
		t.Run(kind, func(t *testing.T) {
			const n = 30
			acme := simProvider{name: "acme", limits: []sim.Window{{Limit: 20, Per: time.Second}}}
			f := newFleet(t, acme)
			if kind == "kafka" {
				f, _ = newKafkaFleet(t, acme)
			}
			f.withResults("acme")
			f.established()
			victim := "x-7"
			f.env2 = append(f.env2, FaultKillAfterResult+"="+victim)
			w := f.startWorker()
			f.env2 = f.env2[:len(f.env2)-1]
			if kind == "kafka" {
				f.waitFor("the worker in the group", 30*time.Second, f.inGroup)
			}
			f.mixedJobs("acme", "x", n, 0)
			exited := make(chan error, 1)
			go func() { exited <- w.Wait() }()
			select {
			case err := <-exited:
				if err == nil || !strings.Contains(err.Error(), "killed") {
					t.Fatalf("the worker ended with %v, want killed", err)
				}
			case <-time.After(60 * time.Second):
				t.Fatal("the worker did not kill itself after the victim's result")
			}
			f.startWorker()
			s := f.sims["acme"]
			f.waitFor("every job accepted", 90*time.Second, func() bool { return s.Stats().Accepted >= n })
			var bodies [][]byte
			f.waitFor("the victim's second result", 60*time.Second, func() bool {
				bodies = f.results(kind)
				count := 0
				for _, b := range bodies {
					if bytes.Contains(b, []byte(`"id":"`+victim+`"`)) {
						count++
					}
				}
				return count >= 2
			})
			f.stopAll()
			byID, twice := resultsOf(t, bodies)
			if len(byID) != n || twice < 1 {
				t.Fatalf("%d ids with results (want %d), %d second results (want the victim's at least)", len(byID), n, twice)
			}
			for id, r := range byID {
				if r.Outcome != "succeeded" || r.Status != 200 {
					t.Fatalf("%s: %+v", id, r)
				}
			}
			if st := s.Stats(); st.Accepted != n || st.Duplicates < 1 || st.Violations != 0 {
				t.Fatalf("provider %+v: want %d accepted, the victim's repeat absorbed by its key", st, n)
			}
		})
	}
}

// results reads every result published so far: on RabbitMQ it drains the X.results queue (what it drained
// is kept, for the next call), on Kafka it reads T.results whole.
func (f *fleet) results(kind string) [][]byte {
	f.t.Helper()
	if kind == "kafka" {
		r := worker(f.t, f.env(), "results", "--config", f.cfg, "--json")
		var out [][]byte
		for l := range strings.SplitSeq(strings.TrimSpace(r.stdout), "\n") {
			if l != "" {
				out = append(out, []byte(l))
			}
		}
		return out
	}
	for _, m := range f.drain(f.x + ".results") {
		f.drained = append(f.drained, m.Body)
	}
	return f.drained
}
