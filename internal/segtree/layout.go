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
