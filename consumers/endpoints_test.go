package consumers_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/consumers/memory"
	"github.com/paygate/paygate/job"
)

// A job's operation picks its endpoint's cost for the gate's reservation unless the job gives its own; an
// operation the provider has no endpoint for, or a placeholder the job cannot fill, is dead-lettered
// (invalid) naming it, never reserved.
func TestEndpointCostReachesTheGate(t *testing.T) {
	g := &fakeGate{clock: time.Unix(1_700_000_000, 0), answers: []answer{allow(0)}}
	p := &fakeProvider{}
	w, err := consumers.New(consumers.Config{Concurrency: 1, MaxInlineWait: time.Second, MaxAttempts: 5, MaxDeferralAge: time.Hour,
		ShutdownTimeout: time.Second, BackoffBase: time.Second, BackoffMax: time.Minute, RedisRetry: time.Second,
		Providers: map[string]int64{"acme": 10},
		Endpoints: job.Endpoints{"acme": {"payouts": {}, "refunds": {Cost: 3, Fields: []string{"payload.payment_id"}}}}},
		g, map[string]consumers.Dispatcher{"acme": p}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	g.w = w
	b := memory.New(10, "acme")
	for _, body := range []string{
		`{"id":"r-1","provider":"acme","operation":"refunds","amount":1,"currency":"EUR","payload":{"payment_id":"p/1"}}`,
		`{"id":"r-2","provider":"acme","operation":"refunds","amount":1,"currency":"EUR","cost":1,"payload":{"payment_id":"p/2"}}`,
		`{"id":"p-1","provider":"acme","operation":"payouts","amount":1,"currency":"EUR"}`,
		`{"id":"x-1","provider":"acme","operation":"captures","amount":1,"currency":"EUR"}`,
		`{"id":"x-2","provider":"acme","operation":"refunds","amount":1,"currency":"EUR","payload":{"id":"p/3"}}`,
	} {
		if err := b.PublishAged("acme", []byte(body), 0, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	deliveries, err := b.Consume(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		w.Handle(ctx, "acme", <-deliveries)
	}
	var costs []int64
	for _, r := range g.reserved {
		costs = append(costs, r.cost)
	}
	if len(costs) != 3 || costs[0] != 3 || costs[1] != 1 || costs[2] != 1 {
		t.Fatalf("reserved costs %v, want [3 1 1]: refunds' cost, the job's own, payouts' default", costs)
	}
	settled := b.Settled()
	for i, want := range []string{`operation: "captures" is not an endpoint of provider acme`, "payload: {payload.payment_id} in the path of operation refunds"} {
		s := settled[3+i]
		if s.Kind != "dead" || s.Reason != consumers.ReasonInvalid || s.Why == nil || !strings.Contains(s.Why.Error(), want) {
			t.Errorf("settled %+v, want a dead letter (invalid) naming %q", s, want)
		}
	}
}
