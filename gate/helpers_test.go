package gate_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/internal/testenv"
)

type backend struct {
	name string
	rdb  redis.UniversalClient
}

// backends connects to the single node and to the cluster. An unreachable server fails the test: the gate's
// semantics are only proven against real Redis (run scripts/services.sh up).
func backends(t testing.TB) []backend {
	t.Helper()
	single := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.ClusterAddrs()})
	t.Cleanup(func() { single.Close(); cluster.Close() })
	bs := []backend{{"single", single}, {"cluster", cluster}}
	for _, b := range bs {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := b.rdb.Ping(ctx).Err()
		cancel()
		if err != nil {
			t.Fatalf("redis %s unreachable (%v): run scripts/services.sh up", b.name, err)
		}
	}
	return bs
}

// embedded is the demo's Redis (miniredis, in-process): the gate's suite runs on it too, so the demo's
// answers are the real gate's.
func embedded(t testing.TB) backend {
	t.Helper()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	return backend{"embedded", rdb}
}

// eachBackend runs fn as a parallel subtest against the single node, the cluster and the embedded Redis.
func eachBackend(t *testing.T, fn func(t *testing.T, rdb redis.UniversalClient)) {
	t.Helper()
	for _, b := range append(backends(t), embedded(t)) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			fn(t, b.rdb)
		})
	}
}

// uniquePrefix isolates a test's keys so tests can run in parallel against one server.
func uniquePrefix(t testing.TB) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	name := strings.NewReplacer("/", "-", " ", "_", "{", "", "}", "").Replace(t.Name())
	prefix := "test-" + name + "-" + hex.EncodeToString(b[:])
	t.Cleanup(func() { dropKeys(prefix) })
	return prefix
}

// dropKeys deletes a test's keys from the single node and every cluster node: most expire on their own,
// but an epoch key (the warm-up's) never does.
func dropKeys(prefix string) {
	cleaners.once.Do(func() {
		cleaners.single = redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
		cleaners.cluster = redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.ClusterAddrs()})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	drop := func(ctx context.Context, rdb *redis.Client) error {
		keys, err := rdb.Keys(ctx, prefix+":*").Result()
		for _, k := range keys {
			rdb.Del(ctx, k)
		}
		return err
	}
	_ = drop(ctx, cleaners.single)
	_ = cleaners.cluster.ForEachMaster(ctx, drop)
}

// cleaners are dropKeys' clients, shared by every test of the package.
var cleaners struct {
	once    sync.Once
	single  *redis.Client
	cluster *redis.ClusterClient
}

const prov = "acme"

func newLimiter(t testing.TB, rdb redis.Scripter, margin time.Duration, policies ...gate.Policy) *gate.Limiter {
	t.Helper()
	l, err := gate.New(rdb, gate.Options{
		Prefix:    uniquePrefix(t),
		Margin:    margin,
		Providers: map[string]gate.Provider{prov: {Policies: policies}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func pol(limit int64, window time.Duration) gate.Policy {
	return gate.Policy{Limit: limit, Window: window}
}

func mustReserve(t testing.TB, l *gate.Limiter, id string, cost int64, maxWait time.Duration) gate.Verdict {
	t.Helper()
	v, err := l.Reserve(context.Background(), prov, id, cost, maxWait)
	if err != nil {
		t.Fatalf("reserve %s: %v", id, err)
	}
	return v
}

// entry is one job in the raw log, read back from Redis.
type entry struct {
	id    string
	slot  int64 // µs
	cost  int64
	first bool // the bare id is among the members
}

// recordMembers is how many members the id record holds for jobs of cost 1: the job's id, and under the
// counters (sliding_window, fixed_window) the marker of the keys that counted it.
func recordMembers(algo gate.Algorithm, jobs int64) int64 {
	if algo == gate.SlidingWindow || algo == gate.FixedWindow {
		return 2 * jobs
	}
	return jobs
}

// readLog reads a provider's raw log (or id record) back: one entry per job, all its members at one slot:
// id, id\x00 2, ..., id\x00 n for sliding_log (a member per unit), id and id\x00 n for the others; either
// way its cost is n. The counters' markers (id\x00p<hash>, id\x00m<hash>: which keys counted the job) are
// not units, and are skipped.
func readLog(t testing.TB, rdb redis.UniversalClient, l *gate.Limiter) []entry {
	t.Helper()
	keys, err := l.Keys(prov)
	if err != nil {
		t.Fatal(err)
	}
	members, err := rdb.ZRangeWithScores(context.Background(), keys[0], 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	jobs := map[string]*entry{}
	for _, z := range members {
		id, unit, _ := strings.Cut(z.Member.(string), "\x00")
		if strings.HasPrefix(unit, "p") || strings.HasPrefix(unit, "m") {
			continue // a marker
		}
		e, ok := jobs[id]
		if !ok {
			e = &entry{id: id, slot: int64(z.Score)}
			jobs[id] = e
		}
		if e.slot != int64(z.Score) {
			t.Fatalf("job %s has units at %d and %v", id, e.slot, z.Score)
		}
		if unit == "" {
			e.first = true
			e.cost = max(e.cost, 1)
		} else if k, err := strconv.Atoi(unit); err != nil || k < 2 {
			t.Fatalf("member %q: bad unit suffix", z.Member)
		} else {
			e.cost = max(e.cost, int64(k)) // its k-th unit (sliding_log), or its cost (the others)
		}
	}
	out := make([]entry, 0, len(jobs))
	for _, e := range jobs {
		if !e.first {
			t.Fatalf("units of %s without its first member", e.id)
		}
		e.first = false // compared with what workers were told, which knows nothing of members
		out = append(out, *e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].slot < out[j].slot })
	return out
}

// maxInWindow returns the largest total cost of entries with slot in (t-w, t] over every t.
func maxInWindow(entries []entry, w time.Duration) int64 {
	wµ := w.Microseconds()
	var best, sum int64
	lo := 0
	for hi := range entries {
		sum += entries[hi].cost
		for entries[lo].slot <= entries[hi].slot-wµ {
			sum -= entries[lo].cost
			lo++
		}
		// Entries sharing entries[hi].slot that come later in the slice belong to the same window.
		if hi+1 < len(entries) && entries[hi+1].slot == entries[hi].slot {
			continue
		}
		best = max(best, sum)
	}
	return best
}

func redisTime(t testing.TB, rdb redis.UniversalClient) int64 {
	t.Helper()
	tm, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return tm.UnixMicro()
}

func ceilMs(µs int64) time.Duration {
	return (time.Duration(µs)*time.Microsecond + time.Millisecond - 1).Truncate(time.Millisecond)
}

func id(i int) string { return "job-" + strconv.Itoa(i) }

// privateRedis starts a redis-server of the test's own on a free loopback port, for what would disturb the
// shared one (pausing it, filling its memory, an ACL user), and returns a client of it.
func privateRedis(t testing.TB, args ...string) *redis.Client {
	t.Helper()
	return startNode(t, args...).rdb
}
