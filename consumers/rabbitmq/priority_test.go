package rabbitmq_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/paygate/paygate/consumers"
)

// Each class has its queue: a job published by <provider>.high or <provider>.low arrives only on its
// class's stream; deferred, it comes back there; dead, it says its class, and a replay puts it back there.
func TestClassQueues(t *testing.T) {
	br, x := open(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	streams := map[string]<-chan consumers.Delivery{}
	for _, route := range consumers.Routes("acme") {
		s, err := br.Consume(ctx, route)
		if err != nil {
			t.Fatal(err)
		}
		streams[route] = s
	}
	for _, route := range []string{"acme.low", "acme.high", "acme"} {
		if err := br.Publish(ctx, route, []byte(`{"id":"`+route+`"}`)); err != nil {
			t.Fatal(err)
		}
		d := next(t, streams[route], 5*time.Second)
		if idOf(d.Body()) != route {
			t.Fatalf("%s's stream got %s", route, d.Body())
		}
		if err := d.Defer(ctx, 150*time.Millisecond, 0, errors.New("throttled")); err != nil {
			t.Fatal(err)
		}
		if back := next(t, streams[route], 10*time.Second); idOf(back.Body()) != route {
			t.Fatalf("deferred on %s, came back on it as %s", route, back.Body())
		} else if err := back.DeadLetter(ctx, consumers.ReasonPermanent, 1, errors.New("refused")); err != nil {
			t.Fatal(err)
		}
		m := getOne(t, x+".dead")
		want := map[string]any{"acme.low": "low", "acme.high": "high", "acme": nil}[route]
		if m.Headers[consumers.HeaderPriority] != want || m.Headers[consumers.HeaderProvider] != "acme" {
			t.Fatalf("dead letter of %s: headers %v, want priority %v", route, m.Headers, want)
		}
	}
	for _, route := range []string{"acme.low", "acme.high"} {
		if err := br.Publish(ctx, route, []byte(`{"id":"r-`+route+`"}`)); err != nil {
			t.Fatal(err)
		}
		if err := next(t, streams[route], 5*time.Second).DeadLetter(ctx, consumers.ReasonPermanent, 1, errors.New("refused")); err != nil {
			t.Fatal(err)
		}
	}
	scanDead(t, br.Dead(), func(l consumers.DeadLetter) error { return l.Replay(ctx) })
	for _, route := range []string{"acme.low", "acme.high"} {
		if back := next(t, streams[route], 5*time.Second); idOf(back.Body()) != "r-"+route {
			t.Fatalf("replayed onto %s: %s", route, back.Body())
		}
	}
}
