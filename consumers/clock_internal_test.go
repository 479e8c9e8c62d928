package consumers

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/job"
	"github.com/paygate/paygate/providers"
)

// clockGate admits every job now and finds no room for a postponement; it counts the reservations.
type clockGate struct {
	Gate     // nil: a call the test does not expect panics
	reserved atomic.Int32
}

func (g *clockGate) ReserveFor(context.Context, string, string, string, int64, time.Duration) (gate.Verdict, error) {
	g.reserved.Add(1)
	return gate.Verdict{Allowed: true, Now: time.Unix(1_700_000_000, 0)}, nil
}

func (g *clockGate) ReleaseFor(_ context.Context, _, _, _ string, cost int64, _ time.Time) (int64, error) {
	return cost, nil
}

func (g *clockGate) Postpone(context.Context, string, string, string, time.Time) (time.Time, error) {
	return time.Time{}, nil
}

// clockDelivery is a valid job's delivery that records how it was settled.
type clockDelivery struct{ settled string }

func (*clockDelivery) Body() []byte {
	return []byte(`{"id":"pay-1","provider":"acme","amount":1,"currency":"EUR"}`)
}
func (*clockDelivery) Attempt() int                    { return 0 }
func (*clockDelivery) FirstSeen() time.Time            { return time.Now() }
func (d *clockDelivery) Ack(context.Context) error     { d.settled = "ack"; return nil }
func (d *clockDelivery) Requeue(context.Context) error { d.settled = "requeue"; return nil }
func (d *clockDelivery) Defer(context.Context, time.Duration, int, error) error {
	d.settled = "defer"
	return nil
}
func (d *clockDelivery) DeadLetter(context.Context, Reason, int, error) error {
	d.settled = "dead"
	return nil
}

type countingDispatcher struct{ sent atomic.Int32 }

func (c *countingDispatcher) Dispatch(context.Context, *job.Job) (*providers.Answer, error) {
	c.sent.Add(1)
	return &providers.Answer{Status: 200}, nil
}

// The lateness guard reads the worker's clock: a clock that moves a minute at each reading makes every
// wake-up minutes late, past the late limit, and the job is deferred after MaxLateTries slots, never
// sent; the real clock sends it on its first.
func TestLatenessGuardReadsTheWorkersClock(t *testing.T) {
	tests := []struct {
		name     string
		now      func() time.Time // nil: time.Now
		settled  string
		sent     int32
		reserved int32
	}{
		{name: "real clock: sent on its slot", settled: "ack", sent: 1, reserved: 1},
		{name: "a clock a minute further at each reading: late every time, deferred", now: func() func() time.Time {
			start, readings := time.Now(), atomic.Int64{}
			return func() time.Time { return start.Add(time.Duration(readings.Add(1)) * time.Minute) }
		}(), settled: "defer", sent: 0, reserved: MaxLateTries},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, p := &clockGate{}, &countingDispatcher{}
			w, err := New(Config{Concurrency: 1, MaxInlineWait: time.Second, MaxAttempts: 3, MaxDeferralAge: time.Hour,
				ShutdownTimeout: time.Second, BackoffBase: time.Second, BackoffMax: time.Minute, RedisRetry: time.Second,
				LateLimit: time.Second, Providers: map[string]int64{"acme": 10}},
				g, map[string]Dispatcher{"acme": p}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tt.now != nil {
				w.now = tt.now
			}
			d := &clockDelivery{}
			w.Handle(context.Background(), "acme", d)
			if d.settled != tt.settled || p.sent.Load() != tt.sent || g.reserved.Load() != tt.reserved {
				t.Fatalf("settled %q, sent %d, reserved %d; want %q, %d, %d", d.settled, p.sent.Load(), g.reserved.Load(), tt.settled, tt.sent, tt.reserved)
			}
		})
	}
}
