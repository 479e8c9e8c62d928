package rabbitmq_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine the tests start, the adapter's and amqp091's (readers, heartbeats), must be gone when
// they end: Close ends both connections, and with them amqp091's goroutines. Nothing is ignored.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
