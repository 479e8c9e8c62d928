package gate

import (
	"errors"
	"slices"
	"testing"
)

// A batch's reply is one flat array: now, then each job's error reply alone or its 6 numbers, the first
// holding the flags and the policy. splitReplies reads it back into the jobs' replies, each as a single
// reserve's, and refuses a reply that does not add up to the jobs asked.
func TestSplitReplies(t *testing.T) {
	bad := errors.New("ERR paygate: cost 7 must be 1..5")
	const now = 1764081234567890
	flat := []any{int64(now),
		int64(1 + 32*2 + 256*3), int64(10), int64(0), int64(5), int64(0), int64(99), // allowed, lease 2, policy 3
		bad,
		int64(2 + 4 + 8 + 16 + 128), int64(0), int64(20), int64(0), int64(123), int64(7)} // duplicate, paused, moved, in flight, cancelled
	each, errs, err := splitReplies(flat, 3)
	if err != nil {
		t.Fatal(err)
	}
	want0 := make([]int64, replyLen)
	want0[replyAllowed], want0[replyLease], want0[replyPolicy], want0[replyDelay], want0[replyRemaining], want0[replyResetAfter], want0[replyNow] = 1, 2, 3, 10, 5, 99, now
	want2 := make([]int64, replyLen)
	want2[replyDuplicate], want2[replyPaused], want2[replyMoved], want2[replyInFlight], want2[replyCancelled] = 1, 1, 1, 1, 1
	want2[replyRetryAfter], want2[replyAdmittedAt], want2[replyResetAfter], want2[replyNow] = 20, 123, 7, now
	if !slices.Equal(each[0], want0) || each[1] != nil || !slices.Equal(each[2], want2) {
		t.Fatalf("replies %v, want %v, nil, %v", each, want0, want2)
	}
	if errs[0] != nil || !errors.Is(errs[1], bad) || errs[2] != nil {
		t.Fatalf("errors %v", errs)
	}
	job := []any{int64(1), int64(0), int64(0), int64(5), int64(0), int64(99)}
	for name, c := range map[string]struct {
		reply []any
		n     int
	}{
		"empty":           {nil, 1},
		"no now":          {slices.Concat([]any{"x"}, job), 1},
		"short":           {slices.Concat([]any{int64(now)}, job[:5]), 1},
		"one job missing": {slices.Concat([]any{int64(now)}, job), 2},
		"values past":     {slices.Concat([]any{int64(now)}, job, []any{int64(0)}), 1},
		"not an integer":  {slices.Concat([]any{int64(now)}, job[:3], []any{"x"}, job[4:]), 1},
	} {
		if _, _, err := splitReplies(c.reply, c.n); err == nil {
			t.Errorf("%s: a malformed reply was read", name)
		}
	}
}
