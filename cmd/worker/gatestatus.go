package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/paygate/paygate/gate"
)

type statusPolicy struct {
	Policy       int    `json:"policy"`
	Limit        string `json:"limit"`
	Used         int64  `json:"used"`
	Reserved     int64  `json:"reserved"`
	Remaining    int64  `json:"remaining"`
	ResetAfterMs int64  `json:"reset_after_ms"`
}

type statusReport struct {
	Provider    string `json:"provider"`
	Algorithm   string `json:"algorithm"`
	Now         string `json:"now"`
	PausedUntil string `json:"paused_until,omitempty"`
	Units       int64  `json:"units"`
	// In-flight leases standing, and the cap (providers.<name>.max_in_flight; both 0 without one).
	InFlight    int64          `json:"in_flight"`
	MaxInFlight int64          `json:"max_in_flight"`
	Policies    []statusPolicy `json:"policies"`
	// Where the policies come from: "config", or "override" (worker limits set), and the live limits'
	// version (how many times they were set or reset).
	LimitsSource  string `json:"limits_source"`
	LimitsVersion int64  `json:"limits_version"`
	// The margin in force (gate.margin .. gate.margin_max), and why it is what it is.
	MarginMs      float64 `json:"margin_ms"`
	MarginFloorMs float64 `json:"margin_floor_ms"`
	MarginMaxMs   float64 `json:"margin_max_ms"`
	MarginWhy     string  `json:"margin_why"`
	// The merchants (providers with per_merchant or merchants): see merchantsReport.
	Merchants *merchantsReport `json:"merchants,omitempty"`
}

// merchantsReport is a provider's merchants: how many had jobs admitted lately (in the last minute, or the
// gate's dedup window if longer), the topMerchants using the most of their own limits (used + reserved in their first limit; by
// newest admission for merchants without limits), and the rest taken together. Of the merchants seen,
// the scanMerchants with the newest admissions are read.
type merchantsReport struct {
	Seen int64         `json:"seen"`
	Top  []merchantUse `json:"top"`
	Rest merchantRest  `json:"rest"`
}

type merchantUse struct {
	Merchant string `json:"merchant"`
	Limit    string `json:"limit,omitempty"` // its first limit; "" without limits of its own
	Used     int64  `json:"used"`
	Reserved int64  `json:"reserved"`
	Newest   string `json:"newest"` // its newest admission's slot
}

type merchantRest struct {
	Merchants int64 `json:"merchants"`
	Used      int64 `json:"used"` // used + reserved, of those read
}

const (
	topMerchants  = 10
	scanMerchants = 1000
)

// merchantsOf reads a provider's merchants for gate status.
func merchantsOf(ctx context.Context, l *gate.Limiter, provider string) (*merchantsReport, error) {
	seen, ms, err := l.Merchants(ctx, provider, scanMerchants)
	if err != nil {
		return nil, err
	}
	use := func(m gate.MerchantStatus) int64 {
		if len(m.Policies) == 0 {
			return 0
		}
		return m.Policies[0].Used + m.Policies[0].Reserved
	}
	slices.SortStableFunc(ms, func(a, b gate.MerchantStatus) int { return cmp.Compare(use(b), use(a)) }) // newest first among equals
	rep := &merchantsReport{Seen: seen, Top: []merchantUse{}, Rest: merchantRest{Merchants: seen}}
	for i, m := range ms {
		if i >= topMerchants {
			rep.Rest.Used += use(m)
			continue
		}
		u := merchantUse{Merchant: m.Merchant, Newest: m.Newest.UTC().Format(time.RFC3339Nano)}
		if len(m.Policies) > 0 {
			u.Limit, u.Used, u.Reserved = m.Policies[0].Policy.String(), m.Policies[0].Used, m.Policies[0].Reserved
		}
		rep.Top = append(rep.Top, u)
		rep.Rest.Merchants--
	}
	return rep, nil
}

// gateStatus is "worker gate status": each of a provider's policies, and the margin in force.
func gateStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, path := newFlags("gate status", stderr)
	provider := fs.String("provider", "", "provider name (required)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of a table")
	if err := parse(fs, args); err != nil {
		return err
	}
	l, closeGate, err := openGate("gate status", *path, *provider, stderr)
	if err != nil {
		return err
	}
	defer closeGate()
	m, err := l.ReadMargin(ctx, *provider) // first: the status then counts under the margin in force
	if err != nil {
		return err
	}
	st, err := l.Status(ctx, *provider)
	if err != nil {
		return err
	}
	algo, err := l.Algorithm(*provider)
	if err != nil {
		return err
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	rep := statusReport{Provider: st.Provider, Algorithm: string(algo), Now: st.Now.UTC().Format(time.RFC3339Nano), Units: st.Units,
		InFlight: st.InFlight, MaxInFlight: st.MaxInFlight, LimitsSource: st.LimitsSource, LimitsVersion: st.LimitsVersion,
		MarginMs: ms(m.Margin), MarginFloorMs: ms(m.Floor), MarginMaxMs: ms(m.Ceiling), MarginWhy: m.Why}
	if !st.PausedUntil.IsZero() {
		rep.PausedUntil = st.PausedUntil.UTC().Format(time.RFC3339Nano)
	}
	for i, p := range st.Policies {
		rep.Policies = append(rep.Policies, statusPolicy{
			Policy: i, Limit: p.Policy.String(), Used: p.Used, Reserved: p.Reserved,
			Remaining: p.Remaining, ResetAfterMs: ceilMs(p.ResetAfter),
		})
	}
	if l.TracksMerchants(*provider) {
		if rep.Merchants, err = merchantsOf(ctx, l, *provider); err != nil {
			return err
		}
	}
	if *asJSON {
		return writeJSON(stdout, rep)
	}
	paused := "no"
	if rep.PausedUntil != "" {
		paused = fmt.Sprintf("until %s (%s from now)", rep.PausedUntil, st.PausedUntil.Sub(st.Now).Round(time.Millisecond))
	}
	record := "in the log"
	if algo != gate.SlidingLog {
		record = "in the id record"
	}
	fmt.Fprintf(stdout, "provider %s (%s) at %s (Redis clock), %d units %s, paused: %s\n", rep.Provider, rep.Algorithm, rep.Now, rep.Units, record, paused)
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
