// Package lua holds paygate's Redis scripts. go:embed cannot reach a parent directory, so the scripts live
// here, one per file, each with a header documenting its KEYS, ARGV and reply; package gate runs them.
package lua

import _ "embed"

// SlidingLog keeps an exact log, one member per unit of cost: the default algorithm.
//
//go:embed sliding_log.lua
var SlidingLog string

// Pause stops admissions for one provider until a moment on the Redis clock.
//
//go:embed pause.lua
var Pause string

// Margin keeps the margin in force for one provider, following the fleet's lateness.
//
//go:embed margin.lua
var Margin string

// Sent marks a job whose request was accepted though its delivery was not settled.
//
//go:embed sent.lua
var Sent string

// Land ends an in-flight lease and announces it.
//
//go:embed land.lua
var Land string

// Limits sets, resets and shows a provider's live limits (the override over the configured ones).
//
//go:embed limits.lua
var Limits string

// Family is the driver every algorithm shares (input checks, ids, duplicates, moves, pause, pace,
// warm-up, reserve, release, status): each algorithm's script is appended to it and run as one script,
// with one KEYS/ARGV layout and one reply (see its header).
//
//go:embed family.lua
var Family string

// SlidingWindow counts units in sub-windows, one hash per policy.
//
//go:embed sliding_window.lua
var SlidingWindow string

// TokenBucket keeps a bucket of tokens per policy; it alone can force.
//
//go:embed token_bucket.lua
var TokenBucket string

// GCRA keeps a theoretical arrival time per policy.
//
//go:embed gcra.lua
var GCRA string

// FixedWindow counts units per calendar window, one hash per policy.
//
//go:embed fixed_window.lua
var FixedWindow string

// LeakyBucket queues units that leak at the policy's rate.
//
//go:embed leaky_bucket.lua
var LeakyBucket string

// Events counts a provider's notable outcomes (429s, dead letters by reason) per minute, for the dashboard.
//
//go:embed events.lua
var Events string
