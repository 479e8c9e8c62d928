package dashboard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/dashboard"
	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/internal/report"
	"github.com/paygate/paygate/internal/testenv"
)

// fleetGate is a gate over n providers p00.. on the test Redis, each with a second and a minute limit.
func fleetGate(t testing.TB, n int) (*gate.Limiter, []string, *redis.Client) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	t.Cleanup(func() { rdb.Close() })
	prefix := fmt.Sprintf("test-dashboard-%d", time.Now().UnixNano())
	t.Cleanup(func() {
		keys, _ := rdb.Keys(context.Background(), prefix+"*").Result()
		if len(keys) > 0 {
			rdb.Del(context.Background(), keys...)
		}
	})
	providers := map[string]gate.Provider{}
	var names []string
	for i := range n {
		name := fmt.Sprintf("p%02d", i)
		names = append(names, name)
		providers[name] = gate.Provider{Policies: []gate.Policy{{Limit: 10, Window: time.Minute}, {Limit: 100, Window: time.Hour}}}
	}
	l, err := gate.New(rdb, gate.Options{Prefix: prefix, Margin: 20 * time.Millisecond, MarginMax: 100 * time.Millisecond, Providers: providers}) // as config.yaml
	if err != nil {
		t.Fatal(err)
	}
	return l, names, rdb
}

// serve runs srv and serves its handler until the test ends, once it has read its first sample.
func serve(t *testing.T, srv *dashboard.Server) (url string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { cancel(); ts.Close() })
	go srv.Run(ctx)
	for srv.Samples() == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	return ts.URL
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

// The page shows every provider with the figures gate status --json prints (report.Of), and streams a
// sample each interval.
func TestDashboardServesEveryProvider(t *testing.T) {
	l, names, _ := fleetGate(t, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i, n := range names {
		for j := range i + 2 { // p00: 2 used, p01: 3, p02: 4
			if _, err := l.Reserve(ctx, n, "j"+strconv.Itoa(j), 1, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	url := serve(t, dashboard.New(dashboard.GateSource(l, names), 100*time.Millisecond, 50))

	var last dashboard.Sample
	getJSON(t, url+"/api/status", &last)
	if len(last.Providers) != len(names) {
		t.Fatalf("the sample has %d providers, want %d: %+v", len(last.Providers), len(names), last)
	}
	for i, e := range last.Providers {
		want, err := report.Of(ctx, l, names[i])
		if err != nil {
			t.Fatal(err)
		}
		if e.Provider != names[i] || e.Error != "" || len(e.Policies) != 2 {
			t.Fatalf("provider %d: %+v", i, e)
		}
		for k, p := range e.Policies {
			w := want.Policies[k]
			if p.Limit != w.Limit || p.Used != w.Used || p.Used != int64(i+2) {
				t.Errorf("%s policy %d: used %d of %s; gate status says %d of %s (want %d)", e.Provider, k, p.Used, p.Limit, w.Used, w.Limit, i+2)
			}
		}
	}

	var hist []dashboard.Sample
	getJSON(t, url+"/api/history", &hist)
	if len(hist) == 0 || len(hist) > 50 {
		t.Fatalf("history of %d samples, want 1..50", len(hist))
	}

	// The stream: a sample arrives within a few intervals, with every provider.
	resp, err := http.Get(url + "/api/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("events content type %q", ct)
	}
	got := make(chan dashboard.Sample, 1)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var s dashboard.Sample
				if json.Unmarshal([]byte(data), &s) == nil {
					got <- s
					return
				}
			}
		}
	}()
	select {
	case s := <-got:
		if len(s.Providers) != len(names) {
			t.Fatalf("streamed sample with %d providers", len(s.Providers))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no sample streamed within 5s")
	}

	// The page and its script are served from the binary.
	for path, want := range map[string]string{"/": "app.js", "/app.js": "api/status"} {
		resp, err := http.Get(url + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), want) {
			t.Fatalf("GET %s: %d, no %q", path, resp.StatusCode, want)
		}
	}
}

// A provider that cannot be read is shown with its error, beside the others.
func TestDashboardShowsAProviderItCannotRead(t *testing.T) {
	l, names, _ := fleetGate(t, 1)
	url := serve(t, dashboard.New(dashboard.GateSource(l, append(names, "ghost")), time.Hour, 5))
	var last dashboard.Sample
	getJSON(t, url+"/api/status", &last)
	if len(last.Providers) != 2 || last.Providers[0].Error != "" || last.Providers[1].Provider != "ghost" || last.Providers[1].Error == "" {
		t.Fatalf("sample: %+v", last)
	}
}

// BenchmarkSample50 reads 50 providers once per op, as the dashboard does each second whatever the number of
// open pages, and reports the Redis commands the dashboard sends per sample (calls/sample, counted by a
// go-redis hook on its client) and the time a sample takes.
func BenchmarkSample50(b *testing.B) {
	l, names, rdb := fleetGate(b, 50)
	var calls atomic.Int64
	rdb.AddHook(counter{&calls})
	src := dashboard.GateSource(l, names)
	ctx := context.Background()
	src(ctx) // functions loaded, live limits read
	calls.Store(0)
	for b.Loop() {
		for _, e := range src(ctx) {
			if e.Error != "" {
				b.Fatal(e.Error)
			}
		}
	}
	b.ReportMetric(float64(calls.Load())/float64(b.N), "calls/sample")
}

// counter counts the commands a client sends (a pipeline's each).
type counter struct{ n *atomic.Int64 }

func (c counter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.n.Add(1); return next(ctx, cmd) }
}
func (c counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.n.Add(int64(len(cmds))); return next(ctx, cmds) }
}

// Each entry carries the provider's 429s and dead letters per minute, as workers counted them in Redis,
// and the jobs waiting in the broker (a Backlog); a backlog that cannot be read says so on every entry.
func TestDashboardShowsEventsAndBacklog(t *testing.T) {
	l, names, _ := fleetGate(t, 2)
	ctx := context.Background()
	for _, ev := range []string{gate.EventThrottled, gate.EventThrottled, gate.EventDead + "permanent"} {
		if err := l.CountEvent(ctx, names[1], ev); err != nil {
			t.Fatal(err)
		}
	}
	backlogErr := error(nil)
	src := dashboard.WithBacklog(dashboard.GateSource(l, names), func(context.Context) (map[string]int64, error) {
		if backlogErr != nil {
			return nil, backlogErr
		}
		return map[string]int64{names[1]: 42, names[1] + ".high": 3, names[1] + ".low": 5000}, nil
	})
	got := src(ctx)
	if got[0].Queued != nil || got[1].Queued == nil || *got[1].Queued != 5045 ||
		fmt.Sprint(got[1].QueuedByClass) != "map[high:3 low:5000 normal:42]" {
		t.Fatalf("queued: %v, %v %v; want unknown for %s and 5045 (3 high, 42 normal, 5000 low) for %s", got[0].Queued, got[1].Queued, got[1].QueuedByClass, names[0], names[1])
	}
	var throttled, dead int64
	for _, m := range got[1].Events {
		throttled += m.Throttled
		dead += m.Dead["permanent"]
	}
	if n := len(got[1].Events); n < dashboard.EventMinutes || n > dashboard.EventMinutes+1 || throttled != 2 || dead != 1 {
		t.Fatalf("%s's events %+v: want %d minutes holding 2 429s and 1 permanent dead letter", names[1], got[1].Events, dashboard.EventMinutes)
	}
	for _, m := range got[0].Events {
		if m.Throttled != 0 || len(m.Dead) != 0 {
			t.Fatalf("%s's events %+v: want none", names[0], got[0].Events)
		}
	}
	backlogErr = fmt.Errorf("rabbitmq: connect: refused")
	for _, e := range src(ctx) {
		if e.Queued != nil || !strings.Contains(e.BacklogError, "refused") || e.Error != "" {
			t.Fatalf("with the broker unreachable: %+v", e)
		}
	}
}
