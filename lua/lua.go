// Package lua holds paygate's Redis scripts. go:embed cannot reach a parent directory, so the scripts live
// here, one per file, each with a header documenting its KEYS, ARGV and reply; package gate runs them. The
// family (the driver every algorithm runs under) is in parts under family/, joined here with each
// algorithm's file into that algorithm's script; family/contract.lua is its header.
package lua

import (
	_ "embed"
	"strings"
)

// Pause stops admissions for one provider until a moment on the Redis clock.
//
//go:embed pause.lua
var Pause string

// Breaker is a provider's circuit breaker, one for the fleet: failures counted, opened, probed, closed.
//
//go:embed breaker.lua
var Breaker string

// Margin keeps the margin in force for one provider, following the fleet's lateness.
//
//go:embed margin.lua
var Margin string

// Sent marks a job whose request was accepted though its delivery was not settled.
//
//go:embed sent.lua
var Sent string

// Cancel cancels a job: never admitted again, unless it has left already.
//
//go:embed cancel.lua
var Cancel string

// Journal remembers when jobs' requests left and how the jobs ended.
//
//go:embed journal.lua
var Journal string

// Land ends an in-flight lease and announces it.
//
//go:embed land.lua
var Land string

// Limits sets, resets and shows a provider's live limits (the override over the configured ones).
//
//go:embed limits.lua
var Limits string

// The family: the driver every algorithm runs under, in parts (family/contract.lua's header says what
// each holds), then the helpers only some algorithms use, then each algorithm's own file. Each algorithm's
// script below is the parts it needs, joined in this order into one chunk: the parts share file-level
// locals, so the order is the order of their declarations.
var (
	//go:embed family/contract.lua
	familyContract string
	//go:embed family/writes.lua
	familyWrites string
	//go:embed family/state.lua
	familyState string
	//go:embed family/record.lua
	familyRecord string
	//go:embed family/ops.lua
	familyOps string

	// counters, for the algorithms that keep counters named by window (SlidingWindow, FixedWindow)
	//go:embed family/counters.lua
	familyCounters string
	// the undoable state of the buckets (TokenBucket, GCRA, LeakyBucket)
	//go:embed family/undo.lua
	familyUndo string
	// the theoretical arrival times (GCRA, LeakyBucket), kept in the undoable state
	//go:embed family/arrivals.lua
	familyArrivals string

	//go:embed sliding_log.lua
	slidingLog string
	//go:embed sliding_window.lua
	slidingWindow string
	//go:embed token_bucket.lua
	tokenBucket string
	//go:embed gcra.lua
	gcra string
	//go:embed fixed_window.lua
	fixedWindow string
	//go:embed leaky_bucket.lua
	leakyBucket string
)

// family joins the driver's parts, then parts (the helpers, then the algorithm's file).
func family(parts ...string) string {
	return familyContract + familyWrites + familyState + familyRecord + familyOps + strings.Join(parts, "")
}

// Each algorithm's script: the family's driver, the helpers it uses and its own file, one chunk with one
// KEYS/ARGV layout and one reply (see family/contract.lua). The gate runs each as a Redis Function named
// after its SHA-1, or with EVALSHA.
var (
	// SlidingLog keeps an exact log, one member per unit of cost: the default algorithm.
	SlidingLog = family(slidingLog)
	// SlidingWindow counts units in sub-windows, one hash per policy.
	SlidingWindow = family(familyCounters, slidingWindow)
	// TokenBucket keeps a bucket of tokens per policy; it alone can force.
	TokenBucket = family(familyUndo, tokenBucket)
	// GCRA keeps a theoretical arrival time per policy.
	GCRA = family(familyUndo, familyArrivals, gcra)
	// FixedWindow counts units per calendar window, one hash per policy.
	FixedWindow = family(familyCounters, fixedWindow)
	// LeakyBucket queues units that leak at the policy's rate.
	LeakyBucket = family(familyUndo, familyArrivals, leakyBucket)
)

// Events counts a provider's notable outcomes (429s, dead letters by reason) per minute, for the dashboard.
//
//go:embed events.lua
var Events string
