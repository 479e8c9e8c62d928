package rabbitmq_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/consumers/rabbitmq"
	"github.com/paygate/paygate/internal/testenv"
)

// open connects an adapter on a fresh exchange, so tests never share queues.
func open(t *testing.T, tiers ...time.Duration) (*rabbitmq.Broker, string) {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	x := "test-" + hex.EncodeToString(b[:])
	if len(tiers) == 0 {
		tiers = []time.Duration{200 * time.Millisecond, 2 * time.Second}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	br, err := rabbitmq.Open(ctx, rabbitmq.Options{URL: testenv.AMQPURL(), Exchange: x, Prefetch: 4, Providers: []string{"acme"}, DelayTiers: tiers})
	if err != nil {
		t.Fatalf("rabbitmq unreachable (%v): run scripts/services.sh up", err)
	}
	t.Cleanup(func() {
		br.Close()
		deleteTopology(x, tiers)
	})
	return br, x
}

func deleteTopology(x string, tiers []time.Duration) {
	_ = rabbitmq.DeleteTopology(testenv.AMQPURL(), rabbitmq.TopologyOf(x, []string{"acme"}, tiers))
}

func next(t *testing.T, ch <-chan consumers.Delivery, within time.Duration) consumers.Delivery {
	t.Helper()
	select {
	case d, ok := <-ch:
		if !ok {
			t.Fatal("stream closed")
		}
		return d
	case <-time.After(within):
		t.Fatalf("no delivery within %v", within)
		return nil
	}
}

// A deferred job leaves its queue only once the delay tier confirmed the copy, and comes back to the
// provider's queue after the tier's TTL, carrying its attempt and first-seen time.
func TestDeferThroughDelayTier(t *testing.T) {
	br, _ := open(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := br.Consume(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if err := br.Publish(ctx, "acme", []byte(`{"id":"j1"}`)); err != nil {
		t.Fatal(err)
	}
	d := next(t, stream, 5*time.Second)
	first := d.FirstSeen()
	if d.Attempt() != 0 || string(d.Body()) != `{"id":"j1"}` {
		t.Fatalf("first delivery: attempt %d body %s", d.Attempt(), d.Body())
	}
	sent := time.Now()
	if err := d.Defer(ctx, 150*time.Millisecond, 2, errors.New("provider said 503")); err != nil {
		t.Fatal(err)
	}
	again := next(t, stream, 10*time.Second)
	if waited := time.Since(sent); waited < 150*time.Millisecond {
		t.Fatalf("came back after %v, before the 200ms tier's TTL", waited)
	}
	if again.Attempt() != 2 || !again.FirstSeen().Equal(first.Truncate(time.Millisecond)) || string(again.Body()) != `{"id":"j1"}` {
		t.Fatalf("redelivery: attempt %d first seen %v (want %v) body %s", again.Attempt(), again.FirstSeen(), first, again.Body())
	}
	if err := again.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// A dead letter lands in X.dead with headers saying why.
func TestDeadLetterHeaders(t *testing.T) {
	br, x := open(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, _ := br.Consume(ctx, "acme")
	if err := br.Publish(ctx, "acme", []byte("not json")); err != nil {
		t.Fatal(err)
	}
	d := next(t, stream, 5*time.Second)
	if err := d.DeadLetter(ctx, consumers.ReasonInvalid, 0, errors.New("body is not JSON")); err != nil {
		t.Fatal(err)
	}
	m := getOne(t, x+".dead")
	if m.Headers[consumers.HeaderReason] != "invalid" || m.Headers[consumers.HeaderError] != "body is not JSON" ||
		m.Headers[consumers.HeaderAttempt] != int64(0) || m.Headers[consumers.HeaderFirstSeen] == nil || string(m.Body) != "not json" {
		t.Fatalf("dead letter %q headers %v", m.Body, m.Headers)
	}
}

func getOne(t *testing.T, queue string) amqp.Delivery {
	t.Helper()
	ms := getAll(t, queue, 1)
	if len(ms) == 0 {
		t.Fatalf("nothing in %s", queue)
	}
	return ms[0]
}

// The server closes the consuming connection (as rabbitmqctl close_all_connections would): the adapter
// reconnects, redeclares and resumes; the unacknowledged delivery is redelivered, and acking it on the
// dead channel fails rather than touching the new one.
func TestReconnectAfterServerClose(t *testing.T) {
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		t.Fatal("rabbitmqctl not found: run scripts/services.sh up")
	}
	br, x := open(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, _ := br.Consume(ctx, "acme")
	if err := br.Publish(ctx, "acme", []byte(`{"id":"r1"}`)); err != nil {
		t.Fatal(err)
	}
	d := next(t, stream, 5*time.Second)
	closeConnections(t, "paygate-consume "+x)
	if err := d.Ack(ctx); err == nil {
		t.Fatal("ack on a closed channel succeeded")
	}
	again := next(t, stream, 30*time.Second) // redelivered on the new connection
	if string(again.Body()) != `{"id":"r1"}` {
		t.Fatalf("redelivery %s", again.Body())
	}
	if err := again.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := br.Publish(ctx, "acme", []byte(`{"id":"r2"}`)); err != nil {
		t.Fatal(err)
	}
	if d := next(t, stream, 10*time.Second); string(d.Body()) != `{"id":"r2"}` {
		t.Fatalf("after reconnect %s", d.Body())
	}
	if err := br.Ready(); err != nil {
		t.Fatal(err)
	}
}

// closeConnections closes, from the server side, the connections with the given connection_name.
func closeConnections(t *testing.T, name string) {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", "-q", "list_connections", "pid", "client_properties").CombinedOutput()
	if err != nil {
		t.Fatalf("list_connections: %v %s", err, out)
	}
	closed := 0
	for line := range strings.SplitSeq(string(out), "\n") {
		if !strings.Contains(line, `"`+name+`"`) {
			continue
		}
		pid := strings.Fields(line)[0]
		if out, err := exec.Command("rabbitmqctl", "-q", "close_connection", pid, "test: cut").CombinedOutput(); err != nil {
			t.Fatalf("close_connection: %v %s", err, out)
		}
		closed++
	}
	if closed == 0 {
		t.Fatalf("no connection named %q:\n%s", name, out)
	}
}

// Found in review: a publish nobody can receive must fail, never pass for confirmed (its original would
// be acked and the job lost). Concurrent publishes to a routing key no queue binds, and to one that does.
func TestUnroutablePublishFails(t *testing.T) {
	br, x := open(t)
	ctx := context.Background()
	const n = 200
	errs := make(chan error, 2*n)
	for i := range n {
		go func() { errs <- br.Publish(ctx, "ghost", []byte("x")) }()
		go func() { errs <- br.Publish(ctx, "acme", []byte(`{"i":`+strconv.Itoa(i)+`}`)) }()
	}
	failed := 0
	for range 2 * n {
		if err := <-errs; err != nil {
			if !strings.Contains(err.Error(), "returned") {
				t.Fatalf("unexpected error: %v", err)
			}
			failed++
		}
	}
	if failed != n {
		t.Fatalf("%d of %d unroutable publishes failed, want all of them and none of the routable ones", failed, n)
	}
	if got := len(getAll(t, x+".acme", n)); got != n {
		t.Fatalf("%d routable messages arrived, want %d", got, n)
	}
}

// The queue is deleted under a running consumer (the broker cancels it): the adapter redeclares the
// topology and consumes again.
func TestQueueDeletedUnderConsumer(t *testing.T) {
	br, x := open(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, _ := br.Consume(ctx, "acme")
	if err := br.Publish(ctx, "acme", []byte(`{"id":"before"}`)); err != nil {
		t.Fatal(err)
	}
	if err := next(t, stream, 5*time.Second).Ack(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.Dial(testenv.AMQPURL())
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDelete(x+".acme", false, false, false); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	deadline := time.Now().Add(15 * time.Second)
	for br.Publish(ctx, "acme", []byte(`{"id":"after"}`)) != nil { // returned until the queue is back
		if time.Now().After(deadline) {
			t.Fatal("queue not redeclared within 15s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if d := next(t, stream, 10*time.Second); string(d.Body()) != `{"id":"after"}` {
		t.Fatalf("after redeclare: %s", d.Body())
	}
}

// The names are a public contract (docs/brokers.md, "RabbitMQ topology").
func TestTopologyOf(t *testing.T) {
	got := rabbitmq.TopologyOf("payments", []string{"acme", "globex"}, []time.Duration{time.Second, 2 * time.Minute})
	want := rabbitmq.Topology{Exchange: "payments", Queues: []string{"payments.acme", "payments.globex"},
		Classes: []string{"payments.acme.high", "payments.acme.low", "payments.globex.high", "payments.globex.low"},
		Delays:  []string{"payments.delay.1s", "payments.delay.2m"}, Dead: "payments.dead", Results: "payments.results"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%+v, want %+v", got, want)
	}
}

// The dashboard's queue depth: the ready messages of each queue that exists, by passive declare; a queue
// not declared is left out, and the inspector goes on with the others.
func TestInspectorDepths(t *testing.T) {
	br, x := open(t)
	ctx := context.Background()
	for i := range 3 {
		if err := br.Publish(ctx, "acme", []byte(`{"id":"d`+strconv.Itoa(i)+`"}`)); err != nil {
			t.Fatal(err)
		}
	}
	in := rabbitmq.NewInspector(testenv.AMQPURL(), nil)
	defer in.Close()
	queue := rabbitmq.TopologyOf(x, []string{"acme"}, nil).Queues[0]
	var got map[string]int64
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var err error
		if got, err = in.Depths([]string{x + ".nope", queue, x + ".nope2"}); err != nil {
			t.Fatal(err)
		}
		if got[queue] == 3 || time.Now().After(deadline) {
			break
		}
	}
	if len(got) != 1 || got[queue] != 3 {
		t.Fatalf("depths %v, want %s: 3 and nothing for the queues that do not exist", got, queue)
	}
}
