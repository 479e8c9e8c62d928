package gate

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// batcher gathers one provider's reserves (under one set of limits) and sends them together (lua/family's
// op 'batch'): under load a call decides many jobs, and a job that finds nothing gathering goes at once,
// alone, or after the linger, with those that came meanwhile. Up to calls calls of the provider are on
// their way at once: one drain gathers the queue while the others' calls are on their way, and its call
// goes beside theirs, so that a job waits for a round trip of its own rather than for the call before it
// as well. Redis runs each call whole, one after another, first come first served, as it does the calls
// of several workers. Each job gets the verdict its own call would have had, in the order the jobs
// arrived at Redis.
type batcher struct {
	max     int
	calls   int                                  // the most calls on their way at once (Options.BatchCalls)
	linger  time.Duration                        // Options.BatchLinger
	after   func(time.Duration) <-chan time.Time // the linger's clock: time.After (tests set their own)
	full    chan struct{}                        // a linger ends early: max jobs are queued
	mu      sync.Mutex
	gather  bool // a drain holds the queue (lingers, or is about to take it): later jobs queue for its call
	calling int  // the calls on their way
	queue   []*pending
}

// pending is one job waiting in a batcher: its reserve (under the margin in force it was asked under: a
// call's jobs share one), and once decided its verdict.
type pending struct {
	call
	at   time.Time // when it was queued
	v    Verdict
	err  error
	done chan struct{} // closed once v and err are set
}

// batched decides job, a reserve, with the provider's other reserves waiting meanwhile.
func (l *Limiter) batched(ctx context.Context, p provider, providerName string, job *pending) (Verdict, error) {
	job.done, job.at = make(chan struct{}), time.Now()
	b := p.batch
	b.mu.Lock()
	b.queue = append(b.queue, job)
	lead := b.lead()
	if b.linger > 0 && len(b.queue) >= b.max {
		select {
		case b.full <- struct{}{}:
		default:
		}
	}
	b.mu.Unlock()
	if lead {
		// The next call (this job in it), and what queues meanwhile after it; not cut short by this
		// caller's context, since it decides the others' jobs too.
		go l.drain(context.WithoutCancel(ctx), p, providerName)
	}
	select {
	case <-job.done:
		return job.v, job.err
	case <-ctx.Done():
		// Still queued, it is never sent; already on its way, it is decided like a single call whose
		// caller gave up (an admission nobody uses, which its window returns).
		b.mu.Lock()
		if i := slices.Index(b.queue, job); i >= 0 {
			b.queue = slices.Delete(b.queue, i, i+1)
		}
		b.mu.Unlock()
		return Verdict{}, fmt.Errorf("gate: reserve %s/%s: %w", providerName, job.jobID, ctx.Err())
	}
}

// lead tells, under b.mu with jobs queued, whether a new drain is to gather them: none gathers, and a call
// more may go. It then counts that drain as gathering.
func (b *batcher) lead() bool {
	if b.gather || b.calling >= b.calls {
		return false
	}
	b.gather = true
	return true
}

// drain gathers the queue and sends it, call after call while jobs wait and no other drain gathers them:
// each call the queue's first jobs, in order, up to max and up to the first asked under another margin
// than the head's, once the head has waited the linger (a head that queued behind a call on its way has
// waited that long already, as a rule). Once it has taken its jobs, another drain may gather the rest
// while its call is on its way.
func (l *Limiter) drain(ctx context.Context, p provider, providerName string) {
	b := p.batch
	lingered := false // this call's linger is over
	for {
		b.mu.Lock()
		if len(b.queue) == 0 { // every job queued gave up (batched), or another drain took them
			b.gather = false
			b.mu.Unlock()
			return
		}
		if wait := time.Until(b.queue[0].at.Add(b.linger)); b.linger > 0 && !lingered && wait > 0 && len(b.queue) < b.max {
			b.mu.Unlock()
			select {
			case <-b.after(wait):
			case <-b.full:
			}
			lingered = true
			continue // the queue again: some may have given up meanwhile
		}
		lingered = false
		margin, n := b.queue[0].margin, 0
		for n < len(b.queue) && n < b.max && b.queue[n].margin == margin {
			n++
		}
		take := slices.Clone(b.queue[:n])
		b.queue = slices.Delete(b.queue, 0, n)
		b.gather, b.calling = false, b.calling+1
		more := len(b.queue) > 0 && b.lead() // what is left gathers beside this call
		b.mu.Unlock()
		if more {
			go l.drain(ctx, p, providerName)
		}

		l.decideAll(ctx, p, providerName, margin, take)

		b.mu.Lock()
		b.calling--
		again := len(b.queue) > 0 && b.lead() // what queued while every call was on its way
		b.mu.Unlock()
		if !again {
			return
		}
	}
}

// decideAll decides jobs in as few calls as it can, in order: a call holds a job id at most once (lua/family
// decides a batch's jobs against the state as the call read it), so a redelivery of a job queued beside
// it goes in the next call, and sees the first as a duplicate, as it would alone.
func (l *Limiter) decideAll(ctx context.Context, p provider, providerName string, margin int64, jobs []*pending) {
	for len(jobs) > 0 {
		n, ids := 0, make(map[string]bool, len(jobs))
		for n < len(jobs) && !ids[jobs[n].jobID] {
			ids[jobs[n].jobID] = true
			n++
		}
		l.decideCall(ctx, p, providerName, margin, jobs[:n])
		jobs = jobs[n:]
	}
}

// decideCall decides jobs (distinct ids, under margin) in one call: a single reserve for one job, the batch
// op for several.
func (l *Limiter) decideCall(ctx context.Context, p provider, providerName string, margin int64, jobs []*pending) {
	defer func() {
		for _, j := range jobs {
			close(j.done)
		}
	}()
	asked := time.Now() // before the call leaves: the jobs' Verdict.Asked, after their wait in the queue
	verdict := func(j *pending, reply []int64, err error) {
		if err != nil {
			j.err = fmt.Errorf("gate: reserve %s/%s: %w", providerName, j.jobID, err)
			return
		}
		j.v, j.err = verdictOf(p, providerName, j.call, reply)
		j.v.Asked = asked
	}
	if len(jobs) == 1 {
		j := jobs[0]
		reply, err := reserveReply(l.run(ctx, p, j.call))
		verdict(j, reply, err)
		return
	}
	replies, err := l.run(ctx, p, call{op: opBatch, jobs: jobs, arg5: l.stale, margin: margin}).Slice()
	var each [][]int64
	var errs []error
	if err == nil {
		each, errs, err = splitReplies(replies, len(jobs))
	}
	for i, j := range jobs {
		if err != nil {
			verdict(j, nil, err)
			continue
		}
		verdict(j, each[i], errs[i])
	}
}

// splitReplies reads a batch's reply (lua/family's op 'batch': one flat array, now_us and then each job's
// error reply or its 6 numbers) into its n jobs' replies, each as a single reserve's (replyLen numbers).
func splitReplies(replies []any, n int) ([][]int64, []error, error) {
	malformed := func(what string, args ...any) error {
		return fmt.Errorf("batch of %d: malformed reply: "+what, append([]any{n}, args...)...)
	}
	if len(replies) == 0 {
		return nil, nil, malformed("empty")
	}
	now, ok := replies[0].(int64)
	if !ok {
		return nil, nil, malformed("now %v", replies[0])
	}
	each, errs, k := make([][]int64, n), make([]error, n), 1
	var nums [batchReplyLen]int64
	for i := range n {
		if k < len(replies) {
			if e, ok := replies[k].(error); ok {
				errs[i], k = e, k+1
				continue
			}
		}
		if k+batchReplyLen > len(replies) {
			return nil, nil, malformed("it ends at job %d", i+1)
		}
		for x, v := range replies[k : k+batchReplyLen] {
			if nums[x], ok = v.(int64); !ok {
				return nil, nil, malformed("%v for job %d", replies[k:k+batchReplyLen], i+1)
			}
		}
		k += batchReplyLen
		each[i] = unpackReply(now, nums)
	}
	if k != len(replies) {
		return nil, nil, malformed("%d values past the last job's", len(replies)-k)
	}
	return each, errs, nil
}

// batchReplyLen is how many numbers a batch's reply holds for each job decided (lua/family's op 'batch'),
// and a single reserve's after now_us.
const batchReplyLen = 6
