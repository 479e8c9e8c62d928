package gate_test

import (
	"context"
	"testing"
	"time"

	"github.com/paygate/paygate/gate"
)

// A watch connection that goes silent without breaking (a host gone without a FIN; here: the server
// paused with CLIENT PAUSE ALL, so the ping goes unanswered) is given up within two pings, well inside
// consumers.LossNotice: the worker must not keep sleeping on slots a lost state may not know. A server of
// the test's own, so that pausing it disturbs nothing else.
func TestWatchGivesUpOnASilentConnection(t *testing.T) {
	rdb := privateRedis(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
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
