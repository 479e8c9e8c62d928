package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/internal/stats"
	"github.com/paygate/paygate/providers/sim"
)

// An accuracy case: K workers against one referee, steady (an endless backlog) or bursty (2 x limit jobs
// landing 25ms before every other boundary of the shortest window, where fixed windows let 2x through).
type accuracyCase struct {
	limits []sim.Window
	k      int
	bursty bool
}

func (c accuracyCase) String() string {
	var ls []string
	for _, w := range c.limits {
		ls = append(ls, w.String())
	}
	arrival := "steady"
	if c.bursty {
		arrival = "bursty"
	}
	return fmt.Sprintf("%s, %d workers, %s", strings.Join(ls, "+"), c.k, arrival)
}

type accuracyResult struct {
	contender   string
	accepted    int64
	violations  int64
	requests    int64
	utilisation float64
	callsPerJob float64 // limiter calls per dispatched job (0 for the local limiter)
	p99Wait     time.Duration
	perSecond   []int // requests the referee saw in each second of the run
}

// referee is a strict simulated provider behind a handler that counts what it sees per second.
type referee struct {
	p     *sim.Provider
	srv   *http.Server
	url   string
	start time.Time
	mu    sync.Mutex
	secs  []int
	at    []time.Time // acceptances
}

func startReferee(limits []sim.Window) (*referee, error) {
	r := &referee{start: time.Now()}
	p, err := sim.New(sim.Options{Limits: limits, OnAccept: func(_ string, at time.Time) {
		r.mu.Lock()
		r.at = append(r.at, at)
		r.mu.Unlock()
	}})
	if err != nil {
		return nil, err
	}
	r.p = p
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r.url = "http://" + ln.Addr().String() + "/pay"
	r.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		s := int(time.Since(r.start) / time.Second)
		r.mu.Lock()
		for len(r.secs) <= s {
			r.secs = append(r.secs, 0)
		}
		r.secs[s]++
		r.mu.Unlock()
		p.ServeHTTP(w, req)
	})}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

// accepted returns the acceptance times, in order.
func (r *referee) accepted() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.at)
}

// runAccuracy runs every contender through the case in turn, each alone on the machine for d.
func runAccuracy(ctx context.Context, rdb redis.UniversalClient, c accuracyCase, d time.Duration) ([]accuracyResult, error) {
	var out []accuracyResult
	for i, ct := range contenders {
		r, err := accuracyOne(ctx, rdb, c, d, i, ct)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ct.name, err)
		}
		out = append(out, r)
	}
	return out, nil
}

func accuracyOne(ctx context.Context, rdb redis.UniversalClient, c accuracyCase, d time.Duration, i int, ct contender) (accuracyResult, error) {
	type live struct {
		ref     *referee
		run     run
		calls   atomic.Int64 // limiter calls of the jobs sent
		sent    atomic.Int64
		waitsMu sync.Mutex
		waits   []time.Duration
	}
	ref, err := startReferee(c.limits)
	if err != nil {
		return accuracyResult{}, err
	}
	defer ref.srv.Close()
	r, err := ct.newRun(rdb, fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), i), c.limits, c.k)
	if err != nil {
		return accuracyResult{}, err
	}
	if c, ok := r.(interface{ close() }); ok {
		defer c.close()
	}
	l := &live{ref: ref, run: r}
	runCtx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var wg sync.WaitGroup
	{
		client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: c.k + 4}}
		defer client.CloseIdleConnections()
		jobs := jobSource(runCtx, &wg, c)
		for w := range c.k {
			acq := l.run.worker(w)
			wg.Go(func() {
				for n := 0; ; n++ {
					arrived, ok := jobs()
					if !ok {
						return
					}
					id := fmt.Sprintf("%d-%d-%d", i, w, n)
					calls, err := acq.acquire(runCtx, id)
					if err != nil {
						return // the run ended: this job was never sent, and its calls are not counted
					}
					wait := time.Since(arrived)
					req, _ := http.NewRequestWithContext(runCtx, http.MethodPost, l.ref.url, strings.NewReader(`{"amount":100}`))
					req.Header.Set("Idempotency-Key", id)
					resp, err := client.Do(req)
					if err != nil {
						continue
					}
					// Read to its end, so that the connection is kept for the next request: closed unread, it
					// is dropped, and at thousands a second the dials took a third of the bench's CPU.
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					l.calls.Add(int64(calls))
					l.sent.Add(1)
					l.waitsMu.Lock()
					l.waits = append(l.waits, wait)
					l.waitsMu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	st := l.ref.p.Stats()
	m := sim.Measure(l.ref.accepted(), c.limits)
	slices.Sort(l.waits)
	res := accuracyResult{contender: ct.name, accepted: st.Accepted, violations: st.Violations,
		requests: st.Requests, utilisation: m.Utilization, p99Wait: stats.Percentile(l.waits, 99)}
	if n := l.sent.Load(); n > 0 {
		res.callsPerJob = float64(l.calls.Load()) / float64(n)
		if s, ok := r.(interface{ scriptCallsMade() (int64, bool) }); ok {
			if calls, counted := s.scriptCallsMade(); counted {
				res.callsPerJob = float64(calls) / float64(n) // Redis calls: a batch serves several jobs
			}
		}
	}
	l.ref.mu.Lock()
	res.perSecond = slices.Clone(l.ref.secs)
	l.ref.mu.Unlock()
	return res, nil
}

// jobSource hands workers jobs: at once (steady), or from bursts (bursty). It reports false when the run
// is over.
func jobSource(ctx context.Context, wg *sync.WaitGroup, c accuracyCase) func() (time.Time, bool) {
	if !c.bursty {
		return func() (time.Time, bool) { return time.Now(), ctx.Err() == nil }
	}
	ch := make(chan time.Time, 1<<16)
	per := c.limits[0].Per
	wg.Go(func() {
		for {
			now := time.Now()
			// the next odd multiple of per, less 25ms
			next := now.Truncate(2 * per).Add(per - 25*time.Millisecond)
			if !next.After(now) {
				next = next.Add(2 * per)
			}
			t := time.NewTimer(time.Until(next))
			select {
			case <-ctx.Done():
				t.Stop()
				close(ch)
				return
			case at := <-t.C:
				for range 2 * c.limits[0].Limit {
					ch <- at
				}
			}
		}
	})
	return func() (time.Time, bool) {
		select {
		case at, ok := <-ch:
			return at, ok && ctx.Err() == nil
		case <-ctx.Done():
			return time.Time{}, false
		}
	}
}
