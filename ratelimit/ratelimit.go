package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// Params configure a Limiter.
type Params struct {
	// SamplesPerInsert is how many sampled rows each inserted row pays
	// for. Zero means no ratio: only MinSize holds.
	SamplesPerInsert float64
	// MinSize is the number of rows the buffer must hold before any
	// sample is admitted (at least 1).
	MinSize int64
	// ErrorBuffer is how far diff may stray from spi*MinSize either way
	// (required with a ratio, meaningless without one).
	ErrorBuffer float64
}

// HasRatio reports whether p limits the ratio of samples to inserts, not
// only the size.
func (p Params) HasRatio() bool { return p.SamplesPerInsert != 0 }

// spi is the ratio the counters use: 1 without a ratio, as in Reverb.
func (p Params) spi() float64 {
	if p.HasRatio() {
		return p.SamplesPerInsert
	}
	return 1
}

// Bounds returns min_diff and max_diff (-Inf and +Inf without a ratio).
func (p Params) Bounds() (minDiff, maxDiff float64) {
	if !p.HasRatio() {
		return math.Inf(-1), math.Inf(1)
	}
	centre := p.SamplesPerInsert * float64(p.MinSize)
	return centre - p.ErrorBuffer, centre + p.ErrorBuffer
}

// Problem is one thing wrong with Params: Key is the JSON key
// ("samples_per_insert", "min_size" or "error_buffer").
type Problem struct {
	Key, Msg string
}

// Problems returns what is wrong with p for a buffer of the given capacity
// (every problem, in key order; none when p is usable).
func (p Params) Problems(capacity int64) []Problem {
	var out []Problem
	add := func(key, format string, args ...any) {
		out = append(out, Problem{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	spiOK := true
	if p.HasRatio() && (!(p.SamplesPerInsert > 0) || math.IsInf(p.SamplesPerInsert, 0)) {
		add("samples_per_insert", "must be a finite number > 0 (leave it out for a limiter on min_size only), got %v", p.SamplesPerInsert)
		spiOK = false
	}
	switch {
	case p.MinSize < 1:
		add("min_size", "must be at least 1, got %d", p.MinSize)
	case p.MinSize > capacity:
		add("min_size", "%d is more than the capacity (%d): the buffer never holds that many rows, so no sample would ever be admitted", p.MinSize, capacity)
	}
	switch {
	case !p.HasRatio():
		if p.ErrorBuffer != 0 {
			add("error_buffer", "applies only with samples_per_insert")
		}
	case !(p.ErrorBuffer > 0) || math.IsInf(p.ErrorBuffer, 0):
		add("error_buffer", "must be a finite number > 0 with samples_per_insert, got %v", p.ErrorBuffer)
	case spiOK && p.ErrorBuffer < max(1, p.SamplesPerInsert):
		// Reverb's rule: a window narrower than one insert's worth of
		// samples (or one sample) could admit neither side.
		need := max(1, p.SamplesPerInsert)
		add("error_buffer", "the window max_diff - min_diff = 2*error_buffer = %v is smaller than 2*max(1, samples_per_insert) = %v; raise error_buffer to at least %v", 2*p.ErrorBuffer, 2*need, need)
	}
	return out
}

// Side is which kind of request waits: samples or inserts (extends).
type Side int

// The two sides of the limiter.
const (
	Samples Side = iota
	Inserts
)

// String returns "samples" or "extends" (what the HTTP API calls them).
func (s Side) String() string {
	if s == Samples {
		return "samples"
	}
	return "extends"
}

// ErrRateLimited is matched (errors.Is) by a *BlockedError: the request was
// not admitted before its deadline.
var ErrRateLimited = errors.New("rate limited")

// ErrNeverAdmitted is matched by a *TooLargeError: the request asks for
// more rows than the window can ever admit at once.
var ErrNeverAdmitted = errors.New("larger than the rate limiter's window")

// BlockedError is a request that was not admitted before its deadline,
// with the limiter's state at that moment (what a caller needs to see why).
type BlockedError struct {
	Side   Side
	Rows   int64
	Waited time.Duration
	// Reason says which rule held the request back, with the numbers.
	Reason string
	State  State
}

func (e *BlockedError) Error() string {
	return fmt.Sprintf("rate limited: %s of %d rows not admitted after %v (%s)", sideNoun(e.Side), e.Rows, e.Waited.Round(time.Millisecond), e.Reason)
}

func (e *BlockedError) Unwrap() error { return ErrRateLimited }

// TooLargeError is a request that no state of the limiter could admit.
type TooLargeError struct {
	Side Side
	Rows int64
	// Limit is error_buffer: the most one request may move diff by.
	Limit float64
	SPI   float64
}

func (e *TooLargeError) Error() string {
	const why = "one request may move diff by at most error_buffer, half the window, so that a sample and an extend can never hold each other up"
	if e.Side == Samples {
		return fmt.Sprintf("a sample of %d rows can never be admitted: %s (error_buffer = %v); sample at most %d rows per request or raise error_buffer", e.Rows, why, e.Limit, int64(e.Limit))
	}
	return fmt.Sprintf("an extend of %d rows can never be admitted: it moves diff by samples_per_insert*%d = %v and %s (error_buffer = %v); send at most %d rows per request or raise error_buffer", e.Rows, e.Rows, e.SPI*float64(e.Rows), why, e.Limit, int64(e.Limit/e.SPI))
}

func (e *TooLargeError) Unwrap() error { return ErrNeverAdmitted }

func sideNoun(s Side) string {
	if s == Samples {
		return "a sample"
	}
	return "an extend"
}

// State is a snapshot of a limiter, as the HTTP API shows it. Pointers are
// nil (JSON null) where a limiter without a ratio has no value.
type State struct {
	SamplesPerInsert *float64 `json:"samples_per_insert"`
	MinSize          int64    `json:"min_size"`
	ErrorBuffer      *float64 `json:"error_buffer"`
	// Inserts and Samples count rows since the counters (re)started: at
	// creation from 0, on open and on a change from min(size, min_size)
	// inserts and 0 samples, which puts diff at the window's centre once
	// the buffer holds min_size rows.
	Inserts int64    `json:"inserts"`
	Samples int64    `json:"samples"`
	Diff    float64  `json:"diff"`
	MinDiff *float64 `json:"min_diff"`
	MaxDiff *float64 `json:"max_diff"`
	// Size is the buffer's size as the limiter last heard it.
	Size int64 `json:"size"`
	// Blocked is the side that cannot go on: "samples" when a sample
	// waits or a 1-row sample would be refused, else "extends" likewise,
	// else "none". In a refusal's state it is the refused side.
	Blocked        string `json:"blocked"`
	WaitingSamples int    `json:"waiting_samples"`
	WaitingExtends int    `json:"waiting_extends"`
	// Wait seconds and refusals are totals since the process started.
	SampleWaitSeconds float64 `json:"sample_wait_seconds"`
	ExtendWaitSeconds float64 `json:"extend_wait_seconds"`
	RefusedSamples    int64   `json:"refused_samples"`
	RefusedExtends    int64   `json:"refused_extends"`
}

// Limiter is one buffer's rate limiter. A nil *Params (Set(nil, ...))
// admits everything at once. All methods are safe for concurrent use.
type Limiter struct {
	mu       sync.Mutex
	p        *Params // nil: off
	gen      uint64  // bumped when the counters restart
	inserts  int64
	samples  int64
	size     int64
	queue    [2][]*waiter
	waited   [2]time.Duration
	refused  [2]int64
	closeErr error
	// version counts changes of the state, so a watcher can tell whether
	// there is anything new to show.
	version uint64

	// afterAdmit, set by tests, sees every admission under the lock.
	afterAdmit func(side Side, n int64, st State)
}

type waiter struct {
	side  Side
	n     int64
	since time.Time
	ready chan struct{} // closed once admitted or failed
	grant Grant
	err   error
}

// Grant is an admission. Refund gives rows back when the request fails
// after it was admitted, or returns fewer rows than it asked for.
type Grant struct {
	l      *Limiter
	side   Side
	n      int64
	gen    uint64
	waited time.Duration
}

// New returns a limiter with params p (nil: off) for a buffer that holds
// size rows. The counters start as on a restart: a new buffer (size 0)
// starts at 0 inserts.
func New(p *Params, size int64) *Limiter {
	l := &Limiter{}
	l.Set(p, size)
	return l
}

// Set replaces the parameters (nil turns the limiter off) and restarts the
// counters with min(size, min_size) inserts and 0 samples, so diff sits at
// the window's centre once the buffer holds min_size rows and neither side
// starts blocked. Waiters are judged again at once: those the new window
// can never admit fail with a *TooLargeError.
func (l *Limiter) Set(p *Params, size int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.gen++
	l.version++
	l.size = size
	if p == nil {
		l.p = nil
		l.inserts, l.samples = 0, 0
	} else {
		c := *p
		l.p = &c
		l.inserts, l.samples = min(size, c.MinSize), 0
		for side := range l.queue {
			kept := l.queue[side][:0]
			for _, w := range l.queue[side] {
				if err := l.tooLarge(Side(side), w.n); err != nil {
					l.finish(w, err)
					continue
				}
				kept = append(kept, w)
			}
			clear(l.queue[side][len(kept):])
			l.queue[side] = kept
		}
	}
	l.judge()
}

// Version returns a number that changes whenever the state does.
func (l *Limiter) Version() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.version
}

// Params returns the current parameters (nil when off).
func (l *Limiter) Params() *Params {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.p == nil {
		return nil
	}
	c := *l.p
	return &c
}

// SetSize tells the limiter how many rows the buffer holds now; sample
// waiters held back by min_size are judged again.
func (l *Limiter) SetSize(size int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.size != size {
		l.version++
	}
	l.size = size
	if l.p != nil && len(l.queue[Samples]) > 0 {
		l.judge()
	}
}

// Close fails every waiter, and every later Acquire, with err (a deleted
// buffer, a closed store).
func (l *Limiter) Close(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closeErr = err
	for side := range l.queue {
		for _, w := range l.queue[side] {
			l.finish(w, err)
		}
		l.queue[side] = nil
	}
}

// Reopen undoes Close: the limiter takes requests again (a delete that
// failed keeps its buffer).
func (l *Limiter) Reopen() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closeErr = nil
}

// Acquire admits a request of n rows on side, waiting first-come-first-
// served behind earlier waiters of that side until deadline (a deadline
// not after now means no wait), ctx is done or stop is closed. It returns
// a *BlockedError after the deadline, a *TooLargeError at once if no state
// could admit n rows, ctx.Err() when ctx ends, errStop when stop closes,
// and the Close error once the limiter is closed. A request that is not
// admitted counts nothing.
func (l *Limiter) Acquire(ctx context.Context, side Side, n int64, deadline time.Time, stop <-chan struct{}, errStop error) (Grant, error) {
	l.mu.Lock()
	if l.closeErr != nil {
		defer l.mu.Unlock()
		return Grant{}, l.closeErr
	}
	if l.p == nil {
		defer l.mu.Unlock()
		return Grant{}, nil
	}
	if err := l.tooLarge(side, n); err != nil {
		l.mu.Unlock()
		return Grant{}, err
	}
	if len(l.queue[side]) == 0 && l.can(side, n) {
		defer l.mu.Unlock()
		g := l.admit(side, n)
		l.judge() // the other side's head may go now
		return g, nil
	}
	start := time.Now()
	if !start.Before(deadline) {
		defer l.mu.Unlock()
		l.refused[side]++
		return Grant{}, l.blocked(side, n, 0)
	}
	w := &waiter{side: side, n: n, since: start, ready: make(chan struct{})}
	l.queue[side] = append(l.queue[side], w)
	l.version++
	l.mu.Unlock()

	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	var cause error
	select {
	case <-w.ready:
	case <-timer.C:
	case <-ctx.Done():
		cause = ctx.Err()
	case <-stop:
		cause = errStop
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	waited := time.Since(start)
	l.waited[side] += waited
	select {
	case <-w.ready:
		// Admitted (or failed) by the time we looked: a caller that left
		// gives the rows back, since nothing will be done with them.
		if w.err == nil && cause != nil {
			l.refundLocked(w.grant, w.n)
			return Grant{}, cause
		}
		w.grant.waited = waited
		return w.grant, w.err
	default:
	}
	l.remove(w)
	// The one that left may have been holding up those behind it.
	l.judge()
	if cause != nil {
		return Grant{}, cause
	}
	l.refused[side]++
	return Grant{}, l.blocked(side, n, waited)
}

// Refund gives back n of the granted rows (all of them when the request
// failed). A grant from before the counters restarted, or of a limiter
// that was off, refunds nothing. A refund never moves diff out of the
// window: other requests may have been admitted on the rows it gives back
// (an extend admitted against a sample that then failed), so it gives
// back only what keeps min_diff <= diff <= max_diff, and the counters keep
// the rest as if the request had happened.
func (g Grant) Refund(n int64) {
	if g.l == nil || n <= 0 {
		return
	}
	g.l.mu.Lock()
	defer g.l.mu.Unlock()
	g.l.refundLocked(g, n)
}

// Rows returns the rows granted.
func (g Grant) Rows() int64 { return g.n }

// Waited is how long the request waited in the queue before it was
// admitted (0 when it was admitted at once).
func (g Grant) Waited() time.Duration { return g.waited }

func (l *Limiter) refundLocked(g Grant, n int64) {
	if g.l != l || g.gen != l.gen || l.p == nil {
		return
	}
	n = min(n, g.n)
	if l.p.HasRatio() {
		minDiff, maxDiff := l.p.Bounds()
		d := l.diff()
		// Only a diff inside the window is kept there: during the fill
		// (diff below min_diff) an extend's refund is the true count.
		if g.side == Samples && d <= maxDiff {
			n = min(n, int64(math.Floor(maxDiff-d)))
		}
		if g.side == Inserts && d >= minDiff {
			n = min(n, int64(math.Floor((d-minDiff)/l.p.SamplesPerInsert)))
		}
	}
	if n <= 0 {
		return
	}
	l.version++
	if g.side == Samples {
		l.samples -= n
	} else {
		l.inserts -= n
	}
	l.judge()
}

// State returns a snapshot, and whether the limiter is on.
func (l *Limiter) State() (State, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.p == nil {
		return State{}, false
	}
	return l.stateLocked(), true
}

func (l *Limiter) diff() float64 {
	return l.p.spi()*float64(l.inserts) - float64(l.samples)
}

// can reports whether n rows on side would be admitted now.
func (l *Limiter) can(side Side, n int64) bool {
	minDiff, maxDiff := l.p.Bounds()
	if side == Samples {
		return l.size >= l.p.MinSize && l.diff()-float64(n) >= minDiff
	}
	return l.inserts+n <= l.p.MinSize || l.diff()+l.p.spi()*float64(n) <= maxDiff
}

func (l *Limiter) tooLarge(side Side, n int64) error {
	if !l.p.HasRatio() {
		return nil
	}
	// Each side at most error_buffer, half the window: a sample of n
	// blocks only while diff < min_diff + n <= centre, an extend of m only
	// while diff > max_diff - spi*m >= centre, so the two heads of the
	// queues can never both be stuck. (Reverb checks against the whole
	// window, which lets a pair of requests deadlock at the centre, where
	// the counters restart.)
	cost := float64(n)
	if side == Inserts {
		cost *= l.p.SamplesPerInsert
	}
	if cost > l.p.ErrorBuffer {
		return &TooLargeError{Side: side, Rows: n, Limit: l.p.ErrorBuffer, SPI: l.p.SamplesPerInsert}
	}
	return nil
}

func (l *Limiter) admit(side Side, n int64) Grant {
	l.version++
	if side == Samples {
		l.samples += n
	} else {
		l.inserts += n
	}
	if l.afterAdmit != nil {
		l.afterAdmit(side, n, l.stateLocked())
	}
	return Grant{l: l, side: side, n: n, gen: l.gen}
}

// judge admits waiters from the head of each queue for as long as the head
// can go; an admission on one side can unblock the other, so it loops
// until nothing moves.
func (l *Limiter) judge() {
	for moved := true; moved; {
		moved = false
		for side := range l.queue {
			for len(l.queue[side]) > 0 {
				w := l.queue[side][0]
				if l.p != nil && !l.can(Side(side), w.n) {
					break
				}
				if l.p != nil {
					w.grant = l.admit(Side(side), w.n)
				}
				l.queue[side][0] = nil
				l.queue[side] = l.queue[side][1:]
				close(w.ready)
				moved = true
			}
		}
	}
}

func (l *Limiter) finish(w *waiter, err error) {
	w.err = err
	close(w.ready)
}

func (l *Limiter) remove(w *waiter) {
	q := l.queue[w.side]
	for i, x := range q {
		if x == w {
			copy(q[i:], q[i+1:])
			q[len(q)-1] = nil
			l.queue[w.side] = q[:len(q)-1]
			return
		}
	}
}

func (l *Limiter) stateLocked() State {
	p := l.p
	st := State{
		MinSize:           p.MinSize,
		Inserts:           l.inserts,
		Samples:           l.samples,
		Diff:              l.diff(),
		Size:              l.size,
		WaitingSamples:    len(l.queue[Samples]),
		WaitingExtends:    len(l.queue[Inserts]),
		SampleWaitSeconds: l.waited[Samples].Seconds(),
		ExtendWaitSeconds: l.waited[Inserts].Seconds(),
		RefusedSamples:    l.refused[Samples],
		RefusedExtends:    l.refused[Inserts],
		Blocked:           "none",
	}
	if p.HasRatio() {
		spi, eb := p.SamplesPerInsert, p.ErrorBuffer
		minDiff, maxDiff := p.Bounds()
		st.SamplesPerInsert, st.ErrorBuffer, st.MinDiff, st.MaxDiff = &spi, &eb, &minDiff, &maxDiff
	}
	switch {
	case st.WaitingSamples > 0 || !l.can(Samples, 1):
		st.Blocked = Samples.String()
	case st.WaitingExtends > 0 || !l.can(Inserts, 1):
		st.Blocked = Inserts.String()
	}
	return st
}

// blocked describes why n rows on side are not admitted now.
func (l *Limiter) blocked(side Side, n int64, waited time.Duration) *BlockedError {
	l.version++ // a refusal, and wait time, to show
	e := &BlockedError{Side: side, Rows: n, Waited: waited, State: l.stateLocked()}
	// A 1-row request of that side might fit now; the refused one did not.
	e.State.Blocked = side.String()
	s, p := e.State, l.p
	minDiff, maxDiff := p.Bounds()
	switch {
	case side == Samples && s.Size < p.MinSize:
		e.Reason = fmt.Sprintf("the buffer holds %d rows, fewer than min_size %d: waiting for inserts", s.Size, p.MinSize)
	case side == Samples && s.Diff-float64(n) < minDiff:
		e.Reason = fmt.Sprintf("diff %v - %d rows < min_diff %v: learners are ahead, waiting for inserts", s.Diff, n, minDiff)
	case side == Inserts && !l.can(Inserts, n):
		e.Reason = fmt.Sprintf("diff %v + %v*%d rows > max_diff %v: actors are ahead, waiting for samples", s.Diff, p.spi(), n, maxDiff)
	default:
		e.Reason = fmt.Sprintf("%d earlier %s are waiting first", len(l.queue[side]), side)
	}
	return e
}
