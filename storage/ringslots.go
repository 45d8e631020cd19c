package storage

// ringSlots maps seqs to ring slots (seq mod capacity) without a division
// for the seqs near a write count: a 64-bit division costs about as much
// as the rest of a sample's work on a cached row, and a 256-row sample
// took several per row (drawn, prefetched, checked, decoded, copied).
// Rows, CopyIndexed, Live and NextKnown map through the index's, which
// moves with the write count under the index lock (256-row CartPole
// samples 2-5% faster for each division per row taken out:
// docs/performance.md).
type ringSlots struct {
	base     int64 // the largest multiple of capacity at most the write count
	capacity int64
}

func newRingSlots(writeCount, capacity int64) ringSlots {
	return ringSlots{base: writeCount - writeCount%capacity, capacity: capacity}
}

// of returns seq's slot, seq >= 0: near the write count (near) without a
// division, elsewhere with one.
func (r ringSlots) of(seq int64) int64 {
	if s, ok := r.near(seq); ok {
		return s
	}
	return seq % r.capacity
}

// near returns seq's slot for seqs in [base - capacity, base + capacity),
// which holds the live window of the write count the ringSlots was made
// with and of every later one up to the next multiple of capacity: a
// subtraction and a wrap. For other seqs it reports false.
func (r ringSlots) near(seq int64) (int64, bool) {
	s := seq - r.base
	s += r.capacity & (s >> 63) // base is a multiple of capacity: s keeps seq's residue
	return s, uint64(s) < uint64(r.capacity)
}
