package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/paygate/paygate/gate"
)

const jobUsage = `usage: worker job show --config FILE --provider NAME --id ID [--json]

Prints what the gate holds of a job: whether a cancel stands, each attempt's admission (its slot) and
marks (sent, a duplicate let go, the breaker's probe), and its standing in-flight leases.
`

// jobReport is what "worker job show --json" prints: its keys are a public contract (docs/operations.md,
// "Where is a payment?").
type jobReport struct {
	Provider string `json:"provider"`
	ID       string `json:"id"`
	Now      string `json:"now"` // the Redis clock as read (RFC 3339, UTC)
	// State sums it up: cancelled, reserved (admitted for a slot ahead), admitted (at a slot now or past:
	// its request left or is leaving), sent (in the job journal: its request left), or unknown (nothing
	// held: not admitted lately).
	State     string           `json:"state"`
	Cancelled *jobCancel       `json:"cancelled,omitempty"`
	Left      string           `json:"left,omitempty"`    // the job journal's: when its latest request left
	Outcome   string           `json:"outcome,omitempty"` // and how that handling ended ("" in flight)
	Attempts  []jobAttemptJSON `json:"attempts"`
	Leases    []jobLeaseJSON   `json:"leases"`
}

type jobCancel struct {
	Until  string `json:"until"`
	Reason string `json:"reason,omitempty"`
}

// jobAttemptJSON is one attempt the gate holds something of (attempt 0: the first request; k: its k-th
// retry). Each time is omitted where none.
type jobAttemptJSON struct {
	Attempt   int    `json:"attempt"`
	Slot      string `json:"slot,omitempty"`            // admitted at (Redis clock)
	Sent      string `json:"sent_until,omitempty"`      // marked sent, until
	Duplicate string `json:"duplicate_until,omitempty"` // a duplicate let go on its slot, marked until
	Probe     string `json:"probe_until,omitempty"`     // the breaker's probe, marked until
}

type jobLeaseJSON struct {
	Attempt int    `json:"attempt"`
	Lapses  string `json:"lapses"`
}

// jobCmd is "worker job show".
func jobCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "show" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprint(stdout, jobUsage)
			return nil
		}
		fmt.Fprint(stderr, jobUsage)
		return usageError{errors.New("job: want the subcommand show")}
	}
	fs, path := newFlags("job show", stderr)
	provider := fs.String("provider", "", "provider name (required)")
	id := fs.String("id", "", "the job's id (required)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of text")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	if *id == "" {
		return usageError{errors.New("job show: --id is required")}
	}
	l, err := openGate("job show", *path, *provider, stderr)
	if err != nil {
		return err
	}
	defer l.Close()
	st, err := l.Job(ctx, *provider, *id, max(l.cfg.Worker.MaxAttempts, 1))
	if errors.Is(err, gate.ErrInvalid) {
		return usageError{fmt.Errorf("job show: --id %q: %w", *id, err)}
	}
	if err != nil {
		return err
	}
	rep := jobReportOf(*provider, *id, st)
	if *asJSON {
		return writeJSON(stdout, rep)
	}
	return printJob(stdout, rep)
}

func jobReportOf(provider, id string, st gate.JobState) jobReport {
	stamp := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	rep := jobReport{Provider: provider, ID: id, Now: stamp(st.Now), State: "unknown", Attempts: []jobAttemptJSON{}, Leases: []jobLeaseJSON{},
		Left: stamp(st.Left), Outcome: st.Outcome}
	attemptOf := map[string]int{}
	var latest time.Time
	for k, a := range st.Attempts {
		attemptOf[a.GateID] = k
		if a.Slot.IsZero() && a.Sent.IsZero() && a.Duplicate.IsZero() && a.Probe.IsZero() {
			continue
		}
		rep.Attempts = append(rep.Attempts, jobAttemptJSON{Attempt: k, Slot: stamp(a.Slot), Sent: stamp(a.Sent), Duplicate: stamp(a.Duplicate), Probe: stamp(a.Probe)})
		if a.Slot.After(latest) {
			latest = a.Slot
		}
	}
	for _, l := range st.Leases {
		owner, _, _ := strings.Cut(l.Member, "\x00")
		rep.Leases = append(rep.Leases, jobLeaseJSON{Attempt: attemptOf[owner], Lapses: stamp(l.Lapses)})
	}
	switch {
	case !st.Cancelled.IsZero():
		rep.State, rep.Cancelled = "cancelled", &jobCancel{Until: stamp(st.Cancelled), Reason: st.Reason}
	case latest.After(st.Now):
		rep.State = "reserved"
	case !latest.IsZero():
		rep.State = "admitted"
	case !st.Left.IsZero():
		rep.State = "sent"
	}
	return rep
}

func printJob(w io.Writer, rep jobReport) error {
	fmt.Fprintf(w, "job %s of %s at %s (Redis clock): %s\n", rep.ID, rep.Provider, rep.Now, map[string]string{
		"cancelled": "cancelled: no worker sends it",
		"reserved":  "admitted for a slot ahead: a worker holds it",
		"admitted":  "admitted at a slot now or past: its request left, or is leaving",
		"sent":      "its request left (the job journal)",
		"unknown":   "the gate holds nothing of it: not admitted lately (queued, deferred, scheduled, or settled longer ago than the gate remembers)",
	}[rep.State])
	if c := rep.Cancelled; c != nil {
		fmt.Fprintf(w, "cancel stands until %s", c.Until)
		if c.Reason != "" {
			fmt.Fprintf(w, ": %s", c.Reason)
		}
		fmt.Fprintln(w)
	}
	if len(rep.Attempts) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ATTEMPT\tSLOT\tSENT MARK UNTIL\tDUPLICATE LET GO UNTIL\tPROBE UNTIL")
		dash := func(s string) string {
			if s == "" {
				return "-"
			}
			return s
		}
		for _, a := range rep.Attempts {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", a.Attempt, dash(a.Slot), dash(a.Sent), dash(a.Duplicate), dash(a.Probe))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if rep.Left != "" {
		fmt.Fprintf(w, "latest request left at %s, ended %s\n", rep.Left, map[bool]string{true: "(in flight)", false: rep.Outcome}[rep.Outcome == ""])
	}
	for _, l := range rep.Leases {
		fmt.Fprintf(w, "in-flight lease of attempt %d, lapses %s\n", l.Attempt, l.Lapses)
	}
	return nil
}
