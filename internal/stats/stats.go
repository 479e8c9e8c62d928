// Package stats holds the small statistics the demo and the benchmarks report.
package stats

import "time"

// Percentile is the nearest-rank p-th percentile (0 < p <= 100) of sorted values; 0 when there are none.
func Percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted)*p + 99) / 100 // ceil(n*p/100), 1-based
	return sorted[max(i, 1)-1]
}
