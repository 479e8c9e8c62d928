package demo

import (
	"context"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/providers/sim"
)

// bursts returns n acceptances at the start of each of k windows spaced every.
func bursts(t0 time.Time, k, n int, every time.Duration) []time.Time {
	var at []time.Time
	for i := range k {
		for range n {
			at = append(at, t0.Add(time.Duration(i)*every))
		}
	}
	return at
}

func TestMeasure(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	one := []sim.Window{{Limit: 40, Per: time.Second}}
	two := []sim.Window{{Limit: 10, Per: time.Second}, {Limit: 40, Per: 5 * time.Second}}
	tests := []struct {
		name   string
		at     []time.Time
		limits []sim.Window
		span   time.Duration
		util   float64
	}{
		// 11 bursts 1.025s apart span 10.25s: 10 whole windows, whose 10 bursts are all the limit allows.
		{"full, with margin", bursts(t0, 11, 40, 1025*time.Millisecond), one, 10 * time.Second, 1},
		{"half", bursts(t0, 11, 20, 1025*time.Millisecond), one, 10 * time.Second, 0.5},
		// A burst every 1.5s: 7 bursts in [0, 10s) of the 10 possible.
		{"slow", bursts(t0, 8, 40, 1500*time.Millisecond), one, 10 * time.Second, 0.7},
		// Two windows: the 5s one binds (40 per 5s, not 10 per second).
		{"two windows", bursts(t0, 11, 10, 1250*time.Millisecond), two, 10 * time.Second, 80.0 / 80},
		{"short run: one window", bursts(t0, 2, 10, 100*time.Millisecond), one, time.Second, 0.5},
		{"nothing", nil, one, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := measure(tt.at, tt.limits)
			if m.span != tt.span || math.Abs(m.utilization-tt.util) > 1e-9 {
				t.Fatalf("span %s utilisation %v, want %s %v", m.span, m.utilization, tt.span, tt.util)
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	var v []time.Duration
	for i := 1; i <= 100; i++ {
		v = append(v, time.Duration(i)*time.Millisecond)
	}
	if p50, p99 := percentile(v, 50), percentile(v, 99); p50 != 50*time.Millisecond || p99 != 99*time.Millisecond {
		t.Fatalf("p50 %s p99 %s", p50, p99)
	}
	if percentile(nil, 99) != 0 || percentile(v[:1], 50) != time.Millisecond {
		t.Fatal("edge cases")
	}
}

// recorder is a broker that only records what is published.
type recorder struct{ consumers.Broker }

func (recorder) Publish(context.Context, string, []byte) error { return nil }
func (recorder) Close() error                                  { return nil }

// The ledger: a job accepted by its referee or dead-lettered is settled, one found in the census is
// pending, and one in neither is lost, by id.
func TestLedger(t *testing.T) {
	e, err := start(Options{Workers: 1, Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	p := newProducer(recorder{}, e.refs)
	ctx := context.Background()
	if err := p.publish(ctx, "acme", 4); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 0, 4)
	for id := range p.enqueued {
		ids = append(ids, id)
	}
	// ids[0]: accepted by the referee; ids[1]: dead-lettered; ids[2]: still queued; ids[3]: nowhere.
	req := e.refs["acme"].srv.URL() + "/payments"
	if code := postKey(t, req, ids[0]); code != 200 {
		t.Fatalf("referee answered %d", code)
	}
	c := newCensus()
	c.dead = append(c.dead, deadLetter{id: ids[1], provider: "acme", reason: "invalid"}, deadLetter{id: "not-ours", reason: "invalid"})
	c.queued[ids[2]] = true
	c.queued[ids[0]] = true // accepted, then read again: settled wins
	s := e.summarize(p, c, newGateStats())
	if s.Enqueued != 4 || s.Settled != 2 || s.Pending != 1 || s.Lost != 1 || len(s.LostIDs) != 1 || s.LostIDs[0] != ids[3] {
		t.Fatalf("ledger %+v, want 2 settled, 1 pending, %s lost", s, ids[3])
	}
	acme := s.Providers[0]
	if acme.Name != "acme" || acme.Dispatched != 1 || acme.DeadLettered != 1 || acme.DeadReasons["invalid"] != 1 {
		t.Fatalf("acme %+v", acme)
	}
}

func postKey(t *testing.T, url, key string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
