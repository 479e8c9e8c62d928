package main

import (
	"context"
	"net"
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

// sentinelSet is a Sentinel set of the test's own, started by scripts/services.sh sentinel: a primary, one
// replica and three sentinels watching it as "paygate", on free loopback ports.
type sentinelSet struct {
	t                *testing.T
	dir              string
	primary, replica int
	sentinels        []int
	sentinel         *redis.SentinelClient
}

func startSentinelSet(t *testing.T) *sentinelSet {
	t.Helper()
	ports := make([]int, 5)
	var held []net.Listener
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, ln)
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	for _, ln := range held {
		ln.Close()
	}
	s := &sentinelSet{t: t, dir: t.TempDir(), primary: ports[0], replica: ports[1], sentinels: ports[2:]}
	s.services("up")
	t.Cleanup(func() { s.sentinel.Close(); s.services("down") })
	s.sentinel = redis.NewSentinelClient(&redis.Options{Addr: loopback(s.sentinels[0])})
	return s
}

func (s *sentinelSet) services(cmd string) {
	s.t.Helper()
	var ports []string
	for _, p := range append([]int{s.primary, s.replica}, s.sentinels...) {
		ports = append(ports, strconv.Itoa(p))
	}
	c := exec.Command("../../scripts/services.sh", "sentinel", cmd)
	c.Env = append(os.Environ(), "PAYGATE_SENTINEL_PORTS="+strings.Join(ports, " "), "PAYGATE_SENTINEL_DIR="+s.dir)
	if out, err := c.CombinedOutput(); err != nil {
		s.t.Fatalf("scripts/services.sh sentinel %s: %v\n%s", cmd, err, out)
	}
}

// addrs are the sentinels, as redis.addrs lists them.
func (s *sentinelSet) addrs() string {
	var a []string
	for _, p := range s.sentinels {
		a = append(a, loopback(p))
	}
	return strings.Join(a, ",")
}

// killPrimary ends the primary with SIGKILL: whatever it had not sent its replica is gone.
func (s *sentinelSet) killPrimary() {
	s.t.Helper()
	b, err := os.ReadFile(filepath.Join(s.dir, "redis-"+strconv.Itoa(s.primary)+".pid"))
	if err != nil {
		s.t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		s.t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		s.t.Fatal(err)
	}
}

// promoted reports whether the sentinels name the replica as the primary now.
func (s *sentinelSet) promoted() bool {
	addr, err := s.sentinel.GetMasterAddrByName(context.Background(), "paygate").Result()
	return err == nil && len(addr) == 2 && addr[1] == strconv.Itoa(s.replica)
}

// A Sentinel failover in a busy run: two workers with redis.master_name (the sentinels as redis.addrs), a
// backlog of 250 jobs at a strict 25/1s. The primary is killed -9 mid-run; the sentinels promote the
// replica; the workers follow it. Every job is accepted exactly once, none over the limit, nothing
// dead-lettered. The time the failover took, and until the provider saw requests again, is logged
// (docs/reliability.md quotes it).
//   - history: without acknowledgements. The promoted replica's state carries the old primary's
//     replication history: the first decision on it warms up.
//   - acked: redis.min_replicas_acked 1. Promoted, the replica has no replica of its own: no admission
//     is acknowledged, and nothing goes out (the jobs are deferred) until the killed server is started
//     again, as a supervisor would, and the sentinels make it the new primary's replica.
func TestFaultSentinelFailover(t *testing.T) {
	for _, acks := range []int{0, 1} {
		name := map[int]string{0: "history", 1: "acked"}[acks]
		t.Run(name, func(t *testing.T) {
			s := startSentinelSet(t)
			f := faultFleet(t, nil, simProvider{name: "acme", limits: []sim.Window{{Limit: 25, Per: time.Second}}, args: []string{"--latency", "20ms"}}, 250,
				"PAYGATE_REDIS_ADDRS="+s.addrs(), "PAYGATE_REDIS_MASTER_NAME=paygate", "PAYGATE_REDIS_MIN_REPLICAS_ACKED="+strconv.Itoa(acks))
			f.startWorker()
			f.startWorker()
			f.waitAccepted("acme", 80, time.Minute)

			killed := time.Now()
			s.killPrimary()
			f.waitFor("the replica promoted", time.Minute, s.promoted)
			promoted := time.Since(killed)
			if acks > 0 {
				time.Sleep(time.Second) // the reservations handed out before the kill are given up
				before := f.accepted("acme")
				time.Sleep(2 * time.Second)
				if during := f.accepted("acme") - before; during != 0 {
					t.Errorf("%d requests sent with no replica to acknowledge their admissions", during)
				}
				s.services("up") // the killed server back, as the new primary's replica
			}
			before := f.accepted("acme")
			f.waitFor("requests sent again", time.Minute, func() bool { return f.accepted("acme") > before })
			t.Logf("%s: the sentinels named the replica primary %v after the kill; the provider saw requests again %v after it",
				name, promoted.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
			f.waitAccepted("acme", 250, 2*time.Minute)
			// The first decision on the promoted replica found the epoch written under the old primary's
			// history, warmed up, and wrote it again: began after the kill, under the replica's history
			// ("<began µs> <history> @<shape>").
			keys := f.gateKeys("acme")
			rdb := redis.NewClient(&redis.Options{Addr: loopback(s.replica)})
			defer rdb.Close()
			epoch := strings.Fields(rdb.Get(context.Background(), keys[len(keys)-1]).Val())
			if began, _ := strconv.ParseInt(epoch[0], 10, 64); len(epoch) != 3 || began < killed.UnixMicro() {
				t.Errorf("epoch on the promoted replica %q: want one begun after the kill (%d), by the warm-up", epoch, killed.UnixMicro())
			}
			f.stopAll()
			f.exactlyOnce("acme", 250)
			if logs := f.logs(); !strings.Contains(logs, "gate unreachable: deferring jobs") {
				t.Errorf("no worker logged the outage")
			}
		})
	}
}
