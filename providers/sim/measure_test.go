package sim_test

import (
	"math"
	"testing"
	"time"

	"github.com/paygate/paygate/providers/sim"
)

// bursts returns n acceptances at the start of each of k windows spaced every.
func bursts(t0 time.Time, k, n int, every time.Duration) []time.Time {
	var at []time.Time
	for i := range k {
		for range n {
			at = append(at, t0.Add(time.Duration(i)*every))
		}
	}
	return at
}

func TestMeasure(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	one := []sim.Window{{Limit: 40, Per: time.Second}}
	two := []sim.Window{{Limit: 10, Per: time.Second}, {Limit: 40, Per: 5 * time.Second}}
	tests := []struct {
		name   string
		at     []time.Time
		limits []sim.Window
		span   time.Duration
		util   float64
	}{
		// 11 bursts 1.025s apart span 10.25s: 10 whole windows, whose 10 bursts are all the limit allows.
		{"full, with margin", bursts(t0, 11, 40, 1025*time.Millisecond), one, 10 * time.Second, 1},
		{"half", bursts(t0, 11, 20, 1025*time.Millisecond), one, 10 * time.Second, 0.5},
		// A burst every 1.5s: 7 bursts in [0, 10s) of the 10 possible.
		{"slow", bursts(t0, 8, 40, 1500*time.Millisecond), one, 10 * time.Second, 0.7},
		// Two windows: the 5s one binds (40 per 5s, not 10 per second).
		{"two windows", bursts(t0, 11, 10, 1250*time.Millisecond), two, 10 * time.Second, 80.0 / 80},
		{"short run: one window", bursts(t0, 2, 10, 100*time.Millisecond), one, time.Second, 0.5},
		{"nothing", nil, one, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := sim.Measure(tt.at, tt.limits)
			if m.Span != tt.span || math.Abs(m.Utilization-tt.util) > 1e-9 {
				t.Fatalf("span %s utilisation %v, want %s %v", m.Span, m.Utilization, tt.span, tt.util)
			}
		})
	}
}
