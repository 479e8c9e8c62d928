package gate

import (
	"errors"
	"slices"
	"testing"
)

// A batch's reply is one flat array: each job's replyLen integers, or its error reply alone. splitReplies
// reads it back into the jobs' replies, and refuses a reply that does not add up to the jobs asked.
func TestSplitReplies(t *testing.T) {
	job := func(first int64) []any {
		out := make([]any, replyLen)
		for i := range out {
			out[i] = first + int64(i)
		}
		return out
	}
	bad := errors.New("ERR paygate: cost 7 must be 1..5")
	flat := slices.Concat(job(100), []any{bad}, job(200))
	each, errs, err := splitReplies(flat, 3)
	if err != nil {
		t.Fatal(err)
	}
	if each[0][0] != 100 || each[0][replyLen-1] != 100+replyLen-1 || each[2][0] != 200 || each[1] != nil {
		t.Fatalf("replies %v", each)
	}
	if errs[0] != nil || !errors.Is(errs[1], bad) || errs[2] != nil {
		t.Fatalf("errors %v", errs)
	}
	for name, c := range map[string]struct {
		reply []any
		n     int
	}{
		"short":           {job(1)[:replyLen-1], 1},
		"one job missing": {job(1), 2},
		"values past":     {slices.Concat(job(1), []any{int64(0)}), 1},
		"not an integer":  {slices.Concat(job(1)[:3], []any{"x"}, job(1)[4:]), 1},
		"empty":           {nil, 1},
	} {
		if _, _, err := splitReplies(c.reply, c.n); err == nil {
			t.Errorf("%s: a malformed reply was read", name)
		}
	}
}
