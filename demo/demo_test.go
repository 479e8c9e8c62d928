package demo

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/paygate/paygate/consumers"
)

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
