package gate

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/lua"
)

var journalScript = redis.NewScript(lua.Journal)

// journalCall is the most entries one journal.lua call writes.
const journalCall = 1000

// journalBucket is the span of one hash of the job journal (lua/journal.lua).
const journalBucket = 10 * time.Minute

// JournalEntry is one job in the job journal: when its request left, and how it ended ("" while it has
// not). Written when the request leaves, and again, with the outcome, when the job ends.
type JournalEntry struct {
	ID      string // the job's own id
	Left    time.Time
	Outcome string
}

// journalKey is the journal's hash for requests that left at t.
func (p *provider) journalKey(t time.Time) string {
	return p.keys.journal + strconv.FormatInt(t.Unix()/int64(journalBucket/time.Second), 10)
}

// journalKeys are the journal's hashes that may hold a request that left within d of now (newest first).
func (p *provider) journalKeys(now time.Time, d time.Duration) []string {
	var keys []string
	for t := now; !t.Before(now.Add(-d - journalBucket)); t = t.Add(-journalBucket) {
		keys = append(keys, p.journalKey(t))
	}
	return keys
}

// Journal writes entries of a provider's jobs into the job journal (Options.Journal; nothing when it is
// 0), one call per ten minutes of departures. The journal tells `worker cancel` a job that has left and
// `worker job show` when and how one ended, for as long as Options.Journal.
func (l *Limiter) Journal(ctx context.Context, providerName string, entries []JournalEntry) error {
	if l.opts.Journal <= 0 || len(entries) == 0 {
		return nil
	}
	p, err := l.provider(providerName)
	if err != nil {
		return err
	}
	byKey := map[string][]any{}
	var order []string
	for _, e := range entries {
		if checkID(e.ID) != nil || strings.IndexByte(e.Outcome, ' ') >= 0 {
			continue
		}
		k := p.journalKey(e.Left)
		if byKey[k] == nil {
			end := e.Left.Truncate(journalBucket).Add(journalBucket + l.opts.Journal)
			byKey[k], order = []any{end.UnixMilli()}, append(order, k)
		}
		byKey[k] = append(byKey[k], e.ID, strconv.FormatInt(e.Left.UnixMicro(), 10)+" "+e.Outcome)
	}
	for _, k := range order {
		args := byKey[k] // expiry, then field, value pairs: at most journalCall pairs a call
		for i := 1; i < len(args); i += 2 * journalCall {
			call := append([]any{args[0]}, args[i:min(i+2*journalCall, len(args))]...)
			if err := journalScript.Run(ctx, l.rdb, []string{k}, call...).Err(); err != nil {
				return fmt.Errorf("gate: journal %s: %w", providerName, err)
			}
		}
	}
	return nil
}
