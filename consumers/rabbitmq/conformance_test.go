package rabbitmq_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/consumers/conformance"
	"github.com/paygate/paygate/consumers/rabbitmq"
	"github.com/paygate/paygate/internal/testenv"
)

func TestConformance(t *testing.T) {
	conformance.Run(t, func(t *testing.T) *conformance.Harness {
		tiers := []time.Duration{200 * time.Millisecond, 2 * time.Second}
		br, x := open(t, tiers...)
		return &conformance.Harness{
			Broker:      br,
			Publish:     br.Publish,
			MinDeferral: 200 * time.Millisecond,
			Crash: func(t *testing.T) consumers.Broker {
				br.Close() // connections gone without settling: RabbitMQ requeues the unacked
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				b2, err := rabbitmq.Open(ctx, rabbitmq.Options{URL: testenv.AMQPURL(), Exchange: x, Prefetch: 4, Providers: []string{"acme"}, DelayTiers: tiers})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { b2.Close() })
				return b2
			},
			DeadLetters: func(t *testing.T, want int) []conformance.DeadLetter {
				var out []conformance.DeadLetter
				for _, m := range getAll(t, x+".dead", want) {
					out = append(out, conformance.DeadLetter{
						Body:     m.Body,
						Provider: fmt.Sprint(m.Headers[consumers.HeaderProvider]),
						Reason:   consumers.Reason(fmt.Sprint(m.Headers[consumers.HeaderReason])),
						Error:    fmt.Sprint(m.Headers[consumers.HeaderError]),
						Attempt:  int(m.Headers[consumers.HeaderAttempt].(int64)),
					})
				}
				return out
			},
		}
	})
}

// getAll takes messages from a queue until it has want of them (or 5s pass), then what else is there.
func getAll(t *testing.T, queue string, want int) []amqp.Delivery {
	t.Helper()
	conn, err := amqp.Dial(testenv.AMQPURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	var out []amqp.Delivery
	for deadline := time.Now().Add(5 * time.Second); ; {
		m, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			out = append(out, m)
			continue
		}
		if len(out) >= want || time.Now().After(deadline) {
			return out
		}
		time.Sleep(50 * time.Millisecond)
	}
}
