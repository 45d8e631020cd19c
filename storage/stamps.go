package storage

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/rbdb/rbd/internal/prefetch"
	"github.com/rbdb/rbd/storage/internal/mmapfile"
)

// stampTable holds, per ring slot, the seq of the complete row in it or -1
// (empty, a hole, or being written). Readers check it before and after
// copying a row (a seqlock), so it lives apart from the column files, and
// reads never dirty file pages. Stamps are stored as seq+1, so that memory
// never written reads as no row.
//
// A table of its own (memmap buffers with 64-byte file records, compressed
// buffers) is one slice of 8-byte stamps: on the Go heap up to
// stampHeapSlots slots, beyond that anonymous memory mapped without
// reserving it, which the kernel backs page by page as slots are written,
// so a buffer of a billion rows that holds a thousand costs a few pages,
// not 8 GB. (Until 2026-11-28 it was paged on the Go heap, which took a
// second path in Load; one path keeps Load inlinable with pass stamps.)
//
// A memory buffer keeps its stamps in its row group instead (inRows), the
// first 8 bytes of each row's memory record: a sample reads a row's stamp
// and its record from one cache line, where a table of its own costs a
// miss of its own. So does a memmap buffer with rows.meta version 2, in
// its memory records.
//
// With pass stamps (RowMetaStrided) the stamp in the row is 32 bits at
// byte 4 of the row: the low 31 bits of the row's pass round the ring
// (seq / slots), shifted up, with bit 0 set (0: no row). The 32 bits at
// byte 0 are the run word the row's record keeps there (memruns.go), so
// the whole record is 8 bytes. A stamp names its pass only modulo 2^31:
// readers take the other bits from ref, the last pass a writer stored,
// choosing the pass within 2^30 of it. Every row a slot holds or is being
// given is of ref's pass or the one before or after, so the choice is
// exact, and seqs have no bound but int64's (until 2026-11-28 the stamp
// was the whole pass plus one, which stopped seqs at (2^32 - 1) x
// capacity).
type stampTable struct {
	// slot's stamp is the int64 at rows[slot*pitch] (8-byte aligned: a
	// mapping is page aligned, the heap aligns int64s, and pitch is a
	// multiple of 8), or with passes the uint32 at rows[slot*pitch+4],
	// the high half of that word on little-endian CPUs (readers load the
	// whole word).
	rows   unsafe.Pointer
	pitch  int64
	passes bool
	n      int64 // the ring's slots
	// own is the table's own mapping, heap its own slots on the Go heap
	// (at most one of them; neither in a row group).
	own  *mmapfile.Region
	heap []atomic.Int64
	// wBase and wPass cache the last pass a writer stored (wBase = wPass
	// x n), so that stores divide once a pass, not once a row. Writers
	// only (they are serialised); readers multiply.
	wBase, wPass int64
	// ref is wPass for readers (atomic loads and stores: the struct is
	// copied by value where nothing uses it, which an atomic.Int64 would
	// forbid): what a pass stamp's 31 bits are decoded against.
	ref int64
}

// passStampOff is where a pass stamp sits in its row.
const passStampOff = 4

// passBits are the bits of a pass a pass stamp keeps, and passNear how
// far from ref a pass may be for its stamp to name it without doubt.
const (
	passBits = 31
	passNear = 1 << (passBits - 2)
)

// stampHeapSlots is the largest table kept on the Go heap (512 KiB): a
// mapping of its own costs a system call and at least a page.
const stampHeapSlots = 1 << 16

// newStampTable returns a table of slots slots, every one without a
// row.
func newStampTable(slots int64) (stampTable, error) {
	t := stampTable{n: slots, pitch: 8}
	if slots <= stampHeapSlots {
		t.heap = make([]atomic.Int64, slots)
		t.rows = unsafe.Pointer(unsafe.SliceData(t.heap))
		return t, nil
	}
	r, err := mmapfile.AnonymousNoReserve(slots * 8)
	if err != nil {
		return stampTable{}, fmt.Errorf("stamp table of %d slots: %w", slots, err)
	}
	t.own, t.rows = r, unsafe.Pointer(unsafe.SliceData(r.Bytes()))
	return t, nil
}

// inRows moves the table into a row group: rows holds n rows pitch
// bytes apart, each starting with 8 bytes reserved for the stamp. The
// stamps held so far are copied there, and the table's own memory given
// back. Nothing may use the table meanwhile (buffers call it while they
// are created or restored).
//
// With passes the stamps are pass stamps (see stampTable).
func (t *stampTable) inRows(rows []byte, pitch int64, passes bool) error {
	if int64(len(rows)) < t.n*pitch || pitch%8 != 0 || uintptr(unsafe.Pointer(unsafe.SliceData(rows)))%8 != 0 {
		panic("rbd: stamp rows too short or misaligned")
	}
	old := *t
	*t = stampTable{rows: unsafe.Pointer(unsafe.SliceData(rows)), pitch: pitch, passes: passes, n: old.n}
	if old.rows == nil {
		return nil
	}
	for slot := range t.n {
		if seq := old.Load(slot); seq >= 0 {
			t.Store(slot, seq)
		}
	}
	return old.close()
}

// inGroup reports whether the stamps are in a row group (inRows): each in
// its row's first 8 bytes, where a row's first line is its stamp's.
func (t *stampTable) inGroup() bool { return t.rows != nil && t.own == nil && t.heap == nil }

// close gives back the table's own memory. Nothing may use the table
// afterwards (Buffer.unmap calls it).
func (t *stampTable) close() error {
	own := t.own
	*t = stampTable{n: t.n}
	if own != nil {
		return own.Close()
	}
	return nil
}

// inRow returns slot's stamp word (without passes).
func (t *stampTable) inRow(slot int64) *atomic.Int64 {
	return (*atomic.Int64)(unsafe.Add(t.rows, slot*t.pitch))
}

// passOf returns slot's pass stamp.
func (t *stampTable) passOf(slot int64) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Add(t.rows, slot*t.pitch+passStampOff))
}

// seqOfPass is the seq the pass stamp p names in slot, -1 for 0 (no
// row): the pass within passNear of ref whose low 31 bits p holds. A
// reader's ref may be a pass behind or ahead of the writers': the
// window is far wider.
func (t *stampTable) seqOfPass(slot int64, p uint32) int64 {
	ref := atomic.LoadInt64(&t.ref)
	return ((ref+int64(int32(p-uint32(ref<<1))>>1))*t.n + slot) | (int64(p&1) - 1)
}

// passStamp is the pass stamp of pass.
func passStamp(pass int64) uint32 { return uint32(pass)<<1 | 1 }

// passFor returns the pass stamp of seq in slot (0 for seq -1). Writers
// only: it caches the pass, and makes it ref when it changes.
func (t *stampTable) passFor(slot, seq int64) uint32 {
	if seq < 0 {
		return 0
	}
	if base := seq - slot; base != t.wBase {
		t.wBase, t.wPass = base, base/t.n
		atomic.StoreInt64(&t.ref, t.wPass)
	}
	return passStamp(t.wPass)
}

// passOfSeq is passFor without the writers' cache, for readers (and seqs
// of other slots, which name no pass stamp of slot: ok is false, as for
// a pass too far from ref for a stamp to tell it from another).
func (t *stampTable) passOfSeq(slot, seq int64) (p uint32, ok bool) {
	if seq < 0 {
		return 0, true
	}
	if seq%t.n != slot {
		return 0, false
	}
	pass := seq / t.n
	if d := pass - atomic.LoadInt64(&t.ref); d < -passNear || d > passNear {
		return 0, false
	}
	return passStamp(pass), true
}

// Load returns the stamp of slot: the seq of the complete row in it, or -1
// when there is none. Samples call it a few times a row, and stillHolds
// after every copy: both must stay inlinable (go build -gcflags=-m: cost
// at most 80), which a second kind of table or a call here would break (a
// version that decoded both kinds of stamp with one multiply made memory
// samples 2% slower). A void pass stamp decodes to -1 without a branch
// (seqOfPass).
func (t *stampTable) Load(slot int64) int64 {
	w := (*atomic.Uint64)(unsafe.Add(t.rows, slot*t.pitch)).Load()
	if !t.passes {
		return int64(w) - 1
	}
	return t.seqOfPass(slot, uint32(w>>32))
}

// prefetch asks for slot's stamp ahead of a Load (see prefetch.go).
func (t *stampTable) prefetch(slot int64) {
	prefetch.Line(unsafe.Add(t.rows, slot*t.pitch))
}

// Store sets the stamp of slot.
func (t *stampTable) Store(slot, seq int64) {
	if t.passes {
		t.passOf(slot).Store(t.passFor(slot, seq))
		return
	}
	t.inRow(slot).Store(seq + 1)
}

// Swap sets the stamp of slot and returns the old one; it is a full memory
// barrier (writers rely on that, see writeRow).
func (t *stampTable) Swap(slot, seq int64) int64 {
	if t.passes {
		return t.seqOfPass(slot, t.passOf(slot).Swap(t.passFor(slot, seq)))
	}
	return t.inRow(slot).Swap(seq+1) - 1
}

// CompareAndSwap is atomic.Int64.CompareAndSwap on the slot's stamp.
func (t *stampTable) CompareAndSwap(slot, old, seq int64) bool {
	if t.passes {
		// Readers call this too (stillHolds on weakly ordered CPUs): no
		// writer cache here. Only seqs of slot have pass stamps there:
		// any other old is not there, and any other seq cannot be stored
		// there.
		po, ok1 := t.passOfSeq(slot, old)
		pn, ok2 := t.passOfSeq(slot, seq)
		return ok1 && ok2 && t.passOf(slot).CompareAndSwap(po, pn)
	}
	return t.inRow(slot).CompareAndSwap(old+1, seq+1)
}
