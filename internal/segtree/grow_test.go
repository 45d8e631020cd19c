package segtree

import (
	"math/rand/v2"
	"testing"
)

// TestGrowMatchesFreshTree grows trees step by step (odd and even sizes,
// powers of two and one past them), setting leaves in between, and checks
// every node a query can read against trees built at the final size.
func TestGrowMatchesFreshTree(t *testing.T) {
	for _, steps := range [][]int{
		{1, 2, 3, 4, 5, 8, 9, 16, 17, 100},
		{0, 1},
		{0, 7, 64, 65, 1000},
		{3, 3, 4},
	} {
		rng := rand.New(rand.NewPCG(uint64(len(steps)), 7))
		sum, mn := NewSumTree(steps[0]), NewMinTree(steps[0])
		var vals []float64
		for _, n := range steps {
			sum.Grow(n)
			mn.Grow(n)
			for len(vals) < n {
				vals = append(vals, 0)
			}
			for i := range n {
				if rng.IntN(3) == 0 {
					vals[i] = float64(rng.IntN(10))
					sum.Set(i, vals[i])
					if vals[i] > 0 {
						mn.Set(i, vals[i])
					} else {
						mn.Clear(i)
					}
				}
			}
			wantSum, wantMin := NewSumTree(n), NewMinTree(n)
			for i, v := range vals {
				wantSum.Set(i, v)
				if v > 0 {
					wantMin.Set(i, v)
				}
			}
			if sum.Len() != n || mn.Len() != n {
				t.Fatalf("grow to %d: len %d / %d", n, sum.Len(), mn.Len())
			}
			if sum.Total() != wantSum.Total() || mn.Min() != wantMin.Min() {
				t.Fatalf("grow to %d: total %v min %v, want %v %v", n, sum.Total(), mn.Min(), wantSum.Total(), wantMin.Min())
			}
			for k := range wantSum.nodes {
				if sum.nodes[k] != wantSum.nodes[k] || mn.nodes[k] != wantMin.nodes[k] {
					t.Fatalf("grow to %d: node %d is %v / %v, want %v / %v", n, k, sum.nodes[k], mn.nodes[k], wantSum.nodes[k], wantMin.nodes[k])
				}
			}
			for m := 0.0; m < wantSum.Total(); m += 0.5 {
				if got, want := sum.Find(m), wantSum.Find(m); got != want {
					t.Fatalf("grow to %d: Find(%v) = %d, want %d", n, m, got, want)
				}
			}
		}
	}
}

func TestGrowBelowLenPanics(t *testing.T) {
	for name, grow := range map[string]func(){
		"sum": func() { NewSumTree(4).Grow(3) },
		"min": func() { NewMinTree(4).Grow(3) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: Grow below Len did not panic", name)
				}
			}()
			grow()
		}()
	}
}
