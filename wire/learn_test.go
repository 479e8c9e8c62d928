package wire

import (
	"testing"
	"time"

	"github.com/paygate/paygate/gate"
)

// The learner asks for a raise only when the limit binds: a job denied by it, or admitted where the window
// is (almost) full. Bunched light traffic, a pause or the in-flight cap is not the limit binding.
func TestLearnerBinding(t *testing.T) {
	limit := gate.Policy{Limit: 100, Window: time.Second}
	for _, tt := range []struct {
		name  string
		v     gate.Verdict
		bound bool
	}{
		{"admitted with room", gate.Verdict{Allowed: true, Delay: 300 * time.Millisecond, Remaining: 40, Limit: limit}, false},
		{"admitted, window full", gate.Verdict{Allowed: true, Delay: 10 * time.Millisecond, Remaining: 2, Limit: limit}, true},
		{"denied by the limit", gate.Verdict{RetryAfter: time.Second, Limit: limit}, true},
		{"denied by the in-flight cap", gate.Verdict{RetryAfter: time.Second, InFlight: true, Remaining: 50, Limit: limit}, false},
		{"denied by a pause", gate.Verdict{RetryAfter: time.Second, Paused: true, Remaining: 50, Limit: limit}, false},
	} {
		l := &learner{lo: gate.Policy{Limit: 10, Window: time.Second}}
		l.reserved(tt.v)
		if got := l.bound.Load() != 0; got != tt.bound {
			t.Errorf("%s: bound %v, want %v", tt.name, got, tt.bound)
		}
	}
}
