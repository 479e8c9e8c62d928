package sim

import (
	"math"
	"sort"
	"time"
)

// Measurement is how fully a run of accepted requests used a provider's limits.
type Measurement struct {
	// Span is the interval measured: from the first acceptance, the longest whole multiple of the
	// longest window that ends by the last acceptance (at least one window).
	Span time.Duration
	// Accepted counts the acceptances in [first, first+Span).
	Accepted int
	// Rate is Accepted per second of Span.
	Rate float64
	// Utilization is Accepted over the most any sender could get through in Span: for each limit,
	// limit x ceil(Span/window) (split Span into windows: each holds at most limit), the smallest of those.
	// It is never above 1 for requests this simulator accepted.
	Utilization float64
	// Bound is that most.
	Bound float64
}

// Measure rates acceptance times (sorted, as OnAccept reports them) against limits. Measuring over whole
// windows from the first acceptance keeps a run's ragged end from counting against it; a run shorter
// than one window is measured over one window, to its disadvantage.
func Measure(at []time.Time, limits []Window) Measurement {
	if len(at) == 0 || len(limits) == 0 {
		return Measurement{}
	}
	var longest time.Duration
	for _, w := range limits {
		longest = max(longest, w.Per)
	}
	t0 := at[0]
	k := max(int64(at[len(at)-1].Sub(t0)/longest), 1)
	span := time.Duration(k) * longest
	end := t0.Add(span)
	n := sort.Search(len(at), func(i int) bool { return !at[i].Before(end) })
	bound := math.Inf(1)
	for _, w := range limits {
		bound = min(bound, float64(w.Limit)*math.Ceil(float64(span)/float64(w.Per)))
	}
	return Measurement{Span: span, Accepted: n, Rate: float64(n) / span.Seconds(), Utilization: float64(n) / bound, Bound: bound}
}
