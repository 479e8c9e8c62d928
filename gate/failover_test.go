package gate_test

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/gate"
)

// Partial loss (issue: surviving a Redis failover): a replica promoted before it caught up, or a server
// restarted from a file, holds a state that lacks what was admitted last. The gate notices the new
// replication history and warms up; with MinReplicasAcked, nothing is used that a replica does not hold.

// node is a redis-server of the test's own that it can kill and start again on the same port and
// directory.
type node struct {
	t    testing.TB
	port string
	dir  string
	args []string
	cmd  *exec.Cmd
	rdb  *redis.Client
}

func startNode(t testing.TB, args ...string) *node {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, port: strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), dir: t.TempDir(), args: args}
	ln.Close()
	n.rdb = redis.NewClient(&redis.Options{Addr: n.addr(), MaxRetries: -1})
	t.Cleanup(func() { n.rdb.Close(); n.kill() })
	n.start()
	return n
}

func (n *node) addr() string { return "127.0.0.1:" + n.port }

func (n *node) start() {
	n.t.Helper()
	n.cmd = exec.Command("redis-server", append([]string{"--port", n.port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", n.dir}, n.args...)...)
	if err := n.cmd.Start(); err != nil {
		n.t.Fatalf("redis-server (scripts/services.sh installs it): %v", err)
	}
	for deadline := time.Now().Add(10 * time.Second); n.rdb.Ping(context.Background()).Err() != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			n.t.Fatal("redis-server did not answer within 10s")
		}
	}
}

// kill ends the server at once (SIGKILL).
func (n *node) kill() {
	if n.cmd != nil && n.cmd.ProcessState == nil {
		_ = n.cmd.Process.Kill()
		_ = n.cmd.Wait()
	}
}

func (n *node) do(args ...any) any {
	n.t.Helper()
	v, err := n.rdb.Do(context.Background(), args...).Result()
	if err != nil {
		n.t.Fatalf("redis %v: %v", args, err)
	}
	return v
}

// replid is the server's replication history (INFO replication's master_replid).
func (n *node) replid() string {
	n.t.Helper()
	for line := range strings.SplitSeq(n.rdb.Info(context.Background(), "replication").Val(), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "master_replid:"); ok {
			return v
		}
	}
	n.t.Fatal("no master_replid in INFO replication")
	return ""
}

// primaryAndReplica starts two servers, the second a replica of the first through a link of the test's
// own, in sync: a write acknowledged by WAIT. (After a full sync the primary streams nothing to a replica
// until its first acknowledgement, up to a second later.)
func primaryAndReplica(t testing.TB) (primary, replica *node, repl *link) {
	t.Helper()
	primary = startNode(t, "--repl-diskless-sync-delay", "0")
	repl = newLink(t, primary.addr())
	replica = startNode(t, "--replicaof", "127.0.0.1", repl.port())
	ctx := context.Background()
	conn := primary.rdb.Conn()
	defer conn.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if conn.Set(ctx, "synced", 1, 0).Err() == nil {
			if acked, _ := conn.Do(ctx, "WAIT", 1, 100).Int(); acked == 1 {
				return primary, replica, repl
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the replica did not sync within 10s")
		}
	}
}

// link is a TCP proxy between a replica and its primary. Held, it forwards nothing either way and drops
// what it reads: the replication stream lags, and what was sent meanwhile never arrives. (Stopping the
// replica does not do: the stream waits in its socket, and is applied once it runs again. CLIENT PAUSE
// on the replica does not either: it acknowledges what it has not applied.)
type link struct {
	ln     net.Listener
	target string
	held   atomic.Bool
}

func newLink(t testing.TB, target string) *link {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	k := &link{ln: ln, target: target}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go k.pipe(c, u)
			go k.pipe(u, c)
		}
	}()
	return k
}

func (k *link) port() string { return strconv.Itoa(k.ln.Addr().(*net.TCPAddr).Port) }

func (k *link) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		if k.held.Load() {
			continue
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

// promote makes the replica a primary of its own, as Sentinel does after a failover.
func promote(replica *node) { replica.do("REPLICAOF", "NO", "ONE") }

func failoverGate(t *testing.T, rdb redis.Scripter, prefix string, acks int, policies ...gate.Policy) *gate.Limiter {
	t.Helper()
	l, err := gate.New(rdb, gate.Options{Prefix: prefix, Margin: 5 * time.Millisecond, WarmUp: true, WarmUpCap: 100 * time.Millisecond,
		MinReplicasAcked: acks, AckTimeout: 50 * time.Millisecond, Providers: map[string]gate.Provider{prov: {Policies: policies}}})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// begun writes the provider's epoch as an earlier version did (no history): no first-use warm-up.
func begun(t *testing.T, rdb *redis.Client, l *gate.Limiter) string {
	t.Helper()
	keys, _ := l.Keys(prov)
	epoch := keys[len(keys)-1]
	if err := rdb.Set(context.Background(), epoch, "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	return epoch
}

// The state survives a failover, but it is a replica's copy: the first decision on the promoted replica
// finds the epoch written under the old primary's history and warms up, as after a loss; the ones after
// it, under the same history, do not. So does a restart from an RDB file taken before the last admissions.
// (Before the history check, both answered at once from the older state.)
func TestNewHistoryWarmsUp(t *testing.T) {
	ctx := context.Background()
	primary, replica, _ := primaryAndReplica(t)
	prefix := uniquePrefix(t)
	l := failoverGate(t, primary.rdb, prefix, 0, pol(5, time.Second))
	epoch := begun(t, primary.rdb, l)
	for i := range 2 {
		if v := mustReserve(t, l, id(i), 1, 0); !v.Allowed || v.Paused {
			t.Fatalf("job %d on the primary: %+v, want admitted at once (an epoch without a history takes the server's)", i, v)
		}
	}
	if got, want := primary.rdb.Get(ctx, epoch).Val(), "1 "+primary.replid()+" @"; !strings.HasPrefix(got, want) {
		t.Fatalf("epoch %q, want %q and the state's shape", got, want)
	}
	if n := primary.do("WAIT", 1, 2000).(int64); n != 1 {
		t.Fatalf("WAIT: %d replicas, want 1", n)
	}

	promote(replica)
	onReplica := failoverGate(t, replica.rdb, prefix, 0, pol(5, time.Second))
	v := mustReserve(t, onReplica, id(2), 1, 0)
	if v.Allowed || !v.Paused || v.RetryAfter < 100*time.Millisecond {
		t.Fatalf("first decision on the promoted replica: %+v, want the warm-up", v)
	}
	if got := replica.rdb.Get(ctx, epoch).Val(); !strings.Contains(got, " "+replica.replid()+" @") {
		t.Fatalf("epoch after the warm-up %q, want the new history %s", got, replica.replid())
	}
	time.Sleep(v.RetryAfter)
	if v := mustReserve(t, onReplica, id(3), 1, 0); !v.Allowed || v.Paused {
		t.Fatalf("after the warm-up: %+v, want admitted at once", v)
	}

	// A restart from a snapshot: saved, one more admission, then the server dies and comes back from the file.
	replica.do("SAVE")
	if v := mustReserve(t, onReplica, id(4), 1, 0); !v.Allowed {
		t.Fatalf("after the snapshot: %+v", v)
	}
	replica.kill()
	replica.args = nil // a primary now, started from the snapshot (dump.rdb in its directory)
	replica.start()
	if replica.rdb.Exists(ctx, epoch).Val() != 1 {
		t.Fatal("the epoch did not survive the restart from the snapshot")
	}
	if v := mustReserve(t, onReplica, id(5), 1, 0); v.Allowed || !v.Paused {
		t.Fatalf("first decision after the restart from a snapshot: %+v, want the warm-up", v)
	}
}

// Under EVALSHA (a server without functions, or an ACL without them) the check is the same.
func TestNewHistoryWarmsUpUnderEval(t *testing.T) {
	primary, replica, _ := primaryAndReplica(t)
	prefix := uniquePrefix(t)
	l := failoverGate(t, primary.rdb, prefix, 0, pol(5, time.Second))
	gate.ForceEval(l)
	begun(t, primary.rdb, l)
	if v := mustReserve(t, l, "a", 1, 0); !v.Allowed || v.Paused {
		t.Fatalf("on the primary: %+v", v)
	}
	primary.do("WAIT", 1, 2000)
	promote(replica)
	onReplica := failoverGate(t, replica.rdb, prefix, 0, pol(5, time.Second))
	gate.ForceEval(onReplica)
	if v := mustReserve(t, onReplica, "b", 1, 0); v.Allowed || !v.Paused {
		t.Fatalf("on the promoted replica: %+v, want the warm-up", v)
	}
}

// The failover the warm-up cannot cover: a window longer than it (here 10/1m, the warm-up capped at
// 100ms, as a daily cap is by gate.warmup_max). The replication link stops (it lags), three more jobs
// are decided, the primary dies, and the replica is promoted. Without
// acknowledgements those three were admitted and sent, the promoted replica never heard of them, and it
// admits the minute's budget again: 13 requests in the minute. With MinReplicasAcked 1 none of the three
// is acknowledged: each fails with ErrUnacknowledged and does not go out, and the minute holds 10.
func TestAcknowledgedAdmissionsSurviveFailover(t *testing.T) {
	for _, acks := range []int{0, 1} {
		t.Run("min_replicas_acked="+strconv.Itoa(acks), func(t *testing.T) {
			primary, replica, repl := primaryAndReplica(t)
			prefix := uniquePrefix(t)
			l := failoverGate(t, primary.rdb, prefix, acks, pol(10, time.Minute))
			begun(t, primary.rdb, l)
			sent := 0
			decide := func(l *gate.Limiter, job string) (bool, error) {
				v, err := l.Reserve(context.Background(), prov, job, 1, 0)
				if err == nil && v.Allowed {
					sent++ // the worker sends it
				}
				return err == nil && v.Allowed, err
			}
			for i := range 4 {
				if ok, err := decide(l, id(i)); !ok {
					t.Fatalf("job %d with the replica in sync: %v", i, err)
				}
			}
			primary.do("WAIT", 1, 2000) // the replica holds these four
			repl.held.Store(true)
			for i := 4; i < 7; i++ {
				ok, err := decide(l, id(i))
				switch {
				case acks == 0 && !ok:
					t.Fatalf("job %d, no acknowledgement asked: %v, want admitted", i, err)
				case acks > 0 && (ok || !errors.Is(err, gate.ErrUnacknowledged)):
					t.Fatalf("job %d with the replica lagging: admitted %v, %v; want ErrUnacknowledged", i, ok, err)
				}
			}
			if acks > 0 {
				st, err := l.Status(context.Background(), prov)
				if err != nil {
					t.Fatal(err)
				}
				if used := st.Policies[0].Used + st.Policies[0].Reserved; used != 4 {
					t.Errorf("the primary counts %d units after the unacknowledged jobs, want 4: they were given back", used)
				}
			}
			primary.kill()
			promote(replica)

			onReplica := failoverGate(t, replica.rdb, prefix, 0, pol(10, time.Minute))
			for i := 7; i < 30; i++ {
				v, err := onReplica.Reserve(context.Background(), prov, id(i), 1, 0)
				if err != nil {
					t.Fatal(err)
				}
				if v.Paused && !v.Allowed {
					time.Sleep(v.RetryAfter) // the warm-up (100ms): the new history
					continue
				}
				if v.Allowed {
					sent++
				}
			}
			t.Logf("min_replicas_acked %d: %d requests sent in the minute (limit 10)", acks, sent)
			switch {
			case acks == 0 && sent != 13:
				t.Errorf("without acknowledgements %d sent, want 13: the lagging replica forgets 3 and admits them again", sent)
			case acks > 0 && sent != 10:
				t.Errorf("with acknowledgements %d sent in the minute, want exactly the limit, 10", sent)
			}
		})
	}
}

// Acknowledged admissions cost a WAIT on the admission's own connection; a denial none. Options check
// what it needs.
func TestAcknowledgedAdmissionsOptions(t *testing.T) {
	rdb := backends(t)[0].rdb
	for _, o := range []gate.Options{
		{MinReplicasAcked: -1},
		{MinReplicasAcked: 1},
		{MinReplicasAcked: 1, AckTimeout: 2 * time.Second},
	} {
		o.Prefix, o.Providers = "x", map[string]gate.Provider{prov: {Policies: []gate.Policy{pol(1, time.Second)}}}
		if _, err := gate.New(rdb, o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:6379"}})
	defer ring.Close()
	if _, err := gate.New(ring, gate.Options{Prefix: "x", MinReplicasAcked: 1, AckTimeout: time.Millisecond,
		Providers: map[string]gate.Provider{prov: {Policies: []gate.Policy{pol(1, time.Second)}}}}); err == nil {
		t.Error("a Ring with acknowledged admissions: no error")
	}
	// A server without replicas never acknowledges: the admission is refused and given back.
	l, err := gate.New(rdb, gate.Options{Prefix: uniquePrefix(t), MinReplicasAcked: 1, AckTimeout: 5 * time.Millisecond,
		Providers: map[string]gate.Provider{prov: {Policies: []gate.Policy{pol(1, time.Hour)}}}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := l.Reserve(context.Background(), prov, id(i), 1, 0); !errors.Is(err, gate.ErrUnacknowledged) {
			t.Fatalf("job %d on a server without replicas: %v, want ErrUnacknowledged each time (the unit given back)", i, err)
		}
	}
}

// The same on a Redis Cluster whose shards have a replica each (six servers of the test's own; the shared
// test cluster has no replicas): admissions acknowledged by the shard's replica, the shard's primary
// killed -9, the replica promoted by the cluster. Every admission is on the promoted replica, and its
// first decision warms up (a new history on that shard).
func TestClusterFailover(t *testing.T) {
	ctx := context.Background()
	nodes := make([]*node, 6)
	var addrs []string
	for i := range nodes {
		nodes[i] = startNode(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "1000",
			"--repl-diskless-sync-delay", "0")
		addrs = append(addrs, nodes[i].addr())
	}
	create := exec.Command("redis-cli", append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "1", "--cluster-yes")...)
	if out, err := create.CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	clusterOK := func(n *node) bool { return strings.Contains(n.rdb.ClusterInfo(ctx).Val(), "cluster_state:ok") }
	waitUntil(t, "the cluster to form", func() bool { return clusterOK(nodes[0]) })
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer cc.Close()
	prefix := uniquePrefix(t)
	l := failoverGate(t, cc, prefix, 1, pol(10, time.Minute))
	keys, _ := l.Keys(prov)
	// The first decision warms up (first use, 100ms + margin); the first admission acknowledged says the
	// shard's replica streams.
	waitUntil(t, "an admission acknowledged by the shard's replica", func() bool {
		v, err := l.Reserve(ctx, prov, id(0), 1, 0)
		return err == nil && v.Allowed
	})
	const admitted = 5
	for i := 1; i < admitted; i++ {
		v, err := l.Reserve(ctx, prov, id(i), 1, 0)
		if err != nil || !v.Allowed {
			t.Fatalf("job %d: %+v, %v", i, v, err)
		}
	}

	primary, err := cc.MasterForKey(ctx, keys[0])
	if err != nil {
		t.Fatal(err)
	}
	var victim, heir *node
	for _, n := range nodes {
		if n.addr() == primary.Options().Addr {
			victim = n
		}
	}
	for _, n := range nodes {
		if n != victim && strings.Contains(n.rdb.Info(ctx, "replication").Val(), "master_port:"+victim.port) {
			heir = n
		}
	}
	if heir == nil {
		t.Fatalf("no replica of %s", victim.addr())
	}
	victim.kill()
	waitUntil(t, "the replica promoted", func() bool {
		return strings.Contains(heir.rdb.Info(ctx, "replication").Val(), "role:master") && clusterOK(heir)
	})
	var v gate.Verdict
	waitUntil(t, "a decision on the promoted replica", func() bool {
		v, err = l.Reserve(ctx, prov, id(10), 1, 0)
		return err == nil || errors.Is(err, gate.ErrUnacknowledged) // no replica now: nothing is acknowledged
	})
	if err != nil || v.Allowed || !v.Paused {
		t.Errorf("first decision on the promoted replica: %+v, %v; want the warm-up (a denial: nothing to acknowledge)", v, err)
	}
	onHeir := failoverGate(t, heir.rdb, prefix, 0, pol(10, time.Minute))
	st, err := onHeir.Status(ctx, prov)
	if err != nil {
		t.Fatal(err)
	}
	if st.Units != admitted {
		t.Errorf("the promoted replica holds %d units, want the %d acknowledged admissions", st.Units, admitted)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 30s waiting for %s", what)
		}
	}
}

// What an unacknowledged admission gives back (a server without replicas acknowledges nothing): a
// duplicate let go gives back its own lease but not the units, which stand for the first delivery; a
// moved job keeps its units too (its entry stands for a request that may have been sent); a denial waits
// for nothing and is no error.
func TestUnacknowledgedGivesBack(t *testing.T) {
	ctx := context.Background()
	rdb := backends(t)[0].rdb
	prefix := uniquePrefix(t)
	mk := func(acks int) *gate.Limiter {
		l, err := gate.New(rdb, gate.Options{Prefix: prefix, StaleAfter: 50 * time.Millisecond, MinReplicasAcked: acks, AckTimeout: 5 * time.Millisecond,
			Providers: map[string]gate.Provider{prov: {Policies: []gate.Policy{pol(2, time.Hour)}, MaxInFlight: 5, Lease: time.Hour}}})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	plain, acked := mk(0), mk(1)
	status := func() gate.Status {
		st, err := plain.Status(ctx, prov)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	if v := mustReserve(t, plain, "j", 1, 0); !v.Allowed {
		t.Fatalf("j: %+v", v)
	}
	if _, err := acked.Reserve(ctx, prov, "j", 1, 0); !errors.Is(err, gate.ErrUnacknowledged) {
		t.Fatalf("j again (a duplicate): %v, want ErrUnacknowledged", err)
	}
	if st := status(); st.Units != 1 || st.InFlight != 1 {
		t.Fatalf("after the unacknowledged duplicate: %d units, %d leases; want j's 1 and 1 (the duplicate's own lease landed)", st.Units, st.InFlight)
	}
	time.Sleep(100 * time.Millisecond) // j is stale: its next delivery is moved
	if _, err := acked.Reserve(ctx, prov, "j", 1, 0); !errors.Is(err, gate.ErrUnacknowledged) {
		t.Fatalf("j moved: %v, want ErrUnacknowledged", err)
	}
	if st := status(); st.Units != 1 {
		t.Fatalf("after the unacknowledged move: %d units, want 1 (a moved entry is never given back)", st.Units)
	}
	if v := mustReserve(t, plain, "k", 1, 0); !v.Allowed {
		t.Fatalf("k: %+v", v)
	}
	start := time.Now()
	v, err := acked.Reserve(ctx, prov, "l", 1, 0)
	if err != nil || v.Allowed {
		t.Fatalf("l with the limit full: %+v, %v; want a denial, no error", v, err)
	}
	t.Logf("a denial under min_replicas_acked took %v (AckTimeout 5ms)", time.Since(start))
}

// A caller whose ACL refuses INFO sees no history, but does not blind the next caller: the history it
// could not read is not kept.
func TestHistoryNotBlindedByACL(t *testing.T) {
	n := startNode(t)
	n.do("ACL", "SETUSER", "noinfo", "on", "nopass", "~*", "&*", "+@all", "-info")
	restricted := redis.NewClient(&redis.Options{Addr: n.addr(), Username: "noinfo", Password: "any"}) // nopass takes any; none sends no AUTH
	defer restricted.Close()
	prefix := uniquePrefix(t)
	l := failoverGate(t, restricted, prefix, 0, pol(5, time.Second))
	epoch := begun(t, n.rdb, l)
	n.do("SET", epoch, "1 0123456789abcdef0123456789abcdef01234567") // written under another history
	if v := mustReserve(t, l, "a", 1, 0); !v.Allowed {
		t.Fatalf("without INFO: %+v, want admitted (the check is off for this caller)", v)
	}
	full := failoverGate(t, n.rdb, prefix, 0, pol(5, time.Second))
	if v := mustReserve(t, full, "b", 1, 0); v.Allowed || !v.Paused {
		t.Fatalf("with INFO, right after: %+v, want the warm-up", v)
	}
}

// sentWithin is the most of the slots that fall in any window of length w (the provider's count).
func sentWithin(slots []time.Time, w time.Duration) int {
	most := 0
	for _, from := range slots {
		n := 0
		for _, s := range slots {
			if !s.Before(from) && s.Sub(from) < w {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

// A move of an admission in time honours MinReplicasAcked as the admission does. A's holder wakes 300ms
// late with the replication link lagging, and asks to go now (Postpone); the primary dies and the
// replica, which holds A at its old slot, is promoted: after its warm-up it hands out B and C, and D one
// window after A's old slot. Without acknowledgements A went at +300ms and the provider gets A, B, C and
// D within a second (limit 3). With MinReplicasAcked 1 the move is not acknowledged: Postpone fails with
// ErrUnacknowledged, A does not go, and the primary no longer counts it (given back).
func TestAcknowledgedPostponeSurvivesFailover(t *testing.T) {
	for _, acks := range []int{0, 1} {
		t.Run("min_replicas_acked="+strconv.Itoa(acks), func(t *testing.T) {
			ctx := context.Background()
			primary, replica, repl := primaryAndReplica(t)
			prefix := uniquePrefix(t)
			l := failoverGate(t, primary.rdb, prefix, acks, pol(3, time.Second))
			begun(t, primary.rdb, l)
			a := mustReserve(t, l, "a", 1, 0)
			if !a.Allowed || a.Delay != 0 {
				t.Fatalf("a: %+v, want admitted now", a)
			}
			primary.do("WAIT", 1, 2000) // the replica holds A at its slot
			repl.held.Store(true)
			time.Sleep(300 * time.Millisecond) // A's holder woke late
			var sent []time.Time
			at, err := l.Postpone(ctx, prov, "", "a", a.Slot())
			switch {
			case acks == 0 && (err != nil || at.IsZero()):
				t.Fatalf("postpone without acknowledgements: %v, %v; want moved to now", at, err)
			case acks == 0:
				sent = append(sent, at)
			case !errors.Is(err, gate.ErrUnacknowledged) || !at.IsZero():
				t.Fatalf("postpone with the replica lagging: %v, %v; want ErrUnacknowledged and no slot", at, err)
			default:
				st, err := l.Status(ctx, prov)
				if err != nil {
					t.Fatal(err)
				}
				if st.Units != 0 {
					t.Fatalf("the primary counts %d units after the unacknowledged postponement, want 0: given back", st.Units)
				}
			}
			primary.kill()
			promote(replica)
			onReplica := failoverGate(t, replica.rdb, prefix, 0, pol(3, time.Second))
			for i := 0; len(sent) < 4 && i < 20; i++ {
				v, err := onReplica.Reserve(ctx, prov, id(i), 1, 2*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if v.Paused && !v.Allowed {
					time.Sleep(v.RetryAfter) // the warm-up: the new history
					continue
				}
				if v.Allowed {
					sent = append(sent, v.Slot())
				}
			}
			most := sentWithin(sent, time.Second)
			t.Logf("min_replicas_acked %d: at most %d requests within a second (limit 3)", acks, most)
			switch {
			case acks == 0 && most != 4:
				t.Errorf("without acknowledgements %d within a second, want 4: the promoted replica counts A at its old slot", most)
			case acks > 0 && most > 3:
				t.Errorf("with acknowledgements %d within a second, want at most the limit, 3", most)
			}
		})
	}
}

// A request written late (Departed) has left: its move cannot be refused, but under MinReplicasAcked it
// is waited for as an admission is: acknowledged with the replica in sync, and reported when the replica
// lags (ErrUnacknowledged, with the new slot: the move stands on the primary).
func TestAcknowledgedDeparture(t *testing.T) {
	ctx := context.Background()
	primary, _, repl := primaryAndReplica(t)
	l := failoverGate(t, primary.rdb, uniquePrefix(t), 1, pol(3, time.Second))
	begun(t, primary.rdb, l)
	for _, job := range []string{"in-sync", "lagging"} {
		v := mustReserve(t, l, job, 1, 0)
		if !v.Allowed {
			t.Fatalf("%s: %+v", job, v)
		}
		repl.held.Store(job == "lagging")
		time.Sleep(50 * time.Millisecond)
		at, err := l.Departed(ctx, prov, "", job, v.Slot(), 40*time.Millisecond)
		if at.IsZero() || at.Before(v.Slot().Add(40*time.Millisecond)) {
			t.Fatalf("%s departed: %v, %v; want moved 40ms past its slot", job, at, err)
		}
		switch {
		case job == "in-sync" && err != nil:
			t.Fatalf("departed with the replica in sync: %v", err)
		case job == "lagging" && !errors.Is(err, gate.ErrUnacknowledged):
			t.Fatalf("departed with the replica lagging: %v, want ErrUnacknowledged", err)
		}
	}
}
