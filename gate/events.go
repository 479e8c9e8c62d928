package gate

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paygate/paygate/lua"
)

var eventsScript = redis.NewScript(lua.Events)

// EventsKept is how long a minute's event counts stay in Redis.
const EventsKept = time.Hour

// Event names counted by CountEvent: a provider's 429, and a dead letter with its reason appended
// (EventDead + "permanent").
const (
	EventThrottled = "throttled"
	EventDead      = "dead:"
)

// CountEvent adds one to the provider's count of event (EventThrottled, EventDead+reason) in the current
// minute of the caller's clock. Every worker counts into the same minute, which EventsSince reads: the
// operator's view of a fleet (worker dashboard).
func (l *Limiter) CountEvent(ctx context.Context, providerName, event string) error {
	p, err := l.provider(providerName)
	if err != nil {
		return err
	}
	key := p.tag + "events:" + strconv.FormatInt(time.Now().Unix()/60, 10)
	if err := eventsScript.Run(ctx, l.rdb, []string{key}, "count", event, EventsKept.Milliseconds()).Err(); err != nil {
		return fmt.Errorf("gate: count %s of %s: %w", event, providerName, err)
	}
	return nil
}

// EventMinute is one minute's counts of a provider's events.
type EventMinute struct {
	Minute time.Time        // its start
	Counts map[string]int64 // event -> count; empty for a quiet minute
}

// EventsSince returns the provider's event counts for each minute from the one holding `from` to the
// current one (at most EventsKept), oldest first.
func (l *Limiter) EventsSince(ctx context.Context, providerName string, from time.Time) ([]EventMinute, error) {
	p, err := l.provider(providerName)
	if err != nil {
		return nil, err
	}
	now := time.Now().Unix() / 60
	first := max(from.Unix()/60, now-int64(EventsKept/time.Minute)+1)
	var keys []string
	for m := first; m <= now; m++ {
		keys = append(keys, p.tag+"events:"+strconv.FormatInt(m, 10))
	}
	reply, err := eventsScript.Run(ctx, l.rdb, keys, "read").Slice()
	if err != nil {
		return nil, fmt.Errorf("gate: events of %s: %w", providerName, err)
	}
	out := make([]EventMinute, len(keys))
	for i := range out {
		out[i] = EventMinute{Minute: time.Unix((first+int64(i))*60, 0), Counts: map[string]int64{}}
		pairs, _ := reply[i].([]any)
		for j := 0; j+1 < len(pairs); j += 2 {
			name, _ := pairs[j].(string)
			n, _ := strconv.ParseInt(fmt.Sprint(pairs[j+1]), 10, 64)
			out[i].Counts[name] = n
		}
	}
	return out, nil
}
