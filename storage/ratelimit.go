package storage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rbdb/rbd/ratelimit"
)

// ErrStopped is returned by a call that was waiting (for the rate limiter,
// or for data) when its stop channel closed: a server shutting down
// answers its waiters at once.
var ErrStopped = errors.New("storage: stopped while waiting")

// liveRows is the number of rows the index holds.
func (b *Buffer) liveRows() int64 {
	b.imu.RLock()
	defer b.imu.RUnlock()
	return b.ix.rows
}

// RateLimit returns the limiter's live state, and whether the buffer has a
// rate limit.
func (b *Buffer) RateLimit() (ratelimit.State, bool) { return b.limiter.State() }

// AcquireSamples asks the rate limiter to admit a sample of n rows, waiting
// as ratelimit.Limiter.Acquire does. The caller refunds the grant when the
// sample fails, or returns fewer rows.
func (b *Buffer) AcquireSamples(ctx context.Context, n int64, deadline time.Time, stop <-chan struct{}) (ratelimit.Grant, error) {
	if b.closed.Load() {
		return ratelimit.Grant{}, fmt.Errorf("buffer %q: %w", b.name, ErrClosed)
	}
	return b.limiter.Acquire(ctx, ratelimit.Samples, n, deadline, stop, ErrStopped)
}

// SetRateLimit replaces the buffer's rate limit (nil removes it), makes the
// change durable in the catalog and restarts the limiter's counters at the
// new window's centre; waiting requests are judged again at once. Invalid
// parameters are *SpecError values (matching ErrInvalidSpec) naming the
// key, e.g. "rate_limit.error_buffer".
func (b *Buffer) SetRateLimit(p *ratelimit.Params) error {
	if p != nil {
		var errs []error
		for _, pr := range p.Problems(b.capacity) {
			errs = append(errs, &SpecError{Path: "rate_limit." + pr.Key, Msg: pr.Msg})
		}
		if len(errs) > 0 {
			return fmt.Errorf("set rate limit of %q: %w", b.name, errors.Join(errs...))
		}
	}
	if err := b.enter(); err != nil {
		return err
	}
	defer b.leave()
	if b.store.readOnly {
		return fmt.Errorf("set rate limit of %q: %w", b.name, ErrReadOnly)
	}
	if err := b.commitRateLimit(p); err != nil {
		return b.store.asNoSpace(fmt.Sprintf("set rate limit of %q", b.name), fmt.Errorf("set rate limit of %q: %w", b.name, err))
	}
	b.store.publishSnapshot()
	b.log.Info("rate limit set", "rate_limit", rateLimitText(p))
	return nil
}

// commitRateLimit writes the spec with p to the catalog and then applies p,
// under catMu so that two changes land in the catalog in the order they
// apply.
func (b *Buffer) commitRateLimit(p *ratelimit.Params) error {
	b.catMu.Lock()
	defer b.catMu.Unlock()
	spec := b.Spec()
	spec.RateLimit = p
	if err := b.store.cat.putSpec(b.name, spec); err != nil {
		return err
	}
	b.limiter.Set(p, b.liveRows())
	return nil
}

func rateLimitText(p *ratelimit.Params) string {
	j, err := MarshalRateLimit(p)
	if err != nil {
		return err.Error()
	}
	return string(j)
}
