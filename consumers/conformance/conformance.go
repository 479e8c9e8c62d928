// Package conformance is the one test suite every broker adapter of the worker core passes: delivery,
// ack, deferral, dead letter, redelivery after a crash, shutdown. An adapter's tests call Run with a
// factory for fresh, isolated instances.
package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/paygate/paygate/consumers"
)

// DeadLetter is a dead-lettered message as an adapter stores it.
type DeadLetter struct {
	Body     []byte
	Provider string // the x-paygate-provider header
	Reason   consumers.Reason
	Error    string
	Attempt  int
}

// Harness is one isolated adapter instance (its own queues or topics) with the provider "acme".
type Harness struct {
	// Broker is the adapter under test.
	Broker consumers.Broker
	// Publish enqueues a job body as a producer would.
	Publish func(ctx context.Context, provider string, body []byte) error
	// DeadLetters returns the dead letters so far (it may wait briefly for them to arrive).
	DeadLetters func(t *testing.T, want int) []DeadLetter
	// Crash abandons every unsettled delivery as a killed process would, and returns a fresh Broker
	// connected to the same queues.
	Crash func(t *testing.T) consumers.Broker
	// MinDeferral is the shortest delay the adapter can defer by (its first tier).
	MinDeferral time.Duration
}

// Factory makes a fresh Harness for each test.
type Factory func(t *testing.T) *Harness

const provider = "acme"

// Run runs the suite.
func Run(t *testing.T, newHarness Factory) {
	t.Run("DeliveryAndAck", func(t *testing.T) { deliveryAndAck(t, newHarness(t)) })
	t.Run("Deferral", func(t *testing.T) { deferral(t, newHarness(t)) })
	t.Run("DeadLetter", func(t *testing.T) { deadLetter(t, newHarness(t)) })
	t.Run("RedeliveryAfterCrash", func(t *testing.T) { redeliveryAfterCrash(t, newHarness(t)) })
	t.Run("Shutdown", func(t *testing.T) { shutdown(t, newHarness(t)) })
}

func next(t *testing.T, ch <-chan consumers.Delivery, within time.Duration) consumers.Delivery {
	t.Helper()
	select {
	case d, ok := <-ch:
		if !ok {
			t.Fatal("stream closed early")
		}
		return d
	case <-time.After(within):
		t.Fatalf("no delivery within %v", within)
		return nil
	}
}

func nothing(t *testing.T, ch <-chan consumers.Delivery, within time.Duration) {
	t.Helper()
	select {
	case d, ok := <-ch:
		if ok {
			t.Fatalf("unexpected delivery %s", d.Body())
		}
	case <-time.After(within):
	}
}

func consume(t *testing.T, b consumers.Broker) (<-chan consumers.Delivery, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := b.Consume(ctx, provider)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	return ch, cancel
}

func publish(t *testing.T, h *Harness, bodies ...string) {
	t.Helper()
	for _, b := range bodies {
		if err := h.Publish(context.Background(), provider, []byte(b)); err != nil {
			t.Fatal(err)
		}
	}
}

// Every published job is delivered, first time with attempt 0; an acked job does not come back.
func deliveryAndAck(t *testing.T, h *Harness) {
	publish(t, h, "j1", "j2", "j3")
	ch, stop := consume(t, h.Broker)
	defer stop()
	got := map[string]bool{}
	for range 3 {
		d := next(t, ch, 10*time.Second)
		if d.Attempt() != 0 || time.Since(d.FirstSeen()) > time.Minute || d.FirstSeen().After(time.Now().Add(time.Second)) {
			t.Fatalf("first delivery of %s: attempt %d, first seen %v", d.Body(), d.Attempt(), d.FirstSeen())
		}
		got[string(d.Body())] = true
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 3 {
		t.Fatalf("delivered %v", got)
	}
	nothing(t, ch, 2*h.MinDeferral+500*time.Millisecond)
}

// A deferred job comes back after at least its delay, with the attempt it was given and its first-seen
// time, and the original is gone.
func deferral(t *testing.T, h *Harness) {
	publish(t, h, "d1")
	ch, stop := consume(t, h.Broker)
	defer stop()
	d := next(t, ch, 10*time.Second)
	first := d.FirstSeen()
	start := time.Now()
	if err := d.Defer(context.Background(), h.MinDeferral, 3, errors.New("provider said 503")); err != nil {
		t.Fatal(err)
	}
	again := next(t, ch, 30*time.Second)
	if waited := time.Since(start); waited < h.MinDeferral {
		t.Fatalf("back after %v, before the %v asked", waited, h.MinDeferral)
	}
	if string(again.Body()) != "d1" || again.Attempt() != 3 || again.FirstSeen().Sub(first).Abs() > time.Millisecond {
		t.Fatalf("redelivery %s attempt %d first seen %v (was %v)", again.Body(), again.Attempt(), again.FirstSeen(), first)
	}
	if err := again.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	nothing(t, ch, 2*h.MinDeferral+500*time.Millisecond)
}

// A dead-lettered job lands in the dead letters with its reason, error and attempt, and is gone.
func deadLetter(t *testing.T, h *Harness) {
	publish(t, h, "not json")
	ch, stop := consume(t, h.Broker)
	defer stop()
	d := next(t, ch, 10*time.Second)
	if err := d.DeadLetter(context.Background(), consumers.ReasonInvalid, 2, errors.New("body is not JSON")); err != nil {
		t.Fatal(err)
	}
	dead := h.DeadLetters(t, 1)
	if len(dead) != 1 || string(dead[0].Body) != "not json" || dead[0].Reason != consumers.ReasonInvalid || dead[0].Provider != provider ||
		dead[0].Error != "body is not JSON" || dead[0].Attempt != 2 {
		t.Fatalf("dead letters %+v", dead)
	}
	nothing(t, ch, 2*h.MinDeferral+500*time.Millisecond)
}

// A job delivered to a process that dies before settling it is delivered again; settling the abandoned
// delivery fails instead of touching the new one.
func redeliveryAfterCrash(t *testing.T, h *Harness) {
	publish(t, h, "c1")
	ch, stop := consume(t, h.Broker)
	d := next(t, ch, 10*time.Second)
	stop()
	b2 := h.Crash(t)
	ch2, stop2 := consume(t, b2)
	defer stop2()
	again := next(t, ch2, 30*time.Second)
	if string(again.Body()) != "c1" {
		t.Fatalf("redelivered %s", again.Body())
	}
	if err := d.Ack(context.Background()); err == nil {
		t.Log("note: the abandoned delivery's ack returned no error") // harmless if it cannot reach the new one
	}
	if err := again.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	nothing(t, ch2, 2*h.MinDeferral+500*time.Millisecond)
}

// After the consumer's context ends the stream closes; a delivery requeued during shutdown comes back to
// the next consumer untouched.
func shutdown(t *testing.T, h *Harness) {
	publish(t, h, "s1")
	ch, stop := consume(t, h.Broker)
	d := next(t, ch, 10*time.Second)
	stop()
	if err := d.Requeue(context.Background()); err != nil {
		t.Fatal(err)
	}
	closed := time.After(15 * time.Second)
	for open := true; open; {
		select {
		case extra, ok := <-ch:
			if !ok {
				open = false
				break
			}
			_ = extra.Requeue(context.Background()) // handed over while stopping: back to the queue
		case <-closed:
			t.Fatal("stream still open 15s after its context ended")
		}
	}
	ch2, stop2 := consume(t, h.Broker)
	defer stop2()
	again := next(t, ch2, 30*time.Second)
	if string(again.Body()) != "s1" || again.Attempt() != 0 {
		t.Fatalf("after shutdown: %s attempt %d", again.Body(), again.Attempt())
	}
	if err := again.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// ScanDead lists an adapter's dead letters through Scan, calling act (when not nil) on each; it returns
// what each said of itself, in the order Scan handed them over.
func ScanDead(t *testing.T, dl consumers.DeadLetters, act func(consumers.DeadLetter) error) []consumers.DeadInfo {
	t.Helper()
	var out []consumers.DeadInfo
	err := dl.Scan(context.Background(), func(l consumers.DeadLetter) (bool, error) {
		out = append(out, l.Info())
		if act != nil {
			return true, act(l)
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// IDOf is a job body's id ("" when it has none).
func IDOf(body []byte) string {
	var j struct{ ID string }
	_ = json.Unmarshal(body, &j)
	return j.ID
}
