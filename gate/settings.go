package gate

import (
	"fmt"
	"strconv"
	"strings"
)

// settingsAt is a provider's settings under a margin (µs): head is its first ten numbers (and a space), s
// the whole string for a job without a merchant's limits.
type settingsAt struct {
	margin  int64
	head, s string
}

// appendArgv appends ARGV[7..8] for a decision under margin (µs): the merchant, and the settings (see
// the family's contract (lua/family/contract.lua)).
func (p provider) appendArgv(argv []any, margin int64, merchant *merchantCall) []any {
	if merchant == nil {
		return append(argv, "", p.settingsAt(margin, nil))
	}
	return append(argv, merchant.name, p.settingsAt(margin, merchant.limits))
}

// settingsAt is a provider's settings string under margin (µs), for a merchant with the limits ml (nil: none):
// margin, dedup, the algorithm's own number, warm-up, pace, tolerance, max in flight, lease, the live
// limits' version, the state's shape, how many policies are the merchant's, then the provider's policies
// and the merchant's. Without a merchant's limits it is kept for the margin last asked for: a string the
// script has seen is parsed there only once.
func (p provider) settingsAt(margin int64, ml *merchantLimits) string {
	s := p.settings.Load()
	if s == nil || s.margin != margin {
		pace, tolerance := p.paceAt(margin)
		b := make([]byte, 0, 128)
		for _, v := range [...]int64{margin, p.dedup, p.algorithmSetting(), p.warmup, pace, tolerance, p.maxFlight, p.lease, p.version, p.shape} {
			b = append(strconv.AppendInt(b, v, 10), ' ')
		}
		s = &settingsAt{margin: margin, head: string(b), s: string(b) + "0" + p.policyText}
		p.settings.Store(s)
	}
	if ml == nil || len(ml.policies) == 0 {
		return s.s
	}
	return s.head + strconv.Itoa(len(ml.policies)) + p.policyText + ml.text
}

// algorithmSetting is the settings' S[3], the one number whose meaning is the algorithm's: SlidingWindow's
// buckets, SlidingLog's cap on its log (logCap), else 0.
func (p provider) algorithmSetting() int64 {
	switch p.algo {
	case SlidingWindow:
		return int64(p.buckets)
	case SlidingLog:
		return p.logCap
	}
	return 0
}

// settingsText is policies as the settings' tail: " limit window" (µs) per policy.
func settingsText(policies []Policy) string {
	var b strings.Builder
	for _, pol := range policies {
		fmt.Fprintf(&b, " %d %d", pol.Limit, micros(pol.Window))
	}
	return b.String()
}

// paceAt is the pace and the burst tolerance in µs under margin (µs) (0, 0: not paced).
func (p provider) paceAt(margin int64) (pace, tolerance int64) {
	if p.burst == 0 {
		return 0, 0
	}
	pace = paceMicros(p.paced, margin)
	return pace, (p.burst - 1) * pace
}
