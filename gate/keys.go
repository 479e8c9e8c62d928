package gate

import (
	"fmt"
	"hash/fnv"
	"time"
)

// keySet names a provider's Redis keys, all under its hash tag (<prefix>:{<provider>}:), so that every call
// of its script touches one slot of a cluster.
type keySet struct {
	ids   string   // the id record: admitted job ids by slot (sliding_log: the log itself, ...:log)
	pause string   // the end of a pause in force (pause.lua)
	marks string   // the id record's marks: a request sent (sent.lua), a duplicate let go
	state []string // the algorithm's own state: a hash of buckets per window, a bucket's level, ...
	// merchants are the merchants seen; limits the live limits (limits.lua); flight the in-flight leases
	// (land.lua); pace the pace's arrival time; epoch when the state began, and its shape
	merchants, limits, flight, pace, epoch string
	// margin and lateness are margin.lua's: the margin in force and the fleet's lateness reports
	margin, lateness string
	// breaker is breaker.lua's: the provider's circuit breaker
	breaker string
	// cancels is cancel.lua's: the reasons of the provider's cancels; journal the job journal's hashes'
	// prefix (journal.lua: a ten-minute bucket's number follows)
	cancels, journal string
	// all are lua/family's KEYS for a call without a merchant's own state, in the order its header gives:
	// ids, pause, marks, state..., merchants, limits, flight, pace, epoch. Built once: every decision sends it.
	all []string
	// merchantAt is where a merchant's own state goes in all: after the provider's state
	merchantAt int
}

// newKeySet names the keys of a provider whose key prefix is tag, under algo with these policies, margin
// and buckets, at a version of its live limits (the buckets' state is named by it).
func newKeySet(tag string, algo Algorithm, policies []Policy, margin time.Duration, buckets int, version int64) *keySet {
	ids := tag + "ids"
	if algo == SlidingLog {
		ids = tag + "log"
	}
	k := &keySet{ids: ids, pause: tag + "pause", marks: tag + "marks",
		state:     stateKeys(tag, algo, policies, margin, buckets, version),
		merchants: tag + "merchants", limits: tag + "limits", flight: tag + "flight", pace: tag + "pace", epoch: tag + "epoch",
		margin: tag + "margin", lateness: tag + "lateness", breaker: tag + "breaker", cancels: tag + "cancels", journal: tag + "journal:"}
	k.all = append(k.counted(), k.merchants, k.limits, k.flight, k.pace, k.epoch)
	k.merchantAt = 3 + len(k.state)
	return k
}

// counted are the keys that hold what the provider was sent: the id record, pause and marks, and the
// algorithm's state. Their names are the state's shape (stateShape).
func (k *keySet) counted() []string {
	return append([]string{k.ids, k.pause, k.marks}, k.state...)
}

// with is lua/family's KEYS for a call with a merchant's own state (nil: none), which goes after the
// provider's state.
func (k *keySet) with(merchant []string) []string {
	if len(merchant) == 0 {
		return k.all
	}
	keys := make([]string, 0, len(k.all)+len(merchant))
	return append(append(append(keys, k.all[:k.merchantAt]...), merchant...), k.all[k.merchantAt:]...)
}

// live are limits.lua's KEYS: the live limits and the pace.
func (k *keySet) live() []string { return []string{k.limits, k.pace} }

// stateKeys names an algorithm's own state under tag ("<prefix>:{<provider>}:", or a merchant's
// "<prefix>:{<provider>}:m:<merchant>:"). The sliding log keeps none beside its log (the id record).
func stateKeys(tag string, algo Algorithm, policies []Policy, margin time.Duration, buckets int, version int64) []string {
	var keys []string
	switch algo {
	case SlidingWindow:
		// Named by the bucket width: a change of window, margin or bucket count starts a new hash rather
		// than reading the old one's buckets with another width.
		for _, p := range policies {
			keys = append(keys, fmt.Sprintf("%ssw:%d", tag, bucketWidth(p.Window, margin, buckets)))
		}
	case FixedWindow:
		for _, p := range policies {
			keys = append(keys, fmt.Sprintf("%sfw:%d", tag, micros(p.Window)))
		}
	// The buckets keep no history, only a level: read under other limits, the level of the old ones would
	// forget what was sent (a bucket of 10 with 3 taken, cut to 4, would hand out 4 more). Named by their
	// limits and the live limits' version too, a change of limits (configured, or live: set or reset, even
	// back to limits used before, whose old state knows nothing of what went since) starts them afresh
	// and warms up.
	case TokenBucket:
		keys = append(keys, tag+"tb:"+limitsName(policies, version))
	case GCRA:
		keys = append(keys, tag+"gcra:"+limitsName(policies, version))
	case LeakyBucket:
		keys = append(keys, tag+"leaky:"+limitsName(policies, version))
	}
	return keys
}

// merchantKeys are the keys of a merchant's own state under algo: its log (SlidingLog), or its counters
// (named as the provider's, under the provider's tag).
func merchantKeys(tag, merchant string, algo Algorithm, policies []Policy, margin time.Duration, buckets int) []string {
	mt := tag + "m:" + merchant + ":"
	if algo == SlidingLog {
		return []string{mt + "log"}
	}
	return stateKeys(mt, algo, policies, margin, buckets, 0)
}

// limitsName names a set of policies at a version of the live limits in a key: a hash of the version and
// each limit and window (µs), in order.
func limitsName(policies []Policy, version int64) string {
	h := fnv.New32a()
	fmt.Fprintf(h, "v%d|", version)
	for _, p := range policies {
		fmt.Fprintf(h, "%d/%d|", p.Limit, micros(p.Window))
	}
	return fmt.Sprintf("%08x", h.Sum32())
}

// bucketWidth is SlidingWindow's sub-window in µs: buckets of them cover the window plus margin.
func bucketWidth(window, margin time.Duration, buckets int) int64 {
	w := micros(window) + micros(margin)
	return (w + int64(buckets) - 1) / int64(buckets)
}

// Keys returns the Redis keys that hold a provider's state: the id record (sliding_log: the log), pause,
// marks, then the algorithm's own keys, then the merchants seen, the live limits, the in-flight leases,
// the pace and the epoch; for tests and operators.
func (l *Limiter) Keys(providerName string) ([]string, error) {
	p, err := l.provider(providerName)
	if err != nil {
		return nil, err
	}
	return append([]string(nil), p.keys.all...), nil
}
