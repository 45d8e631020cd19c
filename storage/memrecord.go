package storage

import (
	"encoding/binary"
	"math"
	"sync"
)

// A memory buffer's row records live in its row group (anonymous memory,
// never written to disk as such), its stamp first. A file record carries
// what crash recovery needs: its own seq (the writing marker), a data
// checksum and a record checksum. A memory buffer has no crash to recover
// from; its stamp (the seqlock word, see stampTable) is the first 8 bytes
// of the record, so a sample's stamp check reads the cache line the record
// and the small fields are in. Two layouts (Spec.RowMetaLayout):
//
//   - "row" (the default): a 32-byte record narrowed to what real rows
//     use: traj_id in 48 bits beside the index's 16-bit next distance,
//     then step, the distance back to prev_seq and policy_version in 32
//     bits, env in 24 and the flags in 8.
//   - "runs": a 16-byte record naming the row's run (memruns.go), which
//     holds what the consecutive rows of a trajectory share.
//   - "strided": an 8-byte record, a run word (handle and flags, as in
//     "runs") and a 32-bit pass stamp (stampTable), naming a run whose
//     rows are equally spaced: offset and distance follow from the seq.
//
// A row whose values fit neither (a previous row 2^32 seqs back, a step
// or version outside [0, 2^32), an env outside [0, 2^24), a traj_id
// outside [0, 2^48) in the row layout; no free run handle in the runs
// layout) keeps them in the
// buffer's wideRecords, and its record says so with flagWide.
//
// Checkpoints turn these records back into file records (checkpoint.go);
// restoring one turns the file records into these (interleaveSmallFields).
const (
	memRecordSize        = 32 // the row layout
	memRunRecordSize     = 16 // the runs layout
	memStridedRecordSize = 8  // the strided layout

	mrecStamp = 0 // i64 stamp (seq+1, 0: none), owned by stampTable, the row and runs layouts

	// The row layout.
	mrecTraj     = 8  // u64: traj_id in the low 48 bits (trajBits), the row's next distance in the high 16 (mrecNext)
	mrecNext     = 14 // u16 seq of the row's successor minus its own, 0: none known; owned by the index (index.deltaRows)
	mrecStep     = 16 // u32 step
	mrecPrev     = 20 // u32 seq - prev_seq; 0 for prev_seq -1
	mrecVersion  = 24 // u32 policy_version
	mrecEnvFlags = 28 // u32: env in the low 24 bits, flags in the high 8

	memEnvBits = 24
	// trajBits are the bits of a traj_id the row layout keeps: 2.8e14
	// trajectories, where a store hands ids out in order from 0 (a row
	// with a larger one is kept wide all the same).
	trajBits = 48

	// The runs layout.
	mrecRun  = 8  // u32: run handle in the low memRunBits bits, flags above
	mrecOff  = 12 // u16 offset of the row in its run
	mrecDist = 14 // u16 seq - prev_seq, for rows past their run's first

	// The strided layout: the run word first, then the pass stamp.
	mrecStridedRun = 0 // u32 as mrecRun

	// flagWide marks a memory record whose values are in the buffer's
	// wideRecords. It is bit 4 of the record's flags (file records never
	// carry it: their flag bits 4-31 must be 0).
	flagWide = 1 << 4
)

// wideMeta is what a memory record holds in narrow slots (or its run)
// when it fits.
type wideMeta struct{ TrajID, Step, PrevSeq, Env, PolicyVersion int64 }

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
// fit the row layout's narrow slots.
func narrowFits(r *record) bool {
	const most = math.MaxUint32
	d := r.Seq - r.PrevSeq
	prev := r.PrevSeq == -1 || (r.PrevSeq >= 0 && d >= 1 && d <= most)
	return prev && r.Step >= 0 && r.Step <= most && r.Env >= 0 && r.Env < 1<<memEnvBits &&
		r.PolicyVersion >= 0 && r.PolicyVersion <= most && r.TrajID >= 0 && r.TrajID < 1<<trajBits
}

// putMemRecord writes r (with r.Seq set) as slot's memory record, all but
// the stamp. Called by writers only, after the slot's stamp is voided.
func (b *Buffer) putMemRecord(slot int64, r *record) {
	if b.runs != nil {
		b.putRunRecord(slot, r)
		return
	}
	rb := b.recs[slot*b.recPitch : slot*b.recPitch+memRecordSize]
	le := binary.LittleEndian
	if narrowFits(r) {
		// traj_id < 2^48: the next distance's bits are zero, none known
		// yet (the index sets it when the successor is added).
		le.PutUint64(rb[mrecTraj:], uint64(r.TrajID))
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
	b.wide.set(slot, wideMeta{TrajID: r.TrajID, Step: r.Step, PrevSeq: r.PrevSeq, Env: r.Env, PolicyVersion: r.PolicyVersion})
	clear(rb[mrecTraj:mrecEnvFlags])
	le.PutUint32(rb[mrecEnvFlags:], (r.Flags|flagWide)<<memEnvBits)
}

// memRecord decodes the memory record of seq's slot into r (r.Seq and
// r.DataCRC are left alone: the stamp is the one, memory rows have no
// other).
func (b *Buffer) memRecord(seq int64, r *record) {
	r.TrajID, r.Step, r.PrevSeq, r.Env, r.PolicyVersion, r.Flags = b.memFields(seq%b.slots, seq)
}

// memFields decodes the memory record of slot, which holds seq.
func (b *Buffer) memFields(slot, seq int64) (traj, step, prev, env, version int64, flags uint32) {
	if b.runs != nil {
		return b.runFields(slot, seq)
	}
	rb := b.recs[slot*b.recPitch : slot*b.recPitch+memRecordSize]
	le := binary.LittleEndian
	traj = int64(le.Uint64(rb[mrecTraj:]) & (1<<trajBits - 1))
	ef := le.Uint32(rb[mrecEnvFlags:])
	flags = ef >> memEnvBits
	if flags&flagWide != 0 {
		w := b.wide.get(slot)
		return w.TrajID, w.Step, w.PrevSeq, w.Env, w.PolicyVersion, flags &^ flagWide
	}
	prev = -1
	if d := le.Uint32(rb[mrecPrev:]); d != 0 {
		prev = seq - int64(d)
	}
	return traj, int64(le.Uint32(rb[mrecStep:])), prev, int64(ef & (1<<memEnvBits - 1)), int64(le.Uint32(rb[mrecVersion:])), flags
}

// evictFields returns what taking the row of seq (at slot) out of the
// index needs of its record: its trajectory, policy version and flags. A
// run layout reads them from the row's run word and run record alone:
// memFields would also work out the row's step and previous seq (a
// division for a strided run), which an eviction never uses.
func (b *Buffer) evictFields(slot, seq int64) (traj, version int64, flags uint32) {
	if b.runs == nil || !b.compactRecords() {
		var r record
		b.loadRecord(seq, &r)
		return r.TrajID, r.PolicyVersion, r.Flags
	}
	le := binary.LittleEndian
	w := le.Uint32(b.recs[slot*b.recPitch+b.runs.wordOff:])
	if flags = w >> memRunBits; flags&flagWide != 0 {
		traj, _, _, _, version, flags = b.wideFields(slot, flags)
		return traj, version, flags
	}
	run := b.runs.rec(w & memRunMask)
	if run == nil {
		return 0, 0, flags // the index then says it is out of step
	}
	return int64(le.Uint64(run[runTraj:])), int64(le.Uint64(run[runVersion:])), flags
}

// memRecordBytes is the size of a memory record in a buffer of spec.
func memRecordBytes(spec Spec) int64 {
	switch spec.RowMetaLayout {
	case RowMetaRuns, RowMetaBlocks:
		return memRunRecordSize
	case RowMetaStrided:
		return memStridedRecordSize
	}
	return memRecordSize
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
	readRecord(b.rec(seq%b.slots), r)
}

// checkedRecord returns the record of seq's slot and whether it is a
// valid record of seq: for files, its checksums hold and it names seq;
// for memory records, the slot's stamp is seq. c is decodeRecord's
// scratch.
func (b *Buffer) checkedRecord(seq int64, c *[recordSize]byte) (record, bool) {
	if b.compactRecords() {
		var r record
		b.memRecord(seq, &r)
		r.Seq = b.stamps.Load(seq % b.slots)
		return r, r.Seq == seq
	}
	r, ok := decodeRecord(b.rec(seq%b.slots), c)
	return r, ok && r.Seq == seq
}

// rowGroupPitch is the bytes per row of a memory buffer's row group whose
// records take recBytes and small fields fieldBytes a row, rounded up to a
// multiple of 8 and, when that fits a cache line, to 16, 32, 48 or 64.
// Pitches of 16, 32 and 64 never put a row across two lines (a sample's
// row costs one cache miss, not two); at 48 half the rows straddle two,
// which the runs layout accepts for a quarter less memory (compact
// CartPole: 16 + 31 bytes; its samples are measured by
// BenchmarkSampleRunMeta). The row layout keeps its rows in one line: its
// pitches are 32 or 64 below a line. The strided layout takes the bytes
// rounded up to a multiple of 8 and no more (its point is memory: compact
// CartPole 8 + 31 bytes in 40).
func rowGroupPitch(recBytes, fieldBytes int64) int64 {
	p := (recBytes + fieldBytes + 7) &^ 7
	if recBytes == memStridedRecordSize {
		return p
	}
	steps := []int64{16, 32, 64}
	if recBytes == memRunRecordSize {
		steps = []int64{16, 32, 48, 64}
	}
	for _, q := range steps {
		if q >= p {
			return q
		}
	}
	return p
}
