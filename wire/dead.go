package wire

import (
	"context"
	"fmt"
	"time"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/consumers/kafka"
	"github.com/paygate/paygate/consumers/rabbitmq"
)

// Dead is the dead letters of the broker a configuration names, for `worker dead`.
type Dead struct {
	consumers.DeadLetters
	// Where names where they are, for the operator: "queue X.dead", "topic T.dead (marks in T.dead.marks)".
	Where string
	// Marks reports that replayed and purged dead letters stay, marked (Kafka), rather than go (RabbitMQ).
	Marks bool
	// CountsReturns reports that the broker drops a dead letter handed back too often by scans (RabbitMQ
	// 4.0 to 4.2, without a policy lifting the queue's default delivery limit of 20).
	CountsReturns bool
	// Hold is how long a scan may hold what it took before the broker takes it back (RabbitMQ's
	// consumer_timeout, broker.rabbitmq.consumer_timeout); 0 for no bound.
	Hold   time.Duration
	broker Broker
	closer func() error // the dead letters' own, if any
}

// Close closes the dead letters and the broker connections.
func (d *Dead) Close() error {
	if d.closer != nil {
		_ = d.closer()
	}
	return d.broker.Close()
}

// OpenDead connects the broker as `worker run` does (declaring what the providers need) and returns its
// dead letters: X.dead on RabbitMQ; T.dead on Kafka, with T.dead.marks (created when missing) recording
// which were replayed or purged.
func OpenDead(ctx context.Context, c *config.Config, o Options) (*Dead, error) {
	b, err := OpenBroker(ctx, c, o)
	if err != nil {
		return nil, err
	}
	switch br := b.(type) {
	case *rabbitmq.Broker:
		dl := br.Dead()
		counts, err := dl.CountsReturns(ctx)
		if err != nil {
			_ = b.Close()
			return nil, err
		}
		return &Dead{DeadLetters: dl, Where: "queue " + BrokerNames(c).Dead, CountsReturns: counts, Hold: c.Broker.RabbitMQ.ConsumerTimeout, broker: b}, nil
	case *kafka.Broker:
		dl, err := br.Dead(ctx)
		if err != nil {
			_ = b.Close()
			return nil, kafkaRefusal(c.Broker.Kafka, err)
		}
		where := fmt.Sprintf("topic %s (marks in %s)", BrokerNames(c).Dead, kafka.MarksTopic(c.Broker.Kafka.TopicPrefix))
		return &Dead{DeadLetters: dl, Where: where, Marks: true, broker: b, closer: dl.Close}, nil
	default:
		_ = b.Close()
		return nil, fmt.Errorf("wire: broker %T has no dead letters to read", b)
	}
}
