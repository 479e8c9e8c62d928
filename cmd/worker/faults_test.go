package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/providers/sim"
)

// The fault suite (make test-faults): real worker processes against real Redis and RabbitMQ, with a fault
// injected during a busy run with a backlog, and the ledger after it. Every test is named TestFault so
// that make test can run the suite as a step of its own.

// redisProc is a redis-server of the test's own, so that it can be paused, flushed and restarted
// without disturbing anything else on the machine. It keeps nothing on disk, like the CI Redis.
type redisProc struct {
	t    *testing.T
	port int
	args []string // beyond the port, the address and no persistence
	cmd  *exec.Cmd
	rdb  *redis.Client
}

func startRedis(t *testing.T) *redisProc { return startRedisWith(t, "") }

// startRedisWith starts a redis-server of the test's own that wants password ("": none).
func startRedisWith(t *testing.T, password string) *redisProc {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	r := &redisProc{t: t, port: port, rdb: redis.NewClient(&redis.Options{Addr: loopback(port), Password: password, MaxRetries: -1})}
	if password != "" {
		r.args = []string{"--requirepass", password}
	}
	r.start()
	t.Cleanup(func() { r.rdb.Close(); r.kill() })
	return r
}

func loopback(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }

func (r *redisProc) addr() string { return loopback(r.port) }

func (r *redisProc) start() {
	r.t.Helper()
	r.cmd = exec.Command("redis-server", append([]string{"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", r.t.TempDir()}, r.args...)...)
	if err := r.cmd.Start(); err != nil {
		r.t.Fatalf("redis-server (scripts/services.sh installs it): %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for r.rdb.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			r.t.Fatal("redis-server did not answer within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill ends the server at once (SIGKILL): whatever it held is gone.
func (r *redisProc) kill() {
	if r.cmd != nil && r.cmd.ProcessState == nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
	}
}

func (r *redisProc) do(args ...any) {
	r.t.Helper()
	if err := r.rdb.Do(context.Background(), args...).Err(); err != nil {
		r.t.Fatalf("redis %v: %v", args, err)
	}
}

// setFaults posts to the simulator's /faults.
func (s *simProc) setFaults(faults string) {
	s.t.Helper()
	resp, err := http.Post(s.url+"/faults", "application/json", strings.NewReader(faults))
	if err != nil {
		s.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		s.t.Fatalf("POST /faults %s: %s", faults, resp.Status)
	}
}

// rabbitmqctl runs the broker's admin tool (as root, or with sudo, as scripts/services.sh does).
func rabbitmqctl(t *testing.T, args ...string) string {
	t.Helper()
	name, full := "rabbitmqctl", args
	if os.Getuid() != 0 {
		name, full = "sudo", append([]string{"rabbitmqctl"}, args...)
	}
	out, err := exec.Command(name, full...).CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// cutConnections closes the fleet's RabbitMQ connections from the broker's side, as
// close_all_connections does, but only the fleet's: the adapter names its connections after the exchange.
func (f *fleet) cutConnections() int {
	f.t.Helper()
	n := 0
	for line := range strings.SplitSeq(rabbitmqctl(f.t, "list_connections", "pid", "client_properties", "-q", "--no-table-headers"), "\n") {
		pid, props, ok := strings.Cut(line, "\t")
		if ok && strings.Contains(props, `{"connection_name","paygate-`) && strings.Contains(props, " "+f.x+`"}`) {
			rabbitmqctl(f.t, "close_connection", pid, "fault test: connection cut")
			n++
		}
	}
	return n
}

// faultFleet is a RabbitMQ fleet on a Redis of its own, one strict provider, and the jobs enqueued.
func faultFleet(t *testing.T, rp *redisProc, p simProvider, jobs int, env ...string) *fleet {
	t.Helper()
	f := newFleet(t, p)
	if rp != nil {
		f.env2 = append(f.env2, "PAYGATE_REDIS_ADDRS="+rp.addr())
	}
	f.env2 = append(f.env2, env...)
	f.enqueue(p.name, jobs, "j")
	return f
}

// exactlyOnce: every job charged exactly once, nothing dead-lettered, nothing left; no violation.
func (f *fleet) exactlyOnce(provider string, jobs int) sim.Stats {
	f.t.Helper()
	l := f.collect()
	l.check(f.t, ids("j", jobs))
	st := f.sims[provider].Stats()
	f.t.Logf("provider: accepted %d, replays absorbed %d, violations %d, 429s early %d, 500s/hangs %d, cut %d",
		st.Accepted, st.Duplicates, st.Violations, st.EarlyAfter429, st.ErrorsInjected, st.DownRefused)
	if st.Violations != 0 || st.Accepted != int64(jobs) || len(l.accepted) != jobs || len(l.dead) != 0 || len(l.queued) != 0 {
		f.t.Errorf("want %d accepted exactly once, 0 violations, nothing dead or queued: stats %+v, dead %v, queued %d", jobs, st, l.dead, len(l.queued))
	}
	return st
}

// killAndReplace kills a worker with SIGKILL (no shutdown, nothing settled) and starts another.
func (f *fleet) killAndReplace(victim *exec.Cmd) {
	f.t.Helper()
	if err := victim.Process.Signal(syscall.SIGKILL); err != nil {
		f.t.Fatal(err)
	}
	_ = victim.Wait()
	f.startWorker()
}

func (f *fleet) accepted(provider string) int64 { return f.sims[provider].Stats().Accepted }

func (f *fleet) waitAccepted(provider string, n int64, timeout time.Duration) {
	f.t.Helper()
	f.waitFor(fmt.Sprintf("%d accepted", n), timeout, func() bool { return f.accepted(provider) >= n })
}

// The acceptance run: connections cut, scripts flushed, Redis paused for two seconds, and one
// worker killed -9 and replaced, while 300 jobs go through a strict provider at 25/s: every job accepted
// exactly once, 0 violations, nothing dead-lettered.
func TestFaultAcceptance(t *testing.T) {
	rp := startRedis(t)
	f := faultFleet(t, rp, simProvider{name: "acme", limits: []sim.Window{{Limit: 25, Per: time.Second}}, args: []string{"--latency", "50ms"}}, 300)
	victim := f.startWorker()
	f.startWorker()
	f.waitAccepted("acme", 40, time.Minute)
	if n := f.cutConnections(); n < 4 {
		t.Fatalf("cut %d connections, want the 2 workers' 4", n)
	}
	f.waitAccepted("acme", 90, time.Minute)
	rp.do("SCRIPT", "FLUSH")
	rp.do("FUNCTION", "FLUSH")
	f.waitAccepted("acme", 140, time.Minute)
	rp.do("CLIENT", "PAUSE", 2000, "ALL")
	time.Sleep(2 * time.Second)
	f.waitAccepted("acme", 190, time.Minute)
	f.killAndReplace(victim)
	f.waitAccepted("acme", 300, 2*time.Minute)
	f.stopAll()
	f.exactlyOnce("acme", 300)
}

// Redis faults, one after another in a busy run: scripts and functions flushed (workers load them again), the server
// paused (decisions wait), down for three seconds (nothing is dispatched once the reservations handed
// out before have passed; jobs are deferred), and restarted at once, its log gone (the warm-up holds
// the provider, so the requests sent just before and the reservations still held cannot share a window
// with what is admitted after).
func TestFaultRedis(t *testing.T) {
	rp := startRedis(t)
	const maxWait = time.Second
	f := faultFleet(t, rp, simProvider{name: "acme", limits: []sim.Window{{Limit: 25, Per: time.Second}}}, 400,
		"PAYGATE_WORKER_MAX_INLINE_WAIT="+maxWait.String())
	f.startWorker()
	f.startWorker()
	f.waitAccepted("acme", 40, time.Minute)
	rp.do("SCRIPT", "FLUSH")
	rp.do("FUNCTION", "FLUSH")
	f.waitAccepted("acme", 80, time.Minute)
	rp.do("CLIENT", "PAUSE", 2000, "ALL")
	f.waitAccepted("acme", 120, time.Minute)

	rp.kill()
	time.Sleep(maxWait + f.margin + 300*time.Millisecond) // reservations handed out before run out
	before := f.accepted("acme")
	time.Sleep(2 * time.Second)
	if during := f.accepted("acme") - before; during != 0 {
		t.Errorf("%d jobs dispatched while Redis was down, after every reservation had passed", during)
	}
	rp.start()
	f.waitAccepted("acme", before+60, time.Minute)

	rp.kill() // a restart: the log, the pause and the epoch are gone
	rp.start()
	// The first decision after it finds no epoch and warms up: the provider is paused (the key lives one
	// second past the pause's end) for 1s + margin + max_inline_wait.
	keys := f.gateKeys("acme")
	f.waitFor("the first decision after the restart", 10*time.Second, func() bool {
		return rp.rdb.Exists(context.Background(), keys[len(keys)-1]).Val() == 1
	})
	if ttl := rp.rdb.PTTL(context.Background(), keys[1]).Val(); ttl < 1500*time.Millisecond {
		t.Errorf("no warm-up pause after the restart: the pause key's TTL is %v", ttl)
	}
	f.waitAccepted("acme", 400, 2*time.Minute)
	f.stopAll()
	f.exactlyOnce("acme", 400)
	if logs := f.logs(); !strings.Contains(logs, "gate unreachable: deferring jobs") {
		t.Errorf("no worker logged the outage")
	}
}

// Redis killed and started again at once, empty, while the workers sleep on reservations up to
// max_inline_wait (3s) ahead, well past the warm-up (1s + margin + consumers.LossNotice). The workers
// hear of the loss (their pub/sub connection breaks; the warm-up is announced) and give those slots up:
// none is sent beside the jobs the new state admits. Nothing over the limit, nothing lost or doubled.
// (Sent on their old slots, they put 1 to 5 requests over the limit in each run tried.)
func TestFaultRedisRestartUnderReservations(t *testing.T) {
	rp := startRedis(t)
	f := faultFleet(t, rp, simProvider{name: "acme", limits: []sim.Window{{Limit: 5, Per: time.Second}}}, 60,
		"PAYGATE_WORKER_MAX_INLINE_WAIT=3s")
	f.startWorker()
	f.startWorker()
	f.waitAccepted("acme", 10, time.Minute) // 16 handlers hold slots 204ms apart, up to 3s ahead
	rp.kill()
	rp.start()
	f.waitAccepted("acme", 60, 2*time.Minute)
	f.stopAll()
	f.exactlyOnce("acme", 60)
}

// settledLine is a worker's one log line per settled job.
type settledLine struct {
	Msg, Provider, Outcome, Admission, Job string
	Late                                   float64 // seconds after the slot
	Waited                                 float64 // seconds waited for the slot
}

// settled reads every worker's "job settled" lines.
func (f *fleet) settled() []settledLine {
	var out []settledLine
	for line := range strings.SplitSeq(f.logs(), "\n") {
		var l settledLine
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "job settled" {
			out = append(out, l)
		}
	}
	return out
}

// finalOutcomes counts, per provider, the distinct jobs the workers' log lines say ended: accepted, or
// dead-lettered.
func (f *fleet) finalOutcomes() map[string]int {
	ended := map[string]map[string]bool{}
	for _, l := range f.settled() {
		switch l.Outcome {
		case "succeeded", "exhausted", "permanent", "invalid":
			if ended[l.Provider] == nil {
				ended[l.Provider] = map[string]bool{}
			}
			ended[l.Provider][l.Job] = true
		}
	}
	out := map[string]int{}
	for p, jobs := range ended {
		out[p] = len(jobs)
	}
	return out
}

// logs is every worker's output.
func (f *fleet) logs() string {
	var b bytes.Buffer
	paths, _ := filepath.Glob(filepath.Join(f.dir, "worker-*.log"))
	for _, p := range paths {
		out, _ := os.ReadFile(p)
		b.Write(out)
	}
	return b.String()
}

// The broker's connections cut, then the broker restarted (stop_app, start_app): workers reconnect,
// redeclare and resume; nothing lost, nothing charged twice.
func TestFaultBroker(t *testing.T) {
	f := faultFleet(t, nil, simProvider{name: "acme", limits: []sim.Window{{Limit: 25, Per: time.Second}}}, 300)
	f.startWorker()
	f.startWorker()
	f.waitAccepted("acme", 50, time.Minute)
	if n := f.cutConnections(); n < 4 {
		t.Fatalf("cut %d connections, want the 2 workers' 4", n)
	}
	f.waitAccepted("acme", 120, time.Minute)
	rabbitmqctl(t, "stop_app")
	time.Sleep(2 * time.Second)
	rabbitmqctl(t, "start_app")
	rabbitmqctl(t, "await_startup")
	f.waitAccepted("acme", 300, 2*time.Minute)
	f.stopAll()
	f.exactlyOnce("acme", 300)
}

// A worker killed with SIGKILL while requests are in flight (the provider takes 300ms to answer), and
// replaced: its unacknowledged jobs are redelivered, and the provider charges each key once.
func TestFaultKillMidDispatch(t *testing.T) {
	// A second per request: about 12 of the victim's requests are at the provider at any moment, so the
	// kill lands mid-dispatch even if the victim paused dispatching for a while (with 300ms, 1 run in 5
	// saw no replay: nothing of the victim's was in flight when it died).
	f := faultFleet(t, nil, simProvider{name: "acme", limits: []sim.Window{{Limit: 25, Per: time.Second}}, args: []string{"--latency", "1s"}}, 250)
	victim := f.startWorker()
	f.startWorker()
	f.waitAccepted("acme", 60, time.Minute)
	f.killAndReplace(victim)
	f.waitAccepted("acme", 250, 2*time.Minute)
	f.stopAll()
	st := f.exactlyOnce("acme", 250)
	if st.Duplicates == 0 {
		t.Errorf("no replay reached the provider: the kill did not land mid-dispatch")
	}
}

// Provider faults, four providers at once in one fleet: 20% 500s; hung requests past the timeout; a 429
// storm with Retry-After; a provider down for a minute. Every job ends accepted or dead-lettered
// after max_attempts (down's breaker opens after five failures in a row: its jobs wait for the probe
// rather than spend their attempts); the cluster pauses together on 429 (no request arrives before a
// Retry-After ran out); no violations.
func TestFaultProviders(t *testing.T) {
	w := []sim.Window{{Limit: 20, Per: time.Second}}
	f := newFleet(t,
		simProvider{name: "flaky", limits: w, args: []string{"--error-rate", "0.2"}},
		simProvider{name: "hangs", limits: w, args: []string{"--timeout-rate", "0.1"}},
		simProvider{name: "storm", limits: w},
		simProvider{name: "down", limits: w})
	f.margin = 30 * time.Millisecond // seven busy processes on two cores
	const maxAttempts = 5
	f.env2 = append(f.env2, "PAYGATE_WORKER_MAX_ATTEMPTS="+strconv.Itoa(maxAttempts), "PAYGATE_PROVIDERS_HANGS_TIMEOUT=1s")
	jobs := map[string]int{"flaky": 200, "hangs": 150, "storm": 200, "down": 150}
	for p, n := range jobs {
		f.enqueue(p, n, p)
	}
	f.startWorker()
	f.startWorker()
	f.startWorker()
	f.waitAccepted("storm", 40, time.Minute)
	f.sims["storm"].setFaults(`{"throttle_for":"6s","retry_after":"2s"}`)
	f.waitAccepted("down", 30, time.Minute)
	f.sims["down"].setFaults(`{"down_for":"60s"}`)
	settled := func() bool {
		final := f.finalOutcomes()
		for p, n := range jobs {
			if final[p] < n {
				return false
			}
		}
		return true
	}
	f.waitFor("every job accepted or dead-lettered", 3*time.Minute, settled)
	f.stopAll()
	l := f.collect()
	var all []string
	for p, n := range jobs {
		all = append(all, ids(p, n)...)
	}
	l.check(t, all)
	for p, n := range jobs {
		st := f.sims[p].Stats()
		dead := 0
		for _, id := range ids(p, n) {
			dead += l.dead[id]
		}
		t.Logf("%s: accepted %d, dead-lettered %d, violations %d, injected 500s/hangs %d, storm 429s %d (early %d), cut %d",
			p, st.Accepted, dead, st.Violations, st.ErrorsInjected, st.ThrottledInjected, st.EarlyAfter429, st.DownRefused)
		if int(st.Accepted)+dead != n || st.Violations != 0 || st.EarlyAfter429 != 0 || len(l.queued) != 0 {
			t.Errorf("%s: %d accepted + %d dead of %d, stats %+v, queued %d", p, st.Accepted, dead, n, st, len(l.queued))
		}
	}
	if st := f.sims["storm"].Stats(); st.ThrottledInjected == 0 || st.Accepted != int64(jobs["storm"]) {
		t.Errorf("storm: %+v, want 429s answered and every job accepted after the storm", st)
	}
	if st := f.sims["down"].Stats(); st.DownRefused == 0 {
		t.Errorf("down: %+v, want requests cut", st)
	}
	for id, reason := range l.reasons {
		if reason != "attempts-exhausted" {
			t.Errorf("%s dead-lettered with reason %q, want attempts-exhausted", id, reason)
		}
	}
}

// A slow provider (seconds per request) at full concurrency, with the broker's consumer timeout set to
// what the configuration says: no delivery is held past it, so no channel is closed and nothing is
// redelivered.
func TestFaultSlowConsumer(t *testing.T) {
	before := strings.TrimSpace(rabbitmqctl(t, "eval", "application:get_env(rabbit, consumer_timeout)."))
	rabbitmqctl(t, "eval", "application:set_env(rabbit, consumer_timeout, 30000).")
	t.Cleanup(func() {
		if v := strings.TrimSuffix(strings.TrimPrefix(before, "{ok,"), "}"); v != before {
			rabbitmqctl(t, "eval", "application:set_env(rabbit, consumer_timeout, "+v+").")
		} else {
			rabbitmqctl(t, "eval", "application:unset_env(rabbit, consumer_timeout).")
		}
	})
	f := faultFleet(t, nil, simProvider{name: "acme", limits: []sim.Window{{Limit: 10, Per: time.Second}}, args: []string{"--latency", "3s", "--jitter", "500ms"}}, 60,
		"PAYGATE_BROKER_RABBITMQ_CONSUMER_TIMEOUT=30s", "PAYGATE_BROKER_RABBITMQ_PREFETCH=4", "PAYGATE_WORKER_CONCURRENCY=4",
		"PAYGATE_WORKER_MAX_INLINE_WAIT=1s", "PAYGATE_PROVIDERS_ACME_TIMEOUT=5s")
	f.startWorker()
	f.startWorker()
	f.waitAccepted("acme", 60, 2*time.Minute)
	f.stopAll()
	st := f.exactlyOnce("acme", 60)
	if st.Duplicates != 0 {
		t.Errorf("%d requests replayed: deliveries were redelivered", st.Duplicates)
	}
	if logs := f.logs(); strings.Contains(logs, "consumer stopped") || strings.Contains(logs, "PRECONDITION_FAILED") {
		t.Errorf("a consumer was stopped by the broker:\n%s", logs)
	}
}

// The same faults where they apply to Kafka: scripts flushed, Redis paused and restarted, and a worker
// killed -9 mid-dispatch and replaced (its partitions' uncommitted records are read again by the
// others). Every job charged exactly once, no violation. (kfake keeps its log in memory, so a broker
// restart is RabbitMQ's test only.)
func TestFaultKafka(t *testing.T) {
	rp := startRedis(t)
	f, _ := newKafkaFleet(t, simProvider{name: "acme", limits: []sim.Window{{Limit: 25, Per: time.Second}}, args: []string{"--latency", "100ms"}})
	f.margin = 30 * time.Millisecond // Kafka workers run a reader per partition: the Kafka tests' margin
	f.env2 = append(f.env2, "PAYGATE_REDIS_ADDRS="+rp.addr())
	victim := f.startWorker()
	f.startWorker()
	f.waitFor("both workers in the group", 30*time.Second, f.inGroup)
	f.enqueue("acme", 300, "j")
	f.waitAccepted("acme", 40, time.Minute)
	rp.do("SCRIPT", "FLUSH")
	rp.do("FUNCTION", "FLUSH")
	f.waitAccepted("acme", 90, time.Minute)
	rp.do("CLIENT", "PAUSE", 2000, "ALL")
	f.waitAccepted("acme", 140, time.Minute)
	rp.kill()
	rp.start()
	f.waitAccepted("acme", 190, time.Minute)
	f.killAndReplace(victim)
	f.waitAccepted("acme", 300, 2*time.Minute)
	f.stopAll()
	l := ledger{accepted: map[string]int{}}
	for _, k := range f.sims["acme"].AcceptedKeys() {
		l.accepted[k]++
	}
	l.check(t, ids("j", 300))
	st := f.sims["acme"].Stats()
	t.Logf("provider: accepted %d, replays absorbed %d, violations %d", st.Accepted, st.Duplicates, st.Violations)
	if st.Violations != 0 || st.Accepted != 300 || len(l.accepted) != 300 {
		t.Errorf("want 300 accepted exactly once and 0 violations: %+v", st)
	}
}
