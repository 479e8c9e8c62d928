package kafka_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/consumers/conformance"
	"github.com/paygate/paygate/consumers/kafka"
	"github.com/paygate/paygate/providers"
)

var (
	scanDead = conformance.ScanDead
	idOf     = conformance.IDOf
)

// Dead letters are listed oldest first with what their headers say, and stay (a topic cannot lose a
// record): a replayed one is produced to its provider's topic afresh (attempt 0, first seen now) and
// marked replayed in T.dead.marks, a purged one marked purged; a marked one is neither replayed nor purged
// again, by this scan or the next.
func TestDeadScanReplayPurge(t *testing.T) {
	bs := brokers(t)
	o := kafka.Options{Brokers: bs, Group: unique(), TopicPrefix: unique(), Partitions: 2,
		Providers: []string{"acme"}, DelayTiers: []time.Duration{300 * time.Millisecond}}
	ctx, member, b := openMember(t, o, 60*time.Second)
	stream, err := b.Consume(member, "acme")
	if err != nil {
		t.Fatal(err)
	}
	next := func() consumers.Delivery {
		select {
		case d := <-stream:
			return d
		case <-ctx.Done():
			t.Fatal("no delivery")
			return nil
		}
	}
	refused := &providers.StatusError{Provider: "acme", Status: 422, Excerpt: "account not enabled", Permanent: true}
	for _, body := range []string{`{"id":"j0"}`, `{"id":"j1"}`, "not json"} {
		if err := b.Publish(ctx, "acme", []byte(body)); err != nil {
			t.Fatal(err)
		}
		d := next()
		reason := map[string]consumers.Reason{"j0": consumers.ReasonPermanent, "j1": consumers.ReasonPermanent, "": consumers.ReasonInvalid}[idOf(d.Body())]
		if err := d.DeadLetter(ctx, reason, 1, refused); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // a record time of its own, in milliseconds
	}
	dl, err := b.Dead(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer dl.Close()
	got := scanDead(t, dl, nil)
	if len(got) != 3 || idOf(got[0].Body) != "j0" || idOf(got[1].Body) != "j1" || got[2].Reason != consumers.ReasonInvalid {
		t.Fatalf("scan: %+v", got)
	}
	if j0 := got[0]; j0.Provider != "acme" || j0.Status != 422 || j0.Attempt != 1 || j0.State != consumers.DeadStateDead ||
		time.Since(j0.DeadAt) > time.Minute || j0.FirstSeen.IsZero() || j0.Returned != 0 {
		t.Fatalf("j0: %+v", j0)
	}
	replayStart := time.Now().Truncate(time.Millisecond)
	act := func(l consumers.DeadLetter) error {
		switch info := l.Info(); {
		case idOf(info.Body) == "j0":
			return l.Replay(ctx)
		case info.Reason == consumers.ReasonInvalid:
			return l.Purge(ctx)
		}
		return nil
	}
	scanDead(t, dl, act)
	back := next()
	if idOf(back.Body()) != "j0" || back.Attempt() != 0 || back.FirstSeen().Before(replayStart) {
		t.Fatalf("replayed: %s attempt %d first seen %v (replayed at %v)", back.Body(), back.Attempt(), back.FirstSeen(), replayStart)
	}
	_ = back.Ack(ctx)
	dl, err = b.Dead(ctx) // T.dead.marks is there already
	if err != nil {
		t.Fatal(err)
	}
	defer dl.Close()
	var states []string
	for _, in := range scanDead(t, dl, nil) {
		states = append(states, idOf(in.Body)+"/"+string(in.State))
	}
	if fmt.Sprint(states) != "[j0/replayed j1/dead /purged]" {
		t.Fatalf("after a replay and a purge: %v", states)
	}
	err = dl.Scan(ctx, func(l consumers.DeadLetter) (bool, error) { return false, l.Replay(ctx) })
	if err == nil {
		t.Fatal("a replayed dead letter was replayed again")
	}
	marks := readTopic(t, bs, kafka.MarksTopic(o.TopicPrefix))
	if len(marks) != 2 {
		t.Fatalf("%d marks, want 2", len(marks))
	}
}

// readTopic reads every record of a topic's first partition.
func readTopic(t *testing.T, bs []string, topic string) []kafkago.Message {
	t.Helper()
	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: bs, Topic: topic, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	var out []kafkago.Message
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		m, err := r.ReadMessage(ctx)
		cancel()
		if err != nil {
			return out
		}
		out = append(out, m)
	}
}
