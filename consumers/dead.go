package consumers

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/paygate/paygate/job"
	"github.com/paygate/paygate/providers"
)

// Dead letters as the operator's tools handle them (worker dead list|replay|purge): each broker adapter
// hands out its dead letters (X.dead, T.dead) as DeadLetters, one contract for every broker.

// DeadState is where a dead letter stands: still dead, or (Kafka, where a topic cannot lose a record)
// marked replayed or purged.
type DeadState string

// The states.
const (
	DeadStateDead     DeadState = "dead"
	DeadStateReplayed DeadState = "replayed"
	DeadStatePurged   DeadState = "purged"
)

// DeadInfo is what a dead letter says of itself, from its headers (and on Kafka its record).
type DeadInfo struct {
	Where     string       // where the broker holds it: "X.dead" (RabbitMQ), "T.dead/<partition>/<offset>" (Kafka)
	Provider  string       // the provider whose queue or topic it died on ("" when it does not say)
	Priority  job.Priority // the class it died in (HeaderPriority; "" for normal): a replay goes back to it
	Reason    Reason       // "" when it does not say
	Error     string       // the last error (ErrorText)
	Status    int          // the provider's HTTP status, when it answered (HeaderStatus); 0 otherwise
	Attempt   int          // failed requests (HeaderAttempt)
	FirstSeen time.Time    // zero when not known
	DeadAt    time.Time    // zero when not known (a dead letter older than HeaderDeadAt)
	Replays   int          // times it was replayed before (HeaderReplays)
	State     DeadState
	// Returned counts how often the broker has handed it out and had it back (RabbitMQ's x-delivery-count
	// or x-acquired-count, the larger); 0 on Kafka.
	Returned int
	Body     []byte
}

// DeadLetter is one dead letter, during a scan.
type DeadLetter interface {
	Info() DeadInfo
	// Replay puts a copy back on its provider's queue or topic (ReplayHeader) and, once the broker has
	// confirmed the copy, removes the dead letter (RabbitMQ) or marks it replayed (Kafka).
	Replay(ctx context.Context) error
	// Purge removes the dead letter (RabbitMQ) or marks it purged (Kafka).
	Purge(ctx context.Context) error
}

// DeadLetters are a broker's dead letters.
type DeadLetters interface {
	// Scan reads the dead letters there are when it starts, and hands them to visit in the order they
	// were dead-lettered (sortDead), until visit returns false or an error. Whatever visit neither
	// replays nor purges stays dead, where it was.
	Scan(ctx context.Context, visit func(DeadLetter) (bool, error)) error
}

// sortDead sorts dead letters into the order they were dead-lettered: by DeadAt (those without one
// first), then FirstSeen, then as given. A broker's own order is not enough: RabbitMQ puts back the
// messages a scan took in an order of its own.
func sortDead(letters []DeadLetter) {
	infos := make(map[DeadLetter]DeadInfo, len(letters))
	for _, l := range letters {
		infos[l] = l.Info()
	}
	slices.SortStableFunc(letters, func(a, b DeadLetter) int {
		x, y := infos[a], infos[b]
		return cmp.Or(x.DeadAt.Compare(y.DeadAt), x.FirstSeen.Compare(y.FirstSeen))
	})
}

// VisitDead hands the letters to visit in the order they were dead-lettered (sortDead), until visit
// returns false or an error: the end of every adapter's Scan.
func VisitDead(letters []DeadLetter, visit func(DeadLetter) (bool, error)) error {
	sortDead(letters)
	for _, l := range letters {
		more, err := visit(l)
		if err != nil || !more {
			return err
		}
	}
	return nil
}

// ReplayHeader reports whether a replayed copy keeps a dead letter's header: it keeps the producer's
// own, and none that a dead letter or a deferral carries, so that the copy starts afresh (attempt 0,
// first seen when it is replayed). HeaderReplays and HeaderFirstSeen are set on the copy anew. A copy that
// kept HeaderAttempt and HeaderFirstSeen would die again at its next transient failure, or at once when
// first seen longer ago than max_deferral_age.
func ReplayHeader(key string) bool {
	switch key {
	case HeaderAttempt, HeaderFirstSeen, HeaderReason, HeaderError, HeaderNotBefore, HeaderProvider, HeaderPriority,
		HeaderStatus, HeaderDeadAt, HeaderReplays,
		"x-death", "x-delivery-count", "x-acquired-count", "x-first-death-exchange", "x-first-death-queue",
		"x-first-death-reason", "x-last-death-exchange", "x-last-death-queue", "x-last-death-reason":
		return false
	}
	return true
}

// StatusOf is the provider's HTTP status in a dead letter's error, 0 when it did not answer.
func StatusOf(err error) int {
	var st *providers.StatusError
	if errors.As(err, &st) {
		return st.Status
	}
	return 0
}
