package storage

import (
	"encoding/binary"
	"math"
	"sync"
)

// A memory buffer's row record lives in its row group (anonymous memory,
// never written to disk as such) and takes 32 bytes instead of the file
// record's 64. A file record carries what crash recovery needs: its own
// seq (the writing marker), a data checksum and a record checksum. A memory
// buffer has no crash to recover from, and its stamp table already holds
// each slot's seq. What is left is narrowed to what real rows use: prev_seq
// as a distance back from the row's seq, env and policy_version as 32-bit
// values. A row whose values do not fit (a previous row 2^32 seqs back, an
// env or version outside [0, 2^32)) keeps them in the buffer's wideRecords,
// and its record says so with flagWide.
//
// Checkpoints turn these records back into file records (checkpoint.go);
// restoring one turns the file records into these (interleaveSmallFields).
const (
	memRecordSize = 32

	mrecTraj    = 0  // i64 traj_id
	mrecStep    = 8  // i64 step
	mrecPrev    = 16 // u32 seq - prev_seq; 0 for prev_seq -1
	mrecEnv     = 20 // u32 env
	mrecVersion = 24 // u32 policy_version
	mrecFlags   = 28 // u32 flags, as in the file record, plus flagWide

	// flagWide marks a memory record whose prev_seq, env and
	// policy_version are in the buffer's wideRecords. File records never
	// carry it (recovery rejects unknown flags).
	flagWide = 1 << 31
)

// wideMeta is what a memory record holds in 32-bit slots when it fits.
type wideMeta struct{ PrevSeq, Env, PolicyVersion int64 }

// wideRecords holds the wideMeta of the memory rows flagged flagWide, by
// slot. Writers (holding the buffer's wmu) change it; readers look up a
// slot only when its record is flagged, which real workloads never see, so
// a plain mutex costs nothing on the hot path.
type wideRecords struct {
	mu sync.Mutex
	m  map[int64]wideMeta
	// n is len(m) as writers last left it; only writers read it (to skip
	// the lock when no slot is wide), and they are serialised.
	n int
}

func (w *wideRecords) set(slot int64, v wideMeta) {
	w.mu.Lock()
	if w.m == nil {
		w.m = map[int64]wideMeta{}
	}
	w.m[slot] = v
	w.n = len(w.m)
	w.mu.Unlock()
}

func (w *wideRecords) drop(slot int64) {
	if w.n == 0 {
		return
	}
	w.mu.Lock()
	delete(w.m, slot)
	w.n = len(w.m)
	w.mu.Unlock()
}

// get returns slot's wide values. A slot with none (a reader racing a
// writer that just narrowed the slot; its stamp check drops what it read)
// reads as zeros.
func (w *wideRecords) get(slot int64) wideMeta {
	w.mu.Lock()
	v := w.m[slot]
	w.mu.Unlock()
	return v
}

// narrowFits reports whether r's prev_seq, env and policy_version fit a
// memory record's 32-bit slots.
func narrowFits(r *record) bool {
	const most = math.MaxUint32
	d := r.Seq - r.PrevSeq
	prev := r.PrevSeq == -1 || (r.PrevSeq >= 0 && d >= 1 && d <= most)
	return prev && r.Env >= 0 && r.Env <= most && r.PolicyVersion >= 0 && r.PolicyVersion <= most
}

// putMemRecord writes r (with r.Seq set) as slot's memory record. Called
// by writers only.
func (b *Buffer) putMemRecord(slot int64, r *record) {
	rb := b.recs[slot*b.recPitch : slot*b.recPitch+memRecordSize]
	le := binary.LittleEndian
	le.PutUint64(rb[mrecTraj:], uint64(r.TrajID))
	le.PutUint64(rb[mrecStep:], uint64(r.Step))
	if narrowFits(r) {
		dist := uint32(0)
		if r.PrevSeq >= 0 {
			dist = uint32(r.Seq - r.PrevSeq)
		}
		le.PutUint32(rb[mrecPrev:], dist)
		le.PutUint32(rb[mrecEnv:], uint32(r.Env))
		le.PutUint32(rb[mrecVersion:], uint32(r.PolicyVersion))
		le.PutUint32(rb[mrecFlags:], r.Flags)
		b.wide.drop(slot)
		return
	}
	b.wide.set(slot, wideMeta{PrevSeq: r.PrevSeq, Env: r.Env, PolicyVersion: r.PolicyVersion})
	clear(rb[mrecPrev:mrecFlags])
	le.PutUint32(rb[mrecFlags:], r.Flags|flagWide)
}

// memRecord decodes the memory record of seq's slot into r (r.Seq and
// r.DataCRC are left alone: the stamp table holds the one, memory rows
// have no other).
func (b *Buffer) memRecord(seq int64, r *record) {
	slot := seq % b.capacity
	rb := b.recs[slot*b.recPitch : slot*b.recPitch+memRecordSize]
	le := binary.LittleEndian
	r.TrajID = int64(le.Uint64(rb[mrecTraj:]))
	r.Step = int64(le.Uint64(rb[mrecStep:]))
	flags := le.Uint32(rb[mrecFlags:])
	r.Flags = flags &^ flagWide
	if flags&flagWide != 0 {
		w := b.wide.get(slot)
		r.PrevSeq, r.Env, r.PolicyVersion = w.PrevSeq, w.Env, w.PolicyVersion
		return
	}
	r.PrevSeq = -1
	if d := le.Uint32(rb[mrecPrev:]); d != 0 {
		r.PrevSeq = seq - int64(d)
	}
	r.Env = int64(le.Uint32(rb[mrecEnv:]))
	r.PolicyVersion = int64(le.Uint32(rb[mrecVersion:]))
}

// compactRecords reports whether the buffer's records are memory records
// (a memory buffer's row group) rather than file records.
func (b *Buffer) compactRecords() bool { return b.group != nil }

// loadRecord decodes the record of seq's slot into r without checking it:
// for indexed rows, whose records were checked when written or recovered,
// and for readers that check the slot's stamp afterwards. r.Seq is not
// set.
func (b *Buffer) loadRecord(seq int64, r *record) {
	if b.compactRecords() {
		b.memRecord(seq, r)
		return
	}
	readRecord(b.rec(seq%b.capacity), r)
}

// checkedRecord returns the record of seq's slot and whether it is a
// valid record of seq: for files, its checksums hold and it names seq;
// for memory records, the slot's stamp is seq.
func (b *Buffer) checkedRecord(seq int64) (record, bool) {
	if b.compactRecords() {
		var r record
		b.memRecord(seq, &r)
		r.Seq = b.stamps.Load(seq % b.capacity)
		return r, r.Seq == seq
	}
	r, ok := decodeRecord(b.rec(seq % b.capacity))
	return r, ok && r.Seq == seq
}

// rowGroupPitch is the bytes per row of a memory buffer's row group whose
// small fields take fieldBytes a row: the record and the fields, rounded
// up to a multiple of 8 and, when that fits a cache line, to a power of
// two, so that no row straddles two lines (a sample's row costs one cache
// miss, not two).
func rowGroupPitch(fieldBytes int64) int64 {
	p := (memRecordSize + fieldBytes + 7) &^ 7
	if p <= 64 {
		for q := int64(8); ; q <<= 1 {
			if q >= p {
				return q
			}
		}
	}
	return p
}
