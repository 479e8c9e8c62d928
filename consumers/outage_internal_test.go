package consumers

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/paygate/paygate/gate"
)

// outageGate cannot answer while down; otherwise it admits every job now.
type outageGate struct {
	clockGate
	down bool
}

func (g *outageGate) ReserveFor(ctx context.Context, provider, merchant, id string, cost int64, maxWait time.Duration) (gate.Verdict, error) {
	if g.down {
		return gate.Verdict{}, errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
	}
	return g.clockGate.ReserveFor(ctx, provider, merchant, id, cost, maxWait)
}

// deferDelivery records the deferral it was settled with.
type deferDelivery struct {
	clockDelivery
	after time.Duration
}

func (d *deferDelivery) Defer(_ context.Context, after time.Duration, _ int, _ error) error {
	d.settled, d.after = "defer", after
	return nil
}

// A gate outage's deferrals walk up the delay tiers as it lasts, each no longer than the outage so far;
// an answer ends the outage, and the next one starts again from the first tier. One warning goes out per
// 10s, and the deferrals' settled lines are debug lines.
func TestOutageDeferralsWalkUpTheTiers(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	g := &outageGate{}
	tiers := []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute, 10 * time.Minute}
	w, err := New(Config{Concurrency: 1, MaxInlineWait: time.Second, MaxAttempts: 3, MaxDeferralAge: time.Hour,
		ShutdownTimeout: time.Second, BackoffBase: time.Second, BackoffMax: time.Minute, RedisRetry: time.Second,
		OutageTiers: tiers, Providers: map[string]int64{"acme": 10}},
		g, map[string]Dispatcher{"acme": &countingDispatcher{}}, zap.New(core), nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var at time.Duration
	w.now = func() time.Time { return start.Add(at) }
	for _, step := range []struct {
		at      time.Duration
		down    bool
		settled string
		after   time.Duration
	}{
		{0, true, "defer", time.Second},
		{4 * time.Second, true, "defer", time.Second},
		{5 * time.Second, true, "defer", 5 * time.Second},
		{29 * time.Second, true, "defer", 5 * time.Second},
		{31 * time.Second, true, "defer", 30 * time.Second},
		{3 * time.Minute, true, "defer", 2 * time.Minute},
		{3*time.Minute + time.Second, false, "ack", 0},
		{3*time.Minute + 2*time.Second, true, "defer", time.Second},
	} {
		at, g.down = step.at, step.down
		d := &deferDelivery{}
		w.Handle(context.Background(), "acme", d)
		if d.settled != step.settled || d.after != step.after {
			t.Fatalf("at %s (down %v): settled %q after %s, want %q after %s", step.at, step.down, d.settled, d.after, step.settled, step.after)
		}
	}
	warned, settled := 0, 0
	for _, e := range logs.All() {
		switch e.Message {
		case "gate unreachable: deferring jobs":
			warned++
		case "job settled":
			settled++
		}
	}
	// At 0s, 29s and 3m; those at 4s, 5s, 31s and 3m2s came within 10s of one.
	if warned != 3 || settled != 1 {
		t.Fatalf("%d warnings and %d info settled lines; want 3 (at 0s, 29s, 3m) and 1 (the job sent)", warned, settled)
	}
}
