package kafka

import (
	"context"
	"testing"
)

// Found by the benchmark: an ack that arrives after the partition was given up (a member stopping while
// a job is still at its provider) crashed the worker. It must not; and since its offset cannot be
// committed behind an unsettled one, its lost-ack function runs at once. One settled before runs when
// the partition is given up.
func TestTrackerLostAcks(t *testing.T) {
	tr := &tracker{gctx: context.Background(), idle: make(chan struct{}, 1)}
	for off := range int64(4) {
		tr.add(off)
	}
	var lost []int64
	onLost := func(off int64) func() { return func() { lost = append(lost, off) } }
	if err := tr.done(1, onLost(1)); err != nil { // behind unsettled 0: not committed
		t.Fatal(err)
	}
	tr.loseUncommitted()
	if len(lost) != 1 || lost[0] != 1 {
		t.Fatalf("lost %v after giving the partition up, want [1]", lost)
	}
	if err := tr.done(2, onLost(2)); err != nil { // after giving up, still behind 0
		t.Fatal(err)
	}
	if len(lost) != 2 || lost[1] != 2 {
		t.Fatalf("lost %v, want [1 2]: a late ack that cannot commit is lost at once", lost)
	}
	if err := tr.done(0, onLost(0)); err != nil { // the oldest, after giving up: no commit will carry it
		t.Fatal(err)
	}
	if len(lost) != 3 || lost[2] != 0 {
		t.Fatalf("lost %v, want [1 2 0]: the oldest record's late ack is lost too", lost)
	}
}
