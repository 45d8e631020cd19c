package storage

import (
	"encoding/binary"
	"errors"
	"math/bits"
	"sync/atomic"
	"unsafe"

	"github.com/rbdb/rbd/internal/prefetch"
	"github.com/rbdb/rbd/storage/internal/mmapfile"
)

// A memory buffer keeps what consecutive rows of a trajectory share in run
// records instead of in every row's record. A run is a stretch of rows of
// one trajectory with consecutive steps, one env and one policy_version,
// each row at most maxRunDist seqs after the one before it (envs
// interleave), at most maxRunRows long. Its record holds the trajectory,
// its first step, its first row's prev_seq, the env and the version; a
// row's record keeps a handle to its run, its offset in it (the step is
// first step + offset) and, past the first row, its distance back to the
// row before it. Rows of a CartPole-like workload come in runs of one
// trajectory's length, so the run records cost about a byte a row where
// the 32-byte memory records carried those values in every row.
//
// Run records live in anonymous mappings of runBlockRuns records each,
// mapped as handles reach them (a table sized for every slot up front
// would charge capacity x 64 bytes to the commit limit for runs that
// usually number a thirtieth of the rows). Readers copy them without
// locks and judge what they read by the row's stamp, as they judge the
// row's fields. A run record is written before the
// first row that names it and never changes while a live row names it:
// writers release a run only when the last row naming it is overwritten
// (reference counts, writers only), and the slot's stamp is voided before
// that, so a reader that read the old handle sees its row's stamp change.
// Released handles are reused first (a stack), so the table stays as
// large as the most runs ever live at once.
//
// In a strided table (RowMetaStrided) a run's rows are also equally many
// seqs apart: its record adds the first row's seq, the stride (0 until a
// second row joins) and the stride's reciprocal, and a row's record is
// only its run word (beside its pass stamp): the offset is (seq - first)
// / stride, the previous row seq - stride. A row whose distance back
// differs from its run's stride starts a run. Rows that keep no stride
// (actors sending a step or a few at a time, interleaved as their requests
// arrive) would then cost a run record every few rows: once two runs of a
// trajectory in a row break their stride within their first
// irregularBelow rows, its next run is irregular instead (stride
// irregularStride; one early break alone is what a collector's extend
// leaves at its edge when another writer's rows come between its extends),
// and each of its rows past
// the first keeps its offset and distance back in 4 bytes of a side table
// (runTable.irr), mapped at the first such row, whose pages take memory
// only where such rows were written. An irregular run whose last
// irregularBelow distances were equal ends at the next row at that
// distance, which starts a regular run: rows that come evenly spaced again
// (a trajectory that broke its stride at an extend's edge, from one of
// several collectors) go back to runs without a side table entry.
const (
	// runRecordSize is the room a run record takes: its 40 bytes padded
	// to a cache line, so that reading one costs one miss (runs are
	// fewer than rows by their length: a CartPole-like run of 30 to 80
	// rows puts 1-2 bytes a row here).
	runRecordSize = 64

	runTraj    = 0  // i64 traj_id
	runStep    = 8  // i64 step of the run's first row
	runPrev    = 16 // i64 prev_seq of the run's first row (-1: none)
	runEnv     = 24 // i64 env
	runVersion = 32 // i64 policy_version
	// Strided tables only.
	runFirst  = 40 // i64 seq of the run's first row
	runStride = 48 // i64 seqs between the run's rows; 0 while it has one
	runMagic  = 56 // u64 ceil(2^64 / stride) for strides of 2 and more

	// maxStridedSpan bounds seq - first of a strided run's rows: the
	// reciprocal divides exactly below 2^32, and a run has at most 2^32 - 1
	// rows, which its u32 reference count holds.
	maxStridedSpan = 1<<32 - 2

	// memRunBits is the width of the run handle in a memory record's run
	// word; the flags take the 5 bits above it. Handle 0 names no run.
	memRunBits = 27
	memRunMask = 1<<memRunBits - 1

	maxRunRows = 1 << 16 // a row's offset in its run is a u16
	maxRunDist = 1<<16 - 1

	// irregularStride marks an irregular run of a strided table.
	irregularStride = -1
	// irregularBelow: a run that breaks its stride before this many rows
	// breaks it early; a run that does after one that did makes its
	// trajectory's next run irregular. A regular run costs its 64-byte
	// record, 64/k bytes a row for runs of k rows, an irregular one 4
	// bytes a row past its first: even at 16.
	irregularBelow = 16
	// irrEntry is the bytes a slot takes in the side table.
	irrEntry = 4
	// irrRetryRows is how many rows that would use the side table wait
	// after the OS refused to map it before the next try: a system call
	// (a microsecond or two) per 4,096 rows while the refusal lasts.
	irrRetryRows = 4096

	runBlockBits = 12 // 4,096 run records, 256 KiB, a block
	runBlockRuns = 1 << runBlockBits
)

// runTable hands out and releases the run records of a memory buffer.
// Everything but blocks and handedOut is touched by writers only (holding
// the buffer's wmu).
type runTable struct {
	// blocks[i] holds the records of handles [i, i+1) x runBlockRuns,
	// nil until a handle reaches it. Writers store a block before any
	// row names a handle in it; a reader that finds nil read a torn
	// handle.
	blocks  []atomic.Pointer[runBlock]
	regions []*mmapfile.Region // the blocks' mappings, to close
	limit   int64              // handles below limit exist; 0 names no run
	// strided: runs keep a stride (RowMetaStrided); wordOff is where a
	// row's run word is in its memory record.
	strided bool
	wordOff int64
	// irr is the base of the side table of irregular runs (strided
	// tables; see the comment above runRecordSize): slot's entry is the
	// u16 offset in its run and the u16 distance back at irr + 4 x slot.
	// nil until the first irregular row; irrRegion is its mapping.
	// Writers map it, readers load it. When the OS refuses the mapping
	// (a commit limit under strict overcommit, an address-space limit),
	// rows start runs as without irregular runs (a run record each) and
	// irrWait counts down the rows that would have used the table before
	// the next try (irrRetryRows), so that memory freed later is used
	// without a system call per row while it is not. mapIrr maps the
	// table: mmapfile.Anonymous, or a test's refusal.
	irr       atomic.Pointer[byte]
	irrRegion *mmapfile.Region
	irrWait   int64
	mapIrr    func(size int64) (*mmapfile.Region, error)
	// irrDirty: entries were written since the side table was last given
	// back (writers only). When the last irregular run a row names is
	// released, no row reads the table: its pages go back to the kernel
	// (discardIrr), so that a buffer whose actors have gone keeps no
	// memory for them.
	irrDirty bool
	slots    int64 // the ring's slots
	// irregularLive counts the irregular runs rows name (writers change
	// it; prefetchRuns reads it: while it is 0 no row reads the side
	// table).
	irregularLive atomic.Int64

	refs []uint32 // rows naming each handle handed out so far
	// handedOut is len(refs) for readers: how many run records have
	// ever been written.
	handedOut atomic.Int64
	free      []uint32 // released handles, reused last in first out
	live      int64    // handles with refs > 0

	// open maps a trajectory to the run its next row may continue.
	open map[int64]*openRun
	// recent caches open by the trajectory's low bits: the envs of a
	// batch write trajectories with nearby ids, row after row, and a map
	// lookup and update per row made a CartPole extend 22 µs -> 29-32
	// (BenchmarkExtendRunMeta; 22.5-23.0 with the cache).
	recent [openCacheSize]*openRun
}

const openCacheSize = 256

// runBlock is a block of run records. Blocks are mapped whole (a small
// table's last one too: untouched pages cost nothing), so that a lookup
// indexes an array of known length instead of loading a slice's.
type runBlock [runBlockRuns * runRecordSize]byte

// openRun is where a trajectory's last written row left its run.
type openRun struct {
	traj              int64
	handle            uint32
	off               uint32 // the last row's offset in the run
	lastSeq, lastStep int64
	env, version      int64
	first, stride     int64 // strided tables (stride irregularStride: an irregular run)
	// Irregular runs: the last row's distance back and how many rows in
	// a row, up to the last, came at that distance.
	lastDist int64
	same     int
	// afterEarly: the run follows a run of its trajectory that broke its
	// stride early (regular runs).
	afterEarly bool
}

// newRunTable returns the run table of a ring of slots rows: every slot
// holds at most one reference, so no more than slots runs are ever
// live (handles past 2^27 - 1 do not exist; rows that would need one keep
// their values in wideRecords).
func newRunTable(slots int64, strided bool) *runTable {
	limit := min(slots, memRunMask) + 1
	t := &runTable{
		blocks: make([]atomic.Pointer[runBlock], (limit+runBlockRuns-1)/runBlockRuns),
		limit:  limit, refs: []uint32{0}, open: map[int64]*openRun{},
		strided: strided, wordOff: mrecRun, slots: slots,
		mapIrr: mmapfile.Anonymous,
	}
	if strided {
		t.wordOff = mrecStridedRun
	}
	return t
}

// follows reports whether r, a row of o's trajectory, is the row after
// o's last one, with its env and version: the row continues o's run unless
// the run has no room for it or (strided) its distance back breaks the
// run's stride.
func (t *runTable) follows(o *openRun, r *record) bool {
	return r.PrevSeq == o.lastSeq && r.Step == o.lastStep+1 && r.Env == o.env && r.PolicyVersion == o.version
}

// continues reports whether r, a row of o's trajectory, continues o's run.
func (t *runTable) continues(o *openRun, r *record) bool {
	if !t.follows(o, r) {
		return false
	}
	d := r.Seq - r.PrevSeq
	if o.stride == irregularStride && d == o.lastDist && o.same >= irregularBelow {
		return false // evenly spaced again: a regular run next (irregularAfter)
	}
	if !t.strided || o.stride == irregularStride {
		return d <= maxRunDist && o.off+1 < maxRunRows
	}
	if r.Seq-o.first > maxStridedSpan {
		return false
	}
	return d == o.stride || (o.off == 0 && d >= 1)
}

// irregularAfter reports whether the row that follows o's last one but
// does not continue its run should start an irregular run: o is itself
// irregular (it ran out of room, or the row is too far for 16 bits) and
// its rows did not come evenly spaced again, or o broke its stride early
// after a run that did too; and the side table is (or can be) mapped.
func (t *runTable) irregularAfter(o *openRun) bool {
	switch {
	case !t.strided:
		return false
	case o.stride == irregularStride:
		if o.same >= irregularBelow {
			return false
		}
	case !o.afterEarly || !brokeEarly(o):
		return false
	}
	return t.irrMapped()
}

// brokeEarly reports whether o, a regular run whose stride the next row
// breaks, broke it early.
func brokeEarly(o *openRun) bool { return o.off+1 < irregularBelow }

// irrMapped maps the side table of irregular runs if it is not yet, and
// reports whether it is.
func (t *runTable) irrMapped() bool {
	if t.irr.Load() != nil {
		return true
	}
	if t.irrWait > 0 {
		t.irrWait--
		return false
	}
	r, err := t.mapIrr(t.slots * irrEntry)
	if err != nil {
		t.irrWait = irrRetryRows
		return false
	}
	t.irrRegion = r
	t.irr.Store(unsafe.SliceData(r.Bytes()))
	return true
}

// discardIrr gives the side table's pages back: no row names an irregular
// run, so no row reads an entry. A reader still reading one for a row
// overwritten meanwhile reads zeros, which irregularRow calls torn (its
// stamp check drops the row too). If the kernel refuses, the pages stay.
func (t *runTable) discardIrr() {
	if t.irrRegion != nil && t.irrRegion.Discard() == nil {
		t.irrDirty = false
	}
}

// isIrregular reports whether handle (handed out) names an irregular run.
func (t *runTable) isIrregular(handle uint32) bool {
	return t.strided && int64(binary.LittleEndian.Uint64(t.rec(handle)[runStride:])) == irregularStride
}

// irregularRow returns the offset and distance back the side table holds
// for the row in slot, ok false when there is none (a torn read: the
// caller's stamp check drops the row then anyway).
func (t *runTable) irregularRow(slot int64) (off, dist int64, ok bool) {
	irr := t.irr.Load()
	if irr == nil {
		return 0, 0, false
	}
	e := *irrAt(irr, slot)
	off, dist = int64(e&0xffff), int64(e>>16)
	return off, dist, off > 0 && dist > 0
}

// irrAt is slot's entry in the side table at base.
func irrAt(base *byte, slot int64) *uint32 {
	return (*uint32)(unsafe.Add(unsafe.Pointer(base), slot*irrEntry))
}

// setStride gives o's run, which has one row, the stride of its second.
func (t *runTable) setStride(o *openRun, stride int64) {
	o.stride = stride
	rb := t.rec(o.handle)
	le := binary.LittleEndian
	le.PutUint64(rb[runStride:], uint64(stride))
	var magic uint64
	if stride > 1 {
		magic = ^uint64(0)/uint64(stride) + 1
	}
	le.PutUint64(rb[runMagic:], magic)
}

// stridedOffset is (x / stride) for 0 <= x <= maxStridedSpan, through
// magic = ceil(2^64 / stride) (exact for 32-bit x and stride: Lemire,
// Kaser and Kurz, "Faster remainder by direct computation", 2019): a
// multiply where a division cost 20-40 cycles a decoded row.
func stridedOffset(x, stride int64, magic uint64) int64 {
	if stride == 1 {
		return x
	}
	hi, _ := bits.Mul64(magic, uint64(x))
	return int64(hi)
}

func (t *runTable) close() error {
	if t == nil {
		return nil
	}
	var errs []error
	for _, r := range t.regions {
		errs = append(errs, r.Close())
	}
	if t.irrRegion != nil {
		t.irr.Store(nil)
		errs = append(errs, t.irrRegion.Close())
		t.irrRegion = nil
	}
	return errors.Join(errs...)
}

// rec returns the record of handle, or nil when its block is not mapped
// (a torn handle read by a reader). An array pointer, so that reading its
// fields at constant offsets needs no bounds checks.
func (t *runTable) rec(handle uint32) *[runRecordSize]byte {
	i := int64(handle >> runBlockBits)
	if i >= int64(len(t.blocks)) {
		return nil
	}
	b := t.blocks[i].Load()
	if b == nil {
		return nil
	}
	at := (handle & (runBlockRuns - 1)) * runRecordSize
	return (*[runRecordSize]byte)(b[at : at+runRecordSize])
}

// openOf returns the open run of traj, or nil.
func (t *runTable) openOf(traj int64) *openRun {
	if o := t.recent[traj&(openCacheSize-1)]; o != nil && o.traj == traj {
		return o
	}
	o := t.open[traj]
	if o != nil {
		t.recent[traj&(openCacheSize-1)] = o
	}
	return o
}

// closeOpen forgets o, the open run of its trajectory.
func (t *runTable) closeOpen(o *openRun) {
	delete(t.open, o.traj)
	if c := &t.recent[o.traj&(openCacheSize-1)]; *c == o {
		*c = nil
	}
}

// place returns the run and offset of row r (r.Seq set), continuing the
// open run of r's trajectory when r extends it and starting a run
// otherwise, and counts the reference; irregular says the run is an
// irregular one (strided tables), whose rows past the first keep their
// offset and distance in the side table. ok is false when no handle is
// free: the row then names no run.
func (t *runTable) place(r *record) (handle, off uint32, irregular, ok bool) {
	o := t.openOf(r.TrajID)
	if o != nil && t.continues(o, r) {
		if t.strided && o.stride == 0 {
			t.setStride(o, r.Seq-r.PrevSeq)
		}
		if o.stride == irregularStride {
			if d := r.Seq - r.PrevSeq; d == o.lastDist {
				o.same++
			} else {
				o.lastDist, o.same = d, 1
			}
		}
		o.off++
		o.lastSeq, o.lastStep = r.Seq, r.Step
		t.refs[o.handle]++
		handle, off, irregular = o.handle, o.off, o.stride == irregularStride
		if r.Flags&flagDone != 0 {
			t.closeOpen(o) // nothing follows a trajectory's last row
		}
		return handle, off, irregular, true
	}
	var afterEarly bool
	if o != nil {
		if t.follows(o, r) {
			irregular = t.irregularAfter(o)
			afterEarly = !irregular && t.strided && o.stride != irregularStride && brokeEarly(o)
		}
		t.closeOpen(o)
	}
	h, ok := t.alloc()
	if !ok {
		return 0, 0, false, false
	}
	rb := t.rec(h)
	le := binary.LittleEndian
	le.PutUint64(rb[runTraj:], uint64(r.TrajID))
	le.PutUint64(rb[runStep:], uint64(r.Step))
	le.PutUint64(rb[runPrev:], uint64(r.PrevSeq))
	le.PutUint64(rb[runEnv:], uint64(r.Env))
	le.PutUint64(rb[runVersion:], uint64(r.PolicyVersion))
	var stride int64
	if irregular {
		stride = irregularStride
		t.irregularLive.Add(1)
	}
	if t.strided {
		le.PutUint64(rb[runFirst:], uint64(r.Seq))
		le.PutUint64(rb[runStride:], uint64(stride))
		le.PutUint64(rb[runMagic:], 0)
	}
	t.refs[h] = 1
	t.live++
	if r.Flags&flagDone == 0 {
		o := &openRun{traj: r.TrajID, handle: h, lastSeq: r.Seq, lastStep: r.Step, env: r.Env, version: r.PolicyVersion, first: r.Seq, stride: stride, afterEarly: afterEarly}
		t.open[r.TrajID] = o
		t.recent[r.TrajID&(openCacheSize-1)] = o
	}
	return h, 0, irregular, true
}

func (t *runTable) alloc() (uint32, bool) {
	if n := len(t.free); n > 0 {
		h := t.free[n-1]
		t.free = t.free[:n-1]
		return h, true
	}
	h := int64(len(t.refs))
	if h >= t.limit {
		return 0, false
	}
	if blk := &t.blocks[h>>runBlockBits]; blk.Load() == nil {
		r, err := mmapfile.Anonymous(int64(len(runBlock{})))
		if err != nil {
			return 0, false // the row keeps its values in wideRecords
		}
		t.regions = append(t.regions, r)
		blk.Store((*runBlock)(r.Bytes()))
	}
	t.refs = append(t.refs, 0)
	t.handedOut.Store(h + 1)
	return uint32(h), true
}

// release drops a row's reference to handle (0: none). The last one frees
// the run, and the trajectory can no longer continue it.
func (t *runTable) release(handle uint32) {
	if handle == 0 {
		return
	}
	if t.refs[handle]--; t.refs[handle] != 0 {
		return
	}
	t.live--
	t.free = append(t.free, handle)
	if t.isIrregular(handle) && t.irregularLive.Add(-1) == 0 && t.irrDirty {
		t.discardIrr()
	}
	traj := int64(binary.LittleEndian.Uint64(t.rec(handle)[runTraj:]))
	if o := t.openOf(traj); o != nil && o.handle == handle {
		t.closeOpen(o)
	}
}

// runsInCache is the size of run table below which prefetchRuns does
// nothing: a table that small stays in the L2 cache of the CPUs this runs
// on (1-2 MiB a core), where the pass costs more than the hits it would
// speed up (BenchmarkSampleRunMeta at 10^5 rows without the pass: slice
// samples 6% faster, uniform 2%).
const runsInCache = 256 << 10

// prefetchRuns asks for the run records the memory records of seqs (< 0
// skipped) name, and their side table entries while a strided table has
// irregular runs (for every row: which rows are irregular is in the run
// records being asked for). A run record is a second, dependent miss per row in a
// large ring: read one row at a time, the misses would be served one
// after another. The records' own lines were asked for before.
func (b *Buffer) prefetchRuns(seqs []int64, ring ringSlots) {
	irr := b.runs.irr.Load()
	if irr != nil && (b.runs.slots*irrEntry <= runsInCache || b.runs.irregularLive.Load() == 0) {
		irr = nil
	}
	if irr == nil && b.runs.handedOut.Load()*runRecordSize <= runsInCache {
		return
	}
	recs, runs, pitch, at := b.recs, b.runs, b.recPitch, b.runs.wordOff
	for _, seq := range seqs {
		if seq < 0 {
			continue
		}
		slot := ring.of(seq)
		w := binary.LittleEndian.Uint32(recs[slot*pitch+at:])
		if run := runs.rec(w & memRunMask); run != nil {
			prefetch.Line(unsafe.Pointer(run))
		}
		if irr != nil {
			prefetch.Line(unsafe.Pointer(irrAt(irr, slot)))
		}
	}
}

// putRunRecord writes r (with r.Seq set) as slot's runs-layout record and
// releases the run the slot's previous row named. Called by writers only,
// after the slot's stamp is voided.
func (b *Buffer) putRunRecord(slot int64, r *record) {
	if b.runs.strided {
		b.putStridedRecord(slot, r)
		return
	}
	rb := b.recs[slot*b.recPitch : slot*b.recPitch+memRunRecordSize]
	le := binary.LittleEndian
	b.runs.release(le.Uint32(rb[mrecRun:]) & memRunMask)
	h, off, _, ok := b.runs.place(r)
	if !ok {
		b.setWide(slot, r, rb[mrecRun:])
		le.PutUint32(rb[mrecOff:], 0)
		return
	}
	b.wide.drop(slot)
	var dist uint16
	if off > 0 {
		dist = uint16(r.Seq - r.PrevSeq) // place keeps it within maxRunDist
	}
	le.PutUint32(rb[mrecRun:], h|r.Flags<<memRunBits)
	le.PutUint16(rb[mrecOff:], uint16(off))
	le.PutUint16(rb[mrecDist:], dist)
}

// putStridedRecord is putRunRecord for a strided table, whose record is the
// run word alone, beside the pass stamp. It is stored plainly, as every
// record and field is (the stamp's store publishes them: an atomic store
// of the run word, a locked exchange on amd64, made 256-row extends 5-10%
// slower).
func (b *Buffer) putStridedRecord(slot int64, r *record) {
	word := b.recs[slot*b.recPitch+mrecStridedRun : slot*b.recPitch+mrecStridedRun+4]
	le := binary.LittleEndian
	b.runs.release(le.Uint32(word) & memRunMask)
	h, off, irregular, ok := b.runs.place(r)
	if !ok {
		b.setWide(slot, r, word)
		return
	}
	b.wide.drop(slot)
	if irregular && off > 0 {
		// place keeps both within 16 bits for irregular runs.
		*irrAt(b.runs.irr.Load(), slot) = off | uint32(r.Seq-r.PrevSeq)<<16
		b.runs.irrDirty = true
	}
	le.PutUint32(word, h|r.Flags<<memRunBits)
}

// setWide keeps r's values in the buffer's wideRecords (no run handle was
// free) and marks the slot's run word so.
func (b *Buffer) setWide(slot int64, r *record, word []byte) {
	b.wide.set(slot, wideMeta{TrajID: r.TrajID, Step: r.Step, PrevSeq: r.PrevSeq, Env: r.Env, PolicyVersion: r.PolicyVersion})
	binary.LittleEndian.PutUint32(word, (r.Flags|flagWide)<<memRunBits)
}

// runFields decodes the runs-layout record of slot, which holds seq. A
// record read while a writer replaces it may name a run being rewritten,
// or none: the caller's stamp check drops what it returns then, and a
// handle outside the table reads as zeros rather than faulting.
func (b *Buffer) runFields(slot, seq int64) (traj, step, prev, env, version int64, flags uint32) {
	if b.runs.strided {
		return b.stridedFields(slot, seq)
	}
	rb := b.recs[slot*b.recPitch : slot*b.recPitch+memRunRecordSize]
	le := binary.LittleEndian
	w := le.Uint32(rb[mrecRun:])
	flags = w >> memRunBits
	if flags&flagWide != 0 {
		return b.wideFields(slot, flags)
	}
	run := b.runs.rec(w & memRunMask)
	if run == nil {
		return 0, 0, -1, 0, 0, flags
	}
	off := int64(le.Uint16(rb[mrecOff:]))
	traj, step = int64(le.Uint64(run[runTraj:])), int64(le.Uint64(run[runStep:]))+off
	env, version = int64(le.Uint64(run[runEnv:])), int64(le.Uint64(run[runVersion:]))
	if off == 0 {
		prev = int64(le.Uint64(run[runPrev:]))
	} else {
		prev = seq - int64(le.Uint16(rb[mrecDist:]))
	}
	return traj, step, prev, env, version, flags
}

// wideFields returns the values of a row flagged flagWide.
func (b *Buffer) wideFields(slot int64, flags uint32) (traj, step, prev, env, version int64, _ uint32) {
	v := b.wide.get(slot)
	return v.TrajID, v.Step, v.PrevSeq, v.Env, v.PolicyVersion, flags &^ flagWide
}

// stridedFields is runFields for a strided table. A torn read may also
// find another run's first seq and stride (a seq before its first row or
// past its span); what it returns then is dropped by the stamp check too.
func (b *Buffer) stridedFields(slot, seq int64) (traj, step, prev, env, version int64, flags uint32) {
	le := binary.LittleEndian
	w := le.Uint32(b.recs[slot*b.recPitch+mrecStridedRun:])
	flags = w >> memRunBits
	if flags&flagWide != 0 {
		return b.wideFields(slot, flags)
	}
	run := b.runs.rec(w & memRunMask)
	if run == nil {
		return 0, 0, -1, 0, 0, flags
	}
	traj, step = int64(le.Uint64(run[runTraj:])), int64(le.Uint64(run[runStep:]))
	env, version = int64(le.Uint64(run[runEnv:])), int64(le.Uint64(run[runVersion:]))
	x := seq - int64(le.Uint64(run[runFirst:]))
	if x == 0 {
		return traj, step, int64(le.Uint64(run[runPrev:])), env, version, flags
	}
	stride := int64(le.Uint64(run[runStride:]))
	if x < 0 || x > maxStridedSpan || stride <= 0 {
		if stride == irregularStride && x > 0 {
			if off, dist, ok := b.runs.irregularRow(slot); ok {
				return traj, step + off, seq - dist, env, version, flags
			}
		}
		return 0, 0, -1, 0, 0, flags // torn
	}
	return traj, step + stridedOffset(x, stride, le.Uint64(run[runMagic:])), seq - stride, env, version, flags
}
