// Package lua holds paygate's Redis scripts. go:embed cannot reach a parent directory, so the scripts live
// here, one per file, each with a header documenting its KEYS, ARGV and reply; package gate runs them.
package lua

import _ "embed"

// SlidingLog admits, reserves or denies one job against all of one provider's policies.
//
//go:embed sliding_log.lua
var SlidingLog string

// Pause stops admissions for one provider until a moment on the Redis clock.
//
//go:embed pause.lua
var Pause string

// Release gives back a job's admission.
//
//go:embed release.lua
var Release string

// Status reports one provider's use of each policy without changing anything.
//
//go:embed status.lua
var Status string

// Sent marks a job whose request was accepted though its delivery was not settled.
//
//go:embed sent.lua
var Sent string

// Family is the part every algorithm but sliding_log shares (ids, duplicates, moves, pause, release,
// status); each of the scripts below is appended to it and run as one script.
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
