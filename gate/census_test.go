package gate_test

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
)

// TestKeyCensus is the key census (issue 38): what a provider keeps in Redis stays bounded under every kind
// of traffic the gate sees. For every algorithm, on the single node and on the cluster, one provider runs
// the same activity for three of its lifetimes, a lifetime being the longest any key's contents are kept
// (measured in the first from the keys' PTTLs: about 2 s with these windows). Each lifetime:
//
//   - flips: a pause, a lateness report, then 20 changes of the live limits (SetLimits between two sets),
//     each followed by a reserve whose job is marked Sent;
//   - ticks, every censusTick until a lifetime has passed: jobs of merchants (with limits of their own
//     where the algorithm counts them, else tracked), a job marked Sent, a job reserved twice (a duplicate
//     let go), the redeliveries of jobs of two ticks before (one sent: a duplicate; one not: moved), a late
//     wake-up postponed (given back where it cannot move) and a late departure; most leases are landed,
//     a quarter left to lapse;
//   - a quiet time (censusQuiet), longer than any job's entry or mark counts but shorter than the keys'
//     expiry, then a probe: a job of each merchant, one marked Sent, one reserved twice. What is kept
//     of the ticks is trimmed by the probe's writes, so the census taken right after it finds the same
//     state every lifetime, unless something is never trimmed.
//
// A census takes every key under the prefix (SCAN on the single node, on every primary of the cluster):
// its type, PTTL, elements and MEMORY USAGE. The third lifetime's must have no more keys of any kind than
// the second's, nor more elements or memory than a little jitter allows (censusSlack). Every census
// (one is also taken right after each lifetime's flips, while the state of the limits replaced stands)
// checks that each key either expires or is of a kind unexpiring names with its bound, one per provider.
//
// No time is asserted: each phase only needs to end once what the one before it wrote has expired or
// stopped counting, and the lifetime, measured, leaves censusMargin for that.
func TestKeyCensus(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			// The algorithms run at once, each in a goroutine of its own: they mostly wait for their ticks,
			// and parallel subtests would run -parallel (GOMAXPROCS) at a time. Each reports in a subtest.
			var wg sync.WaitGroup
			runs := make([]*censusRun, len(gate.Algorithms))
			for i, algo := range gate.Algorithms {
				runs[i] = newCensusRun(t, b.rdb, algo)
				wg.Go(runs[i].run)
			}
			wg.Wait()
			for _, r := range runs {
				t.Run(string(r.algo), r.report)
			}
		})
	}
}

const (
	censusTick  = 60 * time.Millisecond  // the ticks' spacing
	censusFlips = 20                     // changes of the live limits a lifetime
	censusWait  = 400 * time.Millisecond // every reserve's max wait
	censusLease = 250 * time.Millisecond // Provider.Lease
	// censusQuiet is the quiet time before the probe: longer than an entry of the id record (or a mark)
	// counts after its slot (the longest window + margin, 340ms, plus a reservation's few ms ahead), so
	// that the probe's writes trim every one the ticks left; shorter than the keys the ticks wrote live
	// (the marks' 1.34s), so that a key that never loses what it holds keeps it for the census.
	censusQuiet = 600 * time.Millisecond
	// censusMargin is added to the longest PTTL seen, so that what the flips wrote has expired by the
	// census: it covers a few ticks of scheduling delay on a loaded machine.
	censusMargin = 500 * time.Millisecond
	// censusFirst is the first lifetime's ticking before any PTTL is known: the first lifetime's census is
	// not compared, and measures the lifetime the next two use.
	censusFirst = 2500 * time.Millisecond
	// censusMaxLife bounds the lifetime measured: a kind of key that lives longer and is not in longLived
	// is a finding (the test would take minutes, and the key probably outlives what it holds).
	censusMaxLife = 6 * time.Second
	// censusSlack is how much more the third census may hold of a kind than the second: a tenth, plus
	// censusSlackElems elements and censusSlackBytes bytes. The probe's five jobs may share one counter's
	// bucket or spread over two or three (the pace spaces them 6ms apart, the buckets are 12ms), and a
	// calendar window may end among them; MEMORY USAGE rounds to the allocator's size classes. Anything
	// that never loses what it holds grows by a lifetime's worth (here about 100 marks: a sent hash that kept
	// every mark went from 206 fields and 3176 B to 306 and 5224 B), far beyond this.
	censusSlack      = 0.10
	censusSlackElems = 4
	censusSlackBytes = 128
)

// censusLimits are the two sets of live limits the flips alternate between: the windows stay, the limits
// change, as `worker limits set` most often does.
var censusLimits = [2][]gate.Policy{
	{pol(20, 100*time.Millisecond), pol(60, 300*time.Millisecond)},
	{pol(21, 100*time.Millisecond), pol(61, 300*time.Millisecond)},
}

// censusMerchants name the jobs' merchants: the same few every lifetime, as a platform's merchants come
// back (the registry of merchants seen keeps each for a minute: it is bounded by how many there are).
var censusMerchants = []string{"m0", "m1", "m2", "m3", "big"}

// unexpiring are the kinds of key that may have no expiry, each with its bound: at most one of each per
// provider (the census checks it).
var unexpiring = map[string]string{
	"limits": "the live limits (limits.lua): one hash of a few fields per provider; configuration, kept until reset",
	"epoch":  "the warm-up's epoch: one string per provider, naming the state's shape",
}

// longLived are kinds of key that expire, but later than a lifetime: bounded by their cardinality.
var longLived = map[string]string{
	"merchants": "the merchants seen: one member per merchant admitted in the last minute, kept a minute",
	"margin":    "the margin in force: one string per provider, kept a day after the last report",
	"lateness":  "one field per reporting worker, dropped once its report is older than 10s; kept a day",
	"breaker":   "the provider's breaker (breaker.lua): one hash of ten fields per provider, kept a day past its last change",
}

// censusRun is one algorithm's census on one backend. It runs in a goroutine of its own: fatalf ends it
// (as t.Fatalf would a test), and report tells the test what it found.
type censusRun struct {
	ctx    context.Context
	rdb    redis.UniversalClient
	algo   gate.Algorithm
	prefix string
	l      *gate.Limiter
	set    int // the index in censusLimits of the limits in force
	life   int
	// recent are the jobs of the last two ticks, newest last: later ticks send them again, postpone them
	// and depart them
	recent []censusTickJobs
	n      censusCounts
	// unbounded are the keys found without an expiry beyond what unexpiring allows, by name: reported
	// once, at the end
	unbounded map[string]string
	// logs and failures are what report tells the test
	logs, failures []string
}

// censusTickJobs are the jobs of one tick: a (marked Sent), b (reserved twice), c (postponed a tick later).
type censusTickJobs struct{ a, b, c censusJob }

type censusJob struct {
	id, merchant string
	v            gate.Verdict // zero: not admitted
}

// censusCounts count what a lifetime did, so that the test shows it ran what it says.
type censusCounts struct {
	flips, admitted, denied, dups, moved, sent, postponed, departed, released, landed int
}

func newCensusRun(t *testing.T, rdb redis.UniversalClient, algo gate.Algorithm) *censusRun {
	spec := gate.Provider{Algorithm: algo, Policies: censusLimits[0], Burst: 3, MaxInFlight: 30, Lease: censusLease,
		Breaker: gate.Breaker{Failures: 3, OpenFor: time.Second, OpenMax: time.Minute, Probe: time.Second, Reach: censusWait}}
	if slices.Contains(gate.MerchantAlgorithms, algo) {
		spec.PerMerchant = []gate.Policy{pol(10, 100*time.Millisecond)}
		spec.Merchants = map[string]gate.Merchant{"big": {Policies: []gate.Policy{pol(12, 100*time.Millisecond), pol(30, 300*time.Millisecond)}}}
	} else {
		spec.TrackMerchants = true
	}
	prefix := uniquePrefix(t) + "-" + string(algo) // the algorithm named in every key a failure lists
	t.Cleanup(func() { dropKeys(prefix) })
	l, err := gate.New(rdb, gate.Options{
		// A stale-after (the worker's is margin/2) wide enough that a job delivered twice at once is a duplicate
		// on a loaded machine too; the redeliveries two ticks later are stale.
		Prefix: prefix, Margin: 20 * time.Millisecond, MarginMax: 40 * time.Millisecond, StaleAfter: 40 * time.Millisecond,
		WarmUp: true, Providers: map[string]gate.Provider{prov: spec},
	})
	if err != nil {
		t.Fatal(err)
	}
	return &censusRun{ctx: context.Background(), rdb: rdb, algo: algo, prefix: prefix, l: l, unbounded: map[string]string{}}
}

// fatalf records a failure and ends the run's goroutine.
func (r *censusRun) fatalf(format string, args ...any) {
	r.errorf(format, args...)
	runtime.Goexit()
}

func (r *censusRun) errorf(format string, args ...any) {
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}

func (r *censusRun) logf(format string, args ...any) {
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}

// report tells t what the run found, once it has ended.
func (r *censusRun) report(t *testing.T) {
	for _, s := range r.logs {
		t.Log(s)
	}
	for _, s := range r.failures {
		t.Error(s)
	}
}

// run is the census of one algorithm on one backend: three lifetimes, the last two compared.
func (r *censusRun) run() {
	ticking := censusFirst
	var censuses []census
	for r.life = 1; r.life <= 3; r.life++ {
		r.n = censusCounts{}
		r.flip()
		flipped := r.census()
		r.ticks(ticking)
		time.Sleep(censusQuiet)
		r.probe()
		c := r.census()
		r.checkActivity()
		r.logf("lifetime %d (flips, %s of ticks, %s quiet, the probe): %+v\nafter the flips:\n%safter the probe:\n%s",
			r.life, ticking, censusQuiet, r.n, flipped, c)
		if r.life == 1 {
			longest := max(flipped.longest(), c.longest())
			if longest > censusMaxLife {
				r.fatalf("a key lives %s, longer than a lifetime can be (%s), and its kind is not in longLived:\n%s%s",
					longest, censusMaxLife, flipped.over(censusMaxLife), c.over(censusMaxLife))
			}
			ticking = longest + censusMargin
		}
		censuses = append(censuses, c)
	}
	r.compare(censuses[1], censuses[2])
	if len(r.unbounded) > 0 {
		r.errorf("keys that never expire, beyond the documented bounds (%v):\n  %s\nthe last census:\n%s",
			unexpiring, strings.Join(slices.Sorted(maps.Values(r.unbounded)), "\n  "), censuses[len(censuses)-1])
	}
}

// flip begins a lifetime: a pause, a lateness report, then censusFlips changes of the live limits, each
// followed by a reserve, marked Sent (so that the marks never lapse between lifetimes).
func (r *censusRun) flip() {
	l, ctx := r.l, r.ctx
	if err := l.Pause(ctx, prov, time.Now().Add(50*time.Millisecond)); err != nil {
		r.fatalf("pause: %v", err)
	}
	if _, err := l.ReportLateness(ctx, prov, "worker-1", 2*time.Millisecond); err != nil {
		r.fatalf("report lateness: %v", err)
	}
	// A run of failures begun and ended: the breaker's hash is written (it stays closed).
	for _, report := range []func() (gate.BreakerState, error){
		func() (gate.BreakerState, error) { return l.ReportFailure(ctx, prov, "breaker-a", time.Time{}) },
		func() (gate.BreakerState, error) { return l.ReportFailure(ctx, prov, "breaker-b", time.Time{}) },
		func() (gate.BreakerState, error) { return l.ReportAnswer(ctx, prov, "breaker-c") },
	} {
		if st, err := report(); err != nil || st.Phase != gate.BreakerClosed {
			r.fatalf("breaker: %+v %v", st, err)
		}
	}
	for i := range censusFlips {
		r.set = 1 - r.set
		st, err := l.SetLimits(ctx, prov, censusLimits[r.set])
		if err != nil {
			r.fatalf("set limits %s: %v", gate.FormatPolicies(censusLimits[r.set]), err)
		}
		if !st.Changed {
			r.fatalf("flip %d to %s: nothing changed", i, gate.FormatPolicies(censusLimits[r.set]))
		}
		r.n.flips++
		j := r.reserve(fmt.Sprintf("L%d-F%03d", r.life, i), censusMerchants[i%len(censusMerchants)])
		r.sent(j)
		r.land(j)
	}
}

// ticks runs a tick every censusTick for d. A tick more than a tick late (the machine stalled) is left
// out: run at once with the others, they would crowd the windows with more than the ticks ever hold.
func (r *censusRun) ticks(d time.Duration) {
	start, n := time.Now(), int((d+censusTick-1)/censusTick)
	for k := range n {
		switch wait := time.Until(start.Add(time.Duration(k) * censusTick)); {
		case wait > 0:
			time.Sleep(wait)
		case wait < -censusTick:
			continue
		}
		r.tick(k)
	}
	r.recent = nil
}

// tick is one tick's traffic: fresh jobs of three merchants, a Sent mark, a duplicate let go, the
// redeliveries of jobs of two ticks before, a late wake-up and a late departure of jobs of the tick before.
func (r *censusRun) tick(k int) {
	m := func(i int) string { return censusMerchants[(k+i)%len(censusMerchants)] }
	id := func(job string) string { return fmt.Sprintf("L%d-T%03d-%s", r.life, k, job) }
	var now censusTickJobs
	// a: admitted, its request accepted but its delivery not settled: marked Sent. A quarter of the
	// leases lapse rather than land.
	now.a = r.reserve(id("a"), m(0))
	r.sent(now.a)
	if k%4 != 0 {
		r.land(now.a)
	}
	// b: delivered twice at once, the second a duplicate let go on the first's slot.
	now.b = r.reserve(id("b"), m(1))
	r.land(now.b)
	r.land(r.reserve(now.b.id, now.b.merchant))
	// c: admitted; its holder will wake too late.
	now.c = r.reserve(id("c"), m(2))
	if n := len(r.recent); n >= 1 {
		r.late(r.recent[n-1])
	}
	if n := len(r.recent); n >= 2 {
		// Redeliveries of jobs of two ticks ago, now stale: a's was marked sent, so it is a plain duplicate;
		// b's was not, so it moves.
		for _, j := range []censusJob{r.recent[n-2].a, r.recent[n-2].b} {
			if j.v.Allowed {
				r.land(r.reserve(j.id, j.merchant))
			}
		}
	}
	r.recent = append(r.recent, now)
	if len(r.recent) > 2 {
		r.recent = r.recent[1:]
	}
}

// late is what a worker does with the jobs of the tick before: c woke too late for its slot, so it is
// postponed to now where that fits, else given up (its lease landed, its slot released) and asked for
// again; b's request was written late.
func (r *censusRun) late(before censusTickJobs) {
	l, ctx := r.l, r.ctx
	if c := before.c; c.v.Allowed {
		at, err := l.Postpone(ctx, prov, c.merchant, c.id, c.v.Slot())
		if err != nil {
			r.fatalf("postpone %s: %v", c.id, err)
		}
		r.land(c)
		if !at.IsZero() {
			r.n.postponed++
		} else {
			if _, err := l.ReleaseFor(ctx, prov, c.merchant, c.id, 1, c.v.Slot()); err != nil {
				r.fatalf("release %s: %v", c.id, err)
			}
			r.n.released++
			r.land(r.reserve(c.id, c.merchant))
		}
	}
	if b := before.b; b.v.Allowed {
		at, err := l.Departed(ctx, prov, b.merchant, b.id, b.v.Slot(), 5*time.Millisecond)
		if err != nil {
			r.fatalf("departed %s: %v", b.id, err)
		}
		if !at.IsZero() {
			r.n.departed++
		}
	}
}

// probe ends a lifetime, after the quiet time: a job of every merchant, the first marked Sent, the second
// reserved twice, their leases kept. It writes every kind of key the ticks wrote, each trimming what
// the ticks left there, so that the census after it finds only the probe's, and what is never trimmed.
func (r *censusRun) probe() {
	for i, m := range censusMerchants {
		j := r.reserve(fmt.Sprintf("L%d-P%03d", r.life, i), m)
		switch i {
		case 0:
			r.sent(j)
		case 1:
			r.reserve(j.id, m)
		}
	}
}

func (r *censusRun) reserve(id, merchant string) censusJob {
	v, err := r.l.ReserveFor(r.ctx, prov, merchant, id, 1, censusWait)
	if err != nil {
		r.fatalf("reserve %s: %v", id, err)
	}
	switch {
	case !v.Allowed:
		r.n.denied++
		return censusJob{id: id, merchant: merchant}
	case v.Duplicate:
		r.n.dups++
	case v.Moved:
		r.n.moved++
	default:
		r.n.admitted++
	}
	return censusJob{id: id, merchant: merchant, v: v}
}

// sent marks an admitted job's request as accepted (Limiter.Sent).
func (r *censusRun) sent(j censusJob) {
	if !j.v.Allowed {
		return
	}
	if err := r.l.Sent(r.ctx, prov, j.id); err != nil {
		r.fatalf("sent %s: %v", j.id, err)
	}
	r.n.sent++
}

// land ends the job's lease, if it took one.
func (r *censusRun) land(j censusJob) {
	if j.v.Lease == "" {
		return
	}
	if err := r.l.Land(r.ctx, prov, j.v.Lease); err != nil {
		r.fatalf("land %q: %v", j.v.Lease, err)
	}
	r.n.landed++
}

// checkActivity fails a lifetime that did not do what the census is about: every flip, and enough Sent
// marks and duplicates that a record of them that never shrinks would show. A lifetime marks 30-60 and
// lets 50-90 duplicates go; the floors below leave room for a stalled machine, which leaves ticks out,
// and for leaky_bucket, which denies the flips' reserves (each flip's warm-up fills its queue).
func (r *censusRun) checkActivity() {
	n := r.n
	if n.flips != censusFlips || n.sent < 10 || n.dups < 10 || n.moved < 1 || n.admitted < 30 || n.landed < 30 {
		r.fatalf("lifetime %d did too little to count: %+v (want %d flips, at least 10 sent, 10 duplicates, 1 moved, 30 admitted, 30 landed)",
			r.life, n, censusFlips)
	}
}

// keyInfo is one key as a census found it.
type keyInfo struct {
	key, kind, typ string
	pttl           time.Duration // -1: no expiry
	elems          int64         // members of a sorted set, fields of a hash, 1 for a string
	mem            int64         // MEMORY USAGE, all of it sampled
}

// census is every key under a run's prefix, by name.
type census struct {
	keys []keyInfo
}

// census takes every key under the prefix, on every primary, and notes in r.unbounded each key without an
// expiry that unexpiring does not allow, or more than one of a kind it allows.
func (r *censusRun) census() census {
	var (
		mu   sync.Mutex
		keys []keyInfo
	)
	tag := r.prefix + ":{" + prov + "}:"
	scan := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, r.prefix+":*", 1000).Iterator()
		for iter.Next(ctx) {
			k := keyInfo{key: iter.Val()}
			k.kind = kindOf(tag, k.key)
			var err error
			if k.pttl, err = c.PTTL(ctx, k.key).Result(); err != nil {
				return err
			}
			if k.typ, err = c.Type(ctx, k.key).Result(); err != nil {
				return err
			}
			switch k.typ {
			case "zset":
				k.elems, err = c.ZCard(ctx, k.key).Result()
			case "hash":
				k.elems, err = c.HLen(ctx, k.key).Result()
			default:
				k.elems = 1
			}
			if err != nil {
				return err
			}
			k.mem, err = c.MemoryUsage(ctx, k.key, 0).Result()
			if err == redis.Nil || k.pttl == -2 || k.typ == "none" {
				continue // expired meanwhile
			}
			if err != nil {
				return err
			}
			mu.Lock()
			keys = append(keys, k)
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	switch c := r.rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(r.ctx, scan)
	case *redis.Client:
		err = scan(r.ctx, c)
	default:
		r.fatalf("census of a %T", r.rdb)
	}
	if err != nil {
		r.fatalf("census: %v", err)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].key < keys[j].key })
	perKind := map[string]int{}
	for _, k := range keys {
		if k.pttl >= 0 {
			continue
		}
		perKind[k.kind]++
		switch why, ok := unexpiring[k.kind]; {
		case !ok:
			r.unbounded[k.key] = fmt.Sprintf("%q (%s): no expiry, and no bound", k.key, k.typ)
		case perKind[k.kind] > 1:
			r.unbounded[k.key] = fmt.Sprintf("%q (%s): no expiry, and another %s key too (%s)", k.key, k.typ, k.kind, why)
		}
	}
	return census{keys: keys}
}

// kindNames name a key's kind: the part after the provider's tag, without a merchant's name or the hashes
// in names (of the limits, of a state's shape).
var kindNames = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`^m:[^:]*:`), "m:<merchant>:"},
	{regexp.MustCompile(`^(tb|gcra|leaky|epoch):[0-9a-f]{8}$`), "$1:<hash>"},
}

func kindOf(tag, key string) string {
	rest, ok := strings.CutPrefix(key, tag)
	if !ok {
		return "<outside the provider's tag> " + key
	}
	for _, n := range kindNames {
		rest = n.re.ReplaceAllString(rest, n.with)
	}
	return rest
}

// longest is the longest PTTL among keys of kinds not in longLived: what a lifetime must outlast.
func (c census) longest() time.Duration {
	var d time.Duration
	for _, k := range c.keys {
		if _, ok := longLived[k.kind]; !ok {
			d = max(d, k.pttl)
		}
	}
	return d
}

// over lists the keys of kinds not in longLived whose PTTL passes d.
func (c census) over(d time.Duration) string {
	var b strings.Builder
	for _, k := range c.keys {
		if _, ok := longLived[k.kind]; !ok && k.pttl > d {
			fmt.Fprintf(&b, "  %q (%s) PTTL %s\n", k.key, k.typ, k.pttl)
		}
	}
	return b.String()
}

// kindStat sums a census's keys of one kind.
type kindStat struct {
	typ            string
	keys           int
	elems, mem     int64
	maxTTL         time.Duration
	someUnexpiring bool
}

func (c census) byKind() map[string]*kindStat {
	out := map[string]*kindStat{}
	for _, k := range c.keys {
		s := out[k.kind]
		if s == nil {
			s = &kindStat{typ: k.typ}
			out[k.kind] = s
		}
		s.keys++
		s.elems += k.elems
		s.mem += k.mem
		s.maxTTL = max(s.maxTTL, k.pttl)
		s.someUnexpiring = s.someUnexpiring || k.pttl < 0
	}
	return out
}

func (c census) total() (keys int, mem int64) {
	for _, k := range c.keys {
		keys, mem = keys+1, mem+k.mem
	}
	return keys, mem
}

// String is the census by kind: keys, type, elements, bytes, the longest PTTL.
func (c census) String() string {
	kinds := c.byKind()
	var b strings.Builder
	for _, kind := range slices.Sorted(maps.Keys(kinds)) {
		s := kinds[kind]
		ttl := fmt.Sprint(s.maxTTL.Round(time.Millisecond))
		if s.someUnexpiring {
			ttl = "none"
		}
		fmt.Fprintf(&b, "  %-24s %3d %-6s %4d elements %6d B  PTTL %s\n", kind, s.keys, s.typ, s.elems, s.mem, ttl)
	}
	keys, mem := c.total()
	fmt.Fprintf(&b, "  %-24s %3d %-6s %4s          %6d B\n", "(all)", keys, "", "", mem)
	return b.String()
}

// compare fails where the third lifetime's census has more keys than the second's, of any kind or in all,
// or more elements or memory of a kind, or in all, than censusSlack allows; it names each kind that grew.
func (r *censusRun) compare(second, third census) {
	over := func(was, is, plus int64) bool { return float64(is) > float64(was)*(1+censusSlack)+float64(plus) }
	k2, k3 := second.byKind(), third.byKind()
	var grew []string
	for _, kind := range slices.Sorted(maps.Keys(k3)) {
		s3, s2 := k3[kind], k2[kind]
		if s2 == nil {
			s2 = &kindStat{}
		}
		if s3.keys > s2.keys || over(s2.elems, s3.elems, censusSlackElems) || over(s2.mem, s3.mem, censusSlackBytes) {
			grew = append(grew, fmt.Sprintf("%-24s %3d -> %3d keys, %4d -> %4d elements, %6d -> %6d B",
				kind, s2.keys, s3.keys, s2.elems, s3.elems, s2.mem, s3.mem))
		}
	}
	keys2, mem2 := second.total()
	keys3, mem3 := third.total()
	if len(grew) > 0 || keys3 > keys2 || over(mem2, mem3, 0) {
		r.errorf("from the second lifetime to the third, the keys grew: %d -> %d keys, %d -> %d B; kinds that grew (more keys, or elements or bytes beyond +%.0f%% and %d, %d B):\n  %s\nsecond:\n%sthird:\n%s",
			keys2, keys3, mem2, mem3, 100*censusSlack, censusSlackElems, censusSlackBytes, strings.Join(grew, "\n  "), second, third)
	}
}
