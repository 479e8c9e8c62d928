package memory_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/consumers/conformance"
	"github.com/paygate/paygate/consumers/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	conformance.Run(t, func(t *testing.T) *conformance.Harness {
		b := memory.New(100, "acme")
		b.Redeliver = func(after time.Duration) time.Duration { return after }
		return &conformance.Harness{
			Broker:      b,
			Publish:     b.Publish,
			MinDeferral: 50 * time.Millisecond,
			Crash:       func(*testing.T) consumers.Broker { b.Crash(); return b },
			DeadLetters: func(_ *testing.T, _ int) []conformance.DeadLetter {
				var out []conformance.DeadLetter
				for _, s := range b.Settled() {
					if s.Kind == "dead" {
						out = append(out, conformance.DeadLetter{Body: s.Body, Provider: s.Provider, Reason: s.Reason, Error: s.Why.Error(), Attempt: s.Attempt})
					}
				}
				return out
			},
		}
	})
}
