package kafka

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"go.uber.org/zap"
)

// Found by the benchmark: an ack that arrives after the partition was given up (a member stopping while
// a job is still at its provider) crashed the worker. It must not; and since its offset cannot be
// committed behind an unsettled one, its lost-ack function runs at once. One settled before runs when
// the partition is given up.
func TestTrackerLostAcks(t *testing.T) {
	tr := newTracker(&fakeGen{}, context.Background(), "t", 0)
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
}

// fakeGen records commits; each waits for release when gate is set (a commit on its way).
type fakeGen struct {
	mu      sync.Mutex
	commits []int64
	entered chan int64 // told of each commit as it starts, when set
	gate    chan struct{}
	fail    bool
}

func (g *fakeGen) CommitOffsets(offsets map[string]map[int]int64) error {
	if g.entered != nil {
		g.entered <- offsets["t"][0]
	}
	if g.gate != nil {
		<-g.gate
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.fail {
		return errors.New("kafka: not the group's leader any more")
	}
	g.commits = append(g.commits, offsets["t"][0])
	return nil
}

func (g *fakeGen) committed() []int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.commits)
}

// Acks do not wait for commits: one commit covers the acks that came while the previous one was on its
// way, commits go out in order, never past an unsettled record, and the last settled prefix is committed
// when the partition is given up.
func TestTrackerCommitsInBatches(t *testing.T) {
	g := &fakeGen{entered: make(chan int64), gate: make(chan struct{})}
	tr := newTracker(g, context.Background(), "t", 0)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); tr.commitLoop(stop, zap.NewNop()) }()
	for off := range int64(10) {
		tr.add(off)
	}
	if err := tr.done(0, nil); err != nil {
		t.Fatal(err)
	}
	if off := <-g.entered; off != 1 { // a commit of 1, held on its way
		t.Fatalf("first commit %d, want 1", off)
	}
	for _, off := range []int64{1, 2, 3, 5, 6} { // acks return meanwhile; 4 unsettled: the prefix ends at 4
		if err := tr.done(off, nil); err != nil {
			t.Fatal(err)
		}
	}
	g.gate <- struct{}{}
	if off := <-g.entered; off != 4 { // one commit for the three acks
		t.Fatalf("second commit %d, want 4", off)
	}
	g.gate <- struct{}{}
	if err := tr.done(4, nil); err != nil { // the prefix now runs to 7
		t.Fatal(err)
	}
	if off := <-g.entered; off != 7 {
		t.Fatalf("third commit %d, want 7", off)
	}
	g.gate <- struct{}{}
	close(stop)
	<-done
	got := g.committed()
	if !slices.Equal(got, []int64{1, 4, 7}) {
		t.Fatalf("commits %v, want [1 4 7]: one per batch, in order, never past the unsettled 4 (then 7)", got)
	}
}

// A commit that fails loses the acks it covered: their lost-ack functions run (the records are read
// again); so does an ack settled into the prefix after the last commit, when the partition is given up.
func TestTrackerFailedCommitLosesAcks(t *testing.T) {
	g := &fakeGen{fail: true}
	tr := newTracker(g, context.Background(), "t", 0)
	var mu sync.Mutex
	var lost []int64
	onLost := func(off int64) func() {
		return func() { mu.Lock(); lost = append(lost, off); mu.Unlock() }
	}
	for off := range int64(3) {
		tr.add(off)
	}
	if err := tr.done(0, onLost(0)); err != nil {
		t.Fatal(err)
	}
	tr.commit(zap.NewNop())
	if err := tr.done(1, onLost(1)); err != nil { // settled into the prefix; no commit comes
		t.Fatal(err)
	}
	tr.loseUncommitted()
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(lost, []int64{0, 1}) {
		t.Fatalf("lost %v, want [0 1]", lost)
	}
}
