package kafka_test

import (
	"errors"
	"testing"
	"time"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/consumers/kafka"
)

// Each class has its topic: a record of T.<provider>.high or .low arrives only on its class's stream;
// deferred through a retry topic, it comes back there; dead, it says its class, and a replay puts it back
// there.
func TestClassTopics(t *testing.T) {
	o := kafka.Options{Brokers: brokers(t), Group: unique(), TopicPrefix: unique(), Partitions: 1,
		Providers: []string{"acme"}, DelayTiers: []time.Duration{200 * time.Millisecond}}
	ctx, member, b := openMember(t, o, 60*time.Second)
	streams := map[string]<-chan consumers.Delivery{}
	for _, route := range consumers.Routes("acme") {
		var err error
		if streams[route], err = b.Consume(member, route); err != nil {
			t.Fatal(err)
		}
	}
	next := func(route string) consumers.Delivery {
		t.Helper()
		select {
		case d := <-streams[route]:
			return d
		case <-time.After(20 * time.Second):
			t.Fatalf("nothing on %s", route)
			return nil
		}
	}
	for _, route := range []string{"acme.low", "acme.high", "acme"} {
		if err := b.Publish(ctx, route, []byte(`{"id":"`+route+`"}`)); err != nil {
			t.Fatal(err)
		}
		d := next(route)
		if idOf(d.Body()) != route {
			t.Fatalf("%s's stream got %s", route, d.Body())
		}
		if err := d.Defer(ctx, 100*time.Millisecond, 0, errors.New("throttled")); err != nil {
			t.Fatal(err)
		}
		back := next(route)
		if idOf(back.Body()) != route {
			t.Fatalf("deferred on %s, came back on it as %s", route, back.Body())
		}
		if err := back.DeadLetter(ctx, consumers.ReasonPermanent, 1, errors.New("refused")); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]string{"acme.low": "low", "acme.high": "high", "acme": ""}
	dl, err := b.Dead(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer dl.Close()
	scanDead(t, dl, func(l consumers.DeadLetter) error {
		info := l.Info()
		if got := string(info.Priority); got != want[idOf(info.Body)] || info.Provider != "acme" {
			t.Errorf("dead letter %s: provider %s, priority %q, want %q", info.Body, info.Provider, got, want[idOf(info.Body)])
		}
		return l.Replay(ctx)
	})
	for route := range want {
		if back := next(route); idOf(back.Body()) != route {
			t.Fatalf("replayed onto %s: %s", route, back.Body())
		}
	}
}
