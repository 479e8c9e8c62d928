package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/job"
)

// ReasonDeliveryLimit is the reason of a message RabbitMQ itself dead-lettered to X.dead: redelivered more
// than the provider queue's x-delivery-limit. It carries x-death, not the x-paygate-* headers.
const ReasonDeliveryLimit consumers.Reason = "delivery-limit"

// Dead is X.dead as the operator's tools handle it (worker dead list|replay|purge).
type Dead struct{ b *Broker }

var _ consumers.DeadLetters = (*Dead)(nil)

// Dead returns the broker's dead letters, X.dead.
func (b *Broker) Dead() *Dead { return &Dead{b: b} }

// markDead adds to a dead letter's headers when it died and, when the provider answered, its status.
func markDead(h amqp.Table, why error) {
	h[consumers.HeaderDeadAt] = time.Now().UnixMilli()
	delete(h, consumers.HeaderStatus)
	if st := consumers.StatusOf(why); st > 0 {
		h[consumers.HeaderStatus] = int64(st)
	}
}

// CountsReturns reports whether the broker drops a dead letter that scans have handed back too often:
// RabbitMQ 4.0 to 4.2 give a quorum queue without a delivery limit one of 20, and count every message
// handed back against it (4.3 counts only rejections, basic.nack does not count; 3.x has no default).
func (d *Dead) CountsReturns(ctx context.Context) (bool, error) {
	conn, err := d.b.consume.get(ctx)
	if err != nil {
		return false, err
	}
	v, _ := conn.Properties["version"].(string)
	var major, minor int
	if _, err := fmt.Sscanf(v, "%d.%d", &major, &minor); err != nil {
		return true, nil // unknown: warn rather than not
	}
	return major == 4 && minor < 3, nil
}

// Scan takes every message X.dead holds when it starts (basic.get, unacknowledged, on a channel of its
// own: a quorum queue cannot be read without taking its messages), sorts them (consumers.SortDead), and
// hands them to visit. A dead letter replayed or purged is acknowledged; the others are handed back
// (basic.nack, requeue) when the scan ends, or by RabbitMQ itself when the connection closes (a scan
// killed midway). Nothing is lost, but the queue holds them in an order of its own afterwards: quorum
// queues put messages back in no particular order, hence the sort by when each died.
//
// Every message a scan hands back counts one more delivery (x-delivery-count; x-acquired-count on
// RabbitMQ 4). X.dead is declared without a delivery limit; RabbitMQ 4.0 to 4.2 give a quorum queue
// without one a default of 20, and drop a message past it (X.dead has no dead-letter exchange):
// docs/operations.md says how to lift it.
func (d *Dead) Scan(ctx context.Context, visit func(consumers.DeadLetter) (bool, error)) error {
	conn, err := d.b.consume.get(ctx)
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbitmq: channel: %w", err)
	}
	defer ch.Close()
	letters, err := d.take(ch)
	defer func() {
		for _, l := range letters {
			l.(*deadLetter).giveBack()
		}
	}()
	if err != nil {
		return err
	}
	return consumers.VisitDead(letters, visit)
}

// take gets the messages X.dead holds now: as many as the first get says there are, so that dead letters
// arriving meanwhile (or replayed copies that die again) do not keep the scan going.
func (d *Dead) take(ch *amqp.Channel) ([]consumers.DeadLetter, error) {
	var out []consumers.DeadLetter
	for total := 1; len(out) < total; {
		m, ok, err := ch.Get(d.b.dead(), false)
		if err != nil {
			return out, fmt.Errorf("rabbitmq: get from %s: %w", d.b.dead(), err)
		}
		if !ok {
			break
		}
		if len(out) == 0 {
			total = int(m.MessageCount) + 1
		}
		out = append(out, &deadLetter{m: m, d: d, info: d.infoOf(m)})
	}
	return out, nil
}

// infoOf reads a dead letter's headers.
func (d *Dead) infoOf(m amqp.Delivery) consumers.DeadInfo {
	h := m.Headers
	text := func(k string) string { s, _ := h[k].(string); return s }
	num := func(k string) int { n, _ := headerInt(h, k); return int(n) }
	at := func(k string) time.Time {
		if ms, ok := headerInt(h, k); ok && ms > 0 {
			return time.UnixMilli(ms)
		}
		return time.Time{}
	}
	info := consumers.DeadInfo{
		Where: d.b.dead(), Provider: text(consumers.HeaderProvider), Priority: job.Priority(text(consumers.HeaderPriority)),
		Reason: consumers.Reason(text(consumers.HeaderReason)),
		Error:  text(consumers.HeaderError), Status: num(consumers.HeaderStatus), Attempt: num(consumers.HeaderAttempt),
		FirstSeen: at(consumers.HeaderFirstSeen), DeadAt: at(consumers.HeaderDeadAt), Replays: num(consumers.HeaderReplays),
		State: consumers.DeadStateDead, Returned: max(num("x-delivery-count"), num("x-acquired-count")), Body: m.Body,
	}
	if death, ok := firstDeath(h); ok && info.Reason == "" {
		// Dead-lettered by RabbitMQ itself (x-delivery-limit on the provider's queue).
		q, _ := death["queue"].(string)
		info.Provider, info.Priority = consumers.SplitRoute(strings.TrimPrefix(q, d.b.o.Exchange+"."))
		r, _ := death["reason"].(string) // delivery_limit: ReasonDeliveryLimit
		info.Reason = consumers.Reason(strings.ReplaceAll(r, "_", "-"))
		if t, ok := death["time"].(time.Time); ok && info.DeadAt.IsZero() {
			info.DeadAt = t
		}
	}
	return info
}

// firstDeath is the newest entry of a message's x-death header, which RabbitMQ adds when it
// dead-letters a message itself.
func firstDeath(h amqp.Table) (amqp.Table, bool) {
	deaths, _ := h["x-death"].([]any)
	if len(deaths) == 0 {
		return nil, false
	}
	t, ok := deaths[0].(amqp.Table)
	return t, ok
}

// deadLetter is one message of X.dead, taken by a scan.
type deadLetter struct {
	m       amqp.Delivery
	d       *Dead
	info    consumers.DeadInfo
	settled bool // acknowledged (replayed, purged) or handed back
}

func (l *deadLetter) Info() consumers.DeadInfo { return l.info }

// Replay publishes a copy to X with its route's routing key (the provider's, or <provider>.high or
// <provider>.low for the class it died in; persistent, mandatory, confirmed), then
// acknowledges the dead letter. Killed between the two, the dead letter comes back, and a second replay
// sends the job again under its id and idempotency key.
func (l *deadLetter) Replay(ctx context.Context) error {
	if l.settled {
		return errors.New("rabbitmq: dead letter already settled")
	}
	if l.info.Provider == "" {
		return fmt.Errorf("rabbitmq: a dead letter of %s names no provider", l.d.b.dead())
	}
	h := amqp.Table{}
	for k, v := range l.m.Headers {
		if consumers.ReplayHeader(k) && k != headerPublishID {
			h[k] = v
		}
	}
	h[consumers.HeaderReplays] = int64(l.info.Replays + 1)
	h[consumers.HeaderFirstSeen] = time.Now().UnixMilli()
	route := consumers.Route(l.info.Provider, l.info.Priority)
	err := l.d.b.pub.publish(ctx, l.d.b.o.Exchange, route, amqp.Publishing{
		Headers: h, ContentType: l.m.ContentType, ContentEncoding: l.m.ContentEncoding, DeliveryMode: amqp.Persistent,
		MessageId: l.m.MessageId, Timestamp: l.m.Timestamp, Body: l.m.Body,
	})
	if err != nil {
		return fmt.Errorf("rabbitmq: replay to %s: %w", l.d.b.queue(route), err)
	}
	return l.ack()
}

// Purge acknowledges the dead letter: it is gone.
func (l *deadLetter) Purge(context.Context) error {
	if l.settled {
		return errors.New("rabbitmq: dead letter already settled")
	}
	return l.ack()
}

func (l *deadLetter) ack() error {
	l.settled = true
	if err := l.m.Ack(false); err != nil {
		return fmt.Errorf("rabbitmq: acknowledge a dead letter of %s: %w", l.d.b.dead(), err)
	}
	return nil
}

// giveBack returns an unsettled dead letter to X.dead.
func (l *deadLetter) giveBack() {
	if !l.settled {
		l.settled = true
		_ = l.m.Nack(false, true)
	}
}
