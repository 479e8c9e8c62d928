package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
)

// clusterResult is the decisions per second of 12 providers on the Redis Cluster, their keys (one hash tag
// per provider) on `shards` of its primaries.
type clusterResult struct {
	shards    int
	providers int
	perSec    float64
}

// clusterProviders picks n provider names whose hash tags fall on the first `shards` primaries, as evenly
// as it can.
func clusterProviders(ctx context.Context, cc *redis.ClusterClient, n, shards int) ([]string, error) {
	var masters []string
	err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		masters = append(masters, c.Options().Addr)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(masters) < shards {
		return nil, fmt.Errorf("the cluster has %d primaries, want %d", len(masters), shards)
	}
	// ForEachMaster visits in no fixed order: take the primaries sorted by address.
	sorted := slices.Sorted(slices.Values(masters))
	per := map[string]int{}
	for i, m := range sorted[:shards] {
		per[m] = n / shards
		if i < n%shards {
			per[m]++
		}
	}
	var names []string
	for i := 0; len(names) < n && i < 100000; i++ {
		name := fmt.Sprintf("c%d", i)
		node, err := cc.MasterForKey(ctx, "{"+name+"}")
		if err != nil {
			return nil, err
		}
		if addr := node.Options().Addr; per[addr] > 0 {
			per[addr]--
			names = append(names, name)
		}
	}
	return names, nil
}

// runCluster measures aggregate decisions per second of 12 providers over 1, 2 and 3 shards of the test
// cluster: 4 callers per provider, each deciding new jobs one at a time for runFor.
func runCluster(ctx context.Context, addrs []string, runFor time.Duration) ([]clusterResult, error) {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 64})
	defer cc.Close()
	if err := cc.Ping(ctx).Err(); err != nil {
		return nil, fmt.Errorf("redis cluster %s: %w (run scripts/services.sh up)", strings.Join(addrs, ","), err)
	}
	const providers, callers = 12, 4
	var out []clusterResult
	for _, shards := range []int{1, 2, 3} {
		names, err := clusterProviders(ctx, cc, providers, shards)
		if err != nil {
			return nil, err
		}
		prefix := fmt.Sprintf("bench-cluster-%d", time.Now().UnixNano())
		ps := map[string]gate.Provider{}
		for _, n := range names {
			// Room no run reaches, in a window short enough to keep each log small.
			ps[n] = gate.Provider{Policies: []gate.Policy{{Limit: gate.MaxSlidingLogLimit, Window: 100 * time.Millisecond}}}
		}
		l, err := gate.New(cc, gate.Options{Prefix: prefix, Margin: 10 * time.Millisecond, Providers: ps})
		if err != nil {
			return nil, err
		}
		for _, n := range names { // functions loaded on every primary
			if _, err := l.Reserve(ctx, n, "warm", 1, 0); err != nil {
				return nil, err
			}
		}
		var done atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, providers*callers)
		end := time.Now().Add(runFor)
		for _, n := range names {
			for c := range callers {
				wg.Go(func() {
					for k := 0; time.Now().Before(end); k++ {
						if _, err := l.Reserve(ctx, n, fmt.Sprintf("%d-%d", c, k), 1, 0); err != nil {
							errs <- err
							return
						}
						done.Add(1)
					}
				})
			}
		}
		start := time.Now()
		wg.Wait()
		elapsed := time.Since(start)
		close(errs)
		if err := <-errs; err != nil {
			return nil, err
		}
		for _, n := range names {
			keys, _ := l.Keys(n)
			for _, k := range keys {
				cc.Del(ctx, k)
			}
		}
		out = append(out, clusterResult{shards: shards, providers: providers, perSec: float64(done.Load()) / elapsed.Seconds()})
	}
	return out, nil
}

func clusterTable(b *strings.Builder, rs []clusterResult) {
	fmt.Fprintln(b, "| shards holding the providers | providers | decisions/s | × 1 shard |")
	fmt.Fprintln(b, "|---|---|---|---|")
	for _, r := range rs {
		fmt.Fprintf(b, "| %d | %d | %.0f | %.2f× |\n", r.shards, r.providers, r.perSec, r.perSec/rs[0].perSec)
	}
}
