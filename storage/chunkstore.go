package storage

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/zstd"
)

// chunkStore keeps the compressed fields of a compressed buffer. Rows of
// one trajectory are grouped into chunks of up to ChunkLen consecutive
// steps; each compressed field of a chunk is encoded on its own. A chunk
// fills over several extends: until it is full (or its trajectory ends) it
// is open, held in memory and made durable as fragment records holding the
// rows each extend added; once full it is sealed into one record and its
// fragments become garbage. Records are appended to segment files, which
// are deleted whole once nothing in them is needed (docs/format.md,
// docs/architecture.md).
//
// Locking: b.wmu guards the writer's state (trajs, chunk dieAt and
// fragment bookkeeping); segMu the segment list; mu the per-slot locations
// and the contents of open chunks, which readers snapshot under RLock.
type chunkStore struct {
	b        *Buffer
	fields   []*column    // compressed fields, spec order
	colIdx   []int        // index of each in b.cols
	geoms    []*frameGeom // per field; nil without a frame stack
	tailIdx  []int        // per field: index in b.tails of its final observations, -1 if none
	chunkLen int
	codec    uint8
	delta    bool
	maxK     int // largest frame stack (1 without any)
	maxRows  int // most units a record may hold
	enc      *zstd.Encoder
	dec      *zstd.Decoder
	cache    *chunkCache
	readBufs sync.Pool // *[]byte for stored payloads being decoded

	mu  sync.RWMutex
	loc []rowLoc // per slot

	// Writer state, guarded by b.wmu.
	trajs      map[int64]*trajState
	nextID     uint64
	batchGen   uint64 // counts appendBatch calls
	scratch    []byte
	payScratch [][]byte     // per field: the payload being written
	recScratch []byte       // the record being written
	sealed     atomic.Int64 // chunks sealed so far

	segMu     sync.Mutex
	pins      int        // checkpoints copying the segments: none is deleted meanwhile (segMu)
	segs      []*segment // oldest first; new records go to the last
	nextSeg   uint64
	segTarget int64
	newSeg    bool // the next append starts a new segment (after open)

	// Load state, used only while the buffer is being opened.
	found map[int64][]rowLoc
	// loadNotes are problems met while scanning segments, reported by
	// verify only if rows are missing because of them.
	loadNotes []string
	openByTr  map[int64]*chunk
	lastByTr  map[int64]*chunk

	cuts    []linkCut // b.wmu
	cutHead int
	// undo logs the write in progress (b.wmu), so that a failed one is
	// taken back whole.
	undo *chunkUndo
	// writeFault, set by tests, makes a record write fail (after writing
	// half of it) when it returns an error.
	writeFault func() error
}

// segmentTarget is the size segment files aim for, given the ring's raw
// bytes of compressed fields.
func segmentTarget(logical int64) int64 { return min(max(logical/256, 64<<10), 64<<20) }

// errSlotMoving reports a row whose slot an extend in progress is taking
// over: the row is gone, like one overwritten while being copied.
var errSlotMoving = errors.New("slot being overwritten")

type rowLoc struct {
	c *chunk
	i int
}

// trajState is what the writer keeps per trajectory that can still grow.
type trajState struct {
	open  *chunk   // nil until its next row arrives
	last  *chunk   // its latest sealed chunk (frame stacks reach back into it)
	stack [][]byte // per field, the previous row's whole stack (frame stacks only)
	gen   uint64   // the last batch that wrote to it
}

// chunk is one chunk, open or sealed. An open chunk is appended to under
// cs.mu; sealing makes a new, immutable chunk value, so readers holding the
// open one keep reading consistent bytes.
type chunk struct {
	id    uint64
	traj  int64
	step0 int64
	// prevp is the trajectory's previous chunk, which frame stacks of the
	// first rows reach into. collect cuts the link once that chunk is
	// garbage, so a long trajectory does not keep all its chunks alive.
	prevp  atomic.Pointer[chunk]
	sealed bool
	seqs   []int64
	tail   bool
	f      []chunkField
	seg    *segment // sealed chunks: where the record is

	// dieAt is one past the largest seq that needs this chunk: its own
	// rows, and rows of the next chunk whose frame stacks reach back into
	// it. Once the ring's window starts at or above it, the chunk is garbage.
	dieAt    int64
	sealNo   int64  // open chunks: set when sealed (fragments are then garbage once durable)
	fragFrom int    // open chunks: rows already in fragment records
	loadPrev uint64 // while loading: the predecessor's id, before linking
}

type chunkField struct {
	modes []byte
	offs  []int
	raw   []byte // open chunks only
	// Sealed chunks: the stored payload.
	payOff int64
	stored int
	crc    uint32
	codec  uint8
	delta  bool
}

// segment is one append-only file of chunk records.
type segment struct {
	no    uint64
	path  string
	f     *os.File
	size  int64
	dirty bool
	recs  []segRec // guarded by b.wmu
	dead  int      // recs[:dead] are known garbage (b.wmu)
}

type segRec struct {
	c    *chunk
	frag bool
	// fieldBytes is the stored payload size per field (for Info).
	fieldBytes []int
}

func segName(no uint64) string { return fmt.Sprintf("seg.%08d.rbdk", no) }

func newChunkStore(b *Buffer) (*chunkStore, error) {
	opts := b.spec.Compression
	cs := &chunkStore{
		b: b, chunkLen: opts.ChunkLen, delta: opts.Delta, maxK: 1,
		trajs: map[int64]*trajState{}, nextID: 1, nextSeg: 1, newSeg: true,
		loc:   make([]rowLoc, b.slots),
		cache: newChunkCache(int64(opts.CacheMiB) << 20),
	}
	cs.readBufs.New = func() any { return new([]byte) }
	cs.maxRows = cs.chunkLen
	maxRaw := 0
	for i, c := range b.cols {
		if !b.spec.Compressed(c.field) {
			continue
		}
		c.cz = len(cs.fields)
		cs.fields = append(cs.fields, c)
		cs.colIdx = append(cs.colIdx, i)
		g := newFrameGeom(c.field)
		cs.geoms = append(cs.geoms, g)
		if g != nil {
			cs.maxK = max(cs.maxK, g.k)
		}
		t := -1
		if ti, ok := b.tailOf["next."+c.name]; ok {
			t = ti
			b.tails[ti].cz = c.cz
		}
		cs.tailIdx = append(cs.tailIdx, t)
		maxRaw = max(maxRaw, (cs.chunkLen+1)*c.rowBytes)
	}
	if len(cs.fields) == 0 {
		return nil, nil // every field plain: the buffer works as memmap
	}
	cs.payScratch = make([][]byte, len(cs.fields))
	var logical int64
	for _, c := range cs.fields {
		logical += b.capacity * int64(c.rowBytes)
	}
	// Segments of about 1/256 of the ring's raw bytes: with typical
	// ratios a ring spans tens of segments, so whole-segment deletion
	// keeps disk use close to what is live.
	cs.segTarget = segmentTarget(logical)

	switch opts.Codec {
	case "zstd":
		cs.codec = codecZstd
		enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.EncoderLevelFromZstd(opts.Level)), zstd.WithEncoderConcurrency(1))
		if err != nil {
			return nil, fmt.Errorf("buffer %q: zstd encoder: %w", b.name, err)
		}
		// Stored bytes are never trusted: the decoder refuses output
		// larger than the biggest chunk field the spec allows.
		// (At least 1 MiB: a zstd window is never smaller than 1 KiB, and
		// tiny chunks must still decode.)
		dec, err := zstd.NewReader(nil, zstd.WithDecoderMaxMemory(max(uint64(maxRaw)+1, 1<<20)), zstd.WithDecoderConcurrency(runtime.GOMAXPROCS(0)))
		if err != nil {
			return nil, fmt.Errorf("buffer %q: zstd decoder: %w", b.name, err)
		}
		cs.enc, cs.dec = enc, dec
	default:
		cs.codec = codecNone
	}
	return cs, nil
}

func (cs *chunkStore) closeFiles() error {
	cs.segMu.Lock()
	defer cs.segMu.Unlock()
	var errs []error
	for _, s := range cs.segs {
		if s.f != nil {
			errs = append(errs, s.f.Close())
			s.f = nil
		}
	}
	if cs.enc != nil {
		errs = append(errs, cs.enc.Close())
	}
	if cs.dec != nil {
		cs.dec.Close()
	}
	return errors.Join(errs...)
}

// ---- write path (b.wmu held) ----

// appendBatch puts the compressed fields of every row of a batch into
// chunks and writes the records that make them durable: a sealed record
// for each chunk that filled (or whose trajectory ended), a fragment for
// each chunk still open. It runs before the rows' records are written, so
// a row whose record is whole always has its compressed fields on disk.
// With closeAll (anonymous streams) every chunk it touched is sealed.
func (cs *chunkStore) appendBatch(p *plan, recs []record, written int64, closeAll bool) (err error) {
	cs.begin()
	defer cs.end(&err)
	var touched []*trajState
	cs.batchGen++
	for r := range recs {
		rec := &recs[r]
		cs.saveTraj(rec.TrajID)
		ts := cs.trajs[rec.TrajID]
		if ts == nil {
			ts = &trajState{stack: make([][]byte, len(cs.fields))}
			cs.trajs[rec.TrajID] = ts
		}
		oc := ts.open
		if oc == nil {
			oc = cs.newOpenChunk(rec.TrajID, rec.Step, ts.last)
			ts.open = oc
		}
		if ts.gen != cs.batchGen {
			ts.gen = cs.batchGen
			touched = append(touched, ts)
		}
		cs.appendRow(ts, oc, p, rec, r, written)
		if rec.Flags&flagDone != 0 || len(oc.seqs) == cs.chunkLen {
			if err := cs.seal(ts, oc); err != nil {
				return err
			}
		}
		if rec.Flags&flagDone != 0 {
			delete(cs.trajs, rec.TrajID)
		}
	}
	for _, ts := range touched {
		oc := ts.open
		if oc == nil || oc.fragFrom == len(oc.seqs) {
			continue
		}
		var err error
		if closeAll {
			err = cs.seal(ts, oc)
		} else {
			err = cs.writeFragment(oc)
		}
		if err != nil {
			return err
		}
	}
	if closeAll {
		for _, rec := range recs {
			delete(cs.trajs, rec.TrajID)
		}
	}
	return nil
}

func (cs *chunkStore) newOpenChunk(traj, step int64, prev *chunk) *chunk {
	c := &chunk{id: cs.nextID, traj: traj, step0: step, f: make([]chunkField, len(cs.fields))}
	c.prevp.Store(prev)
	cs.nextID++
	for i := range c.f {
		c.f[i].offs = []int{0}
	}
	return c
}

// appendRow adds row r of the plan to open chunk oc.
func (cs *chunkStore) appendRow(ts *trajState, oc *chunk, p *plan, rec *record, r int, written int64) {
	tailRow := -1
	if rec.Flags&flagDone != 0 {
		tailRow = p.tailRowOf(r)
	}
	cs.saveChunk(oc)
	cs.mu.Lock()
	for fi, c := range cs.fields {
		src := p.src[cs.colIdx[fi]][r*c.rowBytes : (r+1)*c.rowBytes]
		f := &oc.f[fi]
		mode := modeFull
		if g := cs.geoms[fi]; g != nil {
			f.raw, mode = g.encodeUnit(f.raw, ts.stack[fi], src)
			ts.stack[fi] = append(ts.stack[fi][:0], src...)
		} else {
			f.raw = append(f.raw, src...)
		}
		f.modes = append(f.modes, mode)
		f.offs = append(f.offs, len(f.raw))
		if ti := cs.tailIdx[fi]; ti >= 0 && tailRow >= 0 {
			tc := cs.b.tails[ti]
			tsrc := p.tailSrc[ti][tailRow*tc.rowBytes : (tailRow+1)*tc.rowBytes]
			tmode := modeFull
			if g := cs.geoms[fi]; g != nil {
				f.raw, tmode = g.encodeUnit(f.raw, src, tsrc)
			} else {
				f.raw = append(f.raw, tsrc...)
			}
			f.modes = append(f.modes, tmode)
			f.offs = append(f.offs, len(f.raw))
			oc.tail = true
		}
	}
	oc.seqs = append(oc.seqs, rec.Seq)
	if rec.Seq >= written {
		cs.setLoc(rec.Seq%cs.b.slots, rowLoc{oc, len(oc.seqs) - 1})
	}
	cs.mu.Unlock()
	cs.setDieAt(oc, rec.Seq+1)
	// The first K-1 rows of a chunk rebuild their stacks from the end of
	// the previous chunk, which must outlive them.
	if p := oc.prev(); p != nil && int(rec.Step-oc.step0) < cs.maxK-1 {
		cs.setDieAt(p, max(p.dieAt, rec.Seq+1))
	}
}

// pack encodes units [from, to) of chunk field fi for a record. The
// payload lives in a per-field scratch buffer (or aliases the units): it is
// valid until the next pack of the field, which is enough to write the
// record.
func (cs *chunkStore) pack(fi int, f *chunkField, from, to int) recordField {
	units := f.raw[f.offs[from]:f.offs[to]]
	rf := recordField{Codec: cs.codec, Delta: cs.delta, RawLen: uint32(len(units)), Modes: f.modes[from:to]}
	if cs.delta {
		// XOR each unit with the one before it when both have the same
		// size; walking backwards keeps the earlier unit intact to use.
		buf := append(cs.scratch[:0], units...)
		base := f.offs[from]
		for i := to - 1; i > from; i-- {
			a, b := f.offs[i-1]-base, f.offs[i]-base
			c := f.offs[i+1] - base
			if b-a != c-b {
				continue
			}
			for k := 0; k < c-b; k++ {
				buf[b+k] ^= buf[a+k]
			}
		}
		cs.scratch = buf
		units = buf
	}
	if cs.codec == codecZstd {
		rf.Payload = cs.enc.EncodeAll(units, cs.payScratch[fi][:0])
		cs.payScratch[fi] = rf.Payload
	} else if cs.delta {
		// units is the shared delta scratch: the next field reuses it.
		rf.Payload = append(cs.payScratch[fi][:0], units...)
		cs.payScratch[fi] = rf.Payload
	} else {
		rf.Payload = units // open-chunk units never change once written
	}
	return rf
}

// seal writes oc as one sealed record and points its rows at the sealed
// chunk.
func (cs *chunkStore) seal(ts *trajState, oc *chunk) error {
	rec := &chunkRecord{Kind: recSealed, Tail: oc.tail, TrajID: oc.traj, FirstStep: oc.step0, ID: oc.id, Seqs: oc.seqs}
	if p := oc.prev(); p != nil {
		rec.PrevID = p.id
	}
	sc := &chunk{id: oc.id, traj: oc.traj, step0: oc.step0, sealed: true, seqs: oc.seqs, tail: oc.tail,
		f: make([]chunkField, len(cs.fields)), dieAt: oc.dieAt}
	sc.prevp.Store(oc.prev())
	for fi := range cs.fields {
		rec.Fields = append(rec.Fields, cs.pack(fi, &oc.f[fi], 0, len(oc.f[fi].modes)))
	}
	seg, off, err := cs.appendRecord(rec, sc, false)
	if err != nil {
		return err
	}
	for fi := range cs.fields {
		of, rf := &oc.f[fi], &rec.Fields[fi]
		sc.f[fi] = chunkField{modes: of.modes, offs: of.offs, payOff: off + int64(rf.PayloadOff), stored: len(rf.Payload),
			crc: rf.CRC, codec: cs.codec, delta: cs.delta}
	}
	sc.seg = seg
	cs.saveChunk(oc)
	cs.mu.Lock()
	for i, s := range sc.seqs {
		slot := s % cs.b.slots
		// The slot may since hold a later row (of this chunk, too, in a
		// ring shorter than a chunk): move only the entry for this row.
		if l := cs.loc[slot]; l.c == oc && l.i == i {
			cs.setLoc(slot, rowLoc{sc, i})
		}
	}
	cs.mu.Unlock()
	oc.sealNo = cs.sealed.Add(1)
	ts.open = nil
	ts.last = sc
	// The open chunk's rows are done: the link it shares with sc is due
	// once sc's first rows leave (the same dieAt).
	cs.scheduleCut(sc)
	cs.scheduleCut(oc)
	return nil
}

// writeFragment makes the rows added to oc since its last record durable.
func (cs *chunkStore) writeFragment(oc *chunk) error {
	from, to := oc.fragFrom, len(oc.seqs)
	rec := &chunkRecord{Kind: recFragment, TrajID: oc.traj, FirstStep: oc.step0 + int64(from), ID: oc.id, Seqs: oc.seqs[from:to:to]}
	if p := oc.prev(); p != nil {
		rec.PrevID = p.id
	}
	for fi := range cs.fields {
		rec.Fields = append(rec.Fields, cs.pack(fi, &oc.f[fi], from, to))
	}
	if _, _, err := cs.appendRecord(rec, oc, true); err != nil {
		return err
	}
	cs.saveChunk(oc)
	oc.fragFrom = to
	return nil
}

// appendRecord writes a record at the end of the active segment, starting
// a new segment when it is full, and returns where the record starts
// (encode has set each field's CRC and offset in rec).
func (cs *chunkStore) appendRecord(rec *chunkRecord, c *chunk, frag bool) (*segment, int64, error) {
	buf := rec.encode(cs.recScratch[:0])
	cs.recScratch = buf
	cs.segMu.Lock()
	defer cs.segMu.Unlock()
	var seg *segment
	if n := len(cs.segs); n > 0 && !cs.newSeg {
		seg = cs.segs[n-1]
	}
	if seg == nil || (seg.size > segHeaderSize && seg.size+int64(len(buf)) > cs.segTarget) {
		var err error
		if seg, err = cs.createSegment(); err != nil {
			return nil, 0, err
		}
	}
	at := seg.size
	if cs.b.store.crash.armed("mid-chunk") {
		// Leave a torn record behind, as a crash halfway through the
		// write would.
		_, _ = seg.f.WriteAt(buf[:len(buf)/2], at)
	}
	cs.b.store.crash.at("mid-chunk")
	if cs.writeFault != nil {
		if err := cs.writeFault(); err != nil {
			_, _ = seg.f.WriteAt(buf[:len(buf)/2], at) // as a disk that fills mid-record
			if terr := seg.f.Truncate(at); terr != nil {
				err = errors.Join(err, terr)
			}
			return nil, 0, fmt.Errorf("write chunk record to %s: %w", seg.path, err)
		}
	}
	if _, err := seg.f.WriteAt(buf, at); err != nil {
		// Take back whatever part of the record reached the file: the
		// next record is written here (an out-of-space write leaves a
		// prefix behind).
		if terr := seg.f.Truncate(at); terr != nil {
			err = errors.Join(err, terr)
		}
		return nil, 0, fmt.Errorf("write chunk record to %s: %w", seg.path, err)
	}
	seg.size += int64(len(buf))
	seg.dirty = true
	seg.recs = append(seg.recs, segRec{c: c, frag: frag, fieldBytes: payloadSizes(rec)})
	cs.b.store.crash.at("after-chunk")
	return seg, at, nil
}

// createSegment starts a new segment file. Called with segMu held.
func (cs *chunkStore) createSegment() (*segment, error) {
	no := cs.nextSeg
	path := filepath.Join(cs.b.dir, segName(no))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create segment: %w", err)
	}
	hdr := segHeader{Version: FormatVersion, UID: cs.b.uid, Number: no}.encode()
	if _, err := f.WriteAt(hdr, 0); err != nil {
		return nil, errors.Join(fmt.Errorf("write segment header %s: %w", path, err), f.Close())
	}
	// The file must exist after a crash for the records about to be
	// written into it to count.
	if err := f.Sync(); err != nil {
		return nil, errors.Join(fmt.Errorf("sync %s: %w", path, err), f.Close())
	}
	if err := syncDir(cs.b.dir); err != nil {
		return nil, errors.Join(err, f.Close())
	}
	cs.nextSeg++
	cs.newSeg = false
	s := &segment{no: no, path: path, f: f, size: segHeaderSize}
	cs.segs = append(cs.segs, s)
	return s, nil
}

// closeTrajectory seals the open chunk of a trajectory that ends without a
// done row (its stream was closed).
func (cs *chunkStore) closeTrajectory(traj int64) (err error) {
	ts := cs.trajs[traj]
	if ts == nil {
		return nil
	}
	cs.begin()
	defer cs.end(&err)
	cs.saveTraj(traj)
	delete(cs.trajs, traj)
	if ts.open == nil || len(ts.open.seqs) == 0 {
		return nil
	}
	return cs.seal(ts, ts.open)
}

// ---- durability and space ----

// syncFoundOnNextSync makes the next sync cover the segments found at open
// (see runLog.syncFoundOnNextSync: after a kill -9, recovery accepts rows
// whose chunks may be in the page cache only). Their directory entries
// were synced when they were created.
func (cs *chunkStore) syncFoundOnNextSync() {
	cs.segMu.Lock()
	defer cs.segMu.Unlock()
	for _, s := range cs.segs {
		s.dirty = true
	}
}

// syncSegments makes every record written so far durable.
func (cs *chunkStore) syncSegments() error {
	cs.segMu.Lock()
	var dirty []*segment
	for _, s := range cs.segs {
		if s.dirty && s.f != nil {
			dirty = append(dirty, s)
			s.dirty = false
		}
	}
	cs.segMu.Unlock()
	var errs []error
	for _, s := range dirty {
		if err := s.f.Sync(); err != nil {
			errs = append(errs, fmt.Errorf("sync %s: %w", s.path, err))
			cs.segMu.Lock()
			s.dirty = true
			cs.segMu.Unlock()
		}
	}
	return errors.Join(errs...)
}

// collect deletes segments that hold nothing still needed, given that rows
// below lo are durably gone and seals numbered up to sealedDurable are on
// stable storage. Never the segment being appended to.
func (cs *chunkStore) collect(lo, sealedDurable int64) error {
	cs.b.wmu.Lock()
	defer cs.b.wmu.Unlock()
	cs.segMu.Lock()
	defer cs.segMu.Unlock()
	var errs []error
	// A trajectory whose newest row has left the window (a paused stream)
	// starts afresh: its next row opens a new chunk with its whole stack,
	// so nothing written later points into chunks discarded below.
	for _, ts := range cs.trajs {
		c := ts.open
		if c == nil {
			c = ts.last
		}
		if c != nil && c.dieAt <= lo {
			ts.open, ts.last = nil, nil
			clear(ts.stack)
		}
	}
	// Links to previous chunks no longer needed are cut, so a long
	// trajectory does not keep all its chunks in memory. Cuts are queued
	// roughly in the order they fall due.
	for cs.cutHead < len(cs.cuts) && cs.cuts[cs.cutHead].at <= lo {
		cs.cuts[cs.cutHead].c.prevp.Store(nil)
		cs.cuts[cs.cutHead] = linkCut{}
		cs.cutHead++
	}
	if cs.cutHead > 1024 && cs.cutHead*2 > len(cs.cuts) {
		cs.cuts = append(cs.cuts[:0], cs.cuts[cs.cutHead:]...)
		cs.cutHead = 0
	}
	// A record once garbage stays garbage (lo and sealedDurable only grow,
	// and the reset above stops chunks that died from growing), so each
	// segment keeps how many of its records, oldest first, are known
	// garbage: every call does work only for what died since the last.
	kept := cs.segs[:0]
	for i, s := range cs.segs {
		for s.dead < len(s.recs) && recDead(s.recs[s.dead], lo, sealedDurable) {
			s.dead++
		}
		if i == len(cs.segs)-1 || s.dead < len(s.recs) || cs.pins > 0 {
			kept = append(kept, s)
			continue
		}
		errs = append(errs, s.f.Close(), os.Remove(s.path))
		s.f = nil
	}
	clear(cs.segs[len(kept):])
	cs.segs = kept
	return errors.Join(errs...)
}

// linkCut schedules cutting c's link to its previous chunk once the window
// starts at or above at (its first K-1 rows, which need it, are gone).
type linkCut struct {
	c  *chunk
	at int64
}

func (cs *chunkStore) scheduleCut(c *chunk) {
	if p := c.prev(); p != nil {
		cs.cuts = append(cs.cuts, linkCut{c, p.dieAt})
	}
}

func recDead(r segRec, lo, sealedDurable int64) bool {
	if r.c.dieAt <= lo {
		return true
	}
	return r.frag && r.c.sealNo > 0 && r.c.sealNo <= sealedDurable
}

// usage sums the stored bytes per compressed field of records still
// needed, and the bytes of all segment files.
func (cs *chunkStore) usage(lo int64) (perField []int64, files int64) {
	perField = make([]int64, len(cs.fields))
	sealedNow := cs.sealed.Load()
	cs.b.wmu.Lock()
	defer cs.b.wmu.Unlock()
	cs.segMu.Lock()
	defer cs.segMu.Unlock()
	for _, s := range cs.segs {
		files += s.size
		for _, r := range s.recs {
			if recDead(r, lo, sealedNow) {
				continue
			}
			for i, n := range r.fieldBytes {
				perField[i] += int64(n)
			}
		}
	}
	return perField, files
}

// ---- read path ----

// gather copies compressed field fi (its final observations if tail) of
// the rows at slots into dst. It returns an error per row it could not
// read; the caller drops those whose slot was overwritten meanwhile and
// reports the rest.
func (cs *chunkStore) gather(dst []byte, fi int, tail bool, rb int, seqs, slots []int64, recs []record) map[int]error {
	type ref struct {
		rowLoc
		rows int  // rows of the chunk when looked up
		tail bool // it holds a final observation
	}
	refs := make([]ref, len(slots))
	views := map[*chunk]*fieldView{} // snapshots of open chunks
	var errs map[int]error
	fail := func(j int, err error) {
		if errs == nil {
			errs = map[int]error{}
		}
		errs[j] = err
	}
	cs.mu.RLock()
	for j, slot := range slots {
		if slot < 0 {
			continue
		}
		l := cs.loc[slot]
		if l.c == nil || l.i >= len(l.c.seqs) || l.c.seqs[l.i] != seqs[j] {
			// An extend is overwriting the slot: its chunks are written
			// before the old row leaves the index.
			fail(j, errSlotMoving)
			continue
		}
		refs[j] = ref{l, len(l.c.seqs), l.c.tail}
		// Only open chunks change; a chunk's predecessor is always sealed.
		if !l.c.sealed && views[l.c] == nil {
			views[l.c] = cs.snapshot(l.c, fi)
		}
	}
	cs.mu.RUnlock()
	g := cs.geoms[fi]
	var need []*chunk
	seen := map[*chunk]bool{}
	for _, l := range refs {
		if l.c == nil {
			continue
		}
		if l.c.sealed && !seen[l.c] {
			seen[l.c] = true
			need = append(need, l.c)
		}
		if g != nil && l.i < g.k-1 {
			if p := l.c.prev(); p != nil && p.sealed && !seen[p] {
				seen[p] = true
				need = append(need, p)
			}
		}
	}
	cs.prefetch(need, fi, views)
	for j, l := range refs {
		if l.c == nil {
			continue
		}
		// Open chunks may grow meanwhile: only what was looked up under
		// the lock (l.rows, l.tail, the views) is used below.
		out := dst[j*rb : (j+1)*rb]
		us := &unitWalker{cs: cs, fi: fi, c: l.c, views: views}
		i := l.i
		if tail {
			if recs[j].Flags&flagHasTail == 0 {
				clear(out)
				continue
			}
			if !l.tail || l.i != l.rows-1 {
				fail(j, cs.chunkErr(l.c, fi, fmt.Errorf("row %d has a final observation but its chunk holds none", seqs[j])))
				continue
			}
			i = l.rows
		}
		if g != nil {
			if err := g.rebuild(out, us, i); err != nil {
				fail(j, err)
			}
			continue
		}
		mode, data, err := us.unit(i)
		switch {
		case err != nil:
			fail(j, err)
		case mode != modeFull || len(data) != rb:
			fail(j, cs.chunkErr(l.c, fi, fmt.Errorf("unit %d has mode %d and %d bytes, want a %d-byte row", i, mode, len(data), rb)))
		default:
			copy(out, data)
		}
	}
	return errs
}

// snapshot views the units an open chunk holds now. Called with mu held;
// later appends do not touch the bytes the view covers.
func (cs *chunkStore) snapshot(c *chunk, fi int) *fieldView {
	f := &c.f[fi]
	return &fieldView{modes: f.modes[:len(f.modes):len(f.modes)], offs: f.offs[:len(f.offs):len(f.offs)], raw: f.raw[:len(f.raw):len(f.raw)]}
}

// unitWalker reads the units of one field along a trajectory's chunks,
// for frame stacks that reach into the previous chunk.
type unitWalker struct {
	cs    *chunkStore
	fi    int
	c     *chunk
	views map[*chunk]*fieldView
}

func (w *unitWalker) unit(i int) (byte, []byte, error) {
	c := w.c
	for i < 0 {
		if c.prev() == nil {
			return 0, nil, w.cs.chunkErr(c, w.fi, fmt.Errorf("a frame stack reaches before the trajectory's first chunk"))
		}
		c = c.prev()
		i += len(c.seqs)
	}
	v, err := w.cs.view(c, w.fi, w.views)
	if err != nil {
		return 0, nil, err
	}
	if i >= len(v.modes) {
		return 0, nil, w.cs.chunkErr(c, w.fi, fmt.Errorf("unit %d of %d", i, len(v.modes)))
	}
	m, d := v.unit(i)
	return m, d, nil
}

// view returns the decoded units of field fi of chunk c. views memoises
// within one gather, so a batch decodes each chunk once even when the
// cache is too small to keep it.
func (cs *chunkStore) view(c *chunk, fi int, views map[*chunk]*fieldView) (*fieldView, error) {
	if v := views[c]; v != nil {
		return v, nil
	}
	if !c.sealed {
		cs.mu.RLock()
		v := cs.snapshot(c, fi)
		cs.mu.RUnlock()
		views[c] = v
		return v, nil
	}
	v, err := cs.sealedView(c, fi)
	if err != nil {
		return nil, err
	}
	views[c] = v
	return v, nil
}

// sealedView returns field fi of sealed chunk c from the cache, or reads,
// checks and decodes it (and caches it). Safe for concurrent use.
func (cs *chunkStore) sealedView(c *chunk, fi int) (*fieldView, error) {
	key := cacheKey{c.id, fi}
	if v := cs.cache.get(key); v != nil {
		return v, nil
	}
	f := &c.f[fi]
	var buf []byte
	if f.codec == codecZstd {
		// Only the decoded bytes outlive this call; the stored ones are
		// borrowed.
		bp := cs.readBufs.Get().(*[]byte)
		defer cs.readBufs.Put(bp)
		if cap(*bp) < f.stored {
			*bp = make([]byte, f.stored)
		}
		buf = (*bp)[:f.stored]
	} else {
		buf = make([]byte, f.stored)
	}
	if _, err := c.seg.f.ReadAt(buf, f.payOff); err != nil {
		return nil, cs.chunkErr(c, fi, fmt.Errorf("read %d bytes at %d of %s: %w", f.stored, f.payOff, c.seg.path, err))
	}
	if got := crcOf(buf); got != f.crc {
		return nil, &CorruptionError{Path: c.seg.path, Offset: f.payOff, Err: cs.chunkErr(c, fi, fmt.Errorf("payload checksum %08x, record says %08x", got, f.crc))}
	}
	raw, err := cs.unpackOwned(buf, f.codec, f.delta, f.offs)
	if err != nil {
		return nil, &CorruptionError{Path: c.seg.path, Offset: f.payOff, Err: cs.chunkErr(c, fi, err)}
	}
	v := &fieldView{modes: f.modes, offs: f.offs, raw: raw}
	cs.cache.put(key, v)
	return v, nil
}

// prefetch decodes the sealed chunks in need that are not cached, on up to
// GOMAXPROCS goroutines, into views: a uniform batch over a large ring
// needs many chunks, and decoding them is most of its cost. Errors are
// left for view to meet again and report.
func (cs *chunkStore) prefetch(need []*chunk, fi int, views map[*chunk]*fieldView) {
	var todo []*chunk
	for _, c := range need {
		if views[c] == nil && !cs.cache.has(cacheKey{c.id, fi}) {
			todo = append(todo, c)
		}
	}
	workers := min(runtime.GOMAXPROCS(0), len(todo))
	if workers < 2 {
		return
	}
	got := make([]*fieldView, len(todo))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				k := int(next.Add(1)) - 1
				if k >= len(todo) {
					return
				}
				if v, err := cs.sealedView(todo[k], fi); err == nil {
					got[k] = v
				}
			}
		})
	}
	wg.Wait()
	for k, v := range got {
		if v != nil {
			views[todo[k]] = v
		}
	}
}

// unpack decodes a stored payload whose units end at the given offsets,
// checking the decoded size before anything is read from it. The result
// never aliases payload.
func (cs *chunkStore) unpack(payload []byte, codec uint8, delta bool, offs []int) ([]byte, error) {
	if codec == codecNone {
		payload = slices.Clone(payload)
	}
	return cs.unpackOwned(payload, codec, delta, offs)
}

// unpackOwned is unpack for a payload the caller gives up: with codec none
// (and delta undone in place) it is the result.
func (cs *chunkStore) unpackOwned(payload []byte, codec uint8, delta bool, offs []int) ([]byte, error) {
	want := offs[len(offs)-1]
	var raw []byte
	switch codec {
	case codecNone:
		raw = payload
	case codecZstd:
		if cs.dec == nil {
			return nil, fmt.Errorf("zstd payload in a buffer without zstd")
		}
		var err error
		if raw, err = cs.dec.DecodeAll(payload, make([]byte, 0, want)); err != nil {
			return nil, fmt.Errorf("zstd: %w", err)
		}
	default:
		return nil, fmt.Errorf("unknown codec %d", codec)
	}
	if len(raw) != want {
		return nil, fmt.Errorf("decoded %d bytes, units need %d", len(raw), want)
	}
	if delta {
		for i := 1; i+1 < len(offs); i++ {
			a, b, c := offs[i-1], offs[i], offs[i+1]
			if b-a != c-b {
				continue
			}
			for k := 0; k < c-b; k++ {
				raw[b+k] ^= raw[a+k]
			}
		}
	}
	return raw, nil
}

// chunkErr names the buffer, field and seq range of a chunk in an error.
func (cs *chunkStore) chunkErr(c *chunk, fi int, err error) error {
	lo, hi := int64(-1), int64(-1)
	if len(c.seqs) > 0 {
		lo, hi = c.seqs[0], c.seqs[len(c.seqs)-1]
	}
	return fmt.Errorf("buffer %q field %q seqs %d..%d (chunk %d of trajectory %d): %w", cs.b.name, cs.fields[fi].name, lo, hi, c.id, c.traj, err)
}

// unitOffsets turns frame modes into unit offsets.
func (cs *chunkStore) unitOffsets(fi int, modes []byte) []int {
	offs := make([]int, len(modes)+1)
	for i, m := range modes {
		offs[i+1] = offs[i] + unitSize(cs.geoms[fi], cs.fields[fi].rowBytes, m)
	}
	return offs
}

// ---- open and recovery ----

// load scans the segments of a buffer being opened: sealed chunks and the
// fragments of open ones, each checked whole. It fills cs.found with where
// every row's compressed fields are; recovery accepts only rows found.
func (cs *chunkStore) load(writable bool) error {
	entries, err := os.ReadDir(cs.b.dir)
	if err != nil {
		return fmt.Errorf("list %s: %w", cs.b.dir, err)
	}
	var nos []uint64
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, "seg.") || !strings.HasSuffix(name, ".rbdk") {
			continue
		}
		no, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(name, "seg."), ".rbdk"), 10, 64)
		if err != nil || segName(no) != name {
			continue
		}
		nos = append(nos, no)
	}
	slices.Sort(nos)
	byID := map[uint64]*chunk{}
	frags := map[uint64][]*chunkRecord{}
	fragSegs := map[uint64][]*segment{}
	var fragOrder []uint64
	snapshot := !cs.b.store.snapAt.IsZero()
	for _, no := range nos {
		path := filepath.Join(cs.b.dir, segName(no))
		flag := os.O_RDONLY
		if writable {
			flag = os.O_RDWR
		}
		// Open first and read through the descriptor: next to a running
		// writer the segment can be deleted at any moment (its rows left
		// the ring), and what was read must be what stays open.
		f, err := os.OpenFile(path, flag, 0)
		if err != nil {
			if snapshot && errors.Is(err, os.ErrNotExist) {
				continue // the running writer deleted it meanwhile
			}
			return fmt.Errorf("open segment: %w", err)
		}
		data, err := readAllFile(f)
		if err != nil {
			f.Close()
			return fmt.Errorf("read segment: %w", err)
		}
		h, err := decodeSegHeader(path, data, segMagic, FormatVersion, "chunk segment")
		if err != nil {
			f.Close()
			if len(data) < segHeaderSize && no == nos[len(nos)-1] {
				// A segment whose creation a crash cut short.
				continue
			}
			return err
		}
		if h.UID != cs.b.uid || h.Number != no {
			f.Close()
			return corruptf(path, 16, "segment belongs to buffer uid %016x number %d, want %016x number %d", h.UID, h.Number, cs.b.uid, no)
		}
		seg := &segment{no: no, path: path, f: f, size: int64(len(data))}
		cs.segs = append(cs.segs, seg)
		cs.nextSeg = max(cs.nextSeg, no+1)
		off := segHeaderSize
		for off < len(data) {
			n, err := recordLen(data[off:])
			if err == nil && off+n > len(data) {
				err = fmt.Errorf("record of %d bytes runs past the end of the file (%d)", n, len(data))
			}
			var rec *chunkRecord
			if err == nil {
				rec, err = decodeChunkRecord(data[off:off+n], cs.tailFields(), cs.maxRows)
			}
			if err != nil {
				// A damaged record whose length still leads to a whole
				// record is skipped alone (that record's checksum vouches
				// for the position). Otherwise nothing after it can be
				// located: a crash leaves exactly this at the end of the
				// newest segment. Rows that lose data here are judged by
				// recovery against the durable watermark.
				if n > 0 && off+n < len(data) && cs.recordAt(data, off+n) {
					cs.loadNotes = append(cs.loadNotes, fmt.Sprintf("%s offset %d: %v (record skipped)", path, off, err))
					off += n
					continue
				}
				cs.loadNotes = append(cs.loadNotes, fmt.Sprintf("%s offset %d: %v (the %d bytes after it are ignored)", path, off, err, len(data)-off))
				break
			}
			cs.nextID = max(cs.nextID, rec.ID+1)
			switch rec.Kind {
			case recSealed:
				c, err := cs.sealedFromRecord(rec, seg, int64(off))
				if err != nil {
					cs.loadNotes = append(cs.loadNotes, fmt.Sprintf("%s offset %d: %v", path, off, err))
				} else {
					byID[c.id] = c
					seg.recs = append(seg.recs, segRec{c: c, fieldBytes: payloadSizes(rec)})
				}
			case recFragment:
				if _, ok := frags[rec.ID]; !ok {
					fragOrder = append(fragOrder, rec.ID)
				}
				frags[rec.ID] = append(frags[rec.ID], rec)
				fragSegs[rec.ID] = append(fragSegs[rec.ID], seg)
				seg.recs = append(seg.recs, segRec{frag: true, fieldBytes: payloadSizes(rec)})
				// c is filled in below, once the open chunk is built.
				seg.recs[len(seg.recs)-1].c = &chunk{id: rec.ID}
			}
			off += n
		}
	}
	// Link sealed chunks to their predecessors; a dangling link only
	// matters (and is reported) if a live row needs it.
	for _, c := range byID {
		c.prevp.Store(byID[c.loadPrev])
	}
	// Rebuild open chunks from fragments not superseded by a seal.
	open := map[uint64]*chunk{}
	for _, id := range fragOrder {
		if byID[id] != nil {
			continue
		}
		c, err := cs.openFromFragments(frags[id], byID)
		if err != nil {
			cs.loadNotes = append(cs.loadNotes, err.Error())
		}
		if c != nil {
			open[id] = c
		}
	}
	for _, s := range cs.segs {
		for i := range s.recs {
			r := &s.recs[i]
			if !r.frag {
				continue
			}
			if c := open[r.c.id]; c != nil {
				r.c = c
			} else {
				// Superseded by a seal (durable: it was read back from
				// disk) or unusable: garbage.
				r.c = &chunk{id: r.c.id, sealNo: 1}
			}
		}
	}
	cs.found = map[int64][]rowLoc{}
	cs.openByTr = map[int64]*chunk{}
	cs.lastByTr = map[int64]*chunk{}
	add := func(c *chunk) {
		for i, s := range c.seqs {
			cs.found[s] = append(cs.found[s], rowLoc{c, i})
		}
		c.dieAt = max(c.dieAt, c.seqs[len(c.seqs)-1]+1)
		if p := c.prev(); p != nil {
			for i := 0; i < len(c.seqs) && i < cs.maxK-1; i++ {
				p.dieAt = max(p.dieAt, c.seqs[i]+1)
			}
		}
	}
	for _, c := range byID {
		add(c)
		if l := cs.lastByTr[c.traj]; l == nil || l.step0 < c.step0 || (l.step0 == c.step0 && l.id < c.id) {
			cs.lastByTr[c.traj] = c
		}
	}
	for _, c := range open {
		add(c)
		// The newest id wins a tie: a chunk reissued after a failed
		// write holds the rows that were kept.
		if o := cs.openByTr[c.traj]; o == nil || o.step0 < c.step0 || (o.step0 == c.step0 && o.id < c.id) {
			cs.openByTr[c.traj] = c
		}
	}
	for _, c := range byID {
		cs.scheduleCut(c)
	}
	for _, c := range open {
		cs.scheduleCut(c)
	}
	slices.SortFunc(cs.cuts, func(a, b linkCut) int { return cmp.Compare(a.at, b.at) })
	return nil
}

// recordAt reports whether a whole, valid record starts at off.
func (cs *chunkStore) recordAt(data []byte, off int) bool {
	n, err := recordLen(data[off:])
	if err != nil || off+n > len(data) {
		return false
	}
	_, err = decodeChunkRecord(data[off:off+n], cs.tailFields(), cs.maxRows)
	return err == nil
}

func payloadSizes(rec *chunkRecord) []int {
	out := make([]int, len(rec.Fields))
	for i, f := range rec.Fields {
		out[i] = len(f.Payload)
	}
	return out
}

func (c *chunk) prev() *chunk { return c.prevp.Load() }

func (cs *chunkStore) sealedFromRecord(rec *chunkRecord, seg *segment, off int64) (*chunk, error) {
	c := &chunk{id: rec.ID, traj: rec.TrajID, step0: rec.FirstStep, sealed: true, seqs: rec.Seqs, tail: rec.Tail,
		f: make([]chunkField, len(cs.fields)), seg: seg, loadPrev: rec.PrevID}
	for fi, rf := range rec.Fields {
		offs := cs.unitOffsets(fi, rf.Modes)
		if int(rf.RawLen) != offs[len(offs)-1] {
			return nil, cs.chunkErr(c, fi, fmt.Errorf("raw length %d, its frame modes need %d", rf.RawLen, offs[len(offs)-1]))
		}
		c.f[fi] = chunkField{modes: slices.Clone(rf.Modes), offs: offs, payOff: off + int64(rf.PayloadOff), stored: len(rf.Payload),
			crc: rf.CRC, codec: rf.Codec, delta: rf.Delta}
	}
	return c, nil
}

// openFromFragments rebuilds an open chunk from its fragments, in order.
// It stops at the first fragment that does not continue the previous one.
func (cs *chunkStore) openFromFragments(recs []*chunkRecord, byID map[uint64]*chunk) (*chunk, error) {
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].FirstStep < recs[j].FirstStep })
	first := recs[0]
	c := &chunk{id: first.ID, traj: first.TrajID, step0: first.FirstStep, loadPrev: first.PrevID, f: make([]chunkField, len(cs.fields))}
	c.prevp.Store(byID[first.PrevID])
	for i := range c.f {
		c.f[i].offs = []int{0}
	}
	for _, r := range recs {
		if r.TrajID != c.traj || r.FirstStep != c.step0+int64(len(c.seqs)) || r.Tail {
			return c.orNil(), cs.chunkErr(c, 0, fmt.Errorf("fragment at step %d does not continue the open chunk (%d rows)", r.FirstStep, len(c.seqs)))
		}
		raws := make([][]byte, len(cs.fields))
		for fi, rf := range r.Fields {
			offs := cs.unitOffsets(fi, rf.Modes)
			raw, err := cs.unpack(rf.Payload, rf.Codec, rf.Delta, offs)
			if err != nil {
				return c.orNil(), cs.chunkErr(c, fi, err)
			}
			raws[fi] = raw
		}
		for fi, rf := range r.Fields {
			f := &c.f[fi]
			base := len(f.raw)
			f.raw = append(f.raw, raws[fi]...)
			f.modes = append(f.modes, rf.Modes...)
			for _, o := range cs.unitOffsets(fi, rf.Modes)[1:] {
				f.offs = append(f.offs, base+o)
			}
		}
		c.seqs = append(c.seqs, r.Seqs...)
	}
	c.fragFrom = len(c.seqs)
	return c, nil
}

func (c *chunk) orNil() *chunk {
	if len(c.seqs) == 0 {
		return nil
	}
	c.fragFrom = len(c.seqs)
	return c
}

// accept is recovery's check of one row: its compressed fields must be in
// a chunk, with a final observation if its record says so.
func (cs *chunkStore) accept(seq, slot, traj, step int64, hasTail bool) string {
	var l rowLoc
	ok := false
	for _, c := range cs.found[seq] {
		if c.c.traj == traj && c.c.step0+int64(c.i) == step && (!ok || c.c.id > l.c.id) {
			l, ok = c, true
		}
	}
	if !ok {
		return "no chunk record holds its compressed fields"
	}
	if l.c.prev() == nil && l.c.loadPrev != 0 {
		for fi, g := range cs.geoms {
			if g == nil || l.i >= g.k-1 {
				continue
			}
			all := true
			for _, m := range l.c.f[fi].modes[:l.i+1] {
				all = all && m == modeNewest
			}
			if all {
				return fmt.Sprintf("its frame stack needs chunk %d, which is missing", l.c.loadPrev)
			}
		}
	}
	if hasTail && cs.hasTailField() && (!l.c.tail || l.i != len(l.c.seqs)-1) {
		return fmt.Sprintf("its chunk %d holds no final observation", l.c.id)
	}
	cs.loc[slot] = l
	return ""
}

func (cs *chunkStore) tailFields() []bool {
	out := make([]bool, len(cs.fields))
	for i, t := range cs.tailIdx {
		out[i] = t >= 0
	}
	return out
}

func (cs *chunkStore) hasTailField() bool {
	for _, t := range cs.tailIdx {
		if t >= 0 {
			return true
		}
	}
	return false
}

// finishLoad sets up the writer's state for trajectories that continue
// after a clean close and drops the load maps.
func (cs *chunkStore) finishLoad(continued map[int64]bool) {
	for traj := range continued {
		ts := &trajState{stack: make([][]byte, len(cs.fields)), last: cs.lastByTr[traj]}
		if o := cs.openByTr[traj]; o != nil && (ts.last == nil || o.step0 > ts.last.step0) {
			ts.open = o
		}
		cs.trajs[traj] = ts
		if !cs.b.store.readOnly {
			cs.reloadStack(ts)
		}
	}
	cs.found, cs.openByTr, cs.lastByTr = nil, nil, nil
}

// reloadStack rebuilds, for each frame-stacked field, the stack of the unit
// the trajectory's next row will follow (the last of its open chunk, else
// of its last chunk), so dedup continues across a clean restart. A stack
// that cannot be rebuilt stays unknown: the next row is then stored
// without reference to it.
func (cs *chunkStore) reloadStack(ts *trajState) {
	c := ts.open
	if c == nil {
		c = ts.last
	}
	if c == nil || len(c.seqs) == 0 {
		return
	}
	for fi, g := range cs.geoms {
		if g == nil {
			continue
		}
		stack := make([]byte, g.rowBytes())
		w := &unitWalker{cs: cs, fi: fi, c: c, views: map[*chunk]*fieldView{}}
		if err := g.rebuild(stack, w, len(c.seqs)-1); err == nil {
			ts.stack[fi] = stack
		}
	}
}

// checkChunks decodes every chunk a live row needs (for verify).
func (cs *chunkStore) checkChunks() []string {
	var probs []string
	seen := map[cacheKey]bool{}
	for slot := range cs.loc {
		l := cs.loc[slot]
		if l.c == nil || cs.b.stamps.Load(int64(slot)) < 0 {
			continue
		}
		for fi := range cs.fields {
			for c, d := l.c, 0; c != nil && d < 2; c, d = c.prev(), d+1 {
				k := cacheKey{c.id, fi}
				if seen[k] {
					continue
				}
				seen[k] = true
				if _, err := cs.view(c, fi, map[*chunk]*fieldView{}); err != nil {
					probs = append(probs, err.Error())
				}
			}
		}
	}
	return probs
}

// readAllFile reads an open file from its start to its end, sized by one
// stat (it may still grow or shrink meanwhile; what is read is what counts).
func readAllFile(f *os.File) ([]byte, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	buf := bytes.NewBuffer(make([]byte, 0, st.Size()+512))
	if _, err := buf.ReadFrom(io.NewSectionReader(f, 0, 1<<62)); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
