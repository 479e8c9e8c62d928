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
