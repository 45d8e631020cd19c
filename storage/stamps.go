package storage

import (
	"math"
	"sync/atomic"
	"unsafe"

	"github.com/rbdb/rbd/internal/prefetch"
)

// stampTable holds, per ring slot, the seq of the complete row in it or a
// negative number (empty, a hole, or being written; see Load). Readers
// check it before and after copying a row (a seqlock), so it lives on the
// Go heap, not in the mapping, and reads never dirty file pages.
//
// It is paged so that it grows with the rows written, not the capacity: a
// page is allocated the first time a slot in it is stored, and until then
// the table's pages point at one shared page of zeros (absent), whose
// slots read as -1: stamps are stored as seq+1 here too. Slots fill in
// order as the ring first goes round, so a buffer of a billion rows that
// holds a thousand costs two pages, not 8 GB (a table of one page, 64 Ki
// slots or fewer, allocates it at once: a page of zeros beside it would
// double it). No page is ever nil, which keeps Load small enough for the
// compiler to inline with its three kinds of stamp.
//
// A memory buffer keeps its stamps in its row group instead (inRows), the
// first 8 bytes of each row's memory record: a sample reads a row's stamp
// and its record from one cache line, where the heap table costs a miss of
// its own. There a stamp is stored as seq+1, so that the zeros of memory
// never written read as -1.
//
// With pass stamps (RowMetaStrided) the stamp in the row is 32 bits at
// byte 4 of the row, the row's pass round the ring plus one: seq is
// (stamp-1) x capacity + slot, and 0 (no row) reads as slot - capacity,
// a negative number (see Load). The 32 bits at
// byte 0 are the run word the row's record keeps there (memruns.go), so
// the whole record is 8 bytes. Seqs are then bounded by
// maxPassStampSeq; writers check it before reserving seqs.
type stampTable struct {
	pages  []atomic.Pointer[[]atomic.Int64]
	absent *[]atomic.Int64 // the zeros every page not yet written points at
	n      int64           // slots (the capacity)
	// rows and pitch are set in row-group mode: slot's stamp is the int64
	// at rows[slot*pitch] (8-byte aligned: the region is page aligned and
	// pitch a multiple of 8), or with passes the uint32 at
	// rows[slot*pitch+4], the high half of that word on little-endian
	// CPUs (readers load the whole word).
	rows   unsafe.Pointer
	pitch  int64
	passes bool
	// wBase and wPass cache the last pass a writer stored (wBase = wPass
	// x n), so that stores divide once a pass, not once a row. Writers
	// only (they are serialised); readers multiply.
	wBase, wPass int64
}

// passStampOff is where a pass stamp sits in its row.
const passStampOff = 4

// maxPassStampSeq is the first seq a ring of capacity rows with pass
// stamps cannot stamp: its pass + 1 would not fit in 32 bits.
func maxPassStampSeq(capacity int64) int64 {
	const passes = 1<<32 - 1 // stamps 1 .. 2^32-1
	if capacity > math.MaxInt64/passes {
		return math.MaxInt64
	}
	return passes * capacity
}

const (
	stampPageBits = 16 // 64 Ki slots, 512 KiB a page
	stampPageSize = 1 << stampPageBits
	stampPageMask = stampPageSize - 1
)

func newStampTable(capacity int64) stampTable {
	t := stampTable{pages: make([]atomic.Pointer[[]atomic.Int64], (capacity+stampPageSize-1)/stampPageSize), n: capacity}
	if len(t.pages) == 1 {
		// One page: allocated now, where a page of zeros beside it would
		// double what the table takes.
		p := make([]atomic.Int64, capacity)
		t.pages[0].Store(&p)
		return t
	}
	absent := make([]atomic.Int64, stampPageSize)
	t.absent = &absent
	for i := range t.pages {
		t.pages[i].Store(t.absent)
	}
	return t
}

// inRows moves the table into a row group: rows holds capacity rows pitch
// bytes apart, each starting with 8 bytes reserved for the stamp. The
// stamps held so far are copied there. Nothing may use the table
// meanwhile (buffers call it while they are created or restored).
//
// With passes the stamps are pass stamps (see stampTable).
func (t *stampTable) inRows(rows []byte, pitch int64, passes bool) {
	if int64(len(rows)) < t.n*pitch || pitch%8 != 0 || uintptr(unsafe.Pointer(unsafe.SliceData(rows)))%8 != 0 {
		panic("rbd: stamp rows too short or misaligned")
	}
	old := *t
	t.pages, t.absent, t.rows, t.pitch, t.passes = nil, nil, unsafe.Pointer(unsafe.SliceData(rows)), pitch, passes
	t.wBase, t.wPass = 0, 0
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

// passOf returns slot's pass stamp.
func (t *stampTable) passOf(slot int64) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Add(t.rows, slot*t.pitch+passStampOff))
}

// seqOfPass is the seq a pass stamp p names in slot (-1 for 0).
func (t *stampTable) seqOfPass(slot int64, p uint32) int64 {
	if p == 0 {
		return -1
	}
	return int64(p-1)*t.n + slot
}

// passFor returns the pass stamp of seq in slot (0 for seq -1). Writers
// only: it caches the pass. Callers keep seq below maxPassStampSeq.
func (t *stampTable) passFor(slot, seq int64) uint32 {
	if seq < 0 {
		return 0
	}
	if base := seq - slot; base != t.wBase {
		p := base / t.n
		if p+1 > math.MaxUint32 {
			panic("rbd: seq past what a pass stamp holds") // writers check maxPassStampSeq first
		}
		t.wBase, t.wPass = base, p
	}
	return uint32(t.wPass + 1)
}

// passOfSeq is passFor without the writers' cache, for readers (and seqs
// of other slots, which name no pass stamp of slot: ok is false).
func (t *stampTable) passOfSeq(slot, seq int64) (p uint32, ok bool) {
	if seq < 0 {
		return 0, true
	}
	if seq%t.n != slot || seq >= maxPassStampSeq(t.n) {
		return 0, false
	}
	return uint32(seq/t.n + 1), true
}

// Load returns the stamp of slot: the seq of the complete row in it, or a
// negative number when there is none (-1; with pass stamps, whose void
// decodes to slot - capacity, a number in [-capacity, -1]: callers test
// for a seq, or for < 0, never for -1). Samples call it a few times a
// row, and stillHolds after every copy: both must stay inlinable (go
// build -gcflags=-m: cost at most 80), which a nil page test, a call or
// a test for a void pass stamp here would break (a version that decoded
// both row-group kinds with one multiply made memory samples 2% slower).
func (t *stampTable) Load(slot int64) int64 {
	if t.rows == nil {
		return (*t.pages[slot>>stampPageBits].Load())[slot&stampPageMask].Load() - 1
	}
	w := (*atomic.Uint64)(unsafe.Add(t.rows, slot*t.pitch)).Load()
	if !t.passes {
		return int64(w) - 1
	}
	return (int64(w>>32)-1)*t.n + slot
}

// prefetch asks for slot's stamp ahead of a Load (see prefetch.go).
func (t *stampTable) prefetch(slot int64) {
	if t.rows != nil {
		prefetch.Line(unsafe.Add(t.rows, slot*t.pitch))
		return
	}
	if p := t.pages[slot>>stampPageBits].Load(); p != t.absent {
		prefetch.Line(unsafe.Pointer(&(*p)[slot&stampPageMask]))
	}
}

// page returns slot's page, allocating it (every stamp 0: no row) if it is
// still the absent page. Two callers racing on a new page agree on one
// through the CAS.
func (t *stampTable) page(slot int64) []atomic.Int64 {
	pi := slot >> stampPageBits
	if p := t.pages[pi].Load(); p != t.absent {
		return *p
	}
	fresh := make([]atomic.Int64, min(int64(stampPageSize), t.n-pi<<stampPageBits))
	if t.pages[pi].CompareAndSwap(t.absent, &fresh) {
		return fresh
	}
	return *t.pages[pi].Load()
}

// Store sets the stamp of slot.
func (t *stampTable) Store(slot, seq int64) {
	if t.rows != nil {
		if t.passes {
			t.passOf(slot).Store(t.passFor(slot, seq))
			return
		}
		t.inRow(slot).Store(seq + 1)
		return
	}
	t.page(slot)[slot&stampPageMask].Store(seq + 1)
}

// Swap sets the stamp of slot and returns the old one; it is a full memory
// barrier (writers rely on that, see writeRow).
func (t *stampTable) Swap(slot, seq int64) int64 {
	if t.rows != nil {
		if t.passes {
			return t.seqOfPass(slot, t.passOf(slot).Swap(t.passFor(slot, seq)))
		}
		return t.inRow(slot).Swap(seq+1) - 1
	}
	return t.page(slot)[slot&stampPageMask].Swap(seq+1) - 1
}

// CompareAndSwap is atomic.Int64.CompareAndSwap on the slot's stamp. On a
// page never written the stamp is -1, and nothing is allocated for a swap
// that cannot succeed.
func (t *stampTable) CompareAndSwap(slot, old, seq int64) bool {
	if t.rows != nil {
		if t.passes {
			// Readers call this too (stillHolds on weakly ordered
			// CPUs): no writer cache here. Only seqs of slot have pass
			// stamps there: any other old is not there, and any other
			// seq cannot be stored there.
			po, ok1 := t.passOfSeq(slot, old)
			pn, ok2 := t.passOfSeq(slot, seq)
			return ok1 && ok2 && t.passOf(slot).CompareAndSwap(po, pn)
		}
		return t.inRow(slot).CompareAndSwap(old+1, seq+1)
	}
	p := t.pages[slot>>stampPageBits].Load()
	if p == t.absent {
		if old != -1 {
			return false
		}
		return t.page(slot)[slot&stampPageMask].CompareAndSwap(0, seq+1)
	}
	return (*p)[slot&stampPageMask].CompareAndSwap(old+1, seq+1)
}

// heapBytes is what the allocated pages and the absent page take (none
// in row-group mode).
func (t *stampTable) heapBytes() int64 {
	var n int64
	if t.absent != nil {
		n = int64(len(*t.absent)) * 8
	}
	for i := range t.pages {
		if p := t.pages[i].Load(); p != t.absent {
			n += int64(len(*p)) * 8
		}
	}
	return n
}
