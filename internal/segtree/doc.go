// Package segtree holds the segment trees behind prioritised replay.
//
// A prioritised sampler needs two queries over per-slot priorities that change
// on every training step: draw a slot with probability proportional to its
// priority (SumTree.Find) and know the smallest live priority so importance
// weights can be normalised (MinTree.Min). Both trees have one leaf per ring
// slot and answer in O(log n) without allocating.
//
// # Why float64
//
// TorchRL ships float32 segment trees. A float32 has a 24-bit significand, so
// once the root sum is around 2^24 times larger than a typical priority, adding
// that priority no longer changes the upper nodes: with capacities of 10^6 to
// 10^7 slots, small priorities effectively vanish from the upper levels, the
// root under-reports the mass actually stored in the leaves, and a uniformly
// drawn mass in [0, root) can never reach the tail of the buffer. float64 has
// 53 significand bits, which leaves ~29 bits of headroom even at 10^7 leaves
// with widely spread priorities. The extra memory (8 bytes per node instead of
// 4) is small next to the transitions the slots index.
//
// # Why recompute instead of adding deltas
//
// Updating ancestors by adding (new - old) is one addition cheaper per level,
// but every update adds a fresh rounding error that is never taken back, so
// after the hundreds of millions of updates of a long run the internal nodes
// drift away from the sum of their leaves, and a subtree whose leaves are all
// zero can keep a tiny positive (or negative) residue that Find would then
// descend into. Set instead recomputes each ancestor as left+right from the
// current children. Every node is then a pure function of the present leaves:
// the error is bounded by the tree depth rather than by the update history,
// and a subtree of zero leaves sums to exactly zero, which is what lets Find
// guarantee it never returns a zero-priority slot.
package segtree
