package wire_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/internal/testenv"
	"github.com/paygate/paygate/wire"
)

// The backlog reader counts, by provider name, the jobs waiting in the broker the configuration names:
// a RabbitMQ queue's ready messages, a Kafka topic's records the group has not committed.
func TestBacklog(t *testing.T) {
	tests := []struct {
		name  string
		kafka bool
	}{
		{name: "rabbitmq"},
		{name: "kafka", kafka: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testConfig(t, "http://127.0.0.1:1/pay", config.Limit{Requests: 10, Per: time.Second})
			if tt.kafka {
				c.Broker.Kind = "kafka"
				c.Broker.Kafka.Brokers = kafkaBrokers(t)
				c.Broker.Kafka.Group, c.Broker.Kafka.TopicPrefix = c.Redis.KeyPrefix, c.Redis.KeyPrefix
			}
			o := testOptions()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			b, err := wire.OpenBroker(ctx, c, o)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			defer func() {
				if err := wire.DeleteBroker(context.Background(), c, o); err != nil {
					t.Error(err)
				}
			}()
			for i := range 2 {
				body := fmt.Appendf(nil, `{"id":"backlog-%d","provider":"acme","amount":100,"currency":"EUR"}`, i)
				if err := b.Publish(ctx, "acme", body); err != nil {
					t.Fatal(err)
				}
			}
			low := []byte(`{"id":"backlog-low","provider":"acme","amount":100,"currency":"EUR","priority":"low"}`)
			if err := b.Publish(ctx, "acme.low", low); err != nil {
				t.Fatal(err)
			}
			backlog, closeBacklog, err := wire.Backlog(c, o)
			if err != nil {
				t.Fatal(err)
			}
			defer closeBacklog()
			var got map[string]int64
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				got, err = backlog(ctx)
				if err == nil && got["acme"] == 2 && got["acme.low"] == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("backlog %v (%v), want acme: 2, acme.low: 1", got, err)
				}
			}
			if fmt.Sprint(got) != "map[acme:2 acme.high:0 acme.low:1]" {
				t.Fatalf("backlog %v, want acme's by route, its classes' too", got)
			}
		})
	}
}

// Without RabbitMQ's URL there is nothing to read: no reader, and a close that does nothing.
func TestBacklogWithoutURL(t *testing.T) {
	c := testConfig(t, "http://127.0.0.1:1/pay", config.Limit{Requests: 10, Per: time.Second})
	backlog, closeBacklog, err := wire.Backlog(c, wire.Options{Secret: func(string) string { return "" }})
	if err != nil || backlog != nil {
		t.Fatalf("backlog %v, err %v: want neither", backlog != nil, err)
	}
	closeBacklog()
}

// kafkaBrokers is a kfake cluster of the test's own, or the real brokers in PAYGATE_TEST_KAFKA_BROKERS.
func kafkaBrokers(t *testing.T) []string {
	t.Helper()
	if bs := testenv.KafkaBrokers(); bs != nil {
		return bs
	}
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	return kc.ListenAddrs()
}
