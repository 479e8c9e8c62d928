package rabbitmq

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Results is the name of the topic exchange and of the quorum queue that results go to (X.results); a
// result's routing key is <provider>.<outcome>.
func Results(exchange string) string { return exchange + ".results" }

// declareResults declares X.results, a topic exchange, and the durable quorum queue X.results bound to
// all of it (#). Other consumers may bind queues of their own by pattern (acme.*, *.dead).
func (b *Broker) declareResults(ch *amqp.Channel) error {
	name := Results(b.o.Exchange)
	if err := ch.ExchangeDeclare(name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", name, err)
	}
	if _, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}); err != nil {
		return fmt.Errorf("declare queue %s: %w", name, err)
	}
	if err := ch.QueueBind(name, "#", name, false, nil); err != nil {
		return fmt.Errorf("bind queue %s: %w", name, err)
	}
	return nil
}

// PublishResult publishes a job's result to X.results with routing key <provider>.<outcome>, persistent
// and mandatory, its message id the job's, and returns once the broker confirmed it.
func (b *Broker) PublishResult(ctx context.Context, provider, outcome, id string, body []byte) error {
	return b.pub.publish(ctx, Results(b.o.Exchange), provider+"."+outcome, amqp.Publishing{
		ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: id, Timestamp: time.Now(),
		Type: outcome, Body: body,
	})
}

// Follow binds a queue of its own (exclusive, deleted with its connection) to X.results by pattern
// (a routing key pattern: # for all, acme.* for one provider), calls bound, and hands each result's body
// to out until ctx ends, acknowledging it: for an operator's terminal (`worker results`), never taking
// results from the X.results queue that the platform consumes.
func Follow(ctx context.Context, url string, o Options, pattern string, bound func(), out func([]byte)) error {
	conn, err := amqp.DialConfig(url, amqp.Config{TLSClientConfig: o.TLS, Properties: amqp.Table{"connection_name": "paygate-results"}})
	if err != nil {
		return fmt.Errorf("rabbitmq: connect %s: %w", redact(url), refusal(url, err))
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	b := &Broker{o: o}
	if err := b.declareResults(ch); err != nil {
		return err
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return err
	}
	if err := ch.QueueBind(q.Name, pattern, Results(o.Exchange), false, nil); err != nil {
		return err
	}
	msgs, err := ch.ConsumeWithContext(ctx, q.Name, "", true, true, false, false, nil)
	if err != nil {
		return err
	}
	bound()
	for {
		select {
		case m, ok := <-msgs:
			if !ok {
				return fmt.Errorf("rabbitmq: the results connection closed")
			}
			out(m.Body)
		case <-ctx.Done():
			return nil
		}
	}
}
