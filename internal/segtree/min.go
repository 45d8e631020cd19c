package segtree

import (
	"fmt"
	"math"
)

// MinTree keeps the minimum of its leaves; unset leaves are +Inf so they never
// win. Prioritised replay uses it to find the smallest sampling probability,
// which normalises importance-sampling weights to at most 1.
//
// A MinTree is not safe for concurrent use.
type MinTree struct {
	n     int
	size  int
	nodes []float64
}

// NewMinTree returns a tree of n leaves, all unset (+Inf).
func NewMinTree(n int) *MinTree {
	size, slots := layout(n)
	nodes := make([]float64, slots)
	inf := math.Inf(1)
	for k := range nodes {
		nodes[k] = inf
	}
	return &MinTree{n: n, size: size, nodes: nodes}
}

// Len returns the number of leaves.
func (t *MinTree) Len() int { return t.n }

// Set stores v at leaf i and recomputes its ancestors. v must not be NaN: NaN
// compares false with everything and would make the minimum depend on the
// order of updates, so it panics as a caller bug.
func (t *MinTree) Set(i int, v float64) {
	checkIndex(i, t.n)
	if math.IsNaN(v) {
		panic(fmt.Sprintf("tree: MinTree.Set(%d, NaN)", i))
	}
	t.set(i, v)
}

// Clear resets leaf i to +Inf, removing it from the minimum, e.g. when its
// ring slot is overwritten or evicted.
func (t *MinTree) Clear(i int) {
	checkIndex(i, t.n)
	t.set(i, math.Inf(1))
}

func (t *MinTree) set(i int, v float64) {
	nodes := t.nodes
	k := t.size + i
	nodes[k] = v
	for k > 1 {
		k >>= 1
		l, r := nodes[2*k], nodes[2*k+1]
		if r < l {
			l = r
		}
		nodes[k] = l
	}
}

// Get returns the value at leaf i (+Inf if unset).
func (t *MinTree) Get(i int) float64 {
	checkIndex(i, t.n)
	return t.nodes[t.size+i]
}

// Min returns the smallest leaf, or +Inf when every leaf is unset.
func (t *MinTree) Min() float64 { return t.nodes[1] }

// Grow extends the tree to n leaves (n >= Len()); the new leaves are unset.
// Like SumTree.Grow it costs O(n).
func (t *MinTree) Grow(n int) {
	t.size, t.nodes = regrow(t.nodes, t.size, t.n, n, math.Inf(1), math.Min)
	t.n = n
}
