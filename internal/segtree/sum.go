package segtree

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/rbdb/rbd/internal/prefetch"
)

// SumTree keeps sums of non-negative leaf values for proportional sampling.
//
// The zero value is an empty tree; use NewSumTree. A SumTree is not safe for
// concurrent use: the sampler serialises access to it.
type SumTree struct {
	n     int
	size  int
	nodes []float64
}

// NewSumTree returns a tree of n leaves, all zero.
func NewSumTree(n int) *SumTree {
	size, slots := layout(n)
	return &SumTree{n: n, size: size, nodes: make([]float64, slots)}
}

// Len returns the number of leaves.
func (t *SumTree) Len() int { return t.n }

// Set stores v at leaf i and recomputes its ancestors.
//
// v must be finite and >= 0: a negative or NaN priority would corrupt every
// ancestor sum and silently skew sampling, so it is treated as a caller bug
// and panics rather than being clamped.
func (t *SumTree) Set(i int, v float64) {
	checkIndex(i, t.n)
	if !(v >= 0) || math.IsInf(v, 1) {
		panic(fmt.Sprintf("tree: SumTree.Set(%d, %v): value must be finite and >= 0", i, v))
	}
	v += 0 // canonicalise -0 to +0 so stored leaves compare cleanly
	nodes := t.nodes
	k := t.size + i
	nodes[k] = v
	for k > 1 {
		k >>= 1
		// Recompute from both children rather than adding a delta, so
		// rounding errors do not accumulate across updates (see package doc).
		nodes[k] = nodes[2*k] + nodes[2*k+1]
	}
}

// Get returns the value at leaf i.
func (t *SumTree) Get(i int) float64 {
	checkIndex(i, t.n)
	return t.nodes[t.size+i]
}

// Total returns the sum of all leaves.
func (t *SumTree) Total() float64 { return t.nodes[1] }

// Find returns the leaf i whose interval [prefix(i), prefix(i)+leaf(i))
// contains mass, where prefix(i) is the sum of leaves 0..i-1. mass is expected
// in [0, Total()), typically Total() times a uniform variate.
//
// Find never returns a zero-valued leaf while Total() > 0. Rounding in the
// subtractions during descent (or a mass that rounds to Total()) can point
// just past the last positive leaf of a subtree; Find then returns the nearest
// positive leaf to the left. A negative mass yields the first positive leaf,
// and a mass >= Total() or NaN the last one. If Total() == 0 there is nothing
// to sample and Find returns -1.
//
// Find is O(log n) and does not allocate.
func (t *SumTree) Find(mass float64) int {
	nodes := t.nodes
	if !(nodes[1] > 0) {
		return -1
	}
	if mass < 0 {
		mass = 0
	}
	// Invariant: nodes[k] > 0. It holds at the root, and each step keeps it:
	// we go left only if mass < left (so left > mass >= 0) or if right == 0
	// (so left == nodes[k] > 0), and right only if right > 0. Sums of
	// non-negative values are zero exactly when all their leaves are, so
	// the descent can never end on a zero leaf, and taking the left branch
	// when the right one is empty is precisely "nearest positive leaf to the
	// left": the remaining mass is >= left, so the descent keeps to the
	// rightmost positive leaf of that subtree.
	k := 1
	for k < t.size {
		k <<= 1
		left, right := nodes[k], nodes[k+1]
		if mass < left || right == 0 {
			continue
		}
		mass -= left
		k++
	}
	return k - t.size
}

// FindBatch sets out[j] = Find(masses[j]) for every j, overwriting masses
// (out must be as long as masses). The descents run level by level, all of
// them one step at a time: a descent's lower levels are cache misses that
// depend on each other, but the same level of independent descents is not,
// so the CPU has a whole batch of misses in flight at once instead of one.
// Each descent does the arithmetic of Find, step for step, so the leaves
// are exactly Find's. The step takes no branch: which child a random mass
// goes to is a coin toss, so a branch was mispredicted half the time, and
// those flushes, not the loads, had set the pace (256 finds in a 10^5-leaf
// tree took 23 µs with the branch, 8 without; BenchmarkSumTreeFindBatch).
// Find keeps its branch: a lone descent gains from the CPU running ahead
// down the guessed child. Below prefetchLevel each step prefetches the
// descent's next pair of nodes, so that the next level's pass finds them
// arriving (in a 10^7-leaf tree 256 finds took 37-42 µs, with the
// prefetches 18-19).
func (t *SumTree) FindBatch(masses []float64, out []int) {
	if len(out) != len(masses) {
		panic(fmt.Sprintf("tree: FindBatch with %d masses and %d outputs", len(masses), len(out)))
	}
	nodes := t.nodes
	if !(nodes[1] > 0) {
		for j := range out {
			out[j] = -1
		}
		return
	}
	for j, m := range masses {
		if m < 0 {
			masses[j] = 0
		}
		out[j] = 1
	}
	for level := 1; level < t.size; level <<= 1 {
		if level >= prefetchLevel && level<<1 < t.size {
			// Nodes this deep are cache misses: ask for each descent's
			// next pair as soon as it is known. (A loop of its own: a
			// test in the one loop cost the levels above 10%.)
			for j, k := range out {
				masses[j], k = descend(nodes, masses[j], k)
				out[j] = k
				if 2*k < len(nodes) {
					prefetch.Line(unsafe.Pointer(&nodes[2*k]))
				}
			}
			continue
		}
		for j, k := range out {
			masses[j], out[j] = descend(nodes, masses[j], k)
		}
	}
	for j := range out {
		out[j] -= t.size
	}
}

// Grow extends the tree to n leaves (n >= Len()); the new leaves are zero.
// It rebuilds the tree in O(n), so a caller that grows by doubling pays O(1)
// per leaf over the tree's life. It lets per-row trees follow the rows a
// ring has actually written instead of its capacity.
func (t *SumTree) Grow(n int) {
	t.size, t.nodes = regrow(t.nodes, t.size, t.n, n, 0, func(l, r float64) float64 { return l + r })
	t.n = n
}

// descend is one step of a descent from node k with mass m left: the
// child Find would take and the mass left there, without a branch.
func descend(nodes []float64, m float64, k int) (float64, int) {
	k <<= 1
	left, right := nodes[k], nodes[k+1]
	// Right when Find goes right: !(m < left || right == 0).
	step := b2i(!(m < left)) & b2i(right != 0)
	return m - left*float64(step), k + step
}

// b2i is 1 for true and 0 for false, without a branch (the compiler sets
// a register from the flags).
func b2i(b bool) int {
	var i int
	if b {
		i = 1
	}
	return i
}

// prefetchLevel is the first level whose nodes FindBatch prefetches: the
// levels above it (up to 16 Ki nodes, 128 KiB) stay in cache between
// descents. (From 8 Ki nodes on, a 10^5-leaf tree's batches were 5%
// slower; from 32 Ki on, within noise.)
const prefetchLevel = 1 << 15
