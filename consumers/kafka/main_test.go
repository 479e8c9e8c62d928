package kafka_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine the tests start, the adapter's, kafka-go's (the consumer group, readers, the writer's
// connection pool) and kfake's, must be gone when they end: Broker.Close stops them. Nothing is ignored.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
