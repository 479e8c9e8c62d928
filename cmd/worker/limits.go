package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/paygate/paygate/gate"
)

const limitsUsage = `usage: worker limits <subcommand> --config FILE --provider NAME [flags]

subcommands:
  set     put live limits over the configured ones for the whole fleet: --limits SPEC changes the
          configured windows it names and keeps the others (--replace: SPEC alone is in force)
  show    print the limits in force, and which configured limits they keep, replace or drop
  reset   go back to the configured limits

Run "worker limits <subcommand> -h" for its flags.
`

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
	// Kept, Replaced and Dropped sort the configured limits by what the limits in force do with them
	// (see compareLimits); Added are the limits in force of windows the configuration lacks.
	Kept     []string `json:"kept"`
	Replaced []string `json:"replaced"`
	Dropped  []string `json:"dropped"`
	Added    []string `json:"added"`
}

// limitsCmd is "worker limits set|show|reset": a provider's live limits, kept in Redis over the configured
// ones and in force on every worker of the fleet as soon as the command returns.
func limitsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, limitsUsage)
		return usageError{errors.New("limits: want a subcommand: set, show or reset")}
	}
	sub := args[0]
	switch sub {
	case "set", "show", "reset":
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, limitsUsage)
		return nil
	default:
		fmt.Fprint(stderr, limitsUsage)
		return usageError{fmt.Errorf("limits: unknown subcommand %q (want set, show or reset)", sub)}
	}
	name := "limits " + sub
	fs, path := newFlags(name, stderr)
	provider := fs.String("provider", "", "provider name (required)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of a line")
	var spec *string
	var replace *bool
	if sub == "set" {
		spec = fs.String("limits", "", `live limits, comma-separated N/duration, e.g. "200/1s,5000/1m" (required): `+
			"each replaces the configured limit of its window, or adds its window; the configured limits of windows it does not name stay in force")
		replace = fs.Bool("replace", false, "put --limits alone in force: the configured limits of windows it does not name are dropped")
	}
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	var named []gate.Policy
	if sub == "set" {
		var err error
		if named, err = parseLimits(name, *spec, *replace); err != nil {
			return err
		}
	}
	l, err := openGate(name, *path, *provider, stderr)
	if err != nil {
		return err
	}
	defer l.Close()
	var live gate.LiveLimits
	switch sub {
	case "set":
		policies := named
		if !*replace {
			policies = mergeLimits(l.cfg.Providers[*provider].Policies(), named)
		}
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
	return printLimits(stdout, sub, live, *asJSON)
}

// parseLimits reads set's --limits. Without --replace each window may appear once: it names the
// configured limit it replaces.
func parseLimits(cmd, spec string, replace bool) ([]gate.Policy, error) {
	if spec == "" {
		return nil, usageError{fmt.Errorf("%s: --limits is required, e.g. --limits 200/1s", cmd)}
	}
	policies, err := gate.ParsePolicies(spec)
	if err != nil {
		return nil, usageError{fmt.Errorf("%s: --limits: %w", cmd, err)}
	}
	if replace {
		return policies, nil
	}
	for i, p := range policies {
		for _, q := range policies[:i] {
			if q.Window == p.Window {
				return nil, usageError{fmt.Errorf("%s: --limits %s names the window %s twice (%s, %s): name each window once",
					cmd, spec, gate.FormatDuration(p.Window), q, p)}
			}
		}
	}
	return policies, nil
}

// mergeLimits is what "limits set" without --replace puts in force: the configured limits in their
// order, each replaced by the named limit of its window where there is one, and the named limits of
// windows the configuration lacks, each before the first longer window. named holds each window once.
// It starts from the configuration, never from live limits in force, so a set means the same whatever
// was set before it.
func mergeLimits(configured, named []gate.Policy) []gate.Policy {
	out := make([]gate.Policy, 0, len(configured)+len(named))
	placed := make(map[time.Duration]bool, len(named))
	for _, c := range configured {
		i := slices.IndexFunc(named, func(n gate.Policy) bool { return n.Window == c.Window })
		switch {
		case i < 0:
			out = append(out, c)
		case !placed[c.Window]:
			out = append(out, named[i])
			placed[c.Window] = true
		}
	}
	for _, n := range named {
		if placed[n.Window] {
			continue
		}
		if i := slices.IndexFunc(out, func(p gate.Policy) bool { return p.Window > n.Window }); i >= 0 {
			out = slices.Insert(out, i, n)
		} else {
			out = append(out, n)
		}
	}
	return out
}

// limitsDiff sorts the configured limits by what the limits in force do with them.
type limitsDiff struct {
	kept     []gate.Policy // in force as configured
	replaced []gate.Policy // their window in force, at another limit
	dropped  []gate.Policy // their window not in force
	added    []gate.Policy // in force, of a window the configuration lacks
}

func compareLimits(configured, inForce []gate.Policy) limitsDiff {
	var d limitsDiff
	hasWindow := func(ps []gate.Policy, w time.Duration) bool {
		return slices.ContainsFunc(ps, func(p gate.Policy) bool { return p.Window == w })
	}
	for _, c := range configured {
		switch {
		case slices.Contains(inForce, c):
			d.kept = append(d.kept, c)
		case hasWindow(inForce, c.Window):
			d.replaced = append(d.replaced, c)
		default:
			d.dropped = append(d.dropped, c)
		}
	}
	for _, p := range inForce {
		if !hasWindow(configured, p.Window) {
			d.added = append(d.added, p)
		}
	}
	return d
}

// printLimits prints what sub left in force: one JSON object, or a line and, over live limits, a line
// of what became of the configured ones.
func printLimits(w io.Writer, sub string, live gate.LiveLimits, asJSON bool) error {
	d := compareLimits(live.Configured, live.Policies)
	rep := limitsReport{Provider: live.Provider, Limits: policyStrings(live.Policies), Source: live.Source,
		Config: policyStrings(live.Configured), Version: live.Version, Changed: live.Changed,
		Kept: policyStrings(d.kept), Replaced: policyStrings(d.replaced), Dropped: policyStrings(d.dropped), Added: policyStrings(d.added)}
	if !live.At.IsZero() {
		rep.SetAt = live.At.UTC().Format(time.RFC3339Nano)
	}
	if asJSON {
		return writeJSON(w, rep)
	}
	fmt.Fprintf(w, "provider %s: %s (%s", rep.Provider, gate.FormatPolicies(live.Policies), rep.Source)
	if rep.Source != gate.SourceConfig {
		fmt.Fprintf(w, "; configured %s", gate.FormatPolicies(live.Configured))
	}
	if rep.SetAt != "" {
		fmt.Fprintf(w, "; changed %s, version %d", rep.SetAt, rep.Version)
	}
	fmt.Fprint(w, ")")
	if sub != "show" && !live.Changed {
		fmt.Fprint(w, ": unchanged, already in force")
	}
	fmt.Fprintln(w)
	if rep.Source != gate.SourceConfig {
		fmt.Fprintf(w, "  %s\n", d.line(live.Policies))
	}
	return nil
}

// line is the diff for people: "kept 100/1m; replaced 5/1s by 3/1s; dropped 10000/24h; added 20/1h",
// without the empty parts.
func (d limitsDiff) line(inForce []gate.Policy) string {
	var parts []string
	if len(d.kept) > 0 {
		parts = append(parts, "kept "+gate.FormatPolicies(d.kept))
	}
	if len(d.replaced) > 0 {
		by := make([]string, len(d.replaced))
		for i, c := range d.replaced {
			now := slices.DeleteFunc(slices.Clone(inForce), func(p gate.Policy) bool { return p.Window != c.Window })
			by[i] = c.String() + " by " + gate.FormatPolicies(now)
		}
		parts = append(parts, "replaced "+strings.Join(by, ", "))
	}
	if len(d.dropped) > 0 {
		parts = append(parts, "dropped "+gate.FormatPolicies(d.dropped))
	}
	if len(d.added) > 0 {
		parts = append(parts, "added "+gate.FormatPolicies(d.added))
	}
	return strings.Join(parts, "; ")
}

func policyStrings(ps []gate.Policy) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}
