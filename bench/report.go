package main

import (
	"fmt"
	"math"
	"os"
	"strings"
	"time"
)

func ms(d time.Duration) string {
	switch {
	case d == 0:
		return "—"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	default:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
}

func costTable(b *strings.Builder, rs []costResult) {
	fmt.Fprintln(b, "| decision | serial p50 | serial p99 | ÷ GET (p50, interleaved) | 16 goroutines | Redis-side per decision |")
	fmt.Fprintln(b, "|---|---|---|---|---|---|")
	for _, r := range rs {
		redisSide := "—"
		if r.redisUsPerDecide > 0 {
			redisSide = fmt.Sprintf("%.1f µs", r.redisUsPerDecide)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %.2f× | %.0f/s | %s |\n", r.name, ms(r.p50), ms(r.p99), r.ratio, r.parallelPerSec, redisSide)
	}
}

// batchTable writes the batched decisions, and whether they meet their goals: at most 5 µs a job, and
// at most a quarter of the naive script's single decision in the same run (naiveUs; 0: not measured).
func batchTable(b *strings.Builder, rs []batchCost, naiveUs float64) {
	fmt.Fprintln(b, "| jobs a call | calls | jobs | Redis-side per job |")
	fmt.Fprintln(b, "|---|---|---|---|")
	for _, r := range rs {
		fmt.Fprintf(b, "| %d | %d | %d | %.1f µs |\n", r.size, r.calls, r.jobs, r.redisUsPerJob)
	}
	var verdicts []string
	for _, r := range rs {
		if r.size >= 16 {
			verdict := "met"
			if r.redisUsPerJob > 5 {
				verdict = "**not met**"
			}
			verdicts = append(verdicts, fmt.Sprintf("%d a call, %.1f µs: %s", r.size, r.redisUsPerJob, verdict))
		}
	}
	fmt.Fprintf(b, "\nGoal: ≤ 5 µs per admitted job at batch sizes of 16 and more. %s.\n", strings.Join(verdicts, "; "))
	if naiveUs == 0 {
		return
	}
	verdicts = nil
	for _, r := range rs {
		if r.size >= 16 {
			verdict := "met"
			if r.redisUsPerJob > naiveUs/4 {
				verdict = "**not met**"
			}
			verdicts = append(verdicts, fmt.Sprintf("%d a call, %.2f×: %s", r.size, r.redisUsPerJob/naiveUs, verdict))
		}
	}
	fmt.Fprintf(b, "\nGoal: ≤ 0.25× the naive script's single decision in this run (%.1f µs, section 1), at 16 and more a call. %s.\n", naiveUs, strings.Join(verdicts, "; "))
}

func accuracyTable(b *strings.Builder, rs []accuracyResult) {
	fmt.Fprintln(b, "| contender | accepted | violations | utilisation | limiter calls per job | p99 wait |")
	fmt.Fprintln(b, "|---|---|---|---|---|---|")
	for _, r := range rs {
		calls := fmt.Sprintf("%.2f", r.callsPerJob)
		if r.contender == "x/time/rate per worker" {
			calls = "0 (local)"
		}
		fmt.Fprintf(b, "| %s | %d | %d | %.1f%% | %s | %s |\n", r.contender, r.accepted, r.violations, 100*r.utilisation, calls, ms(r.p99Wait))
	}
}

func e2eTable(b *strings.Builder, rs []e2eResult) {
	fmt.Fprintf(b, "| broker | workers | jobs/s, no gate | jobs/s, gate, one job a call | gate's cost | jobs/s, gate, batched | gate's cost | gate calls per job, batched | of them, the lateness guard's | jobs/s, batched, up to %d calls on their way | gate's cost | its calls per job | jobs/s, batched, results on | results' cost |\n", e2eCalls)
	fmt.Fprintln(b, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for i := 0; i+4 < len(rs); i += len(e2eSettings) {
		off, one, many, res, serial := rs[i], rs[i+1], rs[i+2], rs[i+3], rs[i+4]
		fmt.Fprintf(b, "| %s | %d | %.0f | %.0f | %.1f%% | %.0f | %.1f%% | %.2f | %.3f | %.0f | %.1f%% | %.2f | %.0f | %.1f%% |\n", off.broker, off.workers, off.perSec,
			one.perSec, 100*one.cost, many.perSec, 100*many.cost, float64(many.calls)/float64(many.jobs), float64(many.moves)/float64(many.jobs),
			serial.perSec, 100*serial.cost, float64(serial.calls)/float64(serial.jobs), res.perSec, 100*res.cost)
	}
}

// e2eGoals says, for each broker and number of workers, whether the batched gate's cost met the goal.
func e2eGoals(b *strings.Builder, rs []e2eResult) {
	for i := 0; i+3 < len(rs); i += len(e2eSettings) {
		many, res := rs[i+2], rs[i+3]
		mark := "met"
		if many.cost > 0.10 {
			mark = "**not met**"
		}
		workers := fmt.Sprintf("%d workers", many.workers)
		if many.workers == 1 {
			workers = "1 worker"
		}
		fmt.Fprintf(b, "- %s, %s: the batched gate costs %.1f%%: %s.\n", many.broker, workers, 100*many.cost, mark)
		mark = "met"
		if res.cost > 0.05 {
			mark = "**not met**"
		}
		fmt.Fprintf(b, "- %s, %s: publishing results costs %.1f%% (goal ≤ 5%%): %s.\n", res.broker, workers, 100*res.cost, mark)
		off := rs[i]
		if off.ownCPU > 0 {
			ratio := float64(many.ownCPU) / float64(off.ownCPU)
			mark = "met"
			if ratio > 1.10 {
				mark = "**not met**"
			}
			fmt.Fprintf(b, "- %s, %s: this process's CPU per job, batched gate %.1f µs against %.1f µs without: %.2f× (goal ≤ 1.10×): %s.\n",
				many.broker, workers, float64(many.ownCPU)/float64(time.Microsecond), float64(off.ownCPU)/float64(time.Microsecond), ratio, mark)
		}
	}
}

// e2eCPUTable is the CPU each job took, by side (the runs of e2eTable).
func e2eCPUTable(b *strings.Builder, rs []e2eResult) {
	fmt.Fprintf(b, "| broker | workers | Redis, one job a call | Redis, batched | Redis, batched, up to %[1]d calls on their way | this process, no gate | this process, one job a call | this process, batched | this process, batched, up to %[1]d calls on their way |\n", e2eCalls)
	fmt.Fprintln(b, "|---|---|---|---|---|---|---|---|---|")
	us := func(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond)) }
	for i := 0; i+4 < len(rs); i += len(e2eSettings) {
		off, one, many, serial := rs[i], rs[i+1], rs[i+2], rs[i+4]
		fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", off.broker, off.workers, us(one.redisCPU), us(many.redisCPU), us(serial.redisCPU),
			us(off.ownCPU), us(one.ownCPU), us(many.ownCPU), us(serial.ownCPU))
	}
}

func scaleTable(b *strings.Builder, rs []scaleResult) {
	fmt.Fprintln(b, "| limit | window | log entries | Redis memory | bytes per entry | admission p50 | denial p50 |")
	fmt.Fprintln(b, "|---|---|---|---|---|---|---|")
	for _, r := range rs {
		fmt.Fprintf(b, "| %d | %s | %d | %s | %.0f | %s | %s |\n", r.limit, fmtWindow(r.window), r.entries, bytesH(r.bytes), r.bytesPerEntry, ms(r.allowP50), ms(r.denyP50))
	}
}

func fmtWindow(d time.Duration) string {
	switch {
	case d >= time.Hour && d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d >= time.Minute && d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	default:
		return d.String()
	}
}

func bytesH(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	default:
		return fmt.Sprintf("%d B", n)
	}
}

// plot writes an SVG of requests per second seen by the referee, one line per contender, against the
// per-second limit (and the sustained rate of a longer window, dashed).
func plot(path, title string, rs []accuracyResult, perSecondLimit float64, sustained float64) error {
	const w, h, left, right, top, bottom = 760, 360, 56, 200, 36, 40
	secs := 0
	peak := perSecondLimit
	for _, r := range rs {
		secs = max(secs, len(r.perSecond))
		for _, v := range r.perSecond {
			peak = max(peak, float64(v))
		}
	}
	if secs < 2 {
		secs = 2
	}
	ymax := math.Ceil(peak*1.1/10) * 10
	x := func(s float64) float64 { return left + s*(w-left-right)/float64(secs-1) }
	y := func(v float64) float64 { return top + (h-top-bottom)*(1-v/ymax) }
	colors := []string{"#1b9e77", "#66a61e", "#1f78b4", "#6a3d9a", "#b15928", "#e31a1c", "#a6cee3", "#d95f02", "#7570b3", "#e7298a", "#a6761d"}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%d" y="20" font-size="14">%s</text>`+"\n", left, title)
	for i := 0; i <= 5; i++ {
		v := ymax * float64(i) / 5
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#eee"/><text x="%d" y="%.1f" text-anchor="end">%.0f</text>`+"\n", left, w-right, y(v), y(v), left-6, y(v)+4, v)
	}
	for s := 0; s < secs; s += max(1, secs/10) {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%ds</text>`+"\n", x(float64(s)), h-bottom+16, s)
	}
	fmt.Fprintf(&b, `<text x="14" y="%d" transform="rotate(-90 14 %d)" text-anchor="middle">requests/s at the referee</text>`+"\n", h/2, h/2)
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="black" stroke-width="1.5"/>`+"\n", left, w-right, y(perSecondLimit), y(perSecondLimit))
	if sustained > 0 && sustained < perSecondLimit {
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="black" stroke-dasharray="5,4"/>`+"\n", left, w-right, y(sustained), y(sustained))
	}
	for i, r := range rs {
		var pts []string
		for s, v := range r.perSecond {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(float64(s)), y(float64(v))))
		}
		c := colors[i%len(colors)]
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", c, strings.Join(pts, " "))
		ly := top + 16*i
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="3"/><text x="%d" y="%d">%s</text>`+"\n", w-right+10, w-right+28, ly, ly, c, w-right+32, ly+4, r.contender)
	}
	ly := top + 16*len(rs) + 8
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="black" stroke-width="1.5"/><text x="%d" y="%d">limit per second</text>`+"\n", w-right+10, w-right+28, ly, ly, w-right+32, ly+4)
	if sustained > 0 && sustained < perSecondLimit {
		ly += 16
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="black" stroke-dasharray="5,4"/><text x="%d" y="%d">sustained (long window)</text>`+"\n", w-right+10, w-right+28, ly, ly, w-right+32, ly+4)
	}
	b.WriteString("</svg>\n")
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
