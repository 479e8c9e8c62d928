package gate_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
	"github.com/paygate/paygate/internal/testenv"
)

// A worker reserves a slot for each job, sleeps until it, then dispatches. Under overload it asks the
// gate once per job: the slot comes back with the answer instead of a "try again" loop.
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer rdb.Close()
	limiter, err := gate.New(rdb, gate.Options{
		Prefix: "example-" + time.Now().Format("150405.000000"),
		Margin: 5 * time.Millisecond,
		Providers: map[string]gate.Provider{
			"acme": {Policies: []gate.Policy{{Limit: 2, Window: time.Second}, {Limit: 100, Window: time.Minute}}},
		},
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for _, job := range []string{"pay-1", "pay-2", "pay-3", "pay-1"} {
		v, err := limiter.Reserve(ctx, "acme", job, 1, 5*time.Second)
		if err != nil {
			panic(err) // Redis failed: never treat it as an allow
		}
		switch {
		case v.Duplicate:
			fmt.Printf("%s: already admitted, no new permit\n", job)
		case v.Allowed:
			fmt.Printf("%s: dispatch in %s\n", job, v.Delay.Round(time.Second))
			// select { case <-time.After(v.Delay): dispatch(job) ; case <-ctx.Done(): ... }
		default:
			fmt.Printf("%s: defer for %s\n", job, v.RetryAfter)
		}
	}
	// Output:
	// pay-1: dispatch in 0s
	// pay-2: dispatch in 0s
	// pay-3: dispatch in 1s
	// pay-1: already admitted, no new permit
}
