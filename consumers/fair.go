package consumers

import (
	"encoding/json"
	"sync"
)

// Fair shares between merchants (Config.Fair). A provider's deliveries are read ahead, up to what the
// broker lets the worker hold unsettled (RabbitMQ's prefetch, Kafka's records in flight), into one queue
// per merchant; the provider's handlers take from those queues in turn, each merchant as many in a row as
// its weight. A merchant with a backlog therefore has one job asking the gate for each of another
// merchant's (weights equal), whatever the order the broker holds them in, and its jobs beyond that wait
// in the queue without spending budget: they have asked the gate nothing. The gate hands out slots first
// come, first served, so each active merchant gets at least its weight's share of the provider's budget,
// and a job of a merchant that has just become active waits at most for the slots the handlers already
// hold (at most Concurrency of them, well under a window at the rates concurrency is sized for).
//
// What it does not do: a merchant's jobs beyond the read-ahead stay in the broker, in the order they were
// published. A merchant whose backlog is deeper than the fleet's read-ahead (prefetch times processes)
// holds back the jobs published after it by that much of its backlog, at the provider's rate.

// fairQueue is one provider's deliveries (of one class), by merchant; or in one queue, in the order they
// came, when fifo.
type fairQueue struct {
	weights map[string]int // weight per merchant; absent: 1
	limit   int            // deliveries held at most (the read-ahead); the stream waits beyond
	fifo    bool           // no fair shares: every delivery in one queue

	mu      *sync.Mutex // shared with the provider's other classes' queues (classQueues)
	cond    *sync.Cond  // a delivery was queued, or a stream closed (shared likewise)
	space   *sync.Cond  // a delivery was taken
	pending int
	queues  map[string][]Delivery // merchants with deliveries waiting
	turn    []string              // those merchants, in turn order
	next    int                   // turn[next] is served next
	served  int                   // picks turn[next] has had in its current turn
	closed  bool
}

func newFairQueue(weights map[string]int, limit int) *fairQueue {
	mu := &sync.Mutex{}
	return newFairQueueOn(mu, sync.NewCond(mu), weights, limit)
}

// newFairQueueOn is a queue under a lock and a "queued" condition shared with others (classQueues).
func newFairQueueOn(mu *sync.Mutex, queued *sync.Cond, weights map[string]int, limit int) *fairQueue {
	q := &fairQueue{weights: weights, limit: max(limit, 1), queues: map[string][]Delivery{}, mu: mu, cond: queued}
	q.space = sync.NewCond(mu)
	return q
}

// feed reads a stream into the queue until it closes, then closes the queue.
func (q *fairQueue) feed(deliveries <-chan Delivery) {
	for d := range deliveries {
		merchant := ""
		if !q.fifo {
			merchant = merchantOf(d.Body())
		}
		q.push(merchant, d)
	}
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.cond.Broadcast()
}

// merchantOf reads a job's merchant from its body ("" for none, or a body that is not a job: the
// handler dead-letters that).
func merchantOf(body []byte) string {
	var j struct {
		Merchant string `json:"merchant"`
	}
	if json.Unmarshal(body, &j) != nil {
		return ""
	}
	return j.Merchant
}

func (q *fairQueue) push(merchant string, d Delivery) {
	q.mu.Lock()
	for q.pending >= q.limit {
		q.space.Wait()
	}
	q.pending++
	if _, waiting := q.queues[merchant]; !waiting {
		q.turn = append(q.turn, merchant)
	}
	q.queues[merchant] = append(q.queues[merchant], d)
	q.mu.Unlock()
	q.cond.Signal()
}

// pop takes the next delivery in turn, waiting for one; false once the stream has closed and the queue is
// empty.
func (q *fairQueue) pop() (Delivery, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.turn) == 0 {
		if q.closed {
			return nil, false
		}
		q.cond.Wait()
	}
	return q.take(), true
}

// take takes the next delivery in turn, under q.mu; one must be waiting.
func (q *fairQueue) take() Delivery {
	if q.next >= len(q.turn) {
		q.next, q.served = 0, 0
	}
	m := q.turn[q.next]
	waiting := q.queues[m]
	q.pending--
	q.space.Signal()
	d := waiting[0]
	waiting[0] = nil
	waiting = waiting[1:]
	q.served++
	switch {
	case len(waiting) == 0: // its turn ends with its queue: the next merchant moves up to q.next
		delete(q.queues, m)
		q.turn = append(q.turn[:q.next], q.turn[q.next+1:]...)
		q.served = 0
	case q.served >= q.weight(m):
		q.queues[m] = waiting
		q.next, q.served = q.next+1, 0
	default:
		q.queues[m] = waiting
	}
	return d
}

func (q *fairQueue) weight(merchant string) int {
	if w, ok := q.weights[merchant]; ok && w > 0 {
		return w
	}
	return 1
}
