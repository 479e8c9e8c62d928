package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/internal/report"
)

// gateStatus is "worker gate status": each of a provider's policies, and the margin in force.
func gateStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, path := newFlags("gate status", stderr)
	provider := fs.String("provider", "", "provider name (required)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of a table")
	if err := parse(fs, args); err != nil {
		return err
	}
	l, err := openGate("gate status", *path, *provider, stderr)
	if err != nil {
		return err
	}
	defer l.Close()
	rep, err := report.Of(ctx, l.Limiter, *provider)
	if err != nil {
		return err
	}
	st, m, algo := rep.Gate, rep.Margin, gate.Algorithm(rep.Algorithm)
	if *asJSON {
		return writeJSON(stdout, rep)
	}
	paused := "no"
	if rep.PausedUntil != "" {
		paused = fmt.Sprintf("until %s (%s from now)", rep.PausedUntil, st.PausedUntil.Sub(st.Now).Round(time.Millisecond))
	}
	record := "units in the log"
	if algo != gate.SlidingLog {
		record = "members in the id record"
	}
	fmt.Fprintf(stdout, "provider %s (%s) at %s (Redis clock), %d %s, paused: %s\n", rep.Provider, rep.Algorithm, rep.Now, rep.Units, record, paused)
	fmt.Fprintf(stdout, "margin in force %s (gate.margin %s, gate.margin_max %s): %s\n", m.Margin, m.Floor, m.Ceiling, m.Why)
	switch rep.LimitsSource {
	case gate.SourceOverride:
		fmt.Fprintf(stdout, "limits: an operator's live limits (version %d; worker limits reset goes back to the configured ones)\n", rep.LimitsVersion)
	case gate.SourceHeaders:
		fmt.Fprintf(stdout, "limits: as the provider announces them (version %d; limits_from_headers)\n", rep.LimitsVersion)
	case gate.SourceLearned:
		fmt.Fprintf(stdout, "limits: learned from the provider's answers (version %d; adaptive)\n", rep.LimitsVersion)
	}
	if rep.MaxInFlight > 0 {
		fmt.Fprintf(stdout, "in flight: %d of %d leases\n", rep.InFlight, rep.MaxInFlight)
	}
	printBreaker(stdout, rep.Breaker, st.Now)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POLICY\tLIMIT\tUSED\tRESERVED\tREMAINING\tRESET IN")
	for _, p := range rep.Policies {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%dms\n", p.Policy, p.Limit, p.Used, p.Reserved, p.Remaining, p.ResetAfterMs)
	}
	if err := tw.Flush(); err != nil || rep.Merchants == nil {
		return err
	}
	fmt.Fprintf(stdout, "merchants seen lately: %d\n", rep.Merchants.Seen)
	if len(rep.Merchants.Top) == 0 {
		return nil
	}
	tw = tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MERCHANT\tLIMIT\tUSED\tRESERVED\tNEWEST")
	for _, m := range rep.Merchants.Top {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", m.Merchant, cmp.Or(m.Limit, "-"), m.Used, m.Reserved, m.Newest)
	}
	if rep.Merchants.Rest.Merchants > 0 {
		fmt.Fprintf(tw, "(%d more)\t\t%d\t\t\n", rep.Merchants.Rest.Merchants, rep.Merchants.Rest.Used)
	}
	return tw.Flush()
}
