package series

import (
	"sync"
	"time"
)

// Ring holds, for each of the last Window seconds in which something
// changed, the values of Width numbers at the end of that second. The zero
// Ring is not usable: make one with New. Its methods are safe for
// concurrent use.
type Ring struct {
	mu    sync.Mutex
	width int
	// pts is a circular buffer of points in time order; head is the index
	// of the oldest and n how many are used.
	pts  []point
	head int
	n    int
	// cur is the latest values, carried into every new point.
	cur []float64
}

type point struct {
	t    int64 // unix second
	vals []float64
}

// Point is one second of history: T is the unix second, V the values at
// its end.
type Point struct {
	T int64
	V []float64
}

// New returns a ring of width numbers keeping the last window seconds
// that had a change (window >= 1).
func New(window, width int) *Ring {
	r := &Ring{width: width, pts: make([]point, max(window, 1)), cur: make([]float64, width)}
	for i := range r.pts {
		r.pts[i].vals = make([]float64, width)
	}
	return r
}

// SetAll records every number at once (len(vals) == width); Update
// records some of them.
func (r *Ring) SetAll(now time.Time, vals ...float64) {
	r.mu.Lock()
	copy(r.cur, vals)
	r.stamp(now.Unix())
	r.mu.Unlock()
}

// Update calls fn with the latest values, under the ring's lock, and
// records what fn leaves in them at time now. It lets a caller keep a
// counter monotonic when several goroutines record it (fn sees the value
// another one recorded).
func (r *Ring) Update(now time.Time, fn func(vals []float64)) {
	r.mu.Lock()
	fn(r.cur)
	r.stamp(now.Unix())
	r.mu.Unlock()
}

// stamp writes cur into the point of second t, starting a new point (and
// dropping the oldest when full) if t is past the newest. A clock that
// steps back writes into the newest point: the history stays ordered.
func (r *Ring) stamp(t int64) {
	if r.n > 0 {
		last := &r.pts[(r.head+r.n-1)%len(r.pts)]
		if t <= last.t {
			copy(last.vals, r.cur)
			return
		}
	}
	var p *point
	if r.n < len(r.pts) {
		p = &r.pts[(r.head+r.n)%len(r.pts)]
		r.n++
	} else {
		p = &r.pts[r.head]
		r.head = (r.head + 1) % len(r.pts)
	}
	p.t = t
	copy(p.vals, r.cur)
}

// Since returns the points of seconds after since (0: all), oldest first.
func (r *Ring) Since(since int64) []Point {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Point
	for i := 0; i < r.n; i++ {
		p := &r.pts[(r.head+i)%len(r.pts)]
		if p.t > since {
			out = append(out, Point{T: p.t, V: append([]float64(nil), p.vals...)})
		}
	}
	return out
}

// Columns returns the points after since as columns: the seconds, then one
// slice per number, each oldest first. It is what a chart wants, and
// encodes to JSON without a key per point.
func (r *Ring) Columns(since int64) (t []int64, cols [][]float64) {
	pts := r.Since(since)
	t = make([]int64, len(pts))
	cols = make([][]float64, r.width)
	for j := range cols {
		cols[j] = make([]float64, len(pts))
	}
	for i, p := range pts {
		t[i] = p.T
		for j, v := range p.V {
			cols[j][i] = v
		}
	}
	return t, cols
}
