package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/consumers/conformance"
	"github.com/paygate/paygate/consumers/rabbitmq"
	"github.com/paygate/paygate/internal/testenv"
	"github.com/paygate/paygate/providers"
)

var (
	scanDead = conformance.ScanDead
	idOf     = conformance.IDOf
)

// Dead letters of every kind are listed (twice: a scan takes nothing), oldest first, with what their
// headers say; a replayed one goes back to its provider's queue afresh (attempt 0, first seen now, one
// replay counted) and leaves X.dead; a purged one is gone.
func TestDeadScanReplayPurge(t *testing.T) {
	br, x := open(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, _ := br.Consume(ctx, "acme")
	// One that RabbitMQ dead-lettered itself an hour ago (past the provider queue's delivery limit).
	conn, err := amqp.Dial(testenv.AMQPURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, _ := conn.Channel()
	death := amqp.Table{"queue": x + ".acme", "reason": "delivery_limit", "count": int64(1), "time": time.Now().Add(-time.Hour), "exchange": x}
	if err := ch.Publish("", x+".dead", false, false, amqp.Publishing{Body: []byte(`{"id":"looped"}`), Headers: amqp.Table{"x-death": []any{death}}}); err != nil {
		t.Fatal(err)
	}
	refused := &providers.StatusError{Provider: "acme", Status: 422, Excerpt: "account not enabled", Permanent: true}
	why := []struct {
		reason  consumers.Reason
		attempt int
		err     error
	}{{consumers.ReasonPermanent, 1, refused}, {consumers.ReasonExhausted, 3, errors.New("timeout")}, {consumers.ReasonInvalid, 0, errors.New("body is not JSON")}}
	for i, body := range []string{`{"id":"j0","merchant":"m1"}`, `{"id":"j1"}`, "not json"} {
		err := br.Publish(ctx, "acme", []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if err := next(t, stream, 5*time.Second).DeadLetter(ctx, why[i].reason, why[i].attempt, why[i].err); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // a dead-at of its own, in milliseconds
	}
	dl := br.Dead()
	scanDead(t, dl, nil)
	got := scanDead(t, dl, nil)
	var ids []string
	for _, in := range got {
		ids = append(ids, idOf(in.Body)+"/"+string(in.Reason))
	}
	if fmt.Sprint(ids) != "[looped/delivery-limit j0/permanent j1/attempts-exhausted /invalid]" {
		t.Fatalf("scan: %v", ids)
	}
	j0 := got[1]
	if j0.Provider != "acme" || j0.Status != 422 || j0.Attempt != 1 || j0.Replays != 0 || j0.Where != x+".dead" ||
		j0.State != consumers.DeadStateDead || time.Since(j0.DeadAt) > time.Minute || j0.FirstSeen.IsZero() || j0.Returned < 1 {
		t.Fatalf("j0: %+v", j0)
	}
	if got[0].Provider != "acme" || got[0].Reason != rabbitmq.ReasonDeliveryLimit || time.Since(got[0].DeadAt) < 59*time.Minute || got[2].Status != 0 {
		t.Fatalf("looped %+v, j1 %+v", got[0], got[2])
	}
	replayStart := time.Now().Truncate(time.Millisecond)
	scanDead(t, dl, func(l consumers.DeadLetter) error {
		switch info := l.Info(); {
		case idOf(info.Body) == "j0":
			return l.Replay(ctx)
		case info.Reason == consumers.ReasonInvalid:
			return l.Purge(ctx)
		}
		return nil
	})
	back := next(t, stream, 5*time.Second)
	if idOf(back.Body()) != "j0" || back.Attempt() != 0 || back.FirstSeen().Before(replayStart) {
		t.Fatalf("replayed: %s attempt %d first seen %v (replayed at %v)", back.Body(), back.Attempt(), back.FirstSeen(), replayStart)
	}
	if err := back.DeadLetter(ctx, consumers.ReasonPermanent, 1, refused); err != nil { // dies again
		t.Fatal(err)
	}
	ids = nil
	for _, in := range scanDead(t, dl, nil) {
		ids = append(ids, fmt.Sprintf("%s/%d", idOf(in.Body), in.Replays))
	}
	if fmt.Sprint(ids) != "[looped/0 j1/0 j0/1]" {
		t.Fatalf("after replaying j0 (dead again) and purging the invalid one: %v", ids)
	}
}
