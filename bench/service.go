package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/gateapi"
)

// serviceResult is one way of asking the gate at a steady rate: its latency's percentiles.
type serviceResult struct {
	way      string
	rate     int
	n        int
	p50, p99 time.Duration
}

const serviceToken = "bench-token-0123456789abcdef"

// runService measures a decision asked of the gate directly (the Redis call alone) and through `worker gate
// serve`'s handler on loopback, over HTTP/1.1 (a pool of connections) and over HTTP/2 without TLS (one
// connection, as `worker gate serve` offers both), each at rate decisions a second for n decisions, one
// after the other; then the most decisions a second one service instance answers to 64 callers asking back
// to back for d.
func runService(ctx context.Context, redisAddr string, rate, n int, d time.Duration) ([]serviceResult, float64, error) {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 64})
	defer rdb.Close()
	prefix := fmt.Sprintf("bench-service-%d", time.Now().UnixNano())
	defer func() {
		for _, k := range rdb.Keys(context.WithoutCancel(ctx), prefix+":*").Val() {
			rdb.Del(context.WithoutCancel(ctx), k)
		}
	}()
	l, err := gate.New(rdb, gate.Options{Prefix: prefix, Providers: map[string]gate.Provider{
		"acme": {Policies: []gate.Policy{{Limit: gate.MaxSlidingLogLimit, Window: time.Second}}}}})
	if err != nil {
		return nil, 0, err
	}
	srv := httptest.NewUnstartedServer(gateapi.New(gateapi.Options{Gate: l, Tokens: []string{serviceToken}}))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	h2 := new(http.Protocols)
	h2.SetUnencryptedHTTP2(true)
	client2 := &http.Client{Transport: &http.Transport{Protocols: h2}}
	ways := []struct {
		name   string
		decide func(id string) error
	}{
		{"the gate directly (the Redis call alone)", func(id string) error { _, err := l.Allow(ctx, "acme", id, 1); return err }},
		{"through the service (HTTP on loopback)", func(id string) error { return askService(client, srv.URL, id) }},
		{"through the service (HTTP/2 without TLS, one connection)", func(id string) error { return askService(client2, srv.URL, id) }},
	}
	var out []serviceResult
	for _, w := range ways {
		r, err := pacedDecisions(ctx, w.name, rate, n, w.decide)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, r)
	}
	return out, serviceThroughput(client, srv.URL, d), nil
}

// pacedDecisions asks decide rate times a second, n times, each on a goroutine of its own (independent
// callers), and returns the latency's percentiles.
func pacedDecisions(ctx context.Context, way string, rate, n int, decide func(string) error) (serviceResult, error) {
	lat := make([]time.Duration, n)
	var failed atomic.Int64
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	stamp := time.Now().UnixNano()
	for i := range n {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return serviceResult{}, ctx.Err()
		}
		wg.Go(func() {
			start := time.Now()
			if decide(fmt.Sprintf("s-%d-%d", stamp, i)) != nil {
				failed.Add(1)
			}
			lat[i] = time.Since(start)
		})
	}
	wg.Wait()
	if failed.Load() > 0 {
		return serviceResult{}, fmt.Errorf("%s: %d decisions failed", way, failed.Load())
	}
	slices.Sort(lat)
	return serviceResult{way: way, rate: rate, n: n, p50: lat[n/2], p99: lat[n*99/100]}, nil
}

// serviceThroughput is how many decisions a second the service answered to 64 callers asking back to
// back for d.
func serviceThroughput(client *http.Client, base string, d time.Duration) float64 {
	var n atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	start := time.Now()
	for c := range 64 {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				if askService(client, base, fmt.Sprintf("t-%d-%d-%d", start.UnixNano(), c, i)) == nil {
					n.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return float64(n.Load()) / time.Since(start).Seconds()
}

// askService asks the service's allow once.
func askService(client *http.Client, base, id string) error {
	req, _ := http.NewRequest("POST", base+"/v1/providers/acme/allow", strings.NewReader(`{"id":"`+id+`"}`))
	req.Header.Set("Authorization", "Bearer "+serviceToken)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// serviceTable reports the runs, each service way's share at p99 against the gate asked directly, and
// the goal.
func serviceTable(b *strings.Builder, rs []serviceResult, perSec float64) {
	fmt.Fprintln(b, "| asked | decisions | rate | p50 | p99 | added at p99 (at p50) |")
	fmt.Fprintln(b, "|---|---|---|---|---|---|")
	for i, r := range rs {
		added := "—"
		if i > 0 {
			added = fmt.Sprintf("%s (%s)", ms(r.p99-rs[0].p99), ms(r.p50-rs[0].p50))
		}
		fmt.Fprintf(b, "| %s | %d | %d/s | %s | %s | %s |\n", r.way, r.n, r.rate, ms(r.p50), ms(r.p99), added)
	}
	fmt.Fprintln(b)
	for _, r := range rs[1:] {
		mark := "met"
		if r.p99-rs[0].p99 > time.Millisecond {
			mark = "**not met**"
		}
		fmt.Fprintf(b, "- %s: adds %s at p99: goal ≤ 1 ms, %s.\n", r.way, ms(r.p99-rs[0].p99), mark)
	}
	fmt.Fprintf(b, "\nOne instance answered %.0f decisions a second to 64 callers asking back to back (HTTP/1.1).\n", perSec)
}
