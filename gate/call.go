package gate

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The operations of lua/family (its ARGV[1]).
const (
	opReserve   = "reserve"
	opBatch     = "batch"
	opRelease   = "release"
	opDepart    = "depart"
	opPostpone  = "postpone"
	opStatus    = "status"
	opMerchants = "merchants"
)

// call is one call of a provider's script (lua/family with its algorithm's part): what its ARGV carry,
// as its header names them, and where it goes.
type call struct {
	op    string // ARGV[1]
	jobID string // ARGV[2] ("" for status and merchants)
	cost  int64  // ARGV[3]
	// arg4 is ARGV[4]: reserve's max wait (µs); release's, depart's and postpone's admission slot (µs);
	// merchants' most merchants to list
	arg4 int64
	// arg5 is ARGV[5]: reserve's stale-after (µs, Options.StaleAfter); depart's lateness (µs)
	arg5  int64
	force bool // ARGV[6]: Force
	// merchant is the job's merchant: its name (ARGV[7]), limits (in the settings, ARGV[8]) and own state
	// (in KEYS); nil for none
	merchant *merchantCall
	margin   int64 // the margin in force the call is decided under (µs): the settings' S[1]
	// conn is the connection the call goes on, where a WAIT then counts the replicas that hold its
	// writes (Options.MinReplicasAcked); nil: any of the client's
	conn *redis.Conn
	// jobs are op batch's reserves, each with its own id, cost, max wait and force, all under margin and
	// arg5; the merchant is nil
	jobs []*pending
}

// run sends c to p's script, the one way every decision, release, move and status reaches lua/family:
// it puts the KEYS and ARGV together (the family's contract (lua/family/contract.lua)) and calls the script on c.conn, or on any of
// the client's connections.
func (l *Limiter) run(ctx context.Context, p provider, c call) *redis.Cmd {
	var keys []string
	if c.merchant != nil {
		keys = p.keys.with(c.merchant.keys)
	} else {
		keys = p.keys.all
	}
	if c.conn != nil {
		return l.invoke(ctx, c.conn, c.conn, p.script, keys, c.argv(p))
	}
	return l.invoke(ctx, l.rdb, l.fn, p.script, keys, c.argv(p))
}

// argv is the call's ARGV: op, job id, cost, arg4, arg5 and force, then the merchant's name and the
// settings; for op batch, each job's id, cost, max wait, force and merchant (none), then arg5 and the
// settings, shared.
func (c call) argv(p provider) []any {
	if c.op == opBatch {
		argv := make([]any, 0, 4+5*len(c.jobs))
		argv = append(argv, opBatch, len(c.jobs))
		for _, j := range c.jobs {
			argv = append(argv, j.jobID, j.cost, j.arg4, j.forced(), "")
		}
		return append(argv, c.arg5, p.settingsAt(c.margin, nil))
	}
	argv := make([]any, 0, 8)
	argv = append(argv, c.op, c.jobID, c.cost, c.arg4, c.arg5, c.forced())
	return p.appendArgv(argv, c.margin, c.merchant)
}

// forced is ARGV[6]: 1 for a Force, else 0.
func (c call) forced() int {
	if c.force {
		return 1
	}
	return 0
}

// merchantName is the job's merchant ("" for none).
func (c call) merchantName() string {
	if c.merchant == nil {
		return ""
	}
	return c.merchant.name
}

// connFor is a connection of its own to the primary that holds key, for an admission and its WAIT.
func (l *Limiter) connFor(ctx context.Context, key string) (*redis.Conn, error) {
	switch c := l.rdb.(type) {
	case *redis.Client:
		return c.Conn(), nil
	case *redis.ClusterClient:
		node, err := c.MasterForKey(ctx, key)
		if err != nil {
			return nil, err
		}
		return node.Conn(), nil
	}
	return nil, fmt.Errorf("gate: no connection of its own on a %T", l.rdb) // New refuses it
}

// replicated waits (WAIT on conn, for at most Options.AckTimeout) until Options.MinReplicasAcked replicas
// hold what conn wrote. An error, wrapping ErrUnacknowledged, says they do not.
func (l *Limiter) replicated(ctx context.Context, conn *redis.Conn) error {
	n, err := conn.Do(ctx, "WAIT", l.acks, l.ackMillis).Int64()
	switch {
	case err != nil:
		return fmt.Errorf("%w: WAIT: %w", ErrUnacknowledged, err)
	case n < l.acks:
		return fmt.Errorf("%w: %d of %d within %dms", ErrUnacknowledged, n, l.acks, l.ackMillis)
	}
	return nil
}

// movedOn tells a Redis Cluster redirection (the slot is elsewhere now, or moving) from other errors.
func movedOn(err error) bool {
	s := err.Error()
	return strings.HasPrefix(s, "MOVED ") || strings.HasPrefix(s, "ASK ") || strings.HasPrefix(s, "TRYAGAIN") || strings.HasPrefix(s, "CLUSTERDOWN")
}

// functions is what runs the family as a Redis Function; every go-redis client has it.
type functions interface {
	FCall(ctx context.Context, function string, keys []string, args ...any) *redis.Cmd
	FunctionLoad(ctx context.Context, code string) *redis.StringCmd
}

// evalFor is how long a Limiter that met a server without functions (or an ACL user that may not use them)
// runs the family with EVALSHA before it tries FCALL again: a server upgraded in place, or an ACL mended,
// gets the faster path back.
const evalFor = 5 * time.Minute

// invoke runs f with keys and args (args[0] is the op) through rdb and fn (the client's, or one
// connection's; fn nil: no functions): FCALL, loading the library first where the server lacks it (a new
// server, or one restarted empty), or EVALSHA where the server has no functions or the user may not call
// or load them. The script's own error replies are returned as they are.
func (l *Limiter) invoke(ctx context.Context, rdb redis.Scripter, fn functions, f *family, keys []string, args []any) *redis.Cmd {
	if fn != nil && time.Now().UnixNano() >= l.evalUntil.Load() {
		name := f.function(args[0])
		cmd := fn.FCall(ctx, name, keys, args...)
		if !noFunction(cmd.Err()) {
			return cmd
		}
		if !noFunctions(cmd.Err()) {
			lerr := l.loadFamily(ctx, f)
			if lerr == nil {
				if cmd = fn.FCall(ctx, name, keys, args...); !noFunction(cmd.Err()) {
					return cmd
				}
				// loaded elsewhere than where the call went (a proxy, say): this call by EVALSHA
			} else if noFunctions(lerr) {
				l.evalUntil.Store(time.Now().Add(evalFor).UnixNano())
			}
			// otherwise (Redis unreachable, say) this call alone goes by EVALSHA, and meets the same fate
		} else {
			l.evalUntil.Store(time.Now().Add(evalFor).UnixNano())
		}
	}
	return f.eval.Run(ctx, rdb, keys, args...)
}

// noFunction tells a missing function (or no functions at all: noFunctions) from every other error.
func noFunction(err error) bool {
	return err != nil && (strings.HasPrefix(err.Error(), "ERR Function not found") || noFunctions(err))
}

// noFunctions tells a server without functions, or an ACL user that may not use them (FCALL or FUNCTION
// LOAD), from every other error.
func noFunctions(err error) bool {
	s := err.Error()
	return strings.Contains(s, "unknown command") || strings.HasPrefix(s, "NOPERM")
}

// loadFamily loads f's library on the server, or on every primary of a Redis Cluster (every shard of a
// Ring): FCALL goes where its keys are. A library already there (another worker loaded it) is no error.
func (l *Limiter) loadFamily(ctx context.Context, f *family) error {
	load := func(ctx context.Context, c functions) error {
		if err := c.FunctionLoad(ctx, f.lib).Err(); err != nil && !strings.Contains(err.Error(), "already exists") {
			return err
		}
		return nil
	}
	each := func(ctx context.Context, c *redis.Client) error { return load(ctx, c) }
	switch c := l.rdb.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, each)
	case *redis.Ring:
		return c.ForEachShard(ctx, each)
	}
	return load(ctx, l.fn)
}
