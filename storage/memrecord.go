package storage

import (
	"encoding/binary"
	"math"
	"sync"
)

// A memory buffer's row record lives in its row group (anonymous memory,
// never written to disk as such) and takes 32 bytes instead of the file
// record's 64, its stamp included. A file record carries what crash
// recovery needs: its own seq (the writing marker), a data checksum and a
// record checksum. A memory buffer has no crash to recover from; its stamp
// (the seqlock word, see stampTable) is the first 8 bytes of the record,
// so a sample's stamp check reads the cache line the record and the small
// fields are in. The rest is narrowed to what real rows use: step, the
// distance back to prev_seq and policy_version in 32 bits, env in 24 and
// the flags in 8. A row whose values do not fit (a previous row 2^32 seqs
// back, a step or version outside [0, 2^32), an env outside [0, 2^24))
// keeps them in the buffer's wideRecords, and its record says so with
// flagWide.
//
// Checkpoints turn these records back into file records (checkpoint.go);
// restoring one turns the file records into these (interleaveSmallFields).
const (
	memRecordSize = 32

	mrecStamp    = 0  // i64 stamp (seq+1, 0: none), owned by stampTable
	mrecTraj     = 8  // i64 traj_id
	mrecStep     = 16 // u32 step
	mrecPrev     = 20 // u32 seq - prev_seq; 0 for prev_seq -1
	mrecVersion  = 24 // u32 policy_version
	mrecEnvFlags = 28 // u32: env in the low 24 bits, flags in the high 8

	memEnvBits = 24

	// flagWide marks a memory record whose step, prev_seq, env and
	// policy_version are in the buffer's wideRecords. It is bit 7 of the
	// record's flag byte (file records never carry it: their flag bits
	// 4-31 must be 0).
	flagWide = 1 << 7
)

// wideMeta is what a memory record holds in narrow slots when it fits.
type wideMeta struct{ Step, PrevSeq, Env, PolicyVersion int64 }

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

// narrowFits reports whether r's step, prev_seq, env and policy_version
// fit a memory record's narrow slots.
func narrowFits(r *record) bool {
	const most = math.MaxUint32
	d := r.Seq - r.PrevSeq
	prev := r.PrevSeq == -1 || (r.PrevSeq >= 0 && d >= 1 && d <= most)
	return prev && r.Step >= 0 && r.Step <= most && r.Env >= 0 && r.Env < 1<<memEnvBits &&
		r.PolicyVersion >= 0 && r.PolicyVersion <= most
}

// putMemRecord writes r (with r.Seq set) as slot's memory record, all but
// the stamp. Called by writers only.
func (b *Buffer) putMemRecord(slot int64, r *record) {
	rb := b.recs[slot*b.recPitch : slot*b.recPitch+memRecordSize]
	le := binary.LittleEndian
	le.PutUint64(rb[mrecTraj:], uint64(r.TrajID))
	if narrowFits(r) {
		dist := uint32(0)
		if r.PrevSeq >= 0 {
			dist = uint32(r.Seq - r.PrevSeq)
		}
		le.PutUint32(rb[mrecStep:], uint32(r.Step))
		le.PutUint32(rb[mrecPrev:], dist)
		le.PutUint32(rb[mrecVersion:], uint32(r.PolicyVersion))
		le.PutUint32(rb[mrecEnvFlags:], uint32(r.Env)|r.Flags<<memEnvBits)
		b.wide.drop(slot)
		return
	}
	b.wide.set(slot, wideMeta{Step: r.Step, PrevSeq: r.PrevSeq, Env: r.Env, PolicyVersion: r.PolicyVersion})
	clear(rb[mrecStep:mrecEnvFlags])
	le.PutUint32(rb[mrecEnvFlags:], (r.Flags|flagWide)<<memEnvBits)
}

// memRecord decodes the memory record of seq's slot into r (r.Seq and
// r.DataCRC are left alone: the stamp is the one, memory rows have no
// other).
func (b *Buffer) memRecord(seq int64, r *record) {
	r.TrajID, r.Step, r.PrevSeq, r.Env, r.PolicyVersion, r.Flags = b.memFields(seq%b.capacity, seq)
}

// memFields decodes the memory record of slot, which holds seq.
func (b *Buffer) memFields(slot, seq int64) (traj, step, prev, env, version int64, flags uint32) {
	rb := b.recs[slot*b.recPitch : slot*b.recPitch+memRecordSize]
	le := binary.LittleEndian
	traj = int64(le.Uint64(rb[mrecTraj:]))
	ef := le.Uint32(rb[mrecEnvFlags:])
	flags = ef >> memEnvBits
	if flags&flagWide != 0 {
		w := b.wide.get(slot)
		return traj, w.Step, w.PrevSeq, w.Env, w.PolicyVersion, flags &^ flagWide
	}
	prev = -1
	if d := le.Uint32(rb[mrecPrev:]); d != 0 {
		prev = seq - int64(d)
	}
	return traj, int64(le.Uint32(rb[mrecStep:])), prev, int64(ef & (1<<memEnvBits - 1)), int64(le.Uint32(rb[mrecVersion:])), flags
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
