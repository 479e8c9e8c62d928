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
	q := newFairQueue(map[string]int{"b": 2})
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
	q := newFairQueue(nil)
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
