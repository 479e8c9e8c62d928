package throttle

import (
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// One line per interval, whatever the rate of calls, each saying how many it swallowed.
func TestWarn(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	log := zap.New(core)
	var th Log
	start := time.Unix(1_700_000_000, 0)
	for i := range 100 { // one call every 250ms for 25s
		th.Warn(log, start.Add(time.Duration(i)*250*time.Millisecond), "redis down")
	}
	got := logs.All()
	if len(got) != 3 { // at 0s, 10s and 20s
		t.Fatalf("%d lines in 25s, want 3", len(got))
	}
	for i, want := range []int64{0, 39, 39} {
		if n := got[i].ContextMap()["suppressed_since_last"]; n != want {
			t.Errorf("line %d: suppressed_since_last %v, want %d", i, n, want)
		}
	}
	short := Log{Interval: time.Second}
	if ok, _ := short.Allow(start); !ok {
		t.Fatal("the first line is swallowed")
	}
	if ok, _ := short.Allow(start.Add(999 * time.Millisecond)); ok {
		t.Fatal("a line within the interval went out")
	}
	if ok, n := short.Allow(start.Add(time.Second)); !ok || n != 1 {
		t.Fatalf("after the interval: ok %v, suppressed %d; want true, 1", ok, n)
	}
}
