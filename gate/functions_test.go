package gate_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
)

// The family runs as a Redis Function where the server has them. A server that lost its libraries (restarted
// empty, FUNCTION FLUSH, a new cluster primary) gets them again from the next decision, which goes through:
// nothing is refused, and the worker does not fall back to EVALSHA for good.
func TestFunctionsLoadedAgain(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			l := newLimiter(t, b.rdb, time.Millisecond, pol(10, time.Hour))
			if v := mustReserve(t, l, "a", 1, 0); !v.Allowed {
				t.Fatalf("first decision: %+v", v)
			}
			if !gate.UsesFunctions(l) {
				t.Fatal("the gate runs with EVALSHA on a Redis 7 server")
			}
			flushFunctions(t, b.rdb)
			if v := mustReserve(t, l, "b", 1, 0); !v.Allowed || v.Remaining != 8 {
				t.Fatalf("decision after FUNCTION FLUSH: %+v (want admitted, 8 left: the state survived, only the library went)", v)
			}
			if !gate.UsesFunctions(l) {
				t.Fatal("after FUNCTION FLUSH the gate fell back to EVALSHA")
			}
			if n := paygateLibraries(t, b.rdb); n == 0 {
				t.Fatal("no paygate library on the server after the decision")
			}
		})
	}
}

// Where the server has no functions (the demo's miniredis), the same source runs with EVALSHA.
func TestFunctionsFallBackToEval(t *testing.T) {
	l := newLimiter(t, embedded(t).rdb, time.Millisecond, pol(2, time.Hour))
	for i, want := range []bool{true, true, false} {
		if v := mustReserve(t, l, fmt.Sprint("j", i), 1, 0); v.Allowed != want {
			t.Fatalf("job %d: allowed %v, want %v", i, v.Allowed, want)
		}
	}
	if gate.UsesFunctions(l) {
		t.Fatal("the gate says it uses functions on miniredis")
	}
}

// A function keeps its top level between calls, EVALSHA does not: the same calls must get the same answers
// either way. Two limiters, one forced to EVALSHA, run one sequence that moves between providers with
// different numbers of policies, a merchant with limits and one without, releases, duplicates, denials and
// status, so that a value one call leaves behind would show in the next.
func TestFunctionsAndEvalAgree(t *testing.T) {
	rdb := backends(t)[0].rdb
	ctx := context.Background()
	for _, algo := range gate.MerchantAlgorithms {
		t.Run(string(algo), func(t *testing.T) {
			mk := func(eval bool) *gate.Limiter {
				l, err := gate.New(rdb, gate.Options{Prefix: uniquePrefix(t), Margin: time.Millisecond, Providers: map[string]gate.Provider{
					"one": {Algorithm: algo, Policies: []gate.Policy{pol(3, time.Hour)}},
					"two": {Algorithm: algo, Policies: []gate.Policy{pol(5, time.Hour), pol(4, 2*time.Hour)}, PerMerchant: []gate.Policy{pol(2, time.Hour)}},
				}})
				if err != nil {
					t.Fatal(err)
				}
				if eval {
					gate.ForceEval(l)
				}
				return l
			}
			fn, ev := mk(false), mk(true)
			type step struct {
				op, provider, merchant, id string
			}
			steps := []step{
				{"reserve", "one", "", "a"}, {"reserve", "two", "m1", "a"}, {"reserve", "one", "", "b"},
				{"reserve", "two", "m1", "b"}, {"reserve", "two", "m1", "c"}, // m1's own limit: denied
				{"reserve", "two", "", "d"}, {"reserve", "one", "", "a"}, // a duplicate
				{"release", "two", "m1", "b"}, {"reserve", "two", "m1", "c"}, {"reserve", "one", "", "c"},
				{"reserve", "one", "", "e"}, // full
				{"status", "one", "", ""}, {"status", "two", "", ""}, {"reserve", "two", "m2", "f"}, {"reserve", "two", "", "g"},
				{"reserve", "two", "m2", "h"}, // the provider's 4 per 2h: full
			}
			run := func(l *gate.Limiter, s step) string {
				switch s.op {
				case "release":
					n, err := l.ReleaseFor(ctx, s.provider, s.merchant, s.id, 1, time.Time{})
					return fmt.Sprint(n, err)
				case "status":
					st, err := l.Status(ctx, s.provider)
					if err != nil {
						return err.Error()
					}
					var b strings.Builder
					for _, p := range st.Policies {
						fmt.Fprintf(&b, "%d/%d/%d ", p.Used, p.Reserved, p.Remaining)
					}
					return b.String()
				}
				v, err := l.ReserveFor(ctx, s.provider, s.merchant, s.id, 1, 0)
				return fmt.Sprintf("allowed=%v dup=%v remaining=%d policy=%d merchant=%v %v", v.Allowed, v.Duplicate, v.Remaining, v.Policy, v.ByMerchant, err)
			}
			for i, s := range steps {
				got, want := run(fn, s), run(ev, s)
				if got != want {
					t.Fatalf("step %d %+v: function %q, EVALSHA %q", i, s, got, want)
				}
			}
			if !gate.UsesFunctions(fn) || gate.UsesFunctions(ev) {
				t.Fatal("the two limiters did not run one with functions and one with EVALSHA")
			}
		})
	}
}

func flushFunctions(t *testing.T, rdb redis.UniversalClient) {
	t.Helper()
	ctx := context.Background()
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		if err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.FunctionFlush(ctx).Err() }); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err := rdb.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
}

// paygateLibraries counts the paygate libraries on the server (on a cluster, on the primary that answers).
func paygateLibraries(t *testing.T, rdb redis.UniversalClient) int {
	t.Helper()
	libs, err := rdb.FunctionList(context.Background(), redis.FunctionListQuery{LibraryNamePattern: "paygate_*"}).Result()
	if err != nil {
		t.Fatal(err)
	}
	return len(libs)
}

// An ACL user that may not call FCALL (set up for EVALSHA, say) or may not load a library gets EVALSHA: its
// decisions go through, not NOPERM.
func TestFunctionsDeniedByACL(t *testing.T) {
	admin := privateRedis(t)
	ctx := context.Background()
	for _, c := range []struct{ user, rule string }{{"nofcall", "-fcall"}, {"noload", "-function"}} {
		t.Run(c.user, func(t *testing.T) {
			if err := admin.Do(ctx, "ACL", "SETUSER", c.user, "on", ">pw", "~*", "&*", "+@all", c.rule).Err(); err != nil {
				t.Fatal(err)
			}
			rdb := redis.NewClient(&redis.Options{Addr: admin.Options().Addr, Username: c.user, Password: "pw"})
			t.Cleanup(func() { rdb.Close() })
			l := newLimiter(t, rdb, time.Millisecond, pol(1, time.Hour))
			for i, want := range []bool{true, false} {
				if v := mustReserve(t, l, fmt.Sprint("j", i), 1, 0); v.Allowed != want {
					t.Fatalf("job %d: allowed %v, want %v", i, v.Allowed, want)
				}
			}
			if gate.UsesFunctions(l) {
				t.Fatalf("user %s (%s) still calls functions", c.user, c.rule)
			}
		})
	}
}

// On a server out of memory under noeviction, a function that may write is refused before it runs; status
// reads (a no-writes function) and a release only gives back (allow-oom), so both are still served.
func TestFunctionsWhenMemoryIsFull(t *testing.T) {
	rdb := privateRedis(t)
	ctx := context.Background()
	l := newLimiter(t, rdb, time.Millisecond, pol(5, time.Hour))
	v := mustReserve(t, l, "a", 1, 0)
	if !v.Allowed {
		t.Fatalf("reserve: %+v", v)
	}
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "1"}} {
		if err := rdb.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { rdb.ConfigSet(ctx, "maxmemory", "0") })
	if _, err := l.Reserve(ctx, prov, "b", 1, 0); err == nil || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("reserve with memory full: %v, want OOM", err)
	}
	st, err := l.Status(ctx, prov)
	if err != nil || st.Policies[0].Used != 1 {
		t.Fatalf("status with memory full: %+v, %v", st, err)
	}
	if n, err := l.Release(ctx, prov, "a", 1, v.Now.Add(v.Delay)); err != nil || n != 1 {
		t.Fatalf("release with memory full: %d, %v", n, err)
	}
	if !gate.UsesFunctions(l) {
		t.Fatal("an OOM refusal sent the gate to EVALSHA")
	}
}
