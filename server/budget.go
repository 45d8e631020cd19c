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
type budget struct {
	sem     *semaphore.Weighted
	total   int64
	wait    time.Duration
	inUse   atomic.Int64
	refused atomic.Int64
}

func newBudget(total int64, wait time.Duration) *budget {
	return &budget{sem: semaphore.NewWeighted(total), total: total, wait: wait}
}

// lease is one request's share of the budget. It is not safe for
// concurrent use: a request's handler owns it.
type lease struct {
	b *budget
	n int64
}

// errBusy is the cause of a refused reservation, for tests.
var errBusy = errors.New("memory budget busy")

// grow reserves n more bytes for the request.
func (l *lease) grow(ctx context.Context, n int64, what string) error {
	if n <= 0 {
		return nil
	}
	b := l.b
	if l.n+n > b.total {
		b.refused.Add(1)
		return &apiError{status: http.StatusRequestEntityTooLarge, code: "exceeds_max_memory",
			msg: fmt.Sprintf("%s needs %d bytes of memory in flight, more than the server's whole budget of %d (--max-memory)", what, l.n+n, b.total)}
	}
	if !b.sem.TryAcquire(n) {
		wctx, cancel := context.WithTimeout(ctx, b.wait)
		err := b.sem.Acquire(wctx, n)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return clientGone(ctx.Err())
			}
			b.refused.Add(1)
			return &apiError{status: http.StatusServiceUnavailable, code: "busy", cause: errBusy,
				msg: fmt.Sprintf("%s needs %d bytes of memory and the server's budget (--max-memory %d) stayed in use for %v: retry later", what, n, b.total, b.wait)}
		}
	}
	l.n += n
	b.inUse.Add(n)
	return nil
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
	l.b.sem.Release(n)
}

// release gives back everything the request holds.
func (l *lease) release() { l.shrink(l.n) }

// used returns the bytes reserved now.
func (b *budget) used() int64 { return b.inUse.Load() }
