package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/consumers/rabbitmq"
	"github.com/paygate/paygate/wire"
)

const deadUsage = `usage: worker dead <subcommand> --config FILE --provider NAME [flags]

subcommands:
  list     show a provider's dead letters, oldest first, and leave them where they are
  replay   put dead letters back on the provider's queue or topic (attempts and first seen reset), paced
  purge    remove dead letters for good; on Kafka, mark them purged (needs --yes)

Exit status: 0 done, 1 a runtime failure, 2 bad usage or configuration, 3 done in part (an --id not
found, a dead letter that is not a job, a replay stopped early). docs/operations.md, "When jobs are dead".
Run "worker dead <subcommand> -h" for its flags.
`

// deadDefaultRate is replay's --rate: dead letters put back a second.
const deadDefaultRate = 50

// exitStatus is an error with an exit status of its own: 3 for a command done in part.
type exitStatus struct {
	code int
	err  error
}

func (e exitStatus) Error() string { return e.err.Error() }
func (e exitStatus) Unwrap() error { return e.err }

// deadReasons are the reasons a dead letter can give (--reason).
var deadReasons = []string{string(consumers.ReasonInvalid), string(consumers.ReasonPermanent), string(consumers.ReasonExhausted),
	string(consumers.ReasonDeferralAge), string(rabbitmq.ReasonDeliveryLimit)}

// deadOpts are a dead subcommand's flags, checked.
type deadOpts struct {
	sub, path, provider, reason string
	ids                         []string  // replay --id; nil: any
	since                       time.Time // list --since: dead at or after (zero: any)
	before                      time.Time // purge --before: dead before (zero: any)
	limit, max                  int
	rate                        float64
	dryRun, yes, json           bool
}

// deadCmd is "worker dead list|replay|purge": the dead letters of a provider (docs/operations.md, "When
// jobs are dead").
func deadCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, deadUsage)
		return usageError{errors.New("dead: want a subcommand: list, replay or purge")}
	}
	switch args[0] {
	case "list", "replay", "purge":
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, deadUsage)
		return nil
	default:
		fmt.Fprint(stderr, deadUsage)
		return usageError{fmt.Errorf("dead: unknown subcommand %q (want list, replay or purge)", args[0])}
	}
	o, err := deadFlags(args[0], args[1:], stderr)
	if err != nil {
		return err
	}
	d, err := openDead(ctx, o, stderr)
	if err != nil {
		return err
	}
	defer d.Close()
	switch o.sub {
	case "list":
		return deadList(ctx, o, d, stdout, stderr)
	case "replay":
		return deadReplay(ctx, o, d, stdout, stderr)
	default:
		return deadPurge(ctx, o, d, stdout)
	}
}

// deadFlags parses and checks a subcommand's flags.
func deadFlags(sub string, args []string, stderr io.Writer) (*deadOpts, error) {
	name := "dead " + sub
	fs, path := newFlags(name, stderr)
	o := &deadOpts{sub: sub}
	fs.StringVar(&o.provider, "provider", "", "provider name (required)")
	fs.StringVar(&o.reason, "reason", "", "only dead letters of this reason: "+strings.Join(deadReasons, ", "))
	fs.BoolVar(&o.json, "json", false, "print one JSON object instead of text")
	var since, before, ids, rate string
	switch sub {
	case "list":
		fs.StringVar(&since, "since", "", "only those dead in the last DUR (30m, 2h), or since an RFC 3339 time")
		fs.IntVar(&o.limit, "limit", 100, "show at most N (0: all)")
	case "replay":
		fs.StringVar(&ids, "id", "", "only the jobs of these ids (comma-separated)")
		fs.IntVar(&o.max, "max", 0, "replay at most N (0: every one selected)")
		fs.StringVar(&rate, "rate", strconv.Itoa(deadDefaultRate), "at most N a second (20, 20/s, 0.5)")
		fs.BoolVar(&o.dryRun, "dry-run", false, "print what would be replayed, and replay nothing")
	case "purge":
		fs.StringVar(&before, "before", "", "only those dead before an RFC 3339 time, or more than DUR ago (24h)")
		fs.BoolVar(&o.yes, "yes", false, "really purge (required)")
	}
	if err := parse(fs, args); err != nil {
		return nil, err
	}
	o.path = *path
	if err := o.check(name, since, before, ids, rate); err != nil {
		return nil, err
	}
	idSet := false
	fs.Visit(func(fl *flag.Flag) { idSet = idSet || fl.Name == "id" })
	if idSet && o.ids == nil {
		return nil, usageError{fmt.Errorf("%s: --id names no job id (leave it out to select by the other flags)", name)}
	}
	return o, nil
}

// check validates the flags and fills in what they give.
func (o *deadOpts) check(name, since, before, ids, rate string) error {
	bad := func(format string, a ...any) error { return usageError{fmt.Errorf(name+": "+format, a...)} }
	now := time.Now()
	var err error
	switch {
	case o.provider == "":
		return bad("--provider is required")
	case o.reason != "" && !slices.Contains(deadReasons, o.reason):
		return bad("--reason %q is not a reason a dead letter gives (%s)", o.reason, strings.Join(deadReasons, ", "))
	case o.limit < 0 || o.max < 0:
		return bad("--limit and --max must be 0 or more")
	case o.sub == "purge" && !o.yes:
		return bad("purge removes dead letters for good: add --yes (see first what it takes: worker dead list with the same --provider and --reason)")
	}
	if o.since, err = parseWhen(since, now); err != nil {
		return bad("--since: %v", err)
	}
	if o.before, err = parseWhen(before, now); err != nil {
		return bad("--before: %v", err)
	}
	for id := range strings.SplitSeq(ids, ",") {
		if id = strings.TrimSpace(id); id != "" {
			o.ids = append(o.ids, id)
		}
	}
	if o.sub == "replay" {
		if o.rate, err = parseRate(rate); err != nil {
			return bad("--rate: %v", err)
		}
	}
	return nil
}

// parseWhen reads a moment: an RFC 3339 time, or a duration meaning that long before now ("": zero).
func parseWhen(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("want a duration (30m) or an RFC 3339 time (2026-11-27T03:00:00Z), got %q", s)
	}
	return t, nil
}

// parseRate reads --rate: dead letters a second, "20" or "20/s", more than 0.
func parseRate(s string) (float64, error) {
	r, err := strconv.ParseFloat(strings.TrimSuffix(s, "/s"), 64)
	if err != nil || math.IsInf(r, 0) || math.IsNaN(r) {
		return 0, fmt.Errorf("want dead letters a second (20, 20/s), got %q", s)
	}
	if r <= 0 {
		return 0, fmt.Errorf("must be more than 0 a second, got %q", s)
	}
	return r, nil
}

// openDead loads the configuration and opens the dead letters of its broker.
func openDead(ctx context.Context, o *deadOpts, stderr io.Writer) (*wire.Dead, error) {
	c, err := loadConfig(o.path, stderr)
	if err != nil {
		return nil, err
	}
	if _, ok := c.Providers[o.provider]; !ok {
		return nil, usageError{fmt.Errorf("dead %s: provider %q is not configured in %s (configured: %s)", o.sub, o.provider, o.path, strings.Join(c.ProviderNames(), ", "))}
	}
	return wire.OpenDead(ctx, c, wire.Options{})
}

// deadRow is one dead letter as list (and replay --dry-run) print it; its JSON keys are a public contract
// (docs/operations.md).
type deadRow struct {
	ID             string `json:"id"`
	Provider       string `json:"provider"`
	Merchant       string `json:"merchant,omitempty"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	Reason         string `json:"reason"`
	Status         int    `json:"status,omitempty"`
	Error          string `json:"error,omitempty"`
	Attempts       int    `json:"attempts"`
	Replays        int    `json:"replays"`
	FirstSeen      string `json:"first_seen,omitempty"`
	DeadAt         string `json:"dead_at,omitempty"`
	State          string `json:"state"`
	Where          string `json:"where"`
	// Malformed says why the dead letter is not a job (no id to replay it by); "" for a job.
	Malformed string `json:"malformed,omitempty"`
}

// deadTime is the rows' time format: RFC 3339 in UTC, milliseconds (as results).
const deadTime = "2006-01-02T15:04:05.000Z07:00"

// rowOf reads a dead letter: its headers, and its body as far as a job's id, merchant and key go.
func rowOf(info consumers.DeadInfo) deadRow {
	r := deadRow{Provider: info.Provider, Reason: string(info.Reason), Status: info.Status, Error: info.Error,
		Attempts: info.Attempt, Replays: info.Replays, State: string(info.State), Where: info.Where}
	if !info.FirstSeen.IsZero() {
		r.FirstSeen = info.FirstSeen.UTC().Format(deadTime)
	}
	if !info.DeadAt.IsZero() {
		r.DeadAt = info.DeadAt.UTC().Format(deadTime)
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(info.Body, &body); err != nil {
		r.Malformed = "the body is not a JSON object"
		return r
	}
	if json.Unmarshal(body["id"], &r.ID) != nil || r.ID == "" {
		r.Malformed = `the body has no "id" string`
		return r
	}
	_ = json.Unmarshal(body["merchant"], &r.Merchant)
	if json.Unmarshal(body["idempotency_key"], &r.IdempotencyKey) != nil || r.IdempotencyKey == "" {
		r.IdempotencyKey = r.ID
	}
	return r
}

// selects reports whether the flags select a dead letter (of any state).
func (o *deadOpts) selects(r deadRow) bool {
	dead, _ := time.Parse(deadTime, r.DeadAt)
	switch {
	case r.Provider != o.provider:
		return false
	case o.reason != "" && r.Reason != o.reason:
		return false
	case o.ids != nil && !slices.Contains(o.ids, r.ID):
		return false
	case !o.since.IsZero() && (r.DeadAt == "" || dead.Before(o.since)):
		return false
	case !o.before.IsZero() && (r.DeadAt == "" || !dead.Before(o.before)):
		return false
	}
	return true
}

// deadListReport is what list prints with --json.
type deadListReport struct {
	Provider string         `json:"provider"`
	Where    string         `json:"where"`
	Matched  int            `json:"matched"`
	States   map[string]int `json:"states"` // the matched by state: dead, replayed, purged (Kafka)
	Letters  []deadRow      `json:"letters"`
}

// deadList is "worker dead list": the provider's dead letters, oldest first, left where they are.
func deadList(ctx context.Context, o *deadOpts, d *wire.Dead, stdout, stderr io.Writer) error {
	rep := deadListReport{Provider: o.provider, Where: d.Where, States: map[string]int{}, Letters: []deadRow{}}
	returned := 0
	err := d.Scan(ctx, func(l consumers.DeadLetter) (bool, error) {
		r := rowOf(l.Info())
		if !o.selects(r) {
			return true, nil
		}
		rep.Matched++
		rep.States[r.State]++
		returned = max(returned, l.Info().Returned)
		if o.limit == 0 || len(rep.Letters) < o.limit {
			rep.Letters = append(rep.Letters, r)
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	warnReturned(stderr, d, returned)
	if o.json {
		return writeJSON(stdout, rep)
	}
	printRows(stdout, rep.Letters)
	shown := "all shown"
	if len(rep.Letters) < rep.Matched {
		shown = fmt.Sprintf("the oldest %d shown (--limit 0 shows all)", len(rep.Letters))
	}
	fmt.Fprintf(stdout, "%s of %s in %s%s; %s\n", letters(rep.Matched), o.provider, d.Where, statesText(rep.States), shown)
	return nil
}

// statesText is " (dead 3, replayed 97)" where dead letters stay marked (Kafka), else "".
func statesText(states map[string]int) string {
	var parts []string
	for _, s := range []consumers.DeadState{consumers.DeadStateDead, consumers.DeadStateReplayed, consumers.DeadStatePurged} {
		if n := states[string(s)]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", s, n))
		}
	}
	if states[string(consumers.DeadStateDead)] == sum(states) {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// letters is "1 dead letter", "2 dead letters".
func letters(n int) string {
	if n == 1 {
		return "1 dead letter"
	}
	return fmt.Sprintf("%d dead letters", n)
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// printRows prints dead letters as a table.
func printRows(w io.Writer, rows []deadRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DEAD AT\tID\tPROVIDER\tMERCHANT\tREASON\tSTATUS\tATTEMPTS\tFIRST SEEN\tREPLAYS\tSTATE\tLAST ERROR")
	for _, r := range rows {
		id, status := r.ID, "-"
		if r.Malformed != "" {
			id = "(not a job)"
		}
		if r.Status != 0 {
			status = strconv.Itoa(r.Status)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\n", or(r.DeadAt, "-"), id, r.Provider, or(r.Merchant, "-"),
			or(r.Reason, "-"), status, r.Attempts, or(r.FirstSeen, "-"), r.Replays, r.State, excerpt(r.Error, 80))
	}
	_ = tw.Flush()
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// excerpt is the start of an error on one line.
func excerpt(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n]) + "…"
}

// warnReturned warns when scans have handed dead letters back to a quorum queue so often that the broker
// would soon drop them (RabbitMQ 4.0 to 4.2: a default delivery limit of 20).
func warnReturned(stderr io.Writer, d *wire.Dead, returned int) {
	if returned >= 10 && d.CountsReturns {
		fmt.Fprintf(stderr, "worker: warning: dead letters in %s have been handed back to it %d times by these commands; "+
			"RabbitMQ 4.0 to 4.2 drop a message of a quorum queue past its delivery limit (20 by default): lift it for this queue "+
			"(docs/operations.md, \"When jobs are dead\")\n", d.Where, returned)
	}
}

// deadPurgeReport is what purge prints with --json.
type deadPurgeReport struct {
	Provider string `json:"provider"`
	Where    string `json:"where"`
	Purged   int    `json:"purged"`
}

// deadPurge is "worker dead purge": the selected dead letters removed (RabbitMQ) or marked purged (Kafka).
func deadPurge(ctx context.Context, o *deadOpts, d *wire.Dead, stdout io.Writer) error {
	rep := deadPurgeReport{Provider: o.provider, Where: d.Where}
	err := d.Scan(ctx, func(l consumers.DeadLetter) (bool, error) {
		r := rowOf(l.Info())
		if r.State != string(consumers.DeadStateDead) || !o.selects(r) {
			return true, nil
		}
		if err := l.Purge(ctx); err != nil {
			return false, err
		}
		rep.Purged++
		return true, nil
	})
	if o.json {
		_ = writeJSON(stdout, rep)
	} else {
		verb := "purged"
		if d.Marks {
			verb = "marked purged"
		}
		fmt.Fprintf(stdout, "%s %s of %s in %s\n", verb, letters(rep.Purged), o.provider, d.Where)
	}
	return err
}
