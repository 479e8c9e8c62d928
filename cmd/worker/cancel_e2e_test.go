package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/paygate/paygate/providers/sim"
)

// Issue 41's acceptance for worker cancel and worker job show, on RabbitMQ: see cancelAcceptance.
func TestCancelRabbitMQ(t *testing.T) {
	f := newFleet(t, simProvider{name: "acme", limits: []sim.Window{{Limit: 10, Per: time.Second}}})
	cancelAcceptance(t, f, "rabbitmq")
}

// Issue 41's acceptance for worker cancel and worker job show, on Kafka (kfake): see cancelAcceptance.
func TestCancelKafka(t *testing.T) {
	f, _ := newKafkaFleet(t, simProvider{name: "acme", limits: []sim.Window{{Limit: 10, Per: time.Second}}})
	cancelAcceptance(t, f, "kafka")
}

// cancelAcceptance: two worker processes, a strict provider at 10/1s, 100 jobs queued behind that budget.
// Ten of them are cancelled while queued: exactly those ten never reach the provider, and each gets a
// result `cancelled` with the cancel's reason. A cancel of a job already sent exits 3 naming when it
// left, both while the gate's id record holds it and later, from the job journal; job show says where
// each is. Bad input exits 2.
func cancelAcceptance(t *testing.T, f *fleet, kind string) {
	const n = 100
	f.withResults("acme")
	f.established()
	f.startWorker()
	f.startWorker()
	if kind == "kafka" {
		f.waitFor("the group", 30*time.Second, f.inGroup)
	}
	f.enqueue("acme", n, "c")
	s := f.sims["acme"]
	f.waitFor("the first jobs accepted", 20*time.Second, func() bool { return s.Stats().Accepted >= 2 })

	// The last ten published: still queued behind the budget for seconds (on Kafka, each at the tail of
	// its partition).
	cancelled := []string{"c-90", "c-91", "c-92", "c-93", "c-94", "c-95", "c-96", "c-97", "c-98", "c-99"}
	for _, id := range cancelled {
		r := worker(t, f.env(), "cancel", "--config", f.cfg, "--provider", "acme", "--id", id, "--reason", "merchant asked", "--json")
		var rep cancelReport
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rep) != nil || (rep.State != "cancelled" && rep.State != "given_up") || rep.Until == "" {
			t.Fatalf("cancel %s: exit %d\n%s%s", id, r.code, r.stdout, r.stderr)
		}
	}
	if r := worker(t, f.env(), "cancel", "--config", f.cfg, "--provider", "acme", "--id", "c-90"); r.code != 0 || !strings.Contains(r.stdout, "cancelled already") {
		t.Errorf("a second cancel: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	var at map[string]time.Time
	s.get("/accepted", &at)
	sent := ""
	for id := range at {
		sent = id
		break
	}
	cancelSent := func(why string) {
		t.Helper()
		r := worker(t, f.env(), "cancel", "--config", f.cfg, "--provider", "acme", "--id", sent, "--json")
		var rep cancelReport
		if r.code != 3 || json.Unmarshal([]byte(r.stdout), &rep) != nil || rep.State != "left" || !strings.Contains(r.stderr, "not cancelled") {
			t.Fatalf("cancel of %s, sent at %s (%s): exit %d, want 3\n%s%s", sent, at[sent], why, r.code, r.stdout, r.stderr)
		}
		left, err := time.Parse(time.RFC3339Nano, rep.SentAt)
		if err != nil || !strings.Contains(r.stderr, rep.SentAt) || left.Sub(at[sent]).Abs() > 2*time.Second {
			t.Errorf("cancel of %s, accepted at %s: sent_at %q (%v), the error line %q", sent, at[sent], rep.SentAt, err, r.stderr)
		}
	}
	cancelSent("just sent")
	f.waitFor("90 accepted", 60*time.Second, func() bool { return s.Stats().Accepted >= int64(n-len(cancelled)) })
	cancelSent("seconds ago: from the job journal")

	byID := map[string]string{}
	f.waitFor("a result for every job", 30*time.Second, func() bool {
		results, _ := resultsOf(t, f.results(kind))
		for id, r := range results {
			byID[id] = r.Outcome + " " + r.Reason
		}
		return len(byID) >= n
	})
	f.stopAll()
	s.get("/accepted", &at)
	for _, id := range cancelled {
		if _, ok := at[id]; ok {
			t.Errorf("%s reached the provider after its cancel returned", id)
		}
		if byID[id] != "cancelled merchant asked" {
			t.Errorf("%s: result %q, want cancelled with its reason", id, byID[id])
		}
	}
	if len(at) != n-len(cancelled) {
		t.Errorf("%d jobs accepted, want %d", len(at), n-len(cancelled))
	}
	if st := s.Stats(); st.Violations != 0 {
		t.Errorf("%d requests over the limit", st.Violations)
	}

	show := func(id string) jobReport {
		t.Helper()
		r := worker(t, f.env(), "job", "show", "--config", f.cfg, "--provider", "acme", "--id", id, "--json")
		var rep jobReport
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rep) != nil {
			t.Fatalf("job show %s: exit %d\n%s%s", id, r.code, r.stdout, r.stderr)
		}
		return rep
	}
	if rep := show("c-97"); rep.State != "cancelled" || rep.Cancelled == nil || rep.Cancelled.Reason != "merchant asked" || rep.Left != "" {
		t.Errorf("job show of a cancelled job: %+v", rep)
	}
	if rep := show(sent); rep.Left == "" || rep.Outcome != "succeeded" || (rep.State != "sent" && rep.State != "admitted") {
		t.Errorf("job show of a job sent: %+v", rep)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"cancel", "--provider", "nope", "--id", "x"}, `provider "nope" is not configured`},
		{[]string{"cancel", "--provider", "acme"}, "--id is required"},
		{[]string{"job", "show", "--provider", "acme"}, "--id is required"},
		{[]string{"job", "list"}, "want the subcommand show"},
	} {
		if r := worker(t, f.env(), append(c.args[:len(c.args):len(c.args)], "--config", f.cfg)...); r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("worker %s: exit %d, want 2 and %q\n%s", strings.Join(c.args, " "), r.code, c.want, r.stderr)
		}
	}
}
