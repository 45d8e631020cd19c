package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
)

// budget bounds the memory that requests hold in flight, all together:
// bodies being read, rows being decoded, answers being built and written.
// Memory is reserved before it is allocated; a request that would pass the
// budget waits (first come, first served) for at most wait, then is told
// to come back (503 busy). Memory held by the store itself is bounded
// elsewhere (storage.Options.MemoryLimit).
//
// An eighth of the budget is kept for small requests (at most smallLease
// in all: a learner's batch, an actor's extend), so that clients holding
// large answers they do not read cannot starve them: a small request
// never queues behind a large one.
type budget struct {
	small   *semaphore.Weighted
	large   *semaphore.Weighted
	total   int64
	wait    time.Duration
	inUse   atomic.Int64
	refused atomic.Int64
}

// smallLease is the most a request may hold from the small requests'
// share of the budget.
const smallLease = 1 << 20

func newBudget(total int64, wait time.Duration) *budget {
	small := max(total/8, min(total, smallLease))
	return &budget{small: semaphore.NewWeighted(small), large: semaphore.NewWeighted(total - small), total: total, wait: wait}
}

// lease is one request's share of the budget. It is not safe for
// concurrent use: a request's handler owns it.
type lease struct {
	b     *budget
	n     int64
	large bool // n is held in the large share (else in the small one)
}

// errBusy is the cause of a refused reservation, for tests.
var errBusy = errors.New("memory budget busy")

// grow reserves n more bytes for the request. A request stays in the small
// share while it holds at most smallLease; past that its whole lease moves
// to the large share.
func (l *lease) grow(ctx context.Context, n int64, what string) error {
	if n <= 0 {
		return nil
	}
	b := l.b
	if l.n+n > b.total-b.smallCap() && l.n+n > smallLease {
		b.refused.Add(1)
		return &apiError{status: http.StatusRequestEntityTooLarge, code: "exceeds_max_memory",
			msg: fmt.Sprintf("%s needs %d bytes of memory in flight, more than the server's budget for one request (--max-memory %d)", what, l.n+n, b.total)}
	}
	switch {
	case l.large:
		if err := b.acquire(ctx, b.large, n, what); err != nil {
			return err
		}
	case l.n+n <= smallLease:
		if err := b.acquire(ctx, b.small, n, what); err != nil {
			return err
		}
	default:
		// Moving up: take the whole lease from the large share, then give
		// the small share back.
		if err := b.acquire(ctx, b.large, l.n+n, what); err != nil {
			return err
		}
		b.small.Release(l.n)
		l.large = true
	}
	l.n += n
	b.inUse.Add(n)
	return nil
}

func (b *budget) smallCap() int64 { return max(b.total/8, min(b.total, smallLease)) }

// acquire takes n from sem, waiting at most b.wait.
func (b *budget) acquire(ctx context.Context, sem *semaphore.Weighted, n int64, what string) error {
	if sem.TryAcquire(n) {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, b.wait)
	err := sem.Acquire(wctx, n)
	cancel()
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return clientGone(ctx.Err())
	}
	b.refused.Add(1)
	return &apiError{status: http.StatusServiceUnavailable, code: "busy", cause: errBusy,
		msg: fmt.Sprintf("%s needs %d bytes of memory and the server's budget (--max-memory %d) stayed in use for %v: retry later", what, n, b.total, b.wait)}
}

// shrink gives back n bytes of the reservation early (memory freed before
// the request ends).
func (l *lease) shrink(n int64) {
	n = min(n, l.n)
	if n <= 0 {
		return
	}
	l.n -= n
	l.b.inUse.Add(-n)
	if l.large {
		l.b.large.Release(n)
	} else {
		l.b.small.Release(n)
	}
}

// release gives back everything the request holds.
func (l *lease) release() {
	l.shrink(l.n)
	l.large = false
}

// used returns the bytes reserved now.
func (b *budget) used() int64 { return b.inUse.Load() }
