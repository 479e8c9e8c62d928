package gate_test

import (
	"context"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
)

// A watch connection that goes silent without breaking (a host gone without a FIN; here: the server
// paused with CLIENT PAUSE ALL, so the ping goes unanswered) is given up within two pings, well inside
// consumers.LossNotice: the worker must not keep sleeping on slots a lost state may not know. A server of
// the test's own, so that pausing it disturbs nothing else.
func TestWatchGivesUpOnASilentConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	srv := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := srv.Start(); err != nil {
		t.Fatalf("redis-server (scripts/services.sh installs it): %v", err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port)})
	defer rdb.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for deadline := time.Now().Add(10 * time.Second); rdb.Ping(ctx).Err() != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("redis-server did not answer within 10s")
		}
	}
	l, err := gate.New(rdb, gate.Options{Prefix: "silent", Providers: map[string]gate.Provider{prov: {Policies: []gate.Policy{pol(10, time.Second)}}}})
	if err != nil {
		t.Fatal(err)
	}
	w := watchLog{notes: make(chan string, 64)}
	go func() { _ = l.Watch(ctx, rdb, w) }()
	w.next(t, "disconnect", func() {}) // the first subscription counts as one
	for rdb.PubSubNumSub(ctx, "silent:pauses").Val()["silent:pauses"] < 1 {
		time.Sleep(10 * time.Millisecond)
	}
	drain := func() {
		for {
			select {
			case <-w.notes:
			default:
				return
			}
		}
	}
	time.Sleep(500 * time.Millisecond) // idle for a few pings
	drain()
	paused := time.Now()
	if err := rdb.Do(ctx, "CLIENT", "PAUSE", 3000, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-w.notes:
		if n != "disconnect" {
			t.Fatalf("note %q, want disconnect", n)
		}
		t.Logf("silent connection given up %v after the pause began", time.Since(paused).Round(time.Millisecond))
	case <-time.After(2500 * time.Millisecond):
		t.Fatal("the watch did not give up on a connection silent for 2.5s")
	}
}
