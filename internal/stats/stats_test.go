package stats_test

import (
	"testing"
	"time"

	"github.com/paygate/paygate/internal/stats"
)

func TestPercentile(t *testing.T) {
	ten := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, tt := range []struct {
		values []time.Duration
		p      int
		want   time.Duration
	}{
		{nil, 50, 0},
		{[]time.Duration{7}, 99, 7},
		{ten, 50, 5},  // rank ceil(10*50/100) = 5
		{ten, 99, 10}, // rank ceil(9.9) = 10
		{ten, 1, 1},
		{ten, 100, 10},
		{ten, 91, 10}, // ceil(9.1) = 10: nearest rank rounds up
		{ten, 90, 9},
	} {
		if got := stats.Percentile(tt.values, tt.p); got != tt.want {
			t.Errorf("Percentile(%v, %d) = %v, want %v", tt.values, tt.p, got, tt.want)
		}
	}
}
