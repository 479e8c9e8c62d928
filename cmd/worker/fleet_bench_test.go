package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/internal/stats"
	"github.com/paygate/paygate/providers/sim"
)

// The fleet benchmark (make bench-fleet, issue 15): K separate `worker run` processes with the example
// config.yaml's worker and gate settings, on RabbitMQ and on Kafka (cmd/kfake as a process), against a
// strict provider-sim, a backlog, one cell per broker x limits x K. Skipped unless PAYGATE_BENCH_FLEET
// holds the length of a cell (60s); PAYGATE_BENCH_FLEET_OUT names the Markdown file whose fleet section
// it rewrites (BENCHMARKS.md), from the cells kept in bench/fleet.json (a cell measured again replaces
// its row); PAYGATE_BENCH_FLEET_K the process counts (1,2,4,8); PAYGATE_BENCH_FLEET_ONLY a regexp the
// cells' names (kafka/400/1s/K=8) must match. Figures only: nothing is asserted here; the make test case
// is TestFleetExampleSettings.

type fleetCell struct {
	Broker, Limits string
	K              int
	Accepted       int64
	Over           int64 // requests the provider refused for exceeding a limit
	Utilisation    float64
	ColdStart      time.Duration // first acceptance after the first decision (the warm-up began)
	P99Late        time.Duration // the workers' wake-ups on reserved slots
	Margin         time.Duration // the margin in force at the end
	MarginMean     time.Duration // the margin in force, its mean over the cell (sampled)
	Deferred       int           // jobs sent round a delay tier or retry topic, for any reason
	AfterP99       time.Duration // a request's arrival at the provider after its slot: p99 over the cell
	AfterMax       time.Duration // and the largest
	Late           *int64        `json:",omitempty"` // slots given back by late wake-ups (each a unit of budget); nil: not measured
	Postponed      *int64        `json:",omitempty"` // late wake-ups sent at once, their units moved to then (gate.Postpone); nil: not measured
	Departed       *int64        `json:",omitempty"` // requests written late, their entries moved (gate.Departed); nil: not measured
	Measured       string        // when (UTC)
}

var fleetLimits = []struct {
	name    string
	windows []sim.Window
}{
	{"50/1s", []sim.Window{{Limit: 50, Per: time.Second}}},
	{"100/1s + 3000/1m", []sim.Window{{Limit: 100, Per: time.Second}, {Limit: 3000, Per: time.Minute}}},
	{"400/1s", []sim.Window{{Limit: 400, Per: time.Second}}},
}

func TestFleetBench(t *testing.T) {
	spec := os.Getenv("PAYGATE_BENCH_FLEET")
	if spec == "" {
		t.Skip("make bench-fleet runs it (PAYGATE_BENCH_FLEET=60s)")
	}
	cell, err := time.ParseDuration(spec)
	if err != nil || cell < 5*time.Second {
		t.Fatalf("PAYGATE_BENCH_FLEET=%q: want a duration of at least 5s", spec)
	}
	ks := []int{1, 2, 4, 8}
	if s := os.Getenv("PAYGATE_BENCH_FLEET_K"); s != "" {
		ks = nil
		for f := range strings.SplitSeq(s, ",") {
			k, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || k < 1 {
				t.Fatalf("PAYGATE_BENCH_FLEET_K=%q: want counts like 1,2,4,8", s)
			}
			ks = append(ks, k)
		}
	}
	only := regexp.MustCompile(os.Getenv("PAYGATE_BENCH_FLEET_ONLY"))
	var cells []fleetCell
	for _, broker := range []string{"rabbitmq", "kafka"} {
		for _, lim := range fleetLimits {
			for _, k := range ks {
				name := fmt.Sprintf("%s/%s/K=%d", broker, lim.name, k)
				if !only.MatchString(name) {
					continue
				}
				t.Run(name, func(t *testing.T) {
					c := runFleetCell(t, broker, lim.name, lim.windows, k, cell)
					js, _ := json.Marshal(c)
					t.Logf("%s", js)
					cells = append(cells, c)
				})
			}
		}
	}
	if out := os.Getenv("PAYGATE_BENCH_FLEET_OUT"); out != "" {
		if err := writeFleetSection(out, cells, cell); err != nil {
			t.Fatal(err)
		}
	}
}

func runFleetCell(t *testing.T, broker, name string, windows []sim.Window, k int, run time.Duration) fleetCell {
	p := simProvider{name: "acme", limits: windows}
	var f *fleet
	var brokers string
	if broker == "kafka" {
		f, brokers = newKafkaFleet(t, p)
		b, err := os.ReadFile(f.cfg)
		if err != nil {
			t.Fatal(err)
		}
		// A partition per process at most: more would idle.
		if err := os.WriteFile(f.cfg, []byte(strings.Replace(string(b), "partitions: 4", "partitions: 8", 1)), 0o600); err != nil {
			t.Fatal(err)
		}
	} else {
		f = newFleet(t, p)
	}
	f.exampleSettings()
	for range k {
		f.startWorker()
	}
	jobs := int(float64(optimum(run, windows, f.margin)) * 1.1)
	l := f.gate()
	ctx := context.Background()
	// The margin in force, sampled from before the backlog on: a margin wider than the floor admits less
	// than the optimum (computed at the floor), so the table says how wide it was over the cell.
	margins := sampleMargin(t, l, "acme")
	afterSlot := f.watchSlots("acme")
	joinsBefore := 0
	if broker == "kafka" {
		// The group settled: every worker in one generation. Counting k joins is not enough: a worker that
		// joined a generation alone joins again when the others come, after the backlog would be there.
		f.waitFor("every worker in the group", time.Minute, f.inGroup)
		joinsBefore = f.joined()
		// One batch: `worker enqueue` publishes one confirmed record at a time, about 350/s on kfake
		// here, which would starve a 400/1s fleet of jobs rather than measure it.
		var backlog [][]byte
		for i := range jobs {
			backlog = append(backlog, fmt.Appendf(nil, `{"id":"b-%d","provider":"acme","amount":100,"currency":"EUR"}`, i))
		}
		produceRaw(t, brokers, f.x+".acme", backlog...)
	} else {
		f.enqueue("acme", jobs, "b")
	}
	s := f.sims["acme"]
	f.waitFor("a first acceptance", time.Minute, func() bool { return s.Stats().FirstAccepted != nil })
	first := *s.Stats().FirstAccepted
	time.Sleep(time.Until(first.Add(run)))
	marginMean, widened, in := margins(first)
	t.Logf("margin in force: above the floor in %d of %d samples, mean %v", widened, in, marginMean.Round(100*time.Microsecond))
	joins := f.joined()
	ran := s.Stats() // utilisation over the run, before the workers stop (see TestFleetExampleSettings)
	// Slots given back by late wake-ups, over the cell: a late job's slot is in the past by then, and the
	// pace has handed out the slots after it, so each costs a unit of the budget.
	var late, postponed, departed int64
	for i := range k {
		m := f.metrics(i)
		late += int64(decisions(m, "acme", "late"))
		postponed += int64(decisions(m, "acme", "postponed"))
		departed += int64(decisions(m, "acme", "departed"))
	}
	f.stopAll()
	if broker == "kafka" && joins > joinsBefore {
		// The group rebalanced after the cell began, which costs the cell's utilisation.
		t.Logf("%d group generations joined during the cell (%d workers)", joins-joinsBefore, k)
	}
	st := s.Stats()
	for _, o := range st.Overs {
		t.Logf("over the limit: %d/%s, %v after the first acceptance, %s early", o.Limit, o.Per, o.At.Sub(first).Round(time.Millisecond), o.Early)
	}
	c := fleetCell{Broker: broker, Limits: name, K: k, Accepted: ran.Accepted, Over: st.Violations, Utilisation: utilisation(ran, windows, f.margin),
		Late: &late, Postponed: &postponed, Departed: &departed, Measured: time.Now().UTC().Format("2006-01-02 15:04")}

	if began := f.warmUpBegan("acme"); !began.IsZero() {
		c.ColdStart = first.Sub(began)
	}
	c.MarginMean = marginMean
	arrived := afterSlot()
	if after := arrived.afters(); len(after) > 0 {
		c.AfterP99, c.AfterMax = stats.Percentile(after, 99), after[len(after)-1]
		logAfterSlot(t, after, f.margin)
	}
	for _, o := range st.Overs {
		// Its partners: the requests a window before it, give or take the margin, that came latest after
		// their slots (one of them came more than the margin late, or the margin in force was thinner).
		per, err := time.ParseDuration(o.Per)
		if err != nil {
			t.Fatalf("over %+v: %v", o, err)
		}
		for _, x := range arrived.latest(o.At.Add(-per-2*f.margin), o.At.Add(-per+f.margin), 3) {
			t.Logf("  a window before that over: %s arrived %v after the first acceptance, %v after its slot", x.key, x.at.Sub(first).Round(time.Millisecond), x.after.Round(10*time.Microsecond))
		}
	}
	ms, err := l.ReadMargin(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	c.Margin = ms.Margin
	var lates []time.Duration
	atOnce := 0
	for _, l := range f.settled() {
		switch {
		case l.Outcome == "succeeded" && l.Admission == "reserved":
			lates = append(lates, time.Duration(l.Late*float64(time.Second)))
			if l.Waited < 0.001 {
				atOnce++
			}
		case l.Outcome != "succeeded" && l.Outcome != "requeued":
			c.Deferred++
		}
	}
	slices.Sort(lates)
	c.P99Late = stats.Percentile(lates, 99)
	// With a backlog a job waits for its slot; one that did not found the pace behind the clock: no
	// handler had asked for the slots between (each such gap is budget unused).
	t.Logf("%d of %d jobs sent on a reserved slot got it at once (waited < 1ms)", atOnce, len(lates))
	return c
}

// logAfterSlot logs how long after their slots requests reached the provider (sorted, from watchSlots),
// beside the margin floor and half of it (the workers' lateness guard).
func logAfterSlot(t *testing.T, after []time.Duration, floor time.Duration) {
	if len(after) == 0 {
		return
	}
	over := func(d time.Duration) int {
		return len(after) - sort.Search(len(after), func(i int) bool { return after[i] > d })
	}
	t.Logf("arrival after the slot, %d requests: p50 %v, p99 %v, max %v; %d more than half the margin floor (%v) after, %d more than the floor",
		len(after), stats.Percentile(after, 50), stats.Percentile(after, 99), after[len(after)-1], over(floor/2), floor/2, over(floor))
}

// sampleMargin reads the provider's margin in force every 250 ms until the returned function is called,
// which stops it and returns, over the samples from since on, the mean, how many were above the floor, and
// how many there were.
func sampleMargin(t *testing.T, l *gate.Limiter, provider string) func(since time.Time) (mean time.Duration, widened, n int) {
	type sample struct {
		at time.Time
		m  time.Duration
	}
	var samples []sample
	var floor time.Duration
	stop := every(t, 250*time.Millisecond, func(ctx context.Context, at time.Time) {
		if ms, err := l.ReadMargin(ctx, provider); err == nil {
			samples, floor = append(samples, sample{at, ms.Margin}), ms.Floor
		}
	})
	return func(since time.Time) (time.Duration, int, int) {
		stop()
		var sum time.Duration
		var widened, n int
		for _, x := range samples {
			if x.at.Before(since) {
				continue
			}
			n++
			sum += x.m
			if x.m > floor {
				widened++
			}
		}
		if n == 0 {
			return 0, 0, 0
		}
		return sum / time.Duration(n), widened, n
	}
}

var fleetSection = regexp.MustCompile(`(?s)<!-- fleet:begin -->.*<!-- fleet:end -->\n?`)

// writeFleetSection merges the cells into bench/fleet.json beside path (a cell measured again replaces
// the old one), and renders them all into path between the fleet markers (appended when missing), with
// the plot in bench/plots/fleet.svg.
func writeFleetSection(path string, fresh []fleetCell, run time.Duration) error {
	store := filepath.Join(filepath.Dir(path), "bench", "fleet.json")
	var cells []fleetCell
	if b, err := os.ReadFile(store); err == nil {
		if err := json.Unmarshal(b, &cells); err != nil {
			return fmt.Errorf("%s: %w", store, err)
		}
	}
	for _, c := range fresh {
		i := slices.IndexFunc(cells, func(o fleetCell) bool { return o.Broker == c.Broker && o.Limits == c.Limits && o.K == c.K })
		if i < 0 {
			cells = append(cells, c)
		} else {
			cells[i] = c
		}
	}
	order := func(c fleetCell) string {
		lim := slices.IndexFunc(fleetLimits, func(l struct {
			name    string
			windows []sim.Window
		}) bool {
			return l.name == c.Limits
		})
		return fmt.Sprintf("%t %d %03d", c.Broker == "kafka", lim, c.K)
	}
	slices.SortFunc(cells, func(a, b fleetCell) int { return strings.Compare(order(a), order(b)) })
	js, err := json.MarshalIndent(cells, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(store, append(js, '\n'), 0o644); err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("<!-- fleet:begin -->\n## 6. The fleet: separate worker processes\n\n")
	fmt.Fprintf(&b, "Generated by `make bench-fleet` (the cells in `bench/fleet.json`, each with when it was measured; the latest %s), %s per cell. K separate `worker run` processes with the example `config.yaml`'s worker and gate settings (concurrency 16, prefetch 32, `max_inline_wait` 5s, margin 20ms, up to 100ms), on RabbitMQ and on Kafka (`cmd/kfake` as a process, 8 partitions), against `provider-sim` as the strict provider, from a cold start (no gate state in Redis), with a backlog of 1.1 × what the limits allow in the cell (on RabbitMQ by `worker enqueue` as the workers start; on Kafka produced in one batch once every worker has joined the group, since `worker enqueue` publishes about 350 records/s to kfake here, too few for 400/1s). *Accepted*: by the end of the cell, when the workers are stopped (draining, they take no new deliveries). *Over*: requests the provider refused for exceeding a limit, until every worker has stopped. *Utilisation*: accepted over the most the gate could admit between the first and the last acceptance of the cell (the referee of `TestFleetExampleSettings`; the margin is the configured one). On Kafka the cell begins once the group has settled (every worker in one generation). *Cold start*: the first acceptance after the first decision, which began the warm-up (shortest window + `gate.margin_max` + 0.5 s). *p99 late*: the workers' wake-ups on reserved slots. *After slot*: when each accepted request reached the provider after its slot in the gate's id record (`provider-sim`'s `GET /accepted` beside the record; a request written late is there at when it left, see *departed*), p99 and largest: the wake-up, the worker's send and the trip, which is what the margin absorbs. *Margin*: in force, its mean over the cell (sampled every 250 ms; the optimum is at the floor, so a wider margin in force costs utilisation) and at the end. *Late*: wake-ups more than half the margin late, whose slots were given back (`paygate_gate_decisions_total{decision=\"late\"}` over the workers, read at the end of the cell; each costs a unit of budget) / sent at once, their units moved to then where the gate found room (`decision=\"postponed\"`, no unit lost). *Departed*: requests written more than an eighth of the margin after their slots all the same, whose entries the gate moved to when they left (`decision=\"departed\"`, likewise). *Deferred*: jobs sent round a delay tier for any reason.\n\n", slices.MaxFunc(cells, func(a, b fleetCell) int { return strings.Compare(a.Measured, b.Measured) }).Measured+" UTC", run)
	b.WriteString("| broker | limits | K | accepted | over | utilisation | cold start | p99 late | after slot, p99 / max | margin, mean | margin, end | late: given back / postponed | departed | deferred |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range cells {
		mean, late, departed, after := "–", "–", "–", "–"
		if c.MarginMean > 0 {
			mean = c.MarginMean.Round(100 * time.Microsecond).String()
		}
		if c.AfterMax > 0 {
			after = c.AfterP99.Round(10*time.Microsecond).String() + " / " + c.AfterMax.Round(10*time.Microsecond).String()
		}
		if c.Late != nil {
			late = strconv.FormatInt(*c.Late, 10)
		}
		if c.Postponed != nil {
			late += " / " + strconv.FormatInt(*c.Postponed, 10)
		}
		if c.Departed != nil {
			departed = strconv.FormatInt(*c.Departed, 10)
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %.3f | %s | %s | %s | %s | %s | %s | %s | %d |\n", c.Broker, c.Limits, c.K, c.Accepted, c.Over, c.Utilisation,
			c.ColdStart.Round(time.Millisecond), c.P99Late.Round(10*time.Microsecond), after, mean, c.Margin.Round(100*time.Microsecond), late, departed, c.Deferred)
	}
	b.WriteString("\n![utilisation by processes](bench/plots/fleet.svg)\n<!-- fleet:end -->\n")
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	doc := string(old)
	if fleetSection.MatchString(doc) {
		doc = fleetSection.ReplaceAllLiteralString(doc, b.String())
	} else {
		doc = strings.TrimRight(doc, "\n") + "\n\n" + b.String()
	}
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(filepath.Dir(path), "bench", "plots", "fleet.svg"), fleetPlot(cells), 0o644)
}

// fleetPlot draws utilisation against K, one line per broker and limits, and marks a cell with requests
// over the limit in red.
func fleetPlot(cells []fleetCell) []byte {
	const w, h, left, top, right, bottom = 640, 360, 60, 20, 200, 40
	pw, ph := float64(w-left-right), float64(h-top-bottom)
	lo := 0.9
	for _, c := range cells {
		lo = min(lo, c.Utilisation)
	}
	ks := []int{}
	for _, c := range cells {
		if !slices.Contains(ks, c.K) {
			ks = append(ks, c.K)
		}
	}
	slices.Sort(ks)
	x := func(k int) float64 { return left + pw*float64(slices.Index(ks, k))/float64(max(1, len(ks)-1)) }
	y := func(u float64) float64 { return top + ph*(1.02-min(u, 1.02))/(1.02-lo) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	for _, u := range []float64{lo, (lo + 1) / 2, 1} {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%.3f</text>`+"\n", left, y(u), left+pw, y(u), left-6, y(u)+4, u)
	}
	for _, k := range ks {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">K=%d</text>`+"\n", x(k), h-bottom+18, k)
	}
	colours := []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#17becf"}
	series := []string{}
	for _, c := range cells {
		if s := c.Broker + ", " + c.Limits; !slices.Contains(series, s) {
			series = append(series, s)
		}
	}
	for i, s := range series {
		col := colours[i%len(colours)]
		var pts []string
		for _, c := range cells {
			if c.Broker+", "+c.Limits == s {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(c.K), y(c.Utilisation)))
				dot := col
				if c.Over > 0 {
					dot = "red"
				}
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", x(c.K), y(c.Utilisation), dot)
			}
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" points="%s"/>`+"\n", col, strings.Join(pts, " "))
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="%s">%s</text>`+"\n", w-right+10, top+16*(i+1), col, s)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d">utilisation (red: a cell with requests over the limit)</text>`+"\n", left, h-4)
	b.WriteString("</svg>\n")
	return []byte(b.String())
}
