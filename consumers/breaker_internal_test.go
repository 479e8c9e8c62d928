package consumers

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/job"
	"github.com/paygate/paygate/providers"
)

// fakeBreaker is a provider's breaker as the worker meets it: each call answers what the test set, and is
// counted.
type fakeBreaker struct {
	mu                                  sync.Mutex
	probe, failure, answer, read        func(job string) gate.BreakerState
	probes, failures, answers, reads    atomic.Int32
	failedSlots                         []time.Time
	probeErr                            error
	grantedTo                           []string
	failureJobs, answerJobs, probeTaker []string
}

func (f *fakeBreaker) HasBreaker(provider string) bool { return provider == "acme" }

func (f *fakeBreaker) ReadBreaker(context.Context, string) (gate.BreakerState, error) {
	f.reads.Add(1)
	if f.read == nil {
		return closedState(0), nil
	}
	return f.read(""), nil
}

func (f *fakeBreaker) TakeProbe(_ context.Context, _, jobID string) (gate.BreakerState, error) {
	f.probes.Add(1)
	if f.probeErr != nil {
		return gate.BreakerState{}, f.probeErr
	}
	st := f.probe(jobID)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.probeTaker = append(f.probeTaker, jobID)
	if st.Granted {
		f.grantedTo = append(f.grantedTo, jobID)
	}
	return st, nil
}

func (f *fakeBreaker) ReportFailure(_ context.Context, _, jobID string, sent time.Time) (gate.BreakerState, error) {
	f.failures.Add(1)
	f.mu.Lock()
	f.failureJobs, f.failedSlots = append(f.failureJobs, jobID), append(f.failedSlots, sent)
	f.mu.Unlock()
	return f.failure(jobID), nil
}

func (f *fakeBreaker) ReportAnswer(_ context.Context, _, jobID string) (gate.BreakerState, error) {
	f.answers.Add(1)
	f.mu.Lock()
	f.answerJobs = append(f.answerJobs, jobID)
	f.mu.Unlock()
	return f.answer(jobID), nil
}

// redisNow is the fake Redis clock: the worker only compares its moments with each other.
var redisNow = time.Unix(1_800_000_000, 0)

func closedState(seq int64) gate.BreakerState {
	return gate.BreakerState{Phase: gate.BreakerClosed, Seq: seq, Now: redisNow}
}

func openState(seq int64, until time.Duration) gate.BreakerState {
	return gate.BreakerState{Phase: gate.BreakerOpen, Seq: seq, Now: redisNow, Until: redisNow.Add(until), Hold: redisNow.Add(until + time.Second),
		OpenFor: until}
}

// breakerGate admits every job at once (or Delay ahead, paused when Paused), and counts releases.
type breakerGate struct {
	Gate     // nil: a call the test does not expect panics
	delay    time.Duration
	paused   bool
	reserved atomic.Int32
	released atomic.Int32
}

func (g *breakerGate) ReserveFor(context.Context, string, string, string, int64, time.Duration) (gate.Verdict, error) {
	g.reserved.Add(1)
	return gate.Verdict{Allowed: true, Delay: g.delay, Paused: g.paused, Now: redisNow}, nil
}

func (g *breakerGate) ReleaseFor(_ context.Context, _, _, _ string, cost int64, _ time.Time) (int64, error) {
	g.released.Add(1)
	return cost, nil
}

// scriptedDispatcher answers each request with the next of its answers (the last one repeats).
type scriptedDispatcher struct {
	mu   sync.Mutex
	errs []error
	sent atomic.Int32
}

func (d *scriptedDispatcher) Dispatch(context.Context, *job.Job) (*providers.Answer, error) {
	d.sent.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.errs[0]
	if len(d.errs) > 1 {
		d.errs = d.errs[1:]
	}
	if err != nil {
		return nil, err
	}
	return &providers.Answer{Status: 200}, nil
}

var errFailed = &providers.StatusError{Provider: "acme", Status: 500}

// settledDelivery is a valid job's delivery, at its attempt, that records how it was settled.
type settledDelivery struct {
	attempt int
	settled string
	after   time.Duration
	carried int // the attempt a deferral or dead letter carries
	why     error
}

func (*settledDelivery) Body() []byte {
	return []byte(`{"id":"pay-1","provider":"acme","amount":1,"currency":"EUR"}`)
}
func (d *settledDelivery) Attempt() int                  { return d.attempt }
func (*settledDelivery) FirstSeen() time.Time            { return time.Now() }
func (d *settledDelivery) Ack(context.Context) error     { d.settled = "ack"; return nil }
func (d *settledDelivery) Requeue(context.Context) error { d.settled = "requeue"; return nil }
func (d *settledDelivery) Defer(_ context.Context, after time.Duration, attempt int, why error) error {
	d.settled, d.after, d.carried, d.why = "defer", after, attempt, why
	return nil
}
func (d *settledDelivery) DeadLetter(_ context.Context, _ Reason, attempt int, why error) error {
	d.settled, d.carried, d.why = "dead", attempt, why
	return nil
}

var breakerTiers = []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}

func breakerWorker(t *testing.T, g Gate, d Dispatcher, b *fakeBreaker) *Worker {
	t.Helper()
	w, err := New(Config{Concurrency: 1, MaxInlineWait: 300 * time.Millisecond, MaxAttempts: 8, MaxDeferralAge: time.Hour,
		ShutdownTimeout: time.Second, BackoffBase: time.Second, BackoffMax: time.Minute, RedisRetry: time.Second,
		OutageTiers: breakerTiers, Providers: map[string]int64{"acme": 10}}, g, map[string]Dispatcher{"acme": d}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	w.UseBreaker(b)
	return w
}

// While the breaker is open, a job is not sent and spends no attempt: deferred to the longest tier no
// longer than the wait for the probe (it comes back by then). One that fits max_inline_wait waits it out
// in-process and takes the probe; the probe's failure is not an attempt either, and defers the job until
// the next probe. Every other transient failure is an attempt, and is reported.
func TestBreakerSpendsNoAttemptsWhileOpen(t *testing.T) {
	ctx := context.Background()
	t.Run("open for longer than max wait: deferred, unsent, same attempt", func(t *testing.T) {
		g, d := &breakerGate{}, &scriptedDispatcher{errs: []error{nil}}
		b := &fakeBreaker{}
		w := breakerWorker(t, g, d, b)
		w.NoteBreaker("acme", openState(1, 40*time.Second))
		dl := &settledDelivery{attempt: 3}
		w.Handle(ctx, "acme", dl)
		if dl.settled != "defer" || dl.carried != 3 || dl.after != 30*time.Second || !errors.Is(dl.why, errBreakerOpen) ||
			d.sent.Load() != 0 || g.reserved.Load() != 0 || b.probes.Load() != 0 {
			t.Fatalf("settled %q after %s at attempt %d (%v), sent %d, reserved %d, probes %d", dl.settled, dl.after, dl.carried, dl.why,
				d.sent.Load(), g.reserved.Load(), b.probes.Load())
		}
	})
	t.Run("probe due within max wait: waits, takes it, fails: deferred, same attempt", func(t *testing.T) {
		g, d := &breakerGate{}, &scriptedDispatcher{errs: []error{errFailed}}
		b := &fakeBreaker{
			probe: func(job string) gate.BreakerState {
				st := openState(2, 0)
				st.Phase, st.Granted, st.Changed = gate.BreakerProbing, true, true
				return st
			},
			failure: func(string) gate.BreakerState {
				st := openState(3, 2*time.Second)
				st.Changed, st.Counted = true, true
				return st
			},
		}
		w := breakerWorker(t, g, d, b)
		w.NoteBreaker("acme", openState(1, 100*time.Millisecond))
		dl := &settledDelivery{attempt: 3}
		began := time.Now()
		w.Handle(ctx, "acme", dl)
		if time.Since(began) < 100*time.Millisecond {
			t.Errorf("sent %s after the breaker opened for 100ms", time.Since(began))
		}
		if dl.settled != "defer" || dl.carried != 3 || dl.after != time.Second || !errors.Is(dl.why, errProbeFailed) || d.sent.Load() != 1 ||
			len(b.grantedTo) != 1 || b.failures.Load() != 1 {
			t.Fatalf("settled %q after %s at attempt %d (%v); sent %d, granted %v, failures reported %d", dl.settled, dl.after, dl.carried,
				dl.why, d.sent.Load(), b.grantedTo, b.failures.Load())
		}
		if v, _ := w.breakers.view("acme"); v.st.Seq != 3 || v.st.Phase != gate.BreakerOpen {
			t.Fatalf("the worker's view after the probe failed: %+v", v.st)
		}
	})
	t.Run("closed: a failure is an attempt, reported with its slot", func(t *testing.T) {
		g, d := &breakerGate{}, &scriptedDispatcher{errs: []error{errFailed}}
		b := &fakeBreaker{failure: func(string) gate.BreakerState { st := closedState(5); st.Failures, st.Counted = 1, true; return st }}
		w := breakerWorker(t, g, d, b)
		w.NoteBreaker("acme", closedState(4))
		dl := &settledDelivery{attempt: 3}
		w.Handle(ctx, "acme", dl)
		if dl.settled != "defer" || dl.carried != 4 || b.failures.Load() != 1 || b.failedSlots[0].IsZero() {
			t.Fatalf("settled %q at attempt %d; failures reported %d at %v", dl.settled, dl.carried, b.failures.Load(), b.failedSlots)
		}
	})
}

// A healthy provider costs no breaker call per job: a worker reads a breaker it does not know once (after
// it starts, or its watch reconnects), and reports answers only while a run of failures is known to be in
// progress.
func TestBreakerReportsAnswersOnlyWhenTheyEndSomething(t *testing.T) {
	ctx := context.Background()
	g, d := &breakerGate{}, &scriptedDispatcher{errs: []error{nil}}
	var seq atomic.Int64
	seq.Store(7)
	b := &fakeBreaker{answer: func(string) gate.BreakerState { return closedState(seq.Load()) },
		read: func(string) gate.BreakerState { return closedState(seq.Load()) }}
	w := breakerWorker(t, g, d, b)
	for range 5 {
		w.Handle(ctx, "acme", &settledDelivery{})
	}
	if b.answers.Load() != 0 || b.reads.Load() != 1 {
		t.Fatalf("%d answers reported and %d reads for 5 successes, want 0 and 1 (read at first, known closed)", b.answers.Load(), b.reads.Load())
	}
	run := closedState(8)
	run.Failures = 2
	w.NoteBreaker("acme", run) // a run of failures began elsewhere
	seq.Store(9)
	w.Handle(ctx, "acme", &settledDelivery{})
	w.NoteBreaker("acme", run) // older than what it knows: ignored
	if v, _ := w.breakers.view("acme"); v.st.Seq != 9 || v.st.Failures != 0 {
		t.Fatalf("view %+v: the reply to the answer (seq 9) ends the run", v.st)
	}
	w.NoteDisconnect(time.Now())
	w.Handle(ctx, "acme", &settledDelivery{})
	w.Handle(ctx, "acme", &settledDelivery{})
	if b.answers.Load() != 1 || b.reads.Load() != 2 {
		t.Fatalf("%d answers reported and %d reads, want 1 (ending the run) and 2 (again after the lost connection)", b.answers.Load(), b.reads.Load())
	}
	if b.probes.Load() != 0 || b.failures.Load() != 0 || d.sent.Load() != 8 {
		t.Fatalf("probes %d, failures %d, reads %d, sent %d", b.probes.Load(), b.failures.Load(), b.reads.Load(), d.sent.Load())
	}
}

// A job sleeping on a slot when the breaker opens gives the slot back and waits for the breaker; a paused
// verdict on a breaker the worker believes closed reads it, and holds the job when it is open.
func TestBreakerHoldsReservations(t *testing.T) {
	ctx := context.Background()
	t.Run("opened while the job slept on its slot", func(t *testing.T) {
		g, d := &breakerGate{delay: 200 * time.Millisecond}, &scriptedDispatcher{errs: []error{nil}}
		w := breakerWorker(t, g, d, &fakeBreaker{})
		w.NoteBreaker("acme", closedState(1))
		go func() {
			time.Sleep(50 * time.Millisecond)
			w.NoteBreaker("acme", openState(2, time.Minute))
		}()
		dl := &settledDelivery{attempt: 1}
		w.Handle(ctx, "acme", dl)
		if dl.settled != "defer" || dl.carried != 1 || !errors.Is(dl.why, errBreakerOpen) || d.sent.Load() != 0 || g.released.Load() != 1 {
			t.Fatalf("settled %q at attempt %d (%v); sent %d, released %d", dl.settled, dl.carried, dl.why, d.sent.Load(), g.released.Load())
		}
	})
	t.Run("a paused verdict on a breaker believed closed (its opening not heard yet)", func(t *testing.T) {
		g, d := &breakerGate{paused: true}, &scriptedDispatcher{errs: []error{nil}}
		b := &fakeBreaker{read: func(string) gate.BreakerState { return openState(3, time.Minute) }}
		w := breakerWorker(t, g, d, b)
		w.NoteBreaker("acme", closedState(1))
		dl := &settledDelivery{}
		w.Handle(ctx, "acme", dl)
		if dl.settled != "defer" || d.sent.Load() != 0 || b.reads.Load() != 1 || g.released.Load() != 1 {
			t.Fatalf("settled %q; sent %d, reads %d, released %d", dl.settled, d.sent.Load(), b.reads.Load(), g.released.Load())
		}
	})
	t.Run("a breaker not known is read before the reserve", func(t *testing.T) {
		g, d := &breakerGate{}, &scriptedDispatcher{errs: []error{nil}}
		b := &fakeBreaker{read: func(string) gate.BreakerState { return openState(3, time.Minute) }}
		w := breakerWorker(t, g, d, b)
		dl := &settledDelivery{}
		w.Handle(ctx, "acme", dl)
		if dl.settled != "defer" || d.sent.Load() != 0 || b.reads.Load() != 1 || g.reserved.Load() != 0 {
			t.Fatalf("settled %q; sent %d, reads %d, reserved %d", dl.settled, d.sent.Load(), b.reads.Load(), g.reserved.Load())
		}
		reg := prometheus.NewRegistry()
		reg.MustRegister(w.metrics.breaker)
		mfs, err := reg.Gather()
		if err != nil || len(mfs) != 1 || mfs[0].GetName() != "paygate_breaker_state" || mfs[0].GetMetric()[0].GetGauge().GetValue() != float64(gate.BreakerOpen) {
			t.Fatalf("paygate_breaker_state: %v %v, want 1 (open)", mfs, err)
		}
	})
	t.Run("probing elsewhere: waits, and goes as soon as it closes", func(t *testing.T) {
		g, d := &breakerGate{}, &scriptedDispatcher{errs: []error{nil}}
		w := breakerWorker(t, g, d, &fakeBreaker{answer: func(string) gate.BreakerState { return closedState(6) }})
		probing := openState(4, 10*time.Second)
		probing.Phase, probing.Probe = gate.BreakerProbing, "other"
		w.NoteBreaker("acme", probing)
		go func() {
			time.Sleep(80 * time.Millisecond)
			w.NoteBreaker("acme", closedState(5))
		}()
		dl := &settledDelivery{}
		w.Handle(ctx, "acme", dl)
		if dl.settled != "ack" || d.sent.Load() != 1 {
			t.Fatalf("settled %q, sent %d: want sent once the probe closed the breaker", dl.settled, d.sent.Load())
		}
	})
}

// The tier a job the breaker holds is deferred to: the longest no longer than the wait, at least the first.
func TestBreakerTier(t *testing.T) {
	w := breakerWorker(t, &breakerGate{}, &scriptedDispatcher{errs: []error{nil}}, &fakeBreaker{})
	for _, c := range []struct{ wait, tier time.Duration }{
		{0, time.Second}, {500 * time.Millisecond, time.Second}, {4 * time.Second, time.Second}, {5 * time.Second, 5 * time.Second},
		{29 * time.Second, 5 * time.Second}, {time.Hour, 30 * time.Second},
	} {
		if got := w.breakerTier(c.wait); got != c.tier {
			t.Errorf("wait %s: tier %s, want %s", c.wait, got, c.tier)
		}
	}
}
