package storage

// blockRows is B, the rows of a block of format version 3
// (docs/proposals/format-v3.md) and of its spare block, so that a ring's
// slots are a whole number of blocks.
const blockRows = 64

// spareSlots is S for a ring of capacity rows: the capacity rounded up to
// a block, plus a spare block.
func spareSlots(capacity int64) int64 {
	return (capacity+blockRows-1)/blockRows*blockRows + blockRows
}

// ringSlotCount returns how many slots a buffer of spec maps its seqs onto
// (seq mod the count). It is the capacity, except for new memory buffers
// in builds with the rbd_spareslots tag (spareslots_on.go): spareSlots.
// The window stays the last capacity seqs either way; the slots beyond it
// hold rows that have left it (stamped void at eviction). fromFiles is a
// buffer opened from files of one slot a row.
func ringSlotCount(spec Spec, fromFiles bool) int64 {
	if spec.blockFiles() || (spareSlotsInMemory && spec.Storage == KindMemory && !fromFiles) {
		return spareSlots(spec.Capacity)
	}
	return spec.Capacity
}

// ringSlots maps seqs to ring slots (seq mod slots) without a division
// for the seqs near a write count: a 64-bit division costs about as much
// as the rest of a sample's work on a cached row, and a 256-row sample
// took several per row (drawn, prefetched, checked, decoded, copied).
// Rows, CopyIndexed, Live and NextKnown map through the index's, which
// moves with the write count under the index lock (256-row CartPole
// samples 2-5% faster for each division per row taken out:
// docs/performance.md).
type ringSlots struct {
	base  int64 // the largest multiple of slots at most the write count
	slots int64
}

func newRingSlots(writeCount, slots int64) ringSlots {
	return ringSlots{base: writeCount - writeCount%slots, slots: slots}
}

// of returns seq's slot, seq >= 0: near the write count (near) without a
// division, elsewhere with one.
func (r ringSlots) of(seq int64) int64 {
	if s, ok := r.near(seq); ok {
		return s
	}
	return seq % r.slots
}

// near returns seq's slot for seqs in [base - slots, base + slots), which
// holds the live window (at most slots seqs) of the write count the
// ringSlots was made with and of every later one up to the next multiple
// of slots: a subtraction and a wrap. For other seqs it reports false.
func (r ringSlots) near(seq int64) (int64, bool) {
	s := seq - r.base
	s += r.slots & (s >> 63) // base is a multiple of slots: s keeps seq's residue
	return s, uint64(s) < uint64(r.slots)
}
