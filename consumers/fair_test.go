package consumers_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/consumers/memory"
)

// Fair shares through Run: with one handler, a merchant's backlog published first does not hold back the
// merchants published after it (their jobs are among the first dispatched, "big" two in a row for its
// weight), and paygate_merchant_jobs_total counts named merchants by name, the rest as other or none.
func TestFairSharesInRun(t *testing.T) {
	g := &fakeGate{answers: []answer{{v: allow(0).v, block: 50 * time.Millisecond}, allow(0)}}
	p := &fakeProvider{}
	reg := prometheus.NewRegistry()
	w, err := consumers.New(consumers.Config{Concurrency: 1, MaxInlineWait: time.Second, MaxAttempts: 3, MaxDeferralAge: time.Hour,
		ShutdownTimeout: time.Second, BackoffBase: time.Second, BackoffMax: time.Minute, RedisRetry: time.Second,
		Providers: map[string]int64{"acme": 10}, Fair: map[string]map[string]int{"acme": {"big": 2}}, ReadAhead: 20},
		g, map[string]consumers.Dispatcher{"acme": p}, nil, consumers.NewMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	g.w = w
	b := memory.New(20, "acme")
	publish := func(id, merchant string) {
		body := fmt.Sprintf(`{"id":%q,"provider":"acme","amount":1,"currency":"EUR","merchant":%q}`, id, merchant)
		if err := b.Publish(context.Background(), "acme", []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 6 {
		publish(fmt.Sprint("a", i), "a")
	}
	publish("big0", "big")
	publish("big1", "big")
	publish("none0", "")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx, b) }()
	for deadline := time.Now().Add(10 * time.Second); len(b.Settled()) < 9 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	order := slices.Clone(p.jobs)
	p.mu.Unlock()
	if len(order) != 9 {
		t.Fatalf("dispatched %v, want all 9", order)
	}
	first := order[:5]
	big := slices.Index(first, "big0")
	if big < 0 || slices.Index(first, "big1") != big+1 || !slices.Contains(first, "none0") {
		t.Fatalf("dispatched in order %v: want big0, big1 (in a row) and none0 among the first five, not behind a's backlog", order)
	}
	counts := map[string]float64{}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "paygate_merchant_jobs_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			counts[labels["merchant"]+"/"+labels["outcome"]] += m.GetCounter().GetValue()
		}
	}
	if want := map[string]float64{"_other/succeeded": 6, "big/succeeded": 2, "_none/succeeded": 1}; fmt.Sprint(counts) != fmt.Sprint(want) {
		t.Fatalf("paygate_merchant_jobs_total %v, want %v", counts, want)
	}
}
