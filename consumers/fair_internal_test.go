package consumers

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

type bodyOnly struct{ body []byte }

func (d bodyOnly) Body() []byte                                         { return d.body }
func (bodyOnly) Attempt() int                                           { return 0 }
func (bodyOnly) FirstSeen() time.Time                                   { return time.Time{} }
func (bodyOnly) Ack(context.Context) error                              { return nil }
func (bodyOnly) Defer(context.Context, time.Duration, int, error) error { return nil }
func (bodyOnly) DeadLetter(context.Context, Reason, int, error) error   { return nil }
func (bodyOnly) Requeue(context.Context) error                          { return nil }

func jobOf(merchant string, n int) Delivery {
	return bodyOnly{[]byte(fmt.Sprintf(`{"id":"%s-%d","provider":"acme","amount":1,"currency":"EUR","merchant":%q}`, merchant, n, merchant))}
}

// The fair queue serves merchants in turn, each as many in a row as its weight, whatever order the
// stream held them in; a body that is not a job, or a job without a merchant, is the merchant "".
func TestFairQueueOrder(t *testing.T) {
	stream := make(chan Delivery, 100)
	for i := range 6 {
		stream <- jobOf("a", i)
	}
	for i := range 4 {
		stream <- jobOf("b", i)
	}
	stream <- jobOf("c", 0)
	stream <- bodyOnly{[]byte("not json")}
	close(stream)
	q := newFairQueue(map[string]int{"b": 2}, 100)
	q.feed(stream)
	var got []string
	for d, ok := q.pop(); ok; d, ok = q.pop() {
		m := merchantOf(d.Body())
		if m == "" {
			m = "-"
		}
		got = append(got, m)
	}
	if want := "a b b c - a b b a a a a"; strings.Join(got, " ") != want {
		t.Fatalf("served %v, want %s", got, want)
	}
}

// Handlers waiting on an empty queue take what arrives, and all return once the stream closes.
func TestFairQueueWaitsAndCloses(t *testing.T) {
	stream := make(chan Delivery)
	q := newFairQueue(nil, 3) // the stream waits while 3 are held
	go q.feed(stream)
	var mu sync.Mutex
	served := 0
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for _, ok := q.pop(); ok; _, ok = q.pop() {
				mu.Lock()
				served++
				mu.Unlock()
			}
		})
	}
	for i := range 50 {
		stream <- jobOf(fmt.Sprint("m", i%7), i)
	}
	close(stream)
	wg.Wait()
	if served != 50 {
		t.Fatalf("served %d of 50", served)
	}
}

// The read-ahead is bounded: with nobody taking, the queue holds limit deliveries and the stream waits
// (Kafka bounds nothing itself); each one taken lets one more in.
func TestFairQueueReadAhead(t *testing.T) {
	stream := make(chan Delivery, 10)
	for i := range 10 {
		stream <- jobOf("a", i)
	}
	close(stream)
	q := newFairQueue(nil, 3)
	go q.feed(stream)
	held := func() int { q.mu.Lock(); defer q.mu.Unlock(); return q.pending }
	deadline := time.Now().Add(5 * time.Second)
	for held() < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	if held() != 3 || len(stream) != 6 { // the feeder holds the 4th, waiting for room
		t.Fatalf("held %d, %d left in the stream; want 3 held and 6 left", held(), len(stream))
	}
	n := 0
	for _, ok := q.pop(); ok; _, ok = q.pop() {
		n++
	}
	if n != 10 {
		t.Fatalf("took %d of 10", n)
	}
}
