package demo

import (
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/paygate/paygate/internal/stats"
	"github.com/paygate/paygate/providers/sim"
)

// summarize is the ledger: every enqueued job is accepted by its provider, dead-lettered, still queued
// (pending), or lost.
func (e *env) summarize(p *producer, c *census, st *gateStats) *Summary {
	s := &Summary{Broker: e.brokerKind, Redis: e.redisStr}
	s.Results, s.ResultExample = e.results.snapshot()
	p.mu.Lock()
	enqueued := p.enqueued
	p.mu.Unlock()
	settled := map[string]bool{}
	dead := map[string]map[string]int{} // provider -> reason -> count
	for _, pr := range Providers {
		dead[pr.Name] = map[string]int{}
		for _, k := range e.refs[pr.Name].srv.AcceptedKeys() {
			if enqueued[k] == pr.Name {
				settled[k] = true
			}
		}
	}
	for _, d := range c.dead {
		if prov, ok := enqueued[d.id]; ok && !settled[d.id] {
			settled[d.id] = true
			dead[prov][d.reason]++
		}
	}
	s.Enqueued, s.Settled = len(enqueued), len(settled)
	for id := range enqueued {
		switch {
		case settled[id]:
		case c.queued[id]:
			s.Pending++
		default:
			s.Lost++
			s.LostIDs = append(s.LostIDs, id)
		}
	}
	sort.Strings(s.LostIDs)

	st.mu.Lock()
	defer st.mu.Unlock()
	for _, pr := range Providers {
		ref := e.refs[pr.Name]
		seen := ref.srv.Stats()
		ps := ProviderSummary{Name: pr.Name, Dispatched: seen.Accepted, Violations: seen.Violations,
			Duplicates: seen.Duplicates, Requests: seen.Requests, ErrorsInjected: seen.ErrorsInjected,
			DeadReasons: dead[pr.Name]}
		for _, w := range pr.Limits {
			ps.Limits = append(ps.Limits, w.String())
		}
		for _, n := range dead[pr.Name] {
			ps.DeadLettered += n
		}
		m := sim.Measure(ref.times(), pr.Limits)
		ps.RatePerSec, ps.Utilization, ps.MeasuredSeconds = round(m.Rate, 2), round(m.Utilization, 4), round(m.Span.Seconds(), 3)
		if ps.Dispatched > 0 {
			ps.GateCallsPerJob = round(float64(st.calls[pr.Name])/float64(ps.Dispatched), 3)
		}
		ps.GateCalls = st.kinds[pr.Name]
		waits := slices.Clone(st.waits[pr.Name])
		slices.Sort(waits)
		ps.WaitP50Ms, ps.WaitP99Ms = ms(stats.Percentile(waits, 50)), ms(stats.Percentile(waits, 99))
		s.Providers = append(s.Providers, ps)
	}
	return s
}

func ms(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond), 1) }

func round(x float64, digits int) float64 {
	f := math.Pow(10, float64(digits))
	return math.Round(x*f) / f
}

// WriteTable prints the summary for people.
func (s *Summary) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "\npaygate demo: %d workers, broker %s, redis %s, %.1fs\n\n", s.Workers, s.Broker, s.Redis, s.Seconds)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROVIDER\tLIMITS\tDISPATCHED\tRATE/S\tUTILISATION\tVIOLATIONS\tDUPLICATES\tDEAD\tGATE CALLS/JOB\tWAIT P50\tWAIT P99")
	for _, p := range s.Providers {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.1f\t%.1f%%\t%d\t%d\t%d\t%.2f\t%.0fms\t%.0fms\n", p.Name, strings.Join(p.Limits, "+"),
			p.Dispatched, p.RatePerSec, 100*p.Utilization, p.Violations, p.Duplicates, p.DeadLettered, p.GateCallsPerJob, p.WaitP50Ms, p.WaitP99Ms)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\njobs: %d enqueued, %d settled (accepted or dead-lettered), %d still queued when the run stopped, %d lost\n",
		s.Enqueued, s.Settled, s.Pending, s.Lost)
	for _, p := range s.Providers {
		var rs []string
		for r, n := range p.DeadReasons {
			rs = append(rs, fmt.Sprintf("%d %s", n, r))
		}
		sort.Strings(rs)
		if len(rs) > 0 {
			fmt.Fprintf(w, "dead letters of %s: %s\n", p.Name, strings.Join(rs, ", "))
		}
	}
	if s.Lost > 0 {
		fmt.Fprintf(w, "LOST: %s\n", strings.Join(s.LostIDs, " "))
	}
	s.writeResults(w)
	fmt.Fprintln(w, "\nrate and utilisation: from the first acceptance, over whole multiples of the longest window;")
	fmt.Fprintln(w, "utilisation is against the most any sender could get through the provider's limits in that time.")
	return nil
}

// progress shows, while running, each provider's jobs done against enqueued and its use of each limit.
type progress struct {
	w        io.Writer
	terminal bool
	every    time.Duration
	refs     map[string]*referee
	p        *producer
	lines    int // lines drawn last time (terminal)
}

func newProgress(w io.Writer, terminal bool, refs map[string]*referee, p *producer) *progress {
	every := 5 * time.Second
	if terminal {
		every = 250 * time.Millisecond
	}
	return &progress{w: w, terminal: terminal, every: every, refs: refs, p: p}
}

func (g *progress) draw(elapsed time.Duration) {
	if g.w == nil {
		return
	}
	var b strings.Builder
	now := time.Now()
	if g.terminal && g.lines > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", g.lines) // back to the first line drawn
	}
	for _, pr := range Providers {
		enq, done := g.p.counts(pr.Name)
		at := g.refs[pr.Name].times()
		var use []string
		for _, w := range pr.Limits {
			from := now.Add(-w.Per)
			in := len(at) - sort.Search(len(at), func(i int) bool { return at[i].After(from) })
			use = append(use, fmt.Sprintf("%d/%d per %s", in, w.Limit, w.Per))
		}
		if g.terminal {
			fmt.Fprintf(&b, "\x1b[2K%-8s %s %5d/%-5d %s\n", pr.Name, bar(done, enq, 24), done, enq, strings.Join(use, "  "))
		} else {
			fmt.Fprintf(&b, "%6.1fs %-8s %d/%d done, last window %s\n", elapsed.Seconds(), pr.Name, done, enq, strings.Join(use, ", "))
		}
	}
	g.lines = len(Providers)
	_, _ = io.WriteString(g.w, b.String())
}

func (g *progress) done() {}

func bar(done, total, width int) string {
	filled := 0
	if total > 0 {
		filled = min(width, done*width/total)
	}
	return "[" + strings.Repeat("█", filled) + strings.Repeat("░", width-filled) + "]"
}

// writeResults prints the results' counts by outcome and one of them.
func (s *Summary) writeResults(w io.Writer) {
	var rs []string
	for o, n := range s.Results {
		rs = append(rs, fmt.Sprintf("%d %s", n, o))
	}
	sort.Strings(rs)
	if len(rs) == 0 {
		rs = []string{"none"}
	}
	fmt.Fprintf(w, "results published: %s\n", strings.Join(rs, ", "))
	if s.ResultExample != nil {
		fmt.Fprintf(w, "a result: %s\n", s.ResultExample)
	}
}
