package storage

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rbdb/rbd/internal/series"
	"github.com/rbdb/rbd/ratelimit"
	"github.com/rbdb/rbd/storage/internal/mmapfile"
)

// column is one field (or one tail store) laid out as capacity fixed-size
// rows. Row bytes live in an mmap'd region: a file for persistent kinds, or
// anonymous memory for memory buffers.
type column struct {
	name     string // field name; "next.<k>" for tail columns
	file     string // file name inside the buffer dir
	role     uint32
	field    Field
	rowBytes int
	// cz is the column's index among the compressed fields of a
	// compressed buffer (its bytes live in chunks, not in data), or -1.
	cz     int
	region *mmapfile.Region // nil for a column in the buffer's row group
	data   []byte           // capacity*rowBytes, after the header for files
	// stride is the distance in data from one row to the next. Zero means
	// rowBytes (one column after another); a memory buffer's small fields
	// share rows instead (see interleaveSmallFields), so stride is the
	// group's row size and data starts at the column's offset in it.
	stride int64
	// groupOff is the column's offset in the row group's rows (when
	// stride is not zero).
	groupOff int64
	// sparse marks a tail column file whose blocks are allocated only
	// where a row has a final observation (sparseTail); held has a bit per
	// slot whose blocks are allocated (punchTails); noPunch says its
	// filesystem refused to punch holes. held and noPunch: writers only.
	sparse, noPunch bool
	held            slotBits
	// dense marks a dense tail file (densetail.go): entries of rowBytes
	// and a trailer, stride apart, placed by the buffer's tailIndex.
	dense bool
}

func (c *column) row(slot int64) []byte {
	off := slot * c.pitch()
	return c.data[off : off+int64(c.rowBytes)]
}

func (c *column) pitch() int64 {
	if c.stride != 0 {
		return c.stride
	}
	return int64(c.rowBytes)
}

// rowGroupMaxField is the largest field a memory buffer interleaves with
// the others: a gather of a few-dozen-byte row then costs one or two cache
// misses for every field together instead of one per field. Larger fields
// (images) stay in their own column, where a row is one long copy.
const rowGroupMaxField = 128

// Buffer is a named ring of rows with a schema, trajectory links and an
// index of live trajectories. All methods are safe for concurrent use.
type Buffer struct {
	name  string
	spec  Spec
	uid   uint64
	dir   string // "" for memory buffers
	store *Store
	log   *slog.Logger

	persistent bool
	capacity   int64 // the window: the last capacity seqs are live
	// slots is how many slots the ring maps seqs onto (seq mod slots):
	// the capacity, or more with a spare block (ringSlotCount). Every
	// per-slot structure has slots entries.
	slots    int64
	cols     []*column // spec fields, in spec order
	tails    []*column // final observations per obs key (compact buffers)
	tailOf   map[string]int
	colOf    map[string]int
	meta     *mmapfile.Region
	group    *mmapfile.Region // a memory buffer's records and small fields, row-major (nil: none)
	hdr      []byte           // meta header (nil for memory buffers)
	recs     []byte           // slots records, recPitch bytes apart
	recPitch int64            // recordSize, or the row group's row size
	// tailIx places a compact memory buffer's final observations densely
	// in its tail columns, and a memmap buffer's in dense tail files (nil
	// for other buffers: their tails are at the slot). tailScan is what
	// recovery read of dense tail files (nil outside recover).
	tailIx   *tailIndex
	tailScan *denseTailScan
	// wide holds the values of the memory records that do not fit their
	// 32-bit slots (see memRecordSize); empty in real workloads.
	wide     wideRecords
	runs     *runTable // a memory buffer's run records (memruns.go)
	doneCol  int       // index of next.done in cols
	termCol  int       // index of next.terminated, -1 if absent
	truncCol int       // index of next.truncated, -1 if absent

	// rlog and drecs belong to a memmap buffer with row_meta "runs":
	// rows.meta in format version 2 and its run log (runlog.go). Its
	// readers and writers use memory records in group, as a memory
	// buffer's with run records do; drecs are the version 2 file records
	// (16 bytes a slot), written for crash recovery, read only by it.
	rlog  *runLog
	drecs []byte
	// blk is a memmap buffer's with row_meta "blocks" (rows.meta version
	// 3, blocks.go): it has rlog too (a version 3 run log), no drecs.
	// Elsewhere "rlog != nil && blk == nil" means version 2 records.
	blk *blockWriter

	// stamps holds the seq of the complete row in each slot (see
	// stampTable): readers use it as a seqlock, so they never return a torn
	// row.
	stamps stampTable

	// life is held shared by every call that touches the mapping and
	// exclusively by Delete/close, so unmapping never happens under a reader.
	life   sync.RWMutex
	closed atomic.Bool
	// failed is set by recoverFault when touching a mapping faulted: every call
	// after that returns it (wrapping ErrIO).
	failed atomic.Pointer[error]

	// limiter is the buffer's flow control (off without a rate_limit);
	// its parameters, not spec.RateLimit, are the current ones.
	limiter *ratelimit.Limiter
	// snapRateLimit is the limiter state of the running store whose
	// snapshot this read-only store was opened from (Info shows it).
	snapRateLimit *ratelimit.State
	// rlShown is the limiter version the last snapshot showed.
	rlShown atomic.Uint64

	// cs holds the compressed fields of compressed buffers (nil otherwise).
	cs *chunkStore

	// wmu serialises writers: seq allocation, row copies and stream state.
	wmu        sync.Mutex
	streams    map[string]map[int64]*streamPos // guarded by wmu
	streamUsed map[string]time.Time            // last extend of each stream in streams, guarded by wmu
	seqRes     atomic.Int64                    // seqs below this may have been handed out (durable in the catalog); raised with catMu held
	// seqResNext is a reservation being committed ahead of need
	// (reserveAhead), 0 when none: the state committed carries it, but
	// writers may not use it until it is durable and in seqRes.
	seqResNext atomic.Int64
	// wit is the seq witness a memmap buffer's writer raises (nil: none,
	// or not writable); witnessEnd is what the open found in it, when
	// witnessed (witness.go).
	wit        *seqWitness
	witnessEnd int64
	witnessed  bool
	// lapsHeld counts syncs under way that keep a none buffer from
	// reserving a lap (cutLapReservation).
	lapsHeld atomic.Int32
	// reservingAhead is set while a reserveAhead goroutine runs.
	reservingAhead atomic.Bool
	recScratch     [recordSize]byte // a record being built, guarded by wmu
	// crcScratch holds a row's checksummed field bytes side by side
	// while it is written (guarded by wmu): staged and checksummed in one
	// call a CartPole row takes 15 ns, a call per field 35
	// (BenchmarkRowChecksum).
	crcScratch [crcScratchSize]byte
	// runStage holds the checksummed bytes of an extend's rows side by
	// side (stageRunRows; version 2 memmap buffers), guarded by wmu.
	runStage []byte
	recBatch []record // the records of the extend being written (batchRecords), guarded by wmu
	// punchFrom is the first seq whose row punchTails has not looked at
	// (sparse tail files), guarded by wmu.
	punchFrom int64

	// imu guards the trajectory index. Writers hold it only to evict and to
	// publish rows, never while copying bytes.
	imu sync.RWMutex
	ix  index

	writeCount atomic.Int64 // rows ever written; the next seq

	notifyMu sync.Mutex
	notify   chan struct{} // closed (and replaced) when rows are published
	sampled  atomic.Int64  // rows returned by samples (for info and metrics)
	// activity is the last minutes of write_count, samples served and
	// size, a point per second with a change (Activity).
	activity *series.Ring

	sync syncState
	// prio is the prioritised-replay state (nil without spec.Priority),
	// guarded by imu.
	prio *priorities

	// catMu serialises catalog commits of the buffer's state (taken after
	// wmu when both are held).
	catMu sync.Mutex
	// committed is the state last committed to the catalog (nil: unknown),
	// guarded by catMu: checkpoints skip a commit that would change nothing.
	committed *bufferState
	// mutGen is the seqlock of mutable fields: odd while UpdateFields
	// rewrites them, bumped twice per update. Readers copy mutable
	// columns optimistically and copy again if it moved (readMutable).
	// umu serialises updates (taken after wmu).
	mutGen atomic.Uint64
	umu    sync.Mutex
	// dirty is set by every change a checkpoint must make durable (rows
	// written, priorities set) and cleared by the checkpoint that starts
	// after it, so the checkpoint loop skips idle buffers without taking a
	// lock.
	dirty atomic.Bool
	// writeFence is written by every extend between voiding the stamps of
	// the slots it overwrites and writing them: an atomic add is a full
	// memory barrier (write).
	writeFence atomic.Int64
	// stateMu guards the catalog-side state below.
	stateMu sync.Mutex
	holes   [][2]int64
	damage  []string // problems found by recovery, for Info and verify
	// damaged is the seqs of the rows recovery dropped as damage, merged
	// ranges in order: a hot checkpoint leaves them out as it leaves out
	// holes (they have no stamp, and were not overwritten).
	damaged [][2]int64
	// letGo counts the rows recovery let go under the fsync exception
	// (rows at the bottom of the window, or a final observation, that an
	// unacknowledged write may have been overwriting when power was lost):
	// neither served nor reported as damage, counted by verify.
	letGo     int64
	createdAt time.Time
}

// Name returns the buffer's name.
func (b *Buffer) Name() string { return b.name }

// Spec returns a copy of the buffer's spec, defaults filled in, with its
// current rate limit.
func (b *Buffer) Spec() Spec {
	s := b.spec.Clone()
	s.RateLimit = b.limiter.Params()
	return s
}

// Capacity returns the ring size in rows.
func (b *Buffer) Capacity() int64 { return b.capacity }

// WriteCount returns the number of rows ever written (the next seq).
func (b *Buffer) WriteCount() int64 { return b.writeCount.Load() }

// enter marks the start of a call that uses the buffer's memory; it fails
// once the buffer is being deleted or closed.
func (b *Buffer) enter() error {
	b.life.RLock()
	if b.closed.Load() {
		b.life.RUnlock()
		return fmt.Errorf("buffer %q: %w", b.name, ErrClosed)
	}
	if e := b.failed.Load(); e != nil {
		b.life.RUnlock()
		return *e
	}
	return nil
}

func (b *Buffer) leave() { b.life.RUnlock() }

func bufferDir(root, name string) string { return filepath.Join(root, "buffers", name) }

func metaFile(dir string) string { return filepath.Join(dir, "rows.meta") }

// File names inside a buffer dir (docs/format.md).
func colFileName(field string) string { return "f." + field + ".col" }
func tailFileName(key string) string  { return "tail." + key + ".col" }

func colFile(dir, field string) string { return filepath.Join(dir, colFileName(field)) }
func tailFile(dir, key string) string  { return filepath.Join(dir, tailFileName(key)) }

// newBuffer builds the in-memory shell of a buffer; its columns are mapped
// by createFiles or openFiles.
func newBuffer(s *Store, name string, spec Spec, uid uint64, slots int64) (*Buffer, error) {
	b := &Buffer{
		name:       name,
		spec:       spec,
		uid:        uid,
		store:      s,
		log:        s.log.With("buffer", name),
		persistent: spec.Storage != KindMemory,
		capacity:   spec.Capacity,
		slots:      slots,
		recPitch:   recordSize,
		tailOf:     map[string]int{},
		colOf:      map[string]int{},
		termCol:    -1,
		truncCol:   -1,
		streams:    map[string]map[int64]*streamPos{},
		streamUsed: map[string]time.Time{},
		limiter:    ratelimit.New(spec.RateLimit, 0),
		activity:   series.New(ActivityWindow, activityWidth),
	}
	if b.persistent {
		b.dir = bufferDir(s.dir, name)
	}
	if spec.runLogFiles() {
		b.rlog = newRunLog(b)
	}
	if spec.blockFiles() {
		b.blk = &blockWriter{}
	}
	for i, f := range spec.Fields {
		b.colOf[f.Name] = i
		b.cols = append(b.cols, &column{name: f.Name, file: colFileName(f.Name), role: roleField, field: f, rowBytes: f.RowBytes(), cz: -1})
		switch f.Name {
		case "next.done":
			b.doneCol = i
		case "next.terminated":
			b.termCol = i
		case "next.truncated":
			b.truncCol = i
		}
	}
	if spec.CompactObs {
		for i, k := range spec.ObsKeys {
			f, _ := spec.Field(k)
			tf := Field{Name: "next." + k, DType: f.DType, Shape: f.Shape}
			b.tailOf[tf.Name] = i
			b.tails = append(b.tails, &column{name: tf.Name, file: tailFileName(k), role: roleTail, field: tf, rowBytes: f.RowBytes(), cz: -1,
				sparse: b.persistent && sparseTail(f.RowBytes())})
		}
	}
	if spec.Priority != nil {
		pf := Field{Name: "priority", DType: Float64, Shape: []int{}}
		b.prio = newPriorities(spec.Priority.Alpha, spec.Priority.Eps, slots,
			&column{name: pf.Name, file: "priority.col", role: rolePriority, field: pf, rowBytes: 8, cz: -1})
	}
	b.notify = make(chan struct{})
	stamps, err := newStampTable(slots)
	if err != nil {
		return nil, fmt.Errorf("buffer %q: %w", name, err)
	}
	b.stamps = stamps
	b.ix.init(slots)
	b.sync.init()
	if spec.Storage == KindCompressed {
		cs, err := newChunkStore(b)
		if err != nil {
			return nil, errors.Join(err, b.stamps.close())
		}
		if cs != nil {
			b.cs = cs
		}
	}
	return b, nil
}

// allColumns lists the columns kept in fixed-size rows (mapped files or
// memory): every column but the compressed ones.
func (b *Buffer) allColumns() []*column {
	var out []*column
	for _, c := range slices.Concat(b.cols, b.tails) {
		if c.cz < 0 {
			out = append(out, c)
		}
	}
	if b.prio != nil {
		out = append(out, b.prio.col)
	}
	return out
}

// mapMemory allocates anonymous regions for a memory buffer: the row group
// (records and small fields) and a column for each other field.
func (b *Buffer) mapMemory() (retErr error) {
	defer func() {
		if retErr != nil {
			retErr = errors.Join(retErr, b.unmap())
		}
	}()
	if err := b.interleaveSmallFields(false); err != nil {
		return err
	}
	if len(b.tails) > 0 {
		b.tailIx = newTailIndex(b.capacity, b.tails)
	}
	for _, c := range b.allColumns() {
		if c.stride != 0 {
			continue // in the row group
		}
		rows := b.slots
		if c.role == roleTail {
			rows = b.tailIx.rows
		}
		r, err := mmapfile.Anonymous(rows * int64(c.rowBytes))
		if err != nil {
			return fmt.Errorf("buffer %q field %q: %w", b.name, c.name, err)
		}
		c.region, c.data = r, r.Bytes()
	}
	return nil
}

func (b *Buffer) colHeaderFor(c *column) colHeader {
	v := FormatVersion // and for tails at the slot
	switch {
	case c.dense && b.blk != nil:
		v = tailVersionDenseV3
	case c.dense:
		v = tailVersionDense
	}
	return colHeader{
		Version: v, Role: c.role, UID: b.uid,
		Capacity: uint64(b.capacity), RowBytes: uint64(c.rowBytes),
		DType: c.field.DType, Shape: c.field.Shape, Name: c.field.Name,
	}
}

// createFiles makes the directory and files of a new persistent buffer.
// Headers are synced before the catalog entry is committed, so a crash in
// between leaves only an orphan directory that the next create replaces.
func (b *Buffer) createFiles() (retErr error) {
	if err := os.RemoveAll(b.dir); err != nil {
		return fmt.Errorf("clear %s: %w", b.dir, err)
	}
	if err := os.MkdirAll(b.dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", b.dir, err)
	}
	defer func() {
		if retErr != nil {
			retErr = errors.Join(retErr, b.unmap(), os.RemoveAll(b.dir))
		}
	}()
	if b.spec.Storage == KindMemmap && len(b.tails) > 0 && (!b.store.slotTails || b.blk != nil) {
		b.setDenseTails()
	}
	for _, c := range b.allColumns() {
		path := filepath.Join(b.dir, c.file)
		create := mmapfile.Create
		if c.sparse || c.dense {
			create = func(path string, size int64) (*mmapfile.Region, error) {
				return mmapfile.CreateSparse(path, size, headerSize)
			}
		}
		r, err := create(path, b.colFileSize(c))
		if err != nil {
			return err
		}
		c.region = r
		copy(r.Bytes(), b.colHeaderFor(c).encode())
		c.data = r.Bytes()[headerSize:]
		c.adviseDense()
		if err := r.SyncRange(0, headerSize); err != nil {
			return err
		}
	}
	r, err := mmapfile.Create(metaFile(b.dir), b.metaFileSize())
	if err != nil {
		return err
	}
	b.meta = r
	copy(r.Bytes(), b.metaHeader().encode())
	if err := b.mapRecords(r); err != nil {
		return err
	}
	if err := r.SyncRange(0, headerSize); err != nil {
		return err
	}
	return syncDir(b.dir)
}

// metaFileSize is the size of the buffer's rows.meta.
func (b *Buffer) metaFileSize() int64 {
	if b.blk != nil {
		return metaV3Size(b.slots)
	}
	return headerSize + b.slots*b.fileRecordSize()
}

// fileRecordSize is the size of a rows.meta record of this buffer
// (versions 1 and 2; version 3 keeps none).
func (b *Buffer) fileRecordSize() int64 {
	if b.rlog != nil {
		return fileRunRecordSize
	}
	return recordSize
}

// metaHeader is the rows.meta header of this buffer (watermark 0).
func (b *Buffer) metaHeader() metaHeader {
	h := metaHeader{Version: FormatVersion, RecordSize: recordSize, UID: b.uid, Capacity: uint64(b.capacity), Name: b.name}
	switch {
	case b.blk != nil:
		h.Version, h.RecordSize, h.BlockRows, h.Slots = metaVersionBlocks, 0, blockRows, uint64(b.slots)
	case b.rlog != nil:
		h.Version, h.RecordSize = metaVersionRuns, fileRunRecordSize
	}
	return h
}

// mapRecords points the buffer at the records of r, its rows.meta: file
// records read and written in place, or, with a run log, version 2
// records beside memory records in an anonymous region of their own, as
// in a memory buffer of the same row_meta: 16 bytes a slot with "runs"
// (the stamp, the run handle, the offset and the distance), 8 with
// "strided" (a pass stamp and the run word: 8 bytes a slot less for
// uniform samples 7% slower and slices 6% at 10^5 rows,
// docs/performance.md).
func (b *Buffer) mapRecords(r *mmapfile.Region) error {
	b.hdr = r.Bytes()[:headerSize]
	if b.rlog == nil {
		b.recs = r.Bytes()[headerSize:]
		return nil
	}
	if b.blk == nil {
		b.drecs = r.Bytes()[headerSize:]
	}
	size, strided := int64(memRunRecordSize), b.spec.RowMetaLayout == RowMetaStrided
	if strided {
		size = memStridedRecordSize
	}
	g, err := mmapfile.Anonymous(b.slots * size)
	if err != nil {
		return fmt.Errorf("buffer %q records: %w", b.name, err)
	}
	b.group, b.recs, b.recPitch, b.runs = g, g.Bytes(), size, newRunTable(b.slots, strided)
	return b.stamps.inRows(g.Bytes(), size, strided)
}

// openFiles maps the files of an existing persistent buffer and checks
// every header against the catalog. Writable, it also reserves whatever
// blocks of them are not allocated (files of an older build, or copied
// sparse), so that no later write through a mapping can fault.
func (b *Buffer) openFiles(writable bool) (retErr error) {
	defer func() {
		if retErr != nil {
			retErr = errors.Join(retErr, b.unmap())
		} else if writable {
			retErr = b.reserveFiles()
		}
	}()
	if b.spec.Storage == KindMemmap && len(b.tails) > 0 {
		if err := b.openTailsUpgradeState(writable); err != nil {
			return err
		}
		dense, err := b.tailFilesDense()
		if err != nil {
			return err
		}
		if dense {
			b.setDenseTails()
		}
	}
	for _, c := range b.allColumns() {
		path := filepath.Join(b.dir, c.file)
		r, err := mmapfile.Open(path, b.colFileSize(c), writable)
		if err != nil {
			var se *mmapfile.SizeError
			if errors.As(err, &se) {
				return &CorruptionError{Path: path, Offset: -1, Err: err}
			}
			return err
		}
		c.region = r
		h, err := decodeColHeader(path, r.Bytes())
		if err != nil {
			return err
		}
		want := b.colHeaderFor(c)
		if h.UID != want.UID {
			return corruptf(path, 16, "file belongs to another buffer (uid %016x, catalog says %016x)", h.UID, want.UID)
		}
		if h.Role != want.Role || h.Capacity != want.Capacity || h.RowBytes != want.RowBytes || h.DType != want.DType || h.Name != want.Name || !equalInts(h.Shape, want.Shape) {
			return corruptf(path, 0, "header describes %s %v %q capacity %d, catalog says %s %v %q capacity %d",
				h.DType, h.Shape, h.Name, h.Capacity, want.DType, want.Shape, want.Name, want.Capacity)
		}
		if h.Version != want.Version {
			return fmt.Errorf("%s: column format version %d, this build reads %d for %s columns: %w", path, h.Version, want.Version, c.name, ErrVersionMismatch)
		}
		c.data = r.Bytes()[headerSize:]
		c.adviseDense()
		if c.sparse && writable {
			b.markHeldTails(c)
		}
	}
	path, err := b.openUpgradeState(writable)
	if err != nil {
		return err
	}
	r, err := mmapfile.Open(path, b.metaFileSize(), writable)
	if err != nil {
		var se *mmapfile.SizeError
		if errors.As(err, &se) {
			return &CorruptionError{Path: path, Offset: -1, Err: err}
		}
		return err
	}
	b.meta = r
	h, err := decodeMetaHeader(path, r.Bytes())
	if err != nil {
		return err
	}
	if h.UID != b.uid {
		return corruptf(path, 16, "file belongs to another buffer (uid %016x, catalog says %016x)", h.UID, b.uid)
	}
	want := b.metaHeader()
	if h.Version != want.Version {
		return corruptf(path, 8, "row-metadata format version %d, but the spec's row_meta %q keeps version %d", h.Version, cmp.Or(b.spec.RowMetaLayout, RowMetaPerRow), want.Version)
	}
	if h.RecordSize != want.RecordSize || h.Capacity != uint64(b.capacity) || h.Name != b.name {
		return corruptf(path, 0, "header describes buffer %q capacity %d record size %d, catalog says %q capacity %d record size %d",
			h.Name, h.Capacity, h.RecordSize, b.name, b.capacity, want.RecordSize)
	}
	if h.BlockRows != want.BlockRows || h.Slots != want.Slots {
		return corruptf(path, mhBlockRows, "header describes blocks of %d rows in %d slots, this build keeps blocks of %d rows in %d slots for capacity %d",
			h.BlockRows, h.Slots, want.BlockRows, want.Slots, b.capacity)
	}
	return b.mapRecords(r)
}

// markHeldTails marks the slots of a sparse tail file whose blocks are
// allocated, from its data runs: the final observations of live rows, and
// whatever an older build (which allocated the whole file) or a crash
// before a punch left, which punchTails gives back as rows are written.
func (b *Buffer) markHeldTails(c *column) {
	rb, size := int64(c.rowBytes), int64(len(c.region.Bytes()))
	for off := c.region.NextData(headerSize); off < size; {
		end := max(c.region.NextHole(off), off+1) // never stuck, whatever lseek says
		for slot := (off - headerSize) / rb; slot < b.slots && headerSize+slot*rb < end; slot++ {
			c.held.set(slot)
		}
		off = c.region.NextData(end)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// smallFields are the fields a memory buffer keeps in its row group:
// every field of at most rowGroupMaxField bytes a row (tails and
// priorities keep their own columns).
func (b *Buffer) smallFields() []*column {
	var out []*column
	for _, c := range b.cols {
		if c.cz < 0 && c.rowBytes <= rowGroupMaxField {
			out = append(out, c)
		}
	}
	return out
}

// interleaveSmallFields gives a memory buffer one anonymous region for its
// row records and small fields, row after row: the memory record (32 bytes,
// 16 with run records, 8 strided: memrecord.go), then each small field at its
// offset, padded to rowGroupPitch. A sample reads a row's record (trajectory, step, flags)
// and then its fields; row-major, those share a cache line (a CartPole
// row is exactly one) instead of one line in each of seven regions. With
// copyOld, the records and fields move there from the mappings they are in
// (the files of a checkpoint being restored, already recovered), which are
// then closed: the file records of live rows become memory records.
func (b *Buffer) interleaveSmallFields(copyOld bool) error {
	group := b.smallFields()
	var fieldBytes int64
	for _, c := range group {
		fieldBytes += int64(c.rowBytes)
	}
	recBytes := memRecordBytes(b.spec)
	pitch := rowGroupPitch(recBytes, fieldBytes)
	r, err := mmapfile.Anonymous(b.slots * pitch)
	if err != nil {
		return fmt.Errorf("buffer %q row group: %w", b.name, err)
	}
	_ = r.AdviseHugePages()
	var errs []error
	move := func(dst, src []byte, rb int64) {
		for slot := range b.slots {
			copy(dst[slot*pitch:slot*pitch+rb], src[slot*rb:(slot+1)*rb])
		}
	}
	var runs *runTable
	if recBytes != memRecordSize {
		runs = newRunTable(b.slots, recBytes == memStridedRecordSize)
	}
	fileRecs, meta := b.recs, b.meta
	b.meta, b.recs, b.recPitch, b.runs = nil, r.Bytes(), pitch, runs
	if copyOld {
		b.wide = wideRecords{}
		// Oldest row first, so that each trajectory's rows continue
		// their runs (runs layout) as when they were written.
		wc := b.writeCount.Load()
		for seq := max(0, wc-b.capacity); seq < wc; seq++ {
			slot := seq % b.slots
			if b.stamps.Load(slot) != seq {
				continue // no live row: nothing reads this record
			}
			var rec record
			readRecord(fileRecs[slot*recordSize:(slot+1)*recordSize], &rec)
			rec.Seq = seq
			b.putMemRecord(slot, &rec)
		}
		errs = append(errs, meta.Close())
	}
	errs = append(errs, b.stamps.inRows(r.Bytes(), pitch, recBytes == memStridedRecordSize))
	off := recBytes
	for _, c := range group {
		data := r.Bytes()[off:]
		if copyOld {
			move(data, c.data, int64(c.rowBytes))
			errs = append(errs, c.region.Close())
		}
		c.region, c.data, c.stride, c.groupOff = nil, data, pitch, off
		off += int64(c.rowBytes)
	}
	// The rows hold the index's next distances where they have room: the
	// row layout's records, or up to two bytes of the padding after the
	// fields (off).
	if runs == nil {
		errs = append(errs, b.ix.deltasInRows(r.Bytes()[mrecNext:], pitch, 2))
	} else if width := min(pitch-off, 2); width > 0 {
		errs = append(errs, b.ix.deltasInRows(r.Bytes()[off:], pitch, int(width)))
	}
	b.group = r
	return errors.Join(errs...)
}

func (b *Buffer) unmap() error {
	var errs []error
	// The witness stays: a crash's next open reads it (dropWitness).
	errs = append(errs, b.wit.close(false))
	b.wit = nil
	for _, c := range b.allColumns() {
		if c.region != nil {
			errs = append(errs, c.region.Close())
			c.region, c.data = nil, nil
		}
	}
	if b.group != nil {
		errs = append(errs, b.group.Close())
		errs = append(errs, b.runs.close())
		b.group, b.recs, b.recPitch, b.runs = nil, nil, recordSize, nil
		b.wide = wideRecords{}
		b.tailIx = nil
		for _, c := range b.cols {
			if c.stride != 0 {
				c.data, c.stride = nil, 0
			}
		}
	}
	if b.meta != nil {
		errs = append(errs, b.meta.Close())
		b.meta, b.hdr, b.recs, b.drecs = nil, nil, nil, nil
	}
	errs = append(errs, b.ix.release(), b.stamps.close())
	if b.rlog != nil {
		errs = append(errs, b.rlog.close())
	}
	if b.cs != nil {
		errs = append(errs, b.cs.closeFiles())
	}
	return errors.Join(errs...)
}

// rec returns the file record of slot (persistent buffers, and a memory
// buffer's restored checkpoint before interleaveSmallFields; a memory
// buffer's own records are memory records: loadRecord).
func (b *Buffer) rec(slot int64) []byte {
	off := slot * b.recPitch
	return b.recs[off : off+recordSize]
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	if err := d.Sync(); err != nil {
		return errors.Join(fmt.Errorf("sync dir %s: %w", dir, err), d.Close())
	}
	return d.Close()
}

// reserveFiles allocates the missing blocks of the buffer's mapped files.
func (b *Buffer) reserveFiles() error {
	regions := []*mmapfile.Region{b.meta}
	for _, c := range b.allColumns() {
		if !c.sparse && !c.dense { // allocated row by row by the writer
			regions = append(regions, c.region)
		}
	}
	for _, r := range regions {
		n, err := r.Unbacked()
		if err != nil || n == 0 {
			continue
		}
		if err := r.Reserve(); err != nil {
			err = b.store.asNoSpace(fmt.Sprintf("open buffer %q", b.name), err)
			return errors.Join(fmt.Errorf("%s has %d bytes not allocated on disk: %w", r.Path(), n, err), b.unmap())
		}
		b.log.Info("reserved the missing blocks of a buffer file", "file", r.Path(), "bytes", n)
	}
	return nil
}
