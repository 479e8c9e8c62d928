// Package demo runs the whole of paygate in one process, for a first look and as an end-to-end check: an
// embedded Redis (miniredis, which runs the gate's Lua) and an embedded Kafka (kfake) unless real servers
// are given, three simulated providers as strict referees, a producer that keeps a backlog well above what
// the limits allow, and several workers, each with its own clients as separate processes would have.
//
// At the end a ledger accounts for every job the producer enqueued: accepted by its provider (charged
// once), dead-lettered with a reason, or still queued in the broker (read back by a census). A job in none
// of those is lost.
package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/zap"

	"github.com/paygate/paygate/config"
	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/job"
	"github.com/paygate/paygate/providers/sim"
	"github.com/paygate/paygate/wire"
)

// Options tune a demo run.
type Options struct {
	// Duration is how long the producer keeps the backlog up; then the workers finish what they hold and
	// stop. With Jobs set and Duration 0 the run lasts until every job is settled.
	Duration time.Duration
	// Workers is the number of worker "processes".
	Workers int
	// Jobs, when set, is the number of jobs enqueued up front (split across providers by their budget)
	// instead of a backlog kept up for the duration.
	Jobs int
	// Redis is a real Redis address; empty: embedded.
	Redis string
	// RabbitMQ is an AMQP URL; Kafka real brokers. Both empty: embedded Kafka.
	RabbitMQ string
	Kafka    []string
	// Progress receives progress while running (nil: none); Terminal redraws bars in place.
	Progress io.Writer
	Terminal bool
	// Log receives the workers' warnings (nil: discarded).
	Log *zap.Logger
}

// Provider is one simulated provider of the demo.
type Provider struct {
	Name      string
	Limits    []sim.Window
	ErrorRate float64 // share of requests answered 500
}

// Providers are the demo's referees: one plain, one with two windows, one that fails now and then.
var Providers = []Provider{
	{Name: "acme", Limits: []sim.Window{{Limit: 40, Per: time.Second}}},
	{Name: "globex", Limits: []sim.Window{{Limit: 10, Per: time.Second}, {Limit: 40, Per: 5 * time.Second}}},
	{Name: "initech", Limits: []sim.Window{{Limit: 25, Per: time.Second}}, ErrorRate: 0.01},
}

// The demo's settings, chosen like a production config for these limits.
const (
	margin      = 25 * time.Millisecond // the margin follows the workers' lateness up to config's margin_max
	concurrency = 8                     // per provider per worker: enough in flight for 40/s at ~20ms a request
	latency     = 15 * time.Millisecond
	jitter      = 10 * time.Millisecond
	partitions  = 4
	badEvery    = 200 // every 200th job is invalid, to show a dead letter with its reason

	maxInlineWait  = 5 * time.Second
	drainAllowance = maxInlineWait + 500*time.Millisecond
)

var delayTiers = []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}

// Summary is the result of a run.
type Summary struct {
	Broker    string            `json:"broker"`
	Redis     string            `json:"redis"`
	Workers   int               `json:"workers"`
	Seconds   float64           `json:"seconds"`
	Enqueued  int               `json:"enqueued"`
	Settled   int               `json:"settled"` // accepted by the provider or dead-lettered
	Pending   int               `json:"pending"` // still queued in the broker when the run stopped
	Lost      int               `json:"lost"`
	LostIDs   []string          `json:"lost_ids,omitempty"`
	Providers []ProviderSummary `json:"providers"`
	// Results counts the results the workers published, by outcome; ResultExample is one of them.
	Results       map[string]int  `json:"results"`
	ResultExample json.RawMessage `json:"result_example,omitempty"`
}

// ProviderSummary is what one provider's referee and the workers saw.
type ProviderSummary struct {
	Name   string   `json:"name"`
	Limits []string `json:"limits"`
	// Dispatched counts the jobs the provider accepted (charged, each once).
	Dispatched int64 `json:"dispatched"`
	// RatePerSec and Utilization are measured over whole multiples of the longest window from the first
	// acceptance: there no sender can get more than limit x T / window through any one limit.
	RatePerSec  float64 `json:"rate_per_sec"`
	Utilization float64 `json:"utilization"`
	Violations  int64   `json:"violations"` // requests the referee refused for exceeding a limit
	Duplicates  int64   `json:"duplicates"` // replays of an already accepted key, absorbed by the referee
	// DeadLettered counts the provider's jobs in the dead letters, by reason in DeadReasons.
	DeadLettered    int              `json:"dead_lettered"`
	DeadReasons     map[string]int   `json:"dead_reasons,omitempty"`
	Requests        int64            `json:"requests"`           // every request the referee received
	ErrorsInjected  int64            `json:"errors_injected"`    // 500s it answered on purpose
	GateCallsPerJob float64          `json:"gate_calls_per_job"` // Reserve, Release and Pause calls per dispatched job
	GateCalls       map[string]int64 `json:"gate_calls"`         // by kind: admitted, duplicate, denied, other (release, pause, error)
	WaitP50Ms       float64          `json:"wait_p50_ms"`        // in-process wait for a reserved slot
	WaitP99Ms       float64          `json:"wait_p99_ms"`
	MeasuredSeconds float64          `json:"measured_seconds"` // the T of RatePerSec and Utilization
}

// Run runs the demo until it is done or ctx ends (then it stops early and still reports).
func Run(ctx context.Context, o Options) (*Summary, error) {
	if o.Workers < 1 {
		return nil, errors.New("demo: --workers must be at least 1")
	}
	if o.Jobs < 0 || o.Duration < 0 || (o.Jobs == 0 && o.Duration == 0) {
		return nil, errors.New("demo: give a --duration, a number of --jobs, or both")
	}
	if o.RabbitMQ != "" && len(o.Kafka) > 0 {
		return nil, errors.New("demo: --rabbitmq and --kafka are alternatives; give one")
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	env, err := start(o)
	if err != nil {
		return nil, err
	}
	defer env.close()
	return env.run(ctx, o)
}

// env is everything a run uses.
type env struct {
	id       string
	cfg      *config.Config // the workers' configuration, as a config file would give it
	secret   func(string) string
	redisStr string
	closers  []func()

	brokerKind string
	census     func(ctx context.Context) (*census, error)

	refs    map[string]*referee
	results *resultCounts // the workers' results, by outcome
}

// demoAMQPURL is the variable broker.rabbitmq.url_env names in the demo's configuration; its value is the
// --rabbitmq URL, passed to wire without touching the process's environment.
const demoAMQPURL = "PAYGATE_DEMO_AMQP_URL"

func start(o Options) (*env, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	e := &env{id: "paygate-demo-" + hex.EncodeToString(b[:]), refs: map[string]*referee{}}
	e.secret = func(name string) string {
		if name == demoAMQPURL {
			return o.RabbitMQ
		}
		return ""
	}
	ok := false
	defer func() {
		if !ok {
			e.close()
		}
	}()

	addr := o.Redis
	e.redisStr = addr
	if addr == "" {
		m := miniredis.NewMiniRedis()
		if err := m.Start(); err != nil {
			return nil, fmt.Errorf("demo: embedded redis: %w", err)
		}
		e.closers = append(e.closers, m.Close)
		addr = m.Addr()
		e.redisStr = "embedded (miniredis)"
	}
	// config's defaults (the gate's warm-up, margin_max, max_attempts, ...) but for these.
	e.cfg = config.Default()
	e.cfg.Redis.Addrs, e.cfg.Redis.KeyPrefix = []string{addr}, e.id
	e.cfg.Gate.Margin = margin
	e.cfg.Results.Enabled = true
	e.results = newResultCounts()
	w := &e.cfg.Worker
	w.Concurrency, w.MaxInlineWait, w.MaxDeferralAge, w.ShutdownTimeout, w.DelayTiers = concurrency, maxInlineWait, time.Hour, 10*time.Second, delayTiers
	switch {
	case o.RabbitMQ != "":
		e.brokerKind = "rabbitmq"
		r := &e.cfg.Broker.RabbitMQ
		r.URLEnv, r.Exchange, r.Prefetch = demoAMQPURL, e.id, concurrency*2
		e.census = func(ctx context.Context) (*census, error) { return rabbitCensus(ctx, o.RabbitMQ, e.cfg, e.secret) }
	default:
		brokers := o.Kafka
		e.brokerKind = "kafka"
		if len(brokers) == 0 {
			c, err := kfake.NewCluster(kfake.NumBrokers(1))
			if err != nil {
				return nil, fmt.Errorf("demo: embedded kafka: %w", err)
			}
			e.closers = append(e.closers, c.Close)
			brokers = c.ListenAddrs()
			e.brokerKind = "kafka, embedded (kfake)"
		}
		e.cfg.Broker.Kind = "kafka"
		k := &e.cfg.Broker.Kafka
		k.Brokers, k.Group, k.TopicPrefix, k.Partitions = brokers, e.id, e.id, partitions
		e.census = func(ctx context.Context) (*census, error) { return kafkaCensus(ctx, e.cfg) }
	}

	for _, p := range Providers {
		r := newReferee(p)
		srv, err := sim.Start("127.0.0.1:0", sim.Options{Limits: p.Limits, Latency: latency, Jitter: jitter,
			ErrorRate: p.ErrorRate, OnAccept: r.accepted})
		if err != nil {
			return nil, err
		}
		r.srv = srv
		e.closers = append(e.closers, func() { _ = srv.Close() })
		e.refs[p.Name] = r
		cfg := config.Provider{URL: srv.URL() + "/payments", Timeout: 5 * time.Second}
		for _, l := range p.Limits {
			cfg.Limits = append(cfg.Limits, config.Limit{Requests: int64(l.Limit), Per: l.Per})
		}
		e.cfg.Providers[p.Name] = cfg.WithDefaults() // paced, as a worker run with this provider's defaults is
	}
	if err := e.cfg.Validate(); err != nil {
		return nil, fmt.Errorf("demo: its configuration: %w", err)
	}
	ok = true
	return e, nil
}

func (e *env) close() {
	for _, c := range slices.Backward(e.closers) {
		c()
	}
}

// worker is one worker "process": its own Redis client, gate, provider clients and broker connection,
// built by wire from the demo's configuration as `worker run` builds them from a file.
type worker struct {
	*wire.Parts
	w *consumers.Worker
}

func (e *env) newWorker(ctx context.Context, o Options, n int, st *gateStats) (*worker, error) {
	log := o.Log.With(zap.Int("worker", n))
	parts, err := wire.Build(ctx, e.cfg, wire.Options{Log: log, Secret: e.secret})
	if err != nil {
		return nil, fmt.Errorf("demo: worker %d: %w", n, err)
	}
	parts.Core.Results = e.results.tee(parts.Core.Results)
	w, err := parts.Worker(countingGate{parts.Gate, st}, log, nil)
	if err != nil {
		parts.Close()
		return nil, err
	}
	return &worker{Parts: parts, w: w}, nil
}

func (e *env) run(ctx context.Context, o Options) (*Summary, error) {
	began := time.Now()
	st := newGateStats()
	producer, err := wire.OpenBroker(ctx, e.cfg, wire.Options{Log: o.Log, Secret: e.secret})
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	defer producer.Close()

	f, err := e.startFleet(ctx, o, st)
	if err != nil {
		return nil, err
	}
	defer f.stop()
	f.awaitGroup(ctx)
	p := newProducer(producer, e.refs)
	deadline := time.NewTimer(runLimit(o) - time.Since(began)) // the wait for the group counts in the time asked
	defer deadline.Stop()
	if o.Jobs > 0 {
		if err := p.upFront(ctx, o.Jobs); err != nil {
			f.abort()
			return nil, fmt.Errorf("demo: enqueue: %w", err)
		}
	}
	prog := newProgress(o.Progress, o.Terminal, e.refs, p)
	keepUp(ctx, o, p, prog, began, f.stopped, deadline.C)
	// Stop taking jobs; what the workers hold (reserved slots, requests in flight) is finished and settled.
	f.drain()
	prog.draw(time.Since(began))
	prog.done()
	f.close()
	_ = producer.Close()
	if err := f.err(); err != nil {
		return nil, err
	}

	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	c, err := e.census(cctx)
	if err != nil {
		return nil, fmt.Errorf("demo: reading back the broker: %w", err)
	}
	s := e.summarize(p, c, st)
	s.Workers = o.Workers
	s.Seconds = time.Since(began).Seconds()
	return s, nil
}

// fleet is the demo's running workers.
type fleet struct {
	workers []*worker
	wg      sync.WaitGroup
	errs    chan error         // a worker whose Run failed (one slot a worker)
	stop    context.CancelFunc // ends the workers' context: they stop taking jobs
	stopped <-chan struct{}    // closed once the workers' context ends (stop, or the run's context)
}

// startFleet starts o.Workers workers, each watching its configuration and running, as worker run does.
// A worker that fails stops them all: one worker down is a failed demo. If one cannot be built, those
// started are stopped and closed.
func (e *env) startFleet(ctx context.Context, o Options, st *gateStats) (*fleet, error) {
	work, stopWork := context.WithCancel(ctx)
	f := &fleet{errs: make(chan error, o.Workers), stop: stopWork, stopped: work.Done()}
	for n := range o.Workers {
		wk, err := e.newWorker(ctx, o, n+1, st)
		if err != nil {
			f.abort()
			return nil, err
		}
		f.workers = append(f.workers, wk)
		f.wg.Go(func() { _ = wk.Watch(work, wk.w) }) // as worker run does
		f.wg.Go(func() {
			if err := wk.w.Run(work, wk.Broker); err != nil {
				f.errs <- fmt.Errorf("demo: worker %d: %w", n+1, err)
				stopWork() // one worker down is a failed demo: stop, report, exit non-zero
			}
		})
	}
	return f, nil
}

// awaitGroup waits until every worker is in the consumer group before the first job: a member joining
// later rebalances the group, and a rebalance in the measured span costs it a second or two of
// dispatching (Kafka; RabbitMQ is ready at once). A group that does not settle within the allowance is
// measured as it is.
func (f *fleet) awaitGroup(ctx context.Context) {
	settle := time.Now().Add(15 * time.Second)
	for time.Now().Before(settle) && ctx.Err() == nil && !allReady(f.workers) {
		time.Sleep(50 * time.Millisecond)
	}
}

// drain stops the workers taking jobs and waits until they have finished and settled what they hold.
func (f *fleet) drain() {
	f.stop()
	f.wg.Wait()
}

// close closes every worker's clients.
func (f *fleet) close() {
	for _, w := range f.workers {
		w.Close()
	}
}

// abort stops and closes the workers at once, when the run cannot go on.
func (f *fleet) abort() {
	f.drain()
	f.close()
}

// err is the workers' failures, once they have all stopped (nil: none failed).
func (f *fleet) err() error {
	close(f.errs)
	var errs []error
	for err := range f.errs {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// runLimit is how long the backlog phase may last from the start of the run. The workers finish what they
// hold once it ends: up to maxInlineWait for the furthest reservation. That time comes out of the
// duration, so the run ends when asked.
func runLimit(o Options) time.Duration {
	limit := o.Duration - drainAllowance
	if limit < o.Duration/2 {
		limit = o.Duration / 2
	}
	if o.Duration == 0 { // --jobs alone: until they are done, within twice the time the budgets need
		limit = 30*time.Second + time.Duration(2*float64(o.Jobs)/totalRate()*float64(time.Second))
	}
	return limit
}

// keepUp is the backlog phase: it keeps the backlog up (with o.Jobs: waits until every job is accepted)
// and draws the progress, until ctx ends, the workers stop (one failed), or the deadline.
func keepUp(ctx context.Context, o Options, p *producer, prog *progress, began time.Time, stopped <-chan struct{}, deadline <-chan time.Time) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	lastDraw := time.Time{}
	for {
		if o.Jobs == 0 {
			if err := p.topUp(ctx); err != nil && ctx.Err() == nil {
				o.Log.Warn("demo: producer", zap.Error(err))
			}
		} else if p.allAccepted() {
			return
		}
		if time.Since(lastDraw) >= prog.every {
			prog.draw(time.Since(began))
			lastDraw = time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-stopped: // a worker failed
			return
		case <-deadline:
			return
		case <-tick.C:
		}
	}
}

// allReady reports whether every worker's broker is consuming (on Kafka: in the group's generation).
func allReady(workers []*worker) bool {
	for _, w := range workers {
		if w.Broker.Ready() != nil {
			return false
		}
	}
	return true
}

// countingGate counts a worker's gate calls and records how long admitted jobs wait for their slot.
type countingGate struct {
	g  consumers.Gate
	st *gateStats
}

func (c countingGate) ReserveFor(ctx context.Context, provider, merchant, jobID string, cost int64, maxWait time.Duration) (gate.Verdict, error) {
	v, err := c.g.ReserveFor(ctx, provider, merchant, jobID, cost, maxWait)
	c.st.call(provider, v, err == nil && v.Allowed)
	return v, err
}

func (c countingGate) ReleaseFor(ctx context.Context, provider, merchant, jobID string, cost int64, slot time.Time) (int64, error) {
	c.st.call(provider, gate.Verdict{}, false)
	return c.g.ReleaseFor(ctx, provider, merchant, jobID, cost, slot)
}

func (c countingGate) Sent(ctx context.Context, provider, jobID string) error {
	c.st.call(provider, gate.Verdict{}, false)
	return c.g.Sent(ctx, provider, jobID)
}

func (c countingGate) Postpone(ctx context.Context, provider, merchant, jobID string, slot time.Time) (time.Time, error) {
	c.st.call(provider, gate.Verdict{}, false)
	return c.g.Postpone(ctx, provider, merchant, jobID, slot)
}

func (c countingGate) Departed(ctx context.Context, provider, merchant, jobID string, slot time.Time, late time.Duration) (time.Time, error) {
	c.st.call(provider, gate.Verdict{}, false)
	return c.g.Departed(ctx, provider, merchant, jobID, slot, late)
}

// The margin reports are periodic, not per job: not counted.
func (c countingGate) ReportLateness(ctx context.Context, provider, reporter string, p99 time.Duration) (gate.MarginState, error) {
	return c.g.ReportLateness(ctx, provider, reporter, p99)
}

func (c countingGate) ReportThrottle(ctx context.Context, provider, reporter string) (gate.MarginState, error) {
	return c.g.ReportThrottle(ctx, provider, reporter)
}

func (c countingGate) CountEvent(ctx context.Context, provider, event string) error {
	return c.g.CountEvent(ctx, provider, event)
}

func (c countingGate) Land(ctx context.Context, provider, lease string) error {
	return c.g.Land(ctx, provider, lease) // the demo's providers have no in-flight cap: never a call
}

func (c countingGate) Pause(ctx context.Context, provider string, until time.Time) error {
	c.st.call(provider, gate.Verdict{}, false)
	return c.g.Pause(ctx, provider, until)
}

type gateStats struct {
	mu    sync.Mutex
	calls map[string]int64
	kinds map[string]map[string]int64
	waits map[string][]time.Duration
}

func newGateStats() *gateStats {
	return &gateStats{calls: map[string]int64{}, kinds: map[string]map[string]int64{}, waits: map[string][]time.Duration{}}
}

func (s *gateStats) call(provider string, v gate.Verdict, admitted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[provider]++
	if s.kinds[provider] == nil {
		s.kinds[provider] = map[string]int64{}
	}
	switch {
	case v.Duplicate:
		s.kinds[provider]["duplicate"]++
	case admitted:
		s.kinds[provider]["admitted"]++
	case v.RetryAfter > 0:
		s.kinds[provider]["denied"]++
	default:
		s.kinds[provider]["other"]++
	}
	if admitted {
		s.waits[provider] = append(s.waits[provider], v.Delay)
	}
}

// referee is a provider simulator with the acceptance times the demo measures rates from.
type referee struct {
	p   Provider
	srv *sim.Server
	mu  sync.Mutex
	at  []time.Time // every acceptance, in order
}

func newReferee(p Provider) *referee { return &referee{p: p} }

func (r *referee) accepted(_ string, at time.Time) {
	r.mu.Lock()
	r.at = append(r.at, at)
	r.mu.Unlock()
}

func (r *referee) times() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.at)
}

func (r *referee) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.at)
}

// publisher is what the producer needs of a broker.
type publisher interface {
	Publish(ctx context.Context, route string, body []byte) error // route: consumers.Route
}

// classOf is the priority of the demo's n-th job: one in ten high, two in ten low, the rest normal, each
// published to its class's queue or topic.
func classOf(n int) job.Priority {
	switch n % 10 {
	case 1:
		return job.High
	case 2, 3:
		return job.Low
	}
	return job.Normal
}

// producer publishes synthetic jobs, every badEvery-th of them invalid.
type producer struct {
	b    publisher
	refs map[string]*referee
	run  string

	mu       sync.Mutex
	enqueued map[string]string // job id -> provider
	perProv  map[string]int
	bad      map[string]int
	n        int
}

func newProducer(b publisher, refs map[string]*referee) *producer {
	var r [3]byte
	_, _ = rand.Read(r[:])
	return &producer{b: b, refs: refs, run: hex.EncodeToString(r[:]), enqueued: map[string]string{},
		perProv: map[string]int{}, bad: map[string]int{}}
}

func (p *producer) publish(ctx context.Context, provider string, count int) error {
	for range count {
		p.mu.Lock()
		p.n++
		n := p.n
		p.mu.Unlock()
		id := fmt.Sprintf("demo-%s-%d", p.run, n)
		currency := "EUR"
		if n%badEvery == 0 {
			currency = "eur" // refused by the job contract: dead-lettered with the reason
		}
		class := classOf(n)
		priority := ""
		if class != job.Normal {
			priority = fmt.Sprintf(`,"priority":%q`, class)
		}
		body := fmt.Appendf(nil, `{"id":%q,"provider":%q,"amount":%d,"currency":%q,"merchant":"m_%d"%s}`, id, provider, 100+n%9900, currency, n%50, priority)
		if err := p.b.Publish(ctx, consumers.Route(provider, class), body); err != nil {
			return err
		}
		if _, err := job.Decode(body, map[string]int64{provider: 1}); err != nil {
			p.mu.Lock()
			p.bad[provider]++
			p.mu.Unlock()
		}
		p.mu.Lock()
		p.enqueued[id] = provider
		p.perProv[provider]++
		p.mu.Unlock()
	}
	return nil
}

// backlogTarget is the backlog kept per provider: five seconds of its budget, and at least three of its
// largest bursts, so that workers never run dry and the gate alone holds them back.
func backlogTarget(p Provider) int {
	t := int(5 * sustained(p.Limits))
	for _, w := range p.Limits {
		t = max(t, 3*w.Limit)
	}
	return t
}

// sustained is the long-run rate a provider's limits allow, per second.
func sustained(ws []sim.Window) float64 {
	r := 0.0
	for i, w := range ws {
		if x := float64(w.Limit) / w.Per.Seconds(); i == 0 || x < r {
			r = x
		}
	}
	return r
}

func (p *producer) topUp(ctx context.Context) error {
	for _, pr := range Providers {
		p.mu.Lock()
		outstanding := p.perProv[pr.Name] - p.bad[pr.Name] - p.refs[pr.Name].count()
		p.mu.Unlock()
		if need := backlogTarget(pr) - outstanding; need > 0 {
			if err := p.publish(ctx, pr.Name, need); err != nil {
				return err
			}
		}
	}
	return nil
}

// totalRate is the providers' budgets together, per second.
func totalRate() float64 {
	total := 0.0
	for _, pr := range Providers {
		total += sustained(pr.Limits)
	}
	return total
}

// upFront enqueues n jobs at once, split across providers in proportion to their budgets.
func (p *producer) upFront(ctx context.Context, n int) error {
	total := totalRate()
	left := n
	for i, pr := range Providers {
		k := int(float64(n) * sustained(pr.Limits) / total)
		if i == len(Providers)-1 {
			k = left
		}
		left -= k
		if err := p.publish(ctx, pr.Name, k); err != nil {
			return err
		}
	}
	return nil
}

func (p *producer) allAccepted() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pr := range Providers {
		if p.refs[pr.Name].count() < p.perProv[pr.Name]-p.bad[pr.Name] {
			return false
		}
	}
	return true
}

func (p *producer) counts(provider string) (enqueued, done int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.perProv[provider], p.refs[provider].count() + p.bad[provider]
}
