package rabbitmq

import (
	"strings"
	"testing"
)

// A URL that is not AMQP is refused with what is wrong, never with its password.
func TestCheckURLNeverShowsThePassword(t *testing.T) {
	for _, raw := range []string{"amqp://svc:s3cr%zz@host/", "amqp://u:s3cr@host:56x2/", "http://u:s3cr@host/", "amqp://u:s3cr@[::1/"} {
		err := checkURL(raw)
		if err == nil || strings.Contains(err.Error(), "s3cr") {
			t.Fatalf("%q: %v", raw, err)
		}
	}
}
