package storage

import "sync/atomic"

// stampTable holds, per ring slot, the seq of the complete row in it or -1
// (empty, a hole, or being written). Readers check it before and after
// copying a row (a seqlock), so it lives on the Go heap, not in the
// mapping, and reads never dirty file pages.
//
// It is paged so that it grows with the rows written, not the capacity: a
// page is allocated the first time a slot in it is stored, and a slot of a
// missing page reads as -1. Slots fill in order as the ring first goes
// round, so a buffer of a billion rows that holds a thousand costs one
// page, not 8 GB.
type stampTable struct {
	pages []atomic.Pointer[[]atomic.Int64]
	n     int64 // slots (the capacity)
}

const (
	stampPageBits = 16 // 64 Ki slots, 512 KiB a page
	stampPageSize = 1 << stampPageBits
	stampPageMask = stampPageSize - 1
)

func newStampTable(capacity int64) stampTable {
	return stampTable{pages: make([]atomic.Pointer[[]atomic.Int64], (capacity+stampPageSize-1)/stampPageSize), n: capacity}
}

// Load returns the stamp of slot (-1 when its page was never written).
func (t *stampTable) Load(slot int64) int64 {
	p := t.pages[slot>>stampPageBits].Load()
	if p == nil {
		return -1
	}
	return (*p)[slot&stampPageMask].Load()
}

// page returns slot's page, allocating it (every stamp -1) if needed. Two
// callers racing on a new page agree on one through the CAS.
func (t *stampTable) page(slot int64) []atomic.Int64 {
	pi := slot >> stampPageBits
	if p := t.pages[pi].Load(); p != nil {
		return *p
	}
	size := min(int64(stampPageSize), t.n-pi<<stampPageBits)
	fresh := make([]atomic.Int64, size)
	for i := range fresh {
		fresh[i].Store(-1)
	}
	if t.pages[pi].CompareAndSwap(nil, &fresh) {
		return fresh
	}
	return *t.pages[pi].Load()
}

// Store sets the stamp of slot.
func (t *stampTable) Store(slot, seq int64) { t.page(slot)[slot&stampPageMask].Store(seq) }

// Swap sets the stamp of slot and returns the old one; it is a full memory
// barrier (writers rely on that, see writeRow).
func (t *stampTable) Swap(slot, seq int64) int64 { return t.page(slot)[slot&stampPageMask].Swap(seq) }

// CompareAndSwap is atomic.Int64.CompareAndSwap on the slot's stamp. On a
// page never written the stamp is -1, and nothing is allocated for a swap
// that cannot succeed.
func (t *stampTable) CompareAndSwap(slot, old, seq int64) bool {
	p := t.pages[slot>>stampPageBits].Load()
	if p == nil {
		if old != -1 {
			return false
		}
		return t.page(slot)[slot&stampPageMask].CompareAndSwap(old, seq)
	}
	return (*p)[slot&stampPageMask].CompareAndSwap(old, seq)
}

// heapBytes is what the allocated pages take.
func (t *stampTable) heapBytes() int64 {
	var n int64
	for i := range t.pages {
		if p := t.pages[i].Load(); p != nil {
			n += int64(len(*p)) * 8
		}
	}
	return n
}
