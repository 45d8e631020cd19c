package series

import (
	"reflect"
	"sync"
	"testing"
	"time"
)

func at(sec int64) time.Time { return time.Unix(sec, 500) }

func TestRing(t *testing.T) {
	type op struct {
		sec  int64
		i    int // -1: SetAll
		vals []float64
	}
	tests := []struct {
		name   string
		window int
		ops    []op
		since  int64
		want   []Point
	}{
		{name: "empty", window: 3, want: nil},
		{name: "one second keeps its last values", window: 3,
			ops:  []op{{10, 0, []float64{1}}, {10, 1, []float64{5}}, {10, 0, []float64{2}}},
			want: []Point{{10, []float64{2, 5}}}},
		{name: "values carry over seconds", window: 3,
			ops:  []op{{10, 0, []float64{1}}, {12, 1, []float64{7}}},
			want: []Point{{10, []float64{1, 0}}, {12, []float64{1, 7}}}},
		{name: "oldest dropped when full", window: 2,
			ops:  []op{{1, -1, []float64{1, 1}}, {2, -1, []float64{2, 2}}, {3, -1, []float64{3, 3}}},
			want: []Point{{2, []float64{2, 2}}, {3, []float64{3, 3}}}},
		{name: "since skips older points", window: 4,
			ops:   []op{{1, -1, []float64{1, 1}}, {2, -1, []float64{2, 2}}, {3, -1, []float64{3, 3}}},
			since: 2,
			want:  []Point{{3, []float64{3, 3}}}},
		{name: "a clock stepping back writes into the newest point", window: 3,
			ops:  []op{{5, 0, []float64{1}}, {4, 0, []float64{9}}},
			want: []Point{{5, []float64{9, 0}}}},
		{name: "wraps many times", window: 3,
			ops: []op{{1, 0, []float64{1}}, {2, 0, []float64{2}}, {3, 0, []float64{3}}, {4, 0, []float64{4}},
				{5, 0, []float64{5}}, {6, 0, []float64{6}}, {7, 0, []float64{7}}},
			want: []Point{{5, []float64{5, 0}}, {6, []float64{6, 0}}, {7, []float64{7, 0}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := New(tc.window, 2)
			for _, o := range tc.ops {
				if o.i < 0 {
					r.SetAll(at(o.sec), o.vals...)
				} else {
					r.Update(at(o.sec), func(v []float64) { v[o.i] = o.vals[0] })
				}
			}
			if got := r.Since(tc.since); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Since(%d) = %v, want %v", tc.since, got, tc.want)
			}
			ts, cols := r.Columns(tc.since)
			if len(ts) != len(tc.want) || len(cols) != 2 {
				t.Fatalf("Columns: %d seconds, %d columns; want %d, 2", len(ts), len(cols), len(tc.want))
			}
			for i, p := range tc.want {
				if ts[i] != p.T || cols[0][i] != p.V[0] || cols[1][i] != p.V[1] {
					t.Fatalf("Columns point %d = %d %v %v, want %v", i, ts[i], cols[0][i], cols[1][i], p)
				}
			}
		})
	}
}

func TestRingUpdate(t *testing.T) {
	r := New(4, 2)
	r.Update(at(1), func(v []float64) { v[0] = 5 })
	r.Update(at(1), func(v []float64) { v[0] = max(v[0], 3); v[1] = 1 })
	want := []Point{{1, []float64{5, 1}}}
	if got := r.Since(0); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// Points handed out are copies: later writes never change them.
func TestRingSinceCopies(t *testing.T) {
	r := New(2, 1)
	r.SetAll(at(1), 1)
	got := r.Since(0)
	r.SetAll(at(1), 2)
	if got[0].V[0] != 1 {
		t.Fatalf("a point handed out changed to %v", got[0].V[0])
	}
}

func TestRingConcurrent(t *testing.T) {
	r := New(8, 1)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				r.SetAll(at(int64(i/100)), float64(g))
				_ = r.Since(0)
			}
		}()
	}
	wg.Wait()
	pts := r.Since(0)
	if len(pts) != 8 {
		t.Fatalf("%d points, want 8 (a full ring)", len(pts))
	}
	for i := 1; i < len(pts); i++ {
		if pts[i].T <= pts[i-1].T {
			t.Fatalf("points out of order: %v", pts)
		}
	}
}
