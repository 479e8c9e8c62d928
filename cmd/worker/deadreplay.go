package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/wire"
)

// deadReplayReport is what replay prints at the end with --json; its keys are a public contract
// (docs/operations.md).
type deadReplayReport struct {
	Provider string `json:"provider"`
	Where    string `json:"where"`
	DryRun   bool   `json:"dry_run"`
	Matched  int    `json:"matched"`  // dead letters the flags select (still dead)
	Replayed int    `json:"replayed"` // put back (with --dry-run: would be)
	// Malformed are selected dead letters that are not jobs: left dead.
	Malformed int `json:"malformed"`
	// Left are selected jobs not replayed: past --max, or after a stop before the broker's consumer_timeout.
	Left       int       `json:"left"`
	MissingIDs []string  `json:"missing_ids"` // --id values no dead letter of the provider has
	Stopped    string    `json:"stopped,omitempty"`
	Seconds    float64   `json:"seconds"`
	Letters    []deadRow `json:"letters,omitempty"` // with --dry-run: those it would replay
}

// deadReplay is "worker dead replay": the selected dead letters put back on the provider's queue or topic
// (copy confirmed, then the dead letter removed or marked), at most --rate a second, with progress on
// stderr and a summary at the end.
func deadReplay(ctx context.Context, o *deadOpts, d *wire.Dead, stdout, stderr io.Writer) error {
	r := &replayer{o: o, d: d, stderr: stderr, pace: newPacer(o.rate), start: time.Now(), found: map[string]bool{},
		rep: deadReplayReport{Provider: o.provider, Where: d.Where, DryRun: o.dryRun, MissingIDs: []string{}}}
	if !o.dryRun {
		fmt.Fprintf(stderr, "dead replay: %s's dead letters from %s, at most %g a second\n", o.provider, d.Where, o.rate)
	}
	err := d.Scan(ctx, func(l consumers.DeadLetter) (bool, error) { return r.visit(ctx, l) })
	warnReturned(stderr, d, r.returned)
	for _, id := range o.ids {
		if !r.found[id] {
			r.rep.MissingIDs = append(r.rep.MissingIDs, id)
		}
	}
	r.rep.Seconds = time.Since(r.start).Round(time.Millisecond).Seconds()
	r.summary(stdout)
	if err != nil {
		return err
	}
	return r.partly()
}

// replayer replays dead letters one at a time as a scan hands them over.
type replayer struct {
	o        *deadOpts
	d        *wire.Dead
	stderr   io.Writer
	pace     *pacer
	start    time.Time
	found    map[string]bool // the ids selected, replayed or not
	returned int             // the most times a dead letter was handed back (warnReturned)
	shown    time.Time       // the last progress line
	rep      deadReplayReport
}

// visit replays one dead letter if the flags select it. SIGINT (ctx) stops the replay between two.
func (r *replayer) visit(ctx context.Context, l consumers.DeadLetter) (bool, error) {
	info := l.Info()
	row := rowOf(info)
	if row.State != string(consumers.DeadStateDead) || !r.o.selects(row) {
		return true, nil
	}
	r.found[row.ID] = true
	r.returned = max(r.returned, info.Returned)
	r.rep.Matched++
	switch {
	case row.Malformed != "":
		r.rep.Malformed++
		fmt.Fprintf(r.stderr, "dead replay: a dead letter in %s (dead at %s, reason %s) is not a job: %s; left dead (worker dead purge --reason %s removes it)\n",
			row.Where, or(row.DeadAt, "unknown"), or(row.Reason, "unknown"), row.Malformed, or(row.Reason, "…"))
		return true, nil
	case r.o.max > 0 && r.rep.Replayed >= r.o.max, r.rep.Stopped != "":
		r.rep.Left++
		return true, nil
	case r.o.dryRun:
		r.rep.Replayed++
		r.rep.Letters = append(r.rep.Letters, row)
		return true, nil
	case r.nearHold():
		r.rep.Stopped = fmt.Sprintf("before the broker's consumer_timeout (%s) takes back what this run holds: run it again for the rest", r.d.Hold)
		r.rep.Left++
		return true, nil
	}
	if err := r.pace.wait(ctx); err != nil {
		return false, err
	}
	// A replay under way finishes, even on SIGINT: its copy is confirmed and its dead letter settled, or not.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), consumers.SettleTimeout)
	err := l.Replay(rctx)
	cancel()
	r.pace.done()
	if err != nil {
		return false, err
	}
	r.rep.Replayed++
	r.progress()
	return true, nil
}

// nearHold reports whether the next replay would come too close to the broker's consumer_timeout, past
// which RabbitMQ closes the channel and takes back every dead letter the scan holds (none is lost).
func (r *replayer) nearHold() bool {
	return r.d.Hold > 0 && time.Since(r.start)+r.pace.period > r.d.Hold*8/10
}

// progress writes a line at most once a second.
func (r *replayer) progress() {
	if time.Since(r.shown) < time.Second {
		return
	}
	r.shown = time.Now()
	elapsed := time.Since(r.start).Seconds()
	fmt.Fprintf(r.stderr, "dead replay: %d replayed of %d selected so far (%.1f a second)\n", r.rep.Replayed, r.rep.Matched, float64(r.rep.Replayed)/elapsed)
}

// summary prints the report: a few lines, or one JSON object.
func (r *replayer) summary(w io.Writer) {
	rep := r.rep
	if r.o.json {
		_ = writeJSON(w, rep)
		return
	}
	if rep.DryRun {
		printRows(w, rep.Letters)
		fmt.Fprintf(w, "dry run: would replay %d of the %s of %s selected in %s", rep.Replayed, letters(rep.Matched), r.o.provider, rep.Where)
	} else {
		fmt.Fprintf(w, "replayed %d of the %s of %s selected in %s, in %.1fs", rep.Replayed, letters(rep.Matched), r.o.provider, rep.Where, rep.Seconds)
	}
	if rep.Malformed > 0 {
		fmt.Fprintf(w, "; %d not jobs, left dead", rep.Malformed)
	}
	if rep.Left > 0 {
		fmt.Fprintf(w, "; %d left dead past --max or a stop", rep.Left)
	}
	fmt.Fprintln(w)
	if len(rep.MissingIDs) > 0 {
		fmt.Fprintf(w, "no dead letter of %s has the id %s (replayed already, or never dead: worker dead list --provider %s)\n",
			r.o.provider, strings.Join(rep.MissingIDs, ", "), r.o.provider)
	}
	if rep.Stopped != "" {
		fmt.Fprintln(w, "stopped "+rep.Stopped)
	}
}

// partly is the exit status 3 error when the replay did less than it was asked: an --id not found, a
// dead letter that is not a job, a stop before the consumer timeout.
func (r *replayer) partly() error {
	var why []string
	if n := len(r.rep.MissingIDs); n > 0 {
		why = append(why, fmt.Sprintf("%d ids not found", n))
	}
	if r.rep.Malformed > 0 {
		why = append(why, fmt.Sprintf("%d dead letters not jobs", r.rep.Malformed))
	}
	if r.rep.Stopped != "" {
		why = append(why, "stopped with some left")
	}
	if len(why) == 0 {
		return nil
	}
	return exitStatus{code: 3, err: errors.New("dead replay: done in part: " + strings.Join(why, ", "))}
}

// pacer holds replays to at most rate a second: a replay starts a period after the one before, and never
// less than window after the end of the n-th replay before it (n the rate, at least 1; window n/rate). A
// copy's first seen is stamped between its replay's start and end, so no second holds more copies than
// the rate, however long a publish took.
type pacer struct {
	period time.Duration // between two starts
	n      int           // at most n starts ...
	window time.Duration // ... within this of the ends before them
	last   time.Time     // the latest start
	ends   []time.Time   // the latest n ends
}

func newPacer(rate float64) *pacer {
	n := max(1, int(rate))
	return &pacer{period: time.Duration(float64(time.Second) / rate), n: n, window: time.Duration(float64(n) / rate * float64(time.Second))}
}

// wait waits for the next start.
func (p *pacer) wait(ctx context.Context) error {
	next := p.last.Add(p.period)
	if len(p.ends) == p.n {
		next = latest(next, p.ends[0].Add(p.window))
	}
	if !consumers.Sleep(ctx, time.Until(next)) {
		return ctx.Err()
	}
	p.last = time.Now()
	return nil
}

// done notes that the replay started last has ended.
func (p *pacer) done() {
	p.ends = append(p.ends, time.Now())
	if len(p.ends) > p.n {
		p.ends = slices.Delete(p.ends, 0, 1)
	}
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
