package consumers_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/paygate/paygate/consumers"
	"github.com/paygate/paygate/job"
	"github.com/paygate/paygate/providers"
)

// Backoff: exponential from the base, capped, and jittered over the whole of [0, cap).
func TestBackoff(t *testing.T) {
	const base, maxDelay = 100 * time.Millisecond, 5 * time.Second
	for attempt := 1; attempt <= 70; attempt++ {
		ceiling := maxDelay
		if attempt < 7 {
			ceiling = base << (attempt - 1)
		}
		seen := map[time.Duration]bool{}
		for range 200 {
			d := consumers.Backoff(attempt, base, maxDelay)
			if d < 0 || d >= ceiling {
				t.Fatalf("attempt %d: %v outside [0, %v)", attempt, d, ceiling)
			}
			seen[d] = true
		}
		if len(seen) < 100 {
			t.Fatalf("attempt %d: only %d distinct delays in 200: not jittered", attempt, len(seen))
		}
	}
}

// The core invents no settings: what is derived from the configuration is derived once, by wire.Core.
func TestNewWantsDerivedSettings(t *testing.T) {
	d := map[string]consumers.Dispatcher{"acme": nopDispatcher{}}
	base := consumers.Config{Concurrency: 1, MaxAttempts: 1, Providers: map[string]int64{"acme": 1}}
	for name, mutate := range map[string]func(*consumers.Config){
		"valid":                 nil,
		"no backoff base":       func(c *consumers.Config) { c.BackoffBase = 0 },
		"max below base":        func(c *consumers.Config) { c.BackoffMax = c.BackoffBase / 2 },
		"no redis retry":        func(c *consumers.Config) { c.RedisRetry = 0 },
		"negative backoff base": func(c *consumers.Config) { c.BackoffBase = -time.Second },
	} {
		c := base
		c.BackoffBase, c.BackoffMax, c.RedisRetry = time.Second, time.Minute, time.Second
		if mutate == nil {
			if _, err := consumers.New(c, nil, d, nil, nil); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			continue
		}
		mutate(&c)
		if _, err := consumers.New(c, nil, d, nil, nil); err == nil || !strings.Contains(err.Error(), "BackoffBase") {
			t.Errorf("%s: New(%+v) = %v, want the settings named", name, c, err)
		}
	}
}

type nopDispatcher struct{}

func (nopDispatcher) Dispatch(context.Context, *job.Job) (*providers.Answer, error) { return nil, nil }
