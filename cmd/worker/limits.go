package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/paygate/paygate/gate"
)

// limitsReport is what "worker limits" prints with --json.
type limitsReport struct {
	Provider string `json:"provider"`
	// Limits are the limits in force; Source says where they come from: "config" or "override".
	Limits  []string `json:"limits"`
	Source  string   `json:"source"`
	Config  []string `json:"config"`
	Version int64    `json:"version"`
	SetAt   string   `json:"set_at,omitempty"` // when last set or reset (Redis clock), RFC 3339
	// Changed: set or reset changed the live limits (false: they were in force already, or a source
	// that may not change them set them: an operator's stand over the provider's headers).
	Changed bool `json:"changed"`
}

// limitsCmd is "worker limits set|show|reset": a provider's live limits, kept in Redis over the configured
// ones and in force on every worker of the fleet as soon as the command returns.
func limitsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{errors.New("limits: want a subcommand: set, show or reset")}
	}
	sub := args[0]
	if sub != "set" && sub != "show" && sub != "reset" {
		return usageError{fmt.Errorf("limits: unknown subcommand %q (want set, show or reset)", sub)}
	}
	name := "limits " + sub
	fs, path := newFlags(name, stderr)
	provider := fs.String("provider", "", "provider name (required)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of a line")
	var spec *string
	if sub == "set" {
		spec = fs.String("limits", "", `the live limits, comma-separated N/duration, e.g. "200/1s,5000/1m" (required)`)
	}
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	var policies []gate.Policy
	if sub == "set" {
		if *spec == "" {
			return usageError{fmt.Errorf("%s: --limits is required", name)}
		}
		var err error
		if policies, err = gate.ParsePolicies(*spec); err != nil {
			return usageError{fmt.Errorf("%s: --limits: %w", name, err)}
		}
	}
	l, closeGate, err := openGate(name, *path, *provider, stderr)
	if err != nil {
		return err
	}
	defer closeGate()
	var live gate.LiveLimits
	switch sub {
	case "set":
		live, err = l.SetLimits(ctx, *provider, policies)
	case "reset":
		live, err = l.ResetLimits(ctx, *provider)
	default:
		live, err = l.Limits(ctx, *provider)
	}
	if errors.Is(err, gate.ErrInvalid) {
		return usageError{fmt.Errorf("%s: %w", name, err)}
	}
	if err != nil {
		return err
	}
	rep := limitsReport{Provider: live.Provider, Limits: policyStrings(live.Policies), Source: live.Source,
		Config: policyStrings(live.Configured), Version: live.Version, Changed: live.Changed}
	if !live.At.IsZero() {
		rep.SetAt = live.At.UTC().Format(time.RFC3339Nano)
	}
	if *asJSON {
		return writeJSON(stdout, rep)
	}
	fmt.Fprintf(stdout, "provider %s: %s (%s", rep.Provider, gate.FormatPolicies(live.Policies), rep.Source)
	if rep.Source != gate.SourceConfig {
		fmt.Fprintf(stdout, "; configured %s", gate.FormatPolicies(live.Configured))
	}
	if rep.SetAt != "" {
		fmt.Fprintf(stdout, "; changed %s, version %d", rep.SetAt, rep.Version)
	}
	fmt.Fprint(stdout, ")")
	if sub != "show" && !live.Changed {
		fmt.Fprint(stdout, ": unchanged, already in force")
	}
	fmt.Fprintln(stdout)
	return nil
}

func policyStrings(ps []gate.Policy) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}
