package gate_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
)

// members counts a key's members, whatever its type (a hash's fields, a sorted set's members).
func members(t *testing.T, rdb redis.UniversalClient, key string) int64 {
	t.Helper()
	ctx := context.Background()
	switch typ := rdb.Type(ctx, key).Val(); typ {
	case "hash":
		return rdb.HLen(ctx, key).Val()
	case "zset":
		return rdb.ZCard(ctx, key).Val()
	case "none":
		return 0
	default:
		t.Fatalf("%s is a %s", key, typ)
		return 0
	}
}

// The marks on the id record (a duplicate let go, a request sent) last as long as the record keeps the
// id, not as long as the newest mark: forty rounds of a job, its duplicate and its Sent mark, 50ms apart,
// leave the marks of the last dedup (about 220ms: four or five rounds), not of all forty.
func TestMarksAreBounded(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l := newAlgoOpts(t, rdb, gate.Options{Margin: 20 * time.Millisecond}, gate.Provider{Policies: []gate.Policy{pol(100, 200*time.Millisecond)}})
		keys, err := l.Keys(prov)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 40 {
			for range 2 { // the job, then its redelivery: a duplicate let go, marked
				if v := mustReserve(t, l, id(i), 1, 0); !v.Allowed {
					t.Fatalf("round %d: %+v", i, v)
				}
			}
			if err := l.Sent(ctx, prov, id(i)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		// Every round marks its id twice, and a mark lasts dedup (about 220ms) past its slot: some ten
		// stand; jitter may keep a few more. All forty rounds' would be 40 or 80.
		if n := members(t, rdb, keys[2]); n > 20 {
			t.Errorf("%s holds %d marks after forty rounds, want those of the last dedup (at most 20)", keys[2], n)
		}
		if ttl := rdb.PTTL(ctx, keys[2]).Val(); ttl <= 0 || ttl > 2*time.Second {
			t.Errorf("%s expires in %v, want within a second and the dedup", keys[2], ttl)
		}
	})
}

// The buckets start afresh at every change of limits (state keys named by the version), but the epoch
// that records it is one key per provider: twenty flips of the live limits, each followed by a reserve,
// leave one epoch, not twenty (and the live limits, kept until reset).
func TestLimitFlipsLeaveOneEpoch(t *testing.T) {
	rdb := backends(t)[0].rdb
	ctx := context.Background()
	for _, algo := range []gate.Algorithm{gate.TokenBucket, gate.GCRA, gate.LeakyBucket} {
		t.Run(string(algo), func(t *testing.T) {
			prefix := uniquePrefix(t)
			l, err := gate.New(rdb, gate.Options{Prefix: prefix, Margin: 5 * time.Millisecond, WarmUp: true, WarmUpCap: 10 * time.Millisecond,
				Providers: map[string]gate.Provider{prov: {Algorithm: algo, Policies: []gate.Policy{pol(100, time.Second)}}}})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 20 {
				if _, err := l.SetLimits(ctx, prov, []gate.Policy{pol(50+int64(i%2), time.Second)}); err != nil {
					t.Fatal(err)
				}
				if _, err := l.Reserve(ctx, prov, id(i), 1, time.Second); err != nil {
					t.Fatal(err)
				}
			}
			var forever []string
			for _, k := range rdb.Keys(ctx, prefix+":*").Val() {
				if rdb.PTTL(ctx, k).Val() < 0 {
					forever = append(forever, strings.TrimPrefix(k, prefix))
				}
			}
			slices.Sort(forever)
			if want := []string{":{acme}:epoch", ":{acme}:limits"}; !slices.Equal(forever, want) {
				t.Errorf("keys without an expiry after twenty flips: %v, want the provider's one epoch and its live limits %v", forever, want)
			}
		})
	}
}
