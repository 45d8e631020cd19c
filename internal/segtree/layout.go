package segtree

import "fmt"

// layout returns the number of leaves of the complete binary tree over n
// leaves (the next power of two, at least 1) and how many node slots to
// allocate.
//
// Nodes live in one implicit-heap array: the root at index 1, the children of
// node k at 2k and 2k+1, leaf i at size+i. Only the leaves that can ever be
// read are allocated: the n real leaves, plus one padding leaf when n is odd so
// that every real leaf has a sibling and no child access needs a bounds check.
// The remaining padding leaves of the power-of-two level hold the identity
// value (0 or +Inf) implicitly, through the internal nodes above them. This
// trims up to a quarter of the memory of a full 2*size array, which is tens
// of megabytes at 10^7 slots.
func layout(n int) (size, slots int) {
	if n < 0 {
		panic(fmt.Sprintf("tree: negative leaf count %d", n))
	}
	size = 1
	for size < n {
		size <<= 1
	}
	slots = size + n + n&1
	if slots < 2 {
		slots = 2 // an empty tree still needs a root to report 0 or +Inf
	}
	return size, slots
}

func checkIndex(i, n int) {
	if uint(i) >= uint(n) {
		panic(fmt.Sprintf("tree: leaf index %d out of range [0,%d)", i, n))
	}
}

// rebuild recomputes every internal node above the n allocated leaves from
// its children with combine. Nodes whose subtree holds no allocated leaf
// keep the identity value they were initialised with.
func rebuild(nodes []float64, size, n int, combine func(l, r float64) float64) {
	lo, hi := size, size+n+n&1 // allocated leaves of the current level
	for lo > 1 {
		for k := lo / 2; k < (hi+1)/2; k++ {
			if 2*k+1 < len(nodes) {
				nodes[k] = combine(nodes[2*k], nodes[2*k+1])
			} else if 2*k < len(nodes) {
				nodes[k] = nodes[2*k]
			}
		}
		lo, hi = lo/2, (hi+1)/2
	}
}

// regrow returns the layout of a tree of n leaves (n >= oldN) holding the
// leaves of the old one, the new leaves and every node without a leaf below
// it set to identity, and the internal nodes recomputed with combine.
func regrow(old []float64, oldSize, oldN, n int, identity float64, combine func(l, r float64) float64) (int, []float64) {
	if n < oldN {
		panic(fmt.Sprintf("tree: Grow(%d) below %d leaves", n, oldN))
	}
	if n == oldN {
		return oldSize, old
	}
	size, slots := layout(n)
	nodes := make([]float64, slots)
	if identity != 0 {
		for k := range nodes {
			nodes[k] = identity
		}
	}
	copy(nodes[size:size+oldN], old[oldSize:oldSize+oldN])
	rebuild(nodes, size, n, combine)
	return size, nodes
}
