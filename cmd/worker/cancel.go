package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/gate"
)

// cancelReport is what "worker cancel --json" prints: its keys are a public contract (docs/operations.md,
// "Cancelling a payment").
type cancelReport struct {
	Provider string `json:"provider"`
	ID       string `json:"id"`
	// State: cancelled (not admitted), given_up (admitted for a slot ahead, given up by its holder),
	// already_cancelled, or left (its request left, or was due to, at sent_at: not cancelled).
	State  string `json:"state"`
	SentAt string `json:"sent_at,omitempty"` // left: the slot it left on (RFC 3339, UTC)
	Until  string `json:"until,omitempty"`   // while the cancel stands (RFC 3339, UTC)
	Reason string `json:"reason,omitempty"`
}

// cancelCmd is "worker cancel": from its return on, no worker sends the job (unless it had left: exit 3).
func cancelCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, path := newFlags("cancel", stderr)
	provider := fs.String("provider", "", "provider name (required)")
	id := fs.String("id", "", "the job's id (required)")
	reason := fs.String("reason", "", "why, for the job's result (text)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of a line")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *id == "" {
		return usageError{errors.New("cancel: --id is required")}
	}
	l, err := openGate("cancel", *path, *provider, stderr)
	if err != nil {
		return err
	}
	defer l.Close()
	// A job's life counts from its not_before, at most max_deferral_age ahead: twice that outlives it.
	keep := 2 * l.cfg.Worker.MaxDeferralAge
	c, err := l.Cancel(ctx, *provider, *id, gate.CancelOptions{Keep: keep, Attempts: l.cfg.Worker.MaxAttempts,
		Notice: consumers.LossNotice, Reason: *reason})
	if errors.Is(err, gate.ErrInvalid) {
		return usageError{fmt.Errorf("cancel: --id %q: %w", *id, err)}
	}
	if err != nil {
		return err
	}
	rep := cancelReport{Provider: *provider, ID: *id, Reason: *reason}
	stamp := func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
	var line string
	switch c.State {
	case gate.CancelQueued:
		rep.State, rep.Until = "cancelled", stamp(c.Now.Add(keep))
		known := "not admitted, nor in the job journal"
		if j := l.cfg.Gate.Journal; j > 0 {
			known += " (which goes back " + j.String() + ")"
		}
		line = fmt.Sprintf("cancelled %s of %s: %s; no worker sends it (the cancel stands until %s)", *id, *provider, known, rep.Until)
	case gate.CancelGivenUp:
		rep.State, rep.Until = "given_up", stamp(c.Now.Add(keep))
		line = fmt.Sprintf("cancelled %s of %s: its slot at %s was given up by the worker holding it; no worker sends it (the cancel stands until %s)",
			*id, *provider, stamp(c.Slot), rep.Until)
	case gate.CancelAlready:
		rep.State = "already_cancelled"
		line = fmt.Sprintf("%s of %s was cancelled already", *id, *provider)
	default:
		rep.State = "left"
		when := "its request was accepted by the provider (marked sent)"
		if !c.Slot.IsZero() {
			rep.SentAt = stamp(c.Slot)
			when = "its request left, or leaves, at " + rep.SentAt
		}
		if *asJSON {
			if err := writeJSON(stdout, rep); err != nil {
				return err
			}
		}
		return exitStatus{3, fmt.Errorf("cancel: %s of %s not cancelled: %s; the provider may have it (its idempotency key dedupes a retry)", *id, *provider, when)}
	}
	if *asJSON {
		return writeJSON(stdout, rep)
	}
	_, err = fmt.Fprintln(stdout, line)
	return err
}
