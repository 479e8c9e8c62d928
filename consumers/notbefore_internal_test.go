package consumers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/paygate/paygate/job"
	"github.com/paygate/paygate/providers"
)

// scheduledDelivery is a job due at notBefore; it records its deferral.
type scheduledDelivery struct {
	deferDelivery
	notBefore time.Time
	dead      string
}

func (d *scheduledDelivery) Body() []byte {
	return fmt.Appendf(nil, `{"id":"s-1","provider":"acme","amount":1,"currency":"EUR","not_before":%q}`, d.notBefore.Format(time.RFC3339Nano))
}

func (d *scheduledDelivery) DeadLetter(_ context.Context, r Reason, _ int, why error) error {
	d.settled, d.dead = "dead", string(r)+": "+why.Error()
	return nil
}

// sentAt records when each request went.
type sentAt struct{ at []time.Time }

func (s *sentAt) Dispatch(context.Context, *job.Job) (*providers.Answer, error) {
	s.at = append(s.at, time.Now())
	return &providers.Answer{Status: 200}, nil
}

// A job with a not_before waits for it, asking the gate nothing and spending no attempt: in-process when
// it is within max_inline_wait, else deferred for the longest tier that does not pass it; further out
// than max_deferral_age, it is dead-lettered as invalid.
func TestNotBefore(t *testing.T) {
	tiers := []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}
	newWorker := func(g Gate, d Dispatcher) *Worker {
		w, err := New(Config{Concurrency: 1, MaxInlineWait: 500 * time.Millisecond, MaxAttempts: 3, MaxDeferralAge: time.Hour,
			ShutdownTimeout: time.Second, BackoffBase: time.Second, BackoffMax: time.Minute, RedisRetry: time.Second,
			OutageTiers: tiers, Providers: map[string]int64{"acme": 10}}, g, map[string]Dispatcher{"acme": d}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	t.Run("within max_inline_wait: waits, then goes", func(t *testing.T) {
		g, p := &resultGate{}, &sentAt{}
		d := &scheduledDelivery{notBefore: time.Now().Add(300 * time.Millisecond)}
		newWorker(g, p).Handle(context.Background(), "acme", d)
		if d.settled != "ack" || len(p.at) != 1 || p.at[0].Before(d.notBefore) || g.reserved.Load() != 1 {
			t.Fatalf("settled %q, sent at %v (not before %v), reserved %d", d.settled, p.at, d.notBefore, g.reserved.Load())
		}
	})
	for _, tt := range []struct {
		ahead, after time.Duration
	}{{7 * time.Second, 5 * time.Second}, {3 * time.Second, time.Second}, {40 * time.Minute, 30 * time.Second}} {
		t.Run(fmt.Sprintf("%s ahead: deferred %s", tt.ahead, tt.after), func(t *testing.T) {
			g, p := &resultGate{}, &sentAt{}
			d := &scheduledDelivery{notBefore: time.Now().Add(tt.ahead)}
			newWorker(g, p).Handle(context.Background(), "acme", d)
			if d.settled != "defer" || d.after != tt.after || len(p.at) != 0 || g.reserved.Load() != 0 {
				t.Fatalf("settled %q after %s, sent %d, reserved %d; want deferred %s, nothing asked", d.settled, d.after, len(p.at), g.reserved.Load(), tt.after)
			}
		})
	}
	t.Run("further out than max_deferral_age: invalid", func(t *testing.T) {
		d := &scheduledDelivery{notBefore: time.Now().Add(2 * time.Hour)}
		newWorker(&resultGate{}, &sentAt{}).Handle(context.Background(), "acme", d)
		if d.settled != "dead" || !strings.HasPrefix(d.dead, "invalid: not_before: ") || !strings.Contains(d.dead, "more than max_deferral_age 1h0m0s") {
			t.Fatalf("settled %q: %s", d.settled, d.dead)
		}
	})
}
