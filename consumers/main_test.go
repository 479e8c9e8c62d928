package consumers_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a test starts (the core's handlers and reporter, the in-memory broker's streams, the
// gate's watch, httptest servers and their clients' connections, go-redis) must be gone when the tests
// end. Nothing is ignored.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
