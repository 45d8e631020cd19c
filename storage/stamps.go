package storage

import (
	"sync/atomic"
	"unsafe"

	"github.com/rbdb/rbd/internal/prefetch"
)

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
//
// A memory buffer keeps its stamps in its row group instead (inRows), the
// first 8 bytes of each row's memory record: a sample reads a row's stamp
// and its record from one cache line, where the heap table costs a miss of
// its own. There a stamp is stored as seq+1, so that the zeros of memory
// never written read as -1.
type stampTable struct {
	pages []atomic.Pointer[[]atomic.Int64]
	n     int64 // slots (the capacity)
	// rows and pitch are set in row-group mode: slot's stamp is the int64
	// at rows[slot*pitch] (8-byte aligned: the region is page aligned and
	// pitch a multiple of 8).
	rows  unsafe.Pointer
	pitch int64
}

const (
	stampPageBits = 16 // 64 Ki slots, 512 KiB a page
	stampPageSize = 1 << stampPageBits
	stampPageMask = stampPageSize - 1
)

func newStampTable(capacity int64) stampTable {
	return stampTable{pages: make([]atomic.Pointer[[]atomic.Int64], (capacity+stampPageSize-1)/stampPageSize), n: capacity}
}

// inRows moves the table into a row group: rows holds capacity rows pitch
// bytes apart, each starting with 8 bytes reserved for the stamp. The
// stamps held so far are copied there. Nothing may use the table
// meanwhile (buffers call it while they are created or restored).
func (t *stampTable) inRows(rows []byte, pitch int64) {
	if int64(len(rows)) < t.n*pitch || pitch%8 != 0 || uintptr(unsafe.Pointer(unsafe.SliceData(rows)))%8 != 0 {
		panic("rbd: stamp rows too short or misaligned")
	}
	old := *t
	t.pages, t.rows, t.pitch = nil, unsafe.Pointer(unsafe.SliceData(rows)), pitch
	for slot := range t.n {
		if seq := old.Load(slot); seq >= 0 {
			t.Store(slot, seq)
		}
	}
}

// inRow returns slot's stamp word in row-group mode.
func (t *stampTable) inRow(slot int64) *atomic.Int64 {
	return (*atomic.Int64)(unsafe.Add(t.rows, slot*t.pitch))
}

// Load returns the stamp of slot (-1 when its page was never written).
func (t *stampTable) Load(slot int64) int64 {
	if t.rows != nil {
		return t.inRow(slot).Load() - 1
	}
	p := t.pages[slot>>stampPageBits].Load()
	if p == nil {
		return -1
	}
	return (*p)[slot&stampPageMask].Load()
}

// prefetch asks for slot's stamp ahead of a Load (see prefetch.go).
func (t *stampTable) prefetch(slot int64) {
	if t.rows != nil {
		prefetch.Line(unsafe.Pointer(t.inRow(slot)))
		return
	}
	if p := t.pages[slot>>stampPageBits].Load(); p != nil {
		prefetch.Line(unsafe.Pointer(&(*p)[slot&stampPageMask]))
	}
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
func (t *stampTable) Store(slot, seq int64) {
	if t.rows != nil {
		t.inRow(slot).Store(seq + 1)
		return
	}
	t.page(slot)[slot&stampPageMask].Store(seq)
}

// Swap sets the stamp of slot and returns the old one; it is a full memory
// barrier (writers rely on that, see writeRow).
func (t *stampTable) Swap(slot, seq int64) int64 {
	if t.rows != nil {
		return t.inRow(slot).Swap(seq+1) - 1
	}
	return t.page(slot)[slot&stampPageMask].Swap(seq)
}

// CompareAndSwap is atomic.Int64.CompareAndSwap on the slot's stamp. On a
// page never written the stamp is -1, and nothing is allocated for a swap
// that cannot succeed.
func (t *stampTable) CompareAndSwap(slot, old, seq int64) bool {
	if t.rows != nil {
		return t.inRow(slot).CompareAndSwap(old+1, seq+1)
	}
	p := t.pages[slot>>stampPageBits].Load()
	if p == nil {
		if old != -1 {
			return false
		}
		return t.page(slot)[slot&stampPageMask].CompareAndSwap(old, seq)
	}
	return (*p)[slot&stampPageMask].CompareAndSwap(old, seq)
}

// heapBytes is what the allocated pages take (none in row-group mode).
func (t *stampTable) heapBytes() int64 {
	var n int64
	for i := range t.pages {
		if p := t.pages[i].Load(); p != nil {
			n += int64(len(*p)) * 8
		}
	}
	return n
}
