package storage

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"time"

	"github.com/rbdb/rbd/storage/internal/mmapfile"
)

// A checkpoint is a consistent copy of one buffer, written while writers
// and samplers go on, into a new data dir that `Open` (and `rbd serve
// --data`) opens like any other: its catalog, and the buffer's files in
// the format of docs/format.md, whatever the buffer's kind. A memory
// buffer's checkpoint loads its rows back into memory when opened.
//
// Consistency: the copy is the buffer as of one write count W (the
// checkpoint's seq): the rows [W-capacity, W) and the stream, priority and
// trajectory state that goes with them. Writers pause only while W and
// that state are captured (microseconds); then the rows are copied oldest
// first, each checked against its seq stamp after the copy (the readers'
// seqlock), so a row is either copied whole as it was at W or, if a writer
// overwrote it before the copy reached it, left out: such rows, all at the
// oldest end, become holes of the copy and are counted in
// CheckpointResult.Overwritten. Nothing stops the world.
//
// Durability: the destination holds checkpointIncomplete from its first
// byte to its last fsync; Open refuses such a dir (ErrIncompleteCheckpoint),
// so a checkpoint cut short by a crash is never taken for a good one.

// checkpointIncomplete marks a checkpoint being written.
const checkpointIncomplete = "checkpoint.incomplete"

// ErrIncompleteCheckpoint is returned by Open for a data dir that a
// checkpoint was still writing when it stopped (crash, kill).
var ErrIncompleteCheckpoint = errors.New("storage: incomplete checkpoint (the process writing it stopped before it finished: take it again)")

// ErrCheckpointExists is returned by Checkpoint when the destination
// exists.
var ErrCheckpointExists = errors.New("storage: checkpoint destination exists")

// CheckpointOptions configures Buffer.Checkpoint. Nil gives the defaults.
type CheckpointOptions struct {
	// Progress, when set, is called as rows and files are copied with the
	// bytes done and the bytes in all.
	Progress func(done, total int64)
}

// CheckpointResult says what a checkpoint holds.
type CheckpointResult struct {
	Buffer string `json:"buffer"`
	Dir    string `json:"dir"`
	// WriteCount is the checkpoint's seq: it holds the rows written
	// before it, from FirstSeq on, and none written after.
	WriteCount int64 `json:"write_count"`
	FirstSeq   int64 `json:"first_seq"`
	Rows       int64 `json:"rows"`
	// Overwritten counts the rows of [WriteCount-capacity, WriteCount)
	// that writers overwrote before the copy reached them.
	Overwritten int64   `json:"overwritten"`
	Bytes       int64   `json:"bytes"`
	Seconds     float64 `json:"seconds"`
}

// checkpointState is what Checkpoint captures with writers paused.
type checkpointState struct {
	wc      int64
	streams map[string]map[int64]streamPos
	maxPrio float64
	holes   [][2]int64
	trajN   int64
	segs    []segCopy // chunk segments (compressed buffers)
	runSegs []segCopy // run segments (memmap buffers with row_meta "runs")
	// tip is, for rows.meta version 3, the watermark record of wc (the
	// checksum of the block wc ends in), or why it could not be taken.
	tip    watermarkRecord
	tipErr error
}

type segCopy struct {
	f    io.ReaderAt
	no   uint64
	size int64
}

// Checkpoint writes a consistent copy of the buffer into dest, a new data
// dir (ErrCheckpointExists if dest exists). See the comment above for
// what "consistent" means next to running writers.
//
// Cancelling ctx stops the copy and removes what was written.
func (b *Buffer) Checkpoint(ctx context.Context, dest string, opts *CheckpointOptions) (res CheckpointResult, retErr error) {
	var o CheckpointOptions
	if opts != nil {
		o = *opts
	}
	if !b.store.snapAt.IsZero() {
		// Another process writes these files: its writes change no stamp
		// this process can see, so a block overwritten while it is read
		// could not be told from damage, nor a row from a torn one.
		return res, fmt.Errorf("checkpoint %q: %w: this store reads a snapshot of a dir a running server holds; ask the server for the checkpoint (rbd checkpoint --url, POST /v1/buffers/{name}/checkpoint)", b.name, ErrReadOnly)
	}
	start := time.Now()
	if err := b.enter(); err != nil {
		return res, err
	}
	defer b.leave()
	defer b.recoverFault(&retErr, debug.SetPanicOnFault(true))
	if err := os.Mkdir(dest, 0o755); err != nil {
		if errors.Is(err, os.ErrExist) {
			return res, fmt.Errorf("checkpoint %q to %s: %w", b.name, dest, ErrCheckpointExists)
		}
		return res, fmt.Errorf("checkpoint %q: %w", b.name, err)
	}
	defer func() {
		if retErr != nil {
			// Nothing half-valid stays behind: the marker is gone only
			// once the copy is whole.
			retErr = errors.Join(fmt.Errorf("checkpoint %q to %s: %w", b.name, dest, retErr), os.RemoveAll(dest))
		}
	}()
	if err := writeSynced(filepath.Join(dest, checkpointIncomplete), []byte("rbd checkpoint in progress\n")); err != nil {
		return res, err
	}
	bdir := bufferDir(dest, b.name)
	if err := os.MkdirAll(bdir, 0o755); err != nil {
		return res, err
	}
	st := b.captureCheckpoint()
	if b.cs != nil {
		defer b.cs.unpin()
	}
	if b.rlog != nil {
		defer b.rlog.unpin()
	}
	res = CheckpointResult{Buffer: b.name, Dir: dest, WriteCount: st.wc, FirstSeq: max(0, st.wc-b.capacity)}
	cp := &rowCopier{ctx: ctx, b: b, st: st, progress: o.Progress}
	run := cp.run
	if b.blk != nil {
		run = cp.runBlocks
	}
	if err := run(bdir, &res); err != nil {
		return res, err
	}
	if err := cp.copySegments(bdir, cp.st.segs, segName, &res); err != nil {
		return res, err
	}
	if err := cp.copySegments(bdir, cp.st.runSegs, runSegName, &res); err != nil {
		return res, err
	}
	if err := b.writeCheckpointCatalog(dest, st, cp.holes); err != nil {
		return res, err
	}
	if err := syncDir(bdir); err != nil {
		return res, err
	}
	if err := os.Remove(filepath.Join(dest, checkpointIncomplete)); err != nil {
		return res, err
	}
	if err := syncDir(dest); err != nil {
		return res, err
	}
	res.Seconds = time.Since(start).Seconds()
	b.log.Info("checkpoint written", "dir", dest, "write_count", res.WriteCount, "rows", res.Rows,
		"overwritten", res.Overwritten, "bytes", res.Bytes, "seconds", res.Seconds)
	return res, nil
}

// captureCheckpoint takes, with writers paused, the write count and the
// state that goes with it; a compressed buffer's segments are pinned (none
// is deleted until unpin) and their sizes noted.
func (b *Buffer) captureCheckpoint() checkpointState {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	st := checkpointState{wc: b.writeCount.Load(), streams: map[string]map[int64]streamPos{}}
	for name, envs := range b.streams {
		m := make(map[int64]streamPos, len(envs))
		for e, pos := range envs {
			m[e] = *pos
		}
		st.streams[name] = m
	}
	if b.prio != nil {
		b.imu.RLock()
		st.maxPrio = b.prio.max
		b.imu.RUnlock()
	}
	b.stateMu.Lock()
	// Rows recovery dropped as damage are left out of the copy as holes
	// are: they have no stamp, and no writer overwrote them.
	st.holes = mergeHoles(b.holes, b.damaged, -1)
	b.stateMu.Unlock()
	b.store.traj.Lock()
	st.trajN = b.store.traj.next
	b.store.traj.Unlock()
	if b.cs != nil {
		cs := b.cs
		cs.segMu.Lock()
		cs.pins++
		for _, s := range cs.segs {
			st.segs = append(st.segs, segCopy{f: s.f, no: s.no, size: s.size})
		}
		cs.segMu.Unlock()
	}
	if b.rlog != nil {
		// Every piece of a row below wc was appended before the row was
		// written, so it lies within these sizes.
		st.runSegs = b.rlog.pin()
	}
	if b.blk != nil {
		if b.store.readOnly {
			// No writer: the rows' checksums are on disk, the watermark
			// record's tip and the block records (sourceClaims).
			if wr, why := decodeWatermarkRecord(b.hdr); why == "" {
				st.tip = wr
			} else {
				st.tip = watermarkRecord{TipBase: -1}
			}
		} else {
			st.tip, st.tipErr = b.tipLocked()
		}
	}
	return st
}

func (cs *chunkStore) unpin() {
	cs.segMu.Lock()
	cs.pins--
	cs.segMu.Unlock()
}

// rowCopier copies the rows of a checkpoint block by block.
type rowCopier struct {
	ctx      context.Context
	b        *Buffer
	st       checkpointState
	progress func(done, total int64)
	files    []*os.File // per column of b.allColumns(), then rows.meta
	cols     []*column
	holes    [][2]int64
	done     int64
	total    int64
	scratch  [recordSize]byte // decodeRecord's
	// slots is the copy's files' slots: the buffer's, except for a
	// memory buffer with a spare block (ringSlotCount), whose checkpoint
	// files hold one slot a row, as every file of format version 1 or 2.
	slots int64
}

// checkpointBlock is how many rows are copied, checked and written at a
// time: large enough for sequential I/O, small enough that the oldest rows
// are copied before writers reach them.
const checkpointBlock = 4096

func (cp *rowCopier) run(bdir string, res *CheckpointResult) (retErr error) {
	b := cp.b
	cp.cols = b.allColumns()
	cp.slots = b.slots
	if !b.persistent {
		cp.slots = b.capacity
	}
	defer func() {
		for _, f := range cp.files {
			if err := f.Close(); err != nil && retErr == nil {
				retErr = err
			}
		}
	}()
	for _, c := range cp.cols {
		size := headerSize + cp.slots*int64(c.rowBytes)
		if c.dense {
			size = b.colFileSize(c)
		}
		allocated := size
		if c.sparse || c.dense {
			allocated = headerSize // the copy writes the final observations it has, nothing else
		}
		f, err := createFile(filepath.Join(bdir, c.file), size, allocated, b.colHeaderFor(c).encode())
		if err != nil {
			return err
		}
		cp.files = append(cp.files, f)
		cp.total += (res.WriteCount - res.FirstSeq) * int64(c.rowBytes)
	}
	hdr := b.metaHeader().encode()
	putWatermark(hdr, res.WriteCount)
	meta, err := createAllocated(metaFile(bdir), headerSize+cp.slots*b.fileRecordSize(), hdr)
	if err != nil {
		return err
	}
	cp.files = append(cp.files, meta)
	cp.total += (res.WriteCount - res.FirstSeq) * b.fileRecordSize()
	for _, s := range slices.Concat(cp.st.segs, cp.st.runSegs) {
		cp.total += s.size
	}
	// Newest first. Writers overwrite the oldest rows first, so the rows
	// they take before the copy reaches them are always a prefix of the
	// window: once a block has lost one, every older row is lost too and
	// need not be read. A contiguous loss at the oldest end is what a
	// ring that moved on looks like: trajectories keep contiguous runs of
	// their newest rows, as they always do.
	for hi := res.WriteCount; hi > res.FirstSeq; {
		lo := max(res.FirstSeq, hi-checkpointBlock)
		// A block must not wrap around the ring's end, the buffer's or
		// the copy's.
		lo = max(lo, (hi-1)-(hi-1)%b.slots, (hi-1)-(hi-1)%cp.slots)
		if err := cp.ctx.Err(); err != nil {
			return err
		}
		kept, overwritten, err := cp.copyBlock(lo, hi)
		if err != nil {
			return err
		}
		res.Rows += kept
		res.Overwritten += overwritten
		hi = lo
		if overwritten > 0 && hi > res.FirstSeq {
			for seq := res.FirstSeq; seq < hi; seq++ {
				if !inHoles(cp.st.holes, seq) {
					res.Overwritten++
				}
			}
			cp.addHoleRange(res.FirstSeq, hi)
			cp.advance((hi - res.FirstSeq) * cp.rowBytes())
			break
		}
	}
	res.Bytes = cp.done
	for _, f := range cp.files {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("sync %s: %w", f.Name(), err)
		}
	}
	return nil
}

// copyBlock copies rows [lo, hi) (contiguous slots of the buffer and of
// the copy, from src0 and s0): every column's bytes
// and the records, then keeps the rows whose stamps still hold their seq
// (a row overwritten meanwhile, or a hole, gets a zero record: missing).
func (cp *rowCopier) copyBlock(lo, hi int64) (kept, overwritten int64, err error) {
	b := cp.b
	n := hi - lo
	src0, s0 := lo%b.slots, lo%cp.slots
	bufs := make([][]byte, len(cp.cols)+1)
	entries := make([][]tailEntry, len(cp.cols)) // dense tail columns: what bufs[i] holds
	for i, c := range cp.cols {
		rb := int64(c.rowBytes)
		copyCol := func() {
			if c.dense {
				// Dense tail files: the entries of the rows with a final
				// observation, trailer included, go to the same entry of
				// the copy.
				bufs[i] = bufs[i][:0]
				entries[i] = entries[i][:0]
				pitch := c.pitch()
				for k := range n {
					var r record
					b.loadRecord(lo+k, &r)
					if r.Flags&flagHasTail != 0 {
						at := b.tailIx.pos(lo + k)
						bufs[i] = append(bufs[i], c.data[at*pitch:(at+1)*pitch]...)
						entries[i] = append(entries[i], tailEntry{lo + k, at})
					}
				}
				return
			}
			if c.role == roleTail && b.tailIx != nil {
				// Dense tails (tailIndex): checkpoint files keep them
				// at the slot, as memmap buffers do.
				bufs[i] = append(bufs[i][:0], make([]byte, n*rb)...)
				for k := range n {
					var r record
					b.memRecord(lo+k, &r)
					if r.Flags&flagHasTail != 0 {
						at := b.tailIx.pos(lo+k) * rb
						copy(bufs[i][k*rb:(k+1)*rb], c.data[at:at+rb])
					}
				}
				return
			}
			if pitch := c.pitch(); pitch != rb {
				// A row-group field: checkpoint files hold columns.
				bufs[i] = bufs[i][:0]
				for slot := src0; slot < src0+n; slot++ {
					bufs[i] = append(bufs[i], c.data[slot*pitch:slot*pitch+rb]...)
				}
				return
			}
			bufs[i] = append(bufs[i][:0], c.data[src0*rb:(src0+n)*rb]...)
		}
		if c.field.Mutable {
			b.readMutable(copyCol)
		} else {
			copyCol()
		}
	}
	recordSize := b.fileRecordSize()
	recs := make([]byte, 0, n*recordSize)
	switch {
	case b.rlog != nil:
		// Version 2 records as they are: the run segments copied with
		// them hold their pieces.
		recs = append(recs, b.drecs[src0*recordSize:(src0+n)*recordSize]...)
	case b.compactRecords():
		// A memory buffer's records are memory records: write them as
		// file records (the stamp check below drops any caught
		// mid-write; sealRecord adds the data checksum).
		recs = recs[:n*recordSize]
		for i := range n {
			r := record{Seq: lo + i}
			b.memRecord(lo+i, &r)
			encodeRecord(recs[i*recordSize:(i+1)*recordSize], &r)
		}
	default:
		for slot := src0; slot < src0+n; slot++ {
			recs = append(recs, b.rec(slot)...)
		}
	}
	bufs[len(cp.cols)] = recs
	// Newest first: writers overwrite the block from its oldest row up, so
	// once one row is found overwritten, every older one is (or is about
	// to be) too, whatever its stamp says at the moment it is read.
	lost := false
	missing := make([]bool, n)
	for i := n - 1; i >= 0; i-- {
		seq := lo + i
		rec := recs[i*recordSize : (i+1)*recordSize]
		hole := inHoles(cp.st.holes, seq)
		if lost || b.stamps.Load(src0+i) != seq {
			missing[i] = true
			// A hole of the source, or overwritten since the capture (a
			// row below the capture's write count was complete then):
			// missing from the copy either way.
			if !hole {
				overwritten++
				lost = true
			}
			clear(rec)
			cp.addHole(seq)
			continue
		}
		if !b.persistent {
			cp.sealRecord(rec, bufs, i)
		}
		kept++
	}
	for i, c := range cp.cols {
		rb := int64(c.rowBytes)
		if c.dense {
			// The entries of the rows kept: one found overwritten above
			// may have been read from an entry a newer row holds.
			pitch := c.pitch()
			for e, te := range entries[i] {
				if missing[te.seq-lo] {
					continue
				}
				if _, err := cp.files[i].WriteAt(bufs[i][int64(e)*pitch:int64(e+1)*pitch], headerSize+te.at*pitch); err != nil {
					return 0, 0, err
				}
			}
			cp.advance(int64(len(bufs[i])))
			continue
		}
		if c.sparse {
			// Only the rows with a final observation: the file keeps
			// its holes where the source has them. (A row found
			// overwritten above got a zero record; its tail bytes are
			// never read.)
			for k := range n {
				var r record
				b.loadRecord(lo+k, &r)
				if r.Flags&flagHasTail == 0 {
					continue
				}
				if _, err := cp.files[i].WriteAt(bufs[i][k*rb:(k+1)*rb], headerSize+(s0+k)*rb); err != nil {
					return 0, 0, err
				}
			}
			cp.advance(int64(len(bufs[i])))
			continue
		}
		if _, err := cp.files[i].WriteAt(bufs[i], headerSize+s0*rb); err != nil {
			return 0, 0, err
		}
		cp.advance(int64(len(bufs[i])))
	}
	if _, err := cp.files[len(cp.cols)].WriteAt(recs, headerSize+s0*recordSize); err != nil {
		return 0, 0, err
	}
	cp.advance(int64(len(recs)))
	b.store.crash.at("checkpoint-copy")
	return kept, overwritten, nil
}

// sealRecord gives a memory buffer's row the data checksum persistent
// kinds keep in the record (memory rows skip it), so that the copy is
// checked like any file.
func (cp *rowCopier) sealRecord(rec []byte, bufs [][]byte, i int64) {
	r, _ := decodeRecord(rec, &cp.scratch)
	var crc uint32
	for k, c := range cp.cols {
		// Mutable fields stay out, as in writeRow and rowCRC.
		if c.role == rolePriority || (c.role == roleTail && r.Flags&flagHasTail == 0) || c.cz >= 0 || c.field.Mutable {
			continue
		}
		rb := int64(c.rowBytes)
		crc = crc32.Update(crc, castagnoli, bufs[k][i*rb:(i+1)*rb])
	}
	r.DataCRC = crc
	encodeRecord(rec, &r)
}

func (cp *rowCopier) addHole(seq int64) { cp.addHoleRange(seq, seq+1) }

// addHoleRange notes [lo, hi) as missing from the copy (mergeHoles sorts
// and joins the ranges).
func (cp *rowCopier) addHoleRange(lo, hi int64) {
	cp.holes = append(cp.holes, [2]int64{lo, hi})
}

// rowBytes is what one row takes in all the copied files.
func (cp *rowCopier) rowBytes() int64 {
	n := cp.b.fileRecordSize()
	for _, c := range cp.cols {
		n += int64(c.rowBytes)
	}
	return n
}

func (cp *rowCopier) advance(n int64) {
	cp.done += n
	if cp.progress != nil {
		cp.progress(cp.done, cp.total)
	}
}

// copySegments copies pinned segments (of chunks or of runs) up to the
// sizes they had at the capture: every record of the rows below the
// checkpoint's seq, none after.
func (cp *rowCopier) copySegments(bdir string, segs []segCopy, name func(uint64) string, res *CheckpointResult) error {
	for _, s := range segs {
		if err := cp.ctx.Err(); err != nil {
			return err
		}
		path := filepath.Join(bdir, name(s.no))
		out, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		_, err = io.Copy(out, io.NewSectionReader(s.f, 0, s.size))
		if err == nil {
			err = out.Sync()
		}
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("copy segment %s: %w", path, err)
		}
		cp.advance(s.size)
		res.Bytes += s.size
	}
	return nil
}

// writeCheckpointCatalog makes the destination's catalog: the buffer's
// spec, its state as of the checkpoint (a clean close, so that its streams
// continue), the streams, and the trajectory id counter.
func (b *Buffer) writeCheckpointCatalog(dest string, st checkpointState, missing [][2]int64) error {
	cat, err := openCatalog(filepath.Join(dest, "catalog.db"), false, time.Second)
	if err != nil {
		return err
	}
	holes := mergeHoles(st.holes, missing, st.wc-b.capacity)
	state := bufferState{UID: b.uid, WriteCount: st.wc, SeqReserved: b.roundReservation(st.wc), Clean: true, MaxPriority: st.maxPrio,
		Holes: holes, CreatedAt: b.createdAt}
	err = cat.createBuffer(b.name, b.Spec(), state)
	if err == nil {
		err = cat.putState(b.name, state, st.streams, true)
	}
	if err == nil {
		err = cat.putTrajNext(st.trajN)
	}
	return errors.Join(err, cat.close())
}

func inHoles(holes [][2]int64, seq int64) bool {
	for _, h := range holes {
		if seq >= h[0] && seq < h[1] {
			return true
		}
	}
	return false
}

// mergeHoles joins two hole lists, dropping what lies below lo.
func mergeHoles(a, b [][2]int64, lo int64) [][2]int64 {
	var all [][2]int64
	for _, h := range slices.Concat(a, b) {
		if h[1] > lo {
			all = append(all, h)
		}
	}
	slices.SortFunc(all, func(x, y [2]int64) int { return cmp.Compare(x[0], y[0]) })
	return mergeRanges(all)
}

// restoreMemory opens a memory buffer whose rows a checkpoint left in
// files: they are recovered and checked like a memmap buffer's, then
// copied into memory (a read-only open keeps them mapped). The files are
// deleted once the catalog has recorded the open (dropRestoredFiles): a
// memory buffer's rows live in memory only, and a later restart must not
// bring back the checkpoint's.
func (s *Store) restoreMemory(b *Buffer, e catalogEntry) (*Buffer, int64, error) {
	b.persistent, b.dir = true, bufferDir(s.dir, e.name)
	if err := b.openFiles(!s.readOnly); err != nil {
		return nil, 0, err
	}
	maxTraj, err := b.recover(e.state, e.streams)
	if err != nil {
		return nil, 0, errors.Join(err, b.unmap())
	}
	if s.readOnly {
		return b, maxTraj, nil
	}
	if err := b.moveToMemory(); err != nil {
		return nil, 0, errors.Join(err, b.unmap())
	}
	s.restored = append(s.restored, b.dir)
	b.persistent, b.dir, b.hdr = false, "", nil
	s.log.Info("memory buffer restored from checkpoint files", "buffer", b.name, "rows", b.ix.rows, "write_count", b.writeCount.Load())
	return b, maxTraj, nil
}

// moveToMemory replaces every file mapping of the buffer by anonymous
// memory holding the same bytes: the records and small fields go straight
// into the row group, the final observations into dense tail columns
// (moveTailsToMemory), every other column into a region of its own.
func (b *Buffer) moveToMemory() error {
	if err := b.interleaveSmallFields(true); err != nil {
		return err
	}
	if len(b.tails) > 0 {
		if err := b.moveTailsToMemory(); err != nil {
			return err
		}
	}
	for _, c := range b.allColumns() {
		if c.stride != 0 || c.role == roleTail {
			continue // in the row group, or moved already
		}
		anon, err := mmapfile.Anonymous(int64(len(c.data)))
		if err != nil {
			return err
		}
		copy(anon.Bytes(), c.data)
		if err := c.region.Close(); err != nil {
			return errors.Join(err, anon.Close())
		}
		c.region, c.data = anon, anon.Bytes()
	}
	return nil
}

// moveTailsToMemory gives a restored memory buffer its dense tail columns
// (tailIndex): the final observations of its live rows, in seq order,
// from the checkpoint's tail files, which keep them at the slot. Called
// once the records are memory records.
func (b *Buffer) moveTailsToMemory() error {
	ti := newTailIndex(b.capacity, b.tails)
	anons := make([]*mmapfile.Region, 0, len(b.tails))
	for _, c := range b.tails {
		r, err := mmapfile.Anonymous(ti.rows * int64(c.rowBytes))
		if err != nil {
			for _, a := range anons {
				err = errors.Join(err, a.Close())
			}
			return fmt.Errorf("buffer %q tail column %q: %w", b.name, c.name, err)
		}
		anons = append(anons, r)
	}
	wc := b.writeCount.Load()
	for seq := max(0, wc-b.capacity); seq < wc; seq++ {
		ti.begin(seq)
		if b.stamps.Load(seq%b.slots) != seq {
			continue // a hole, or a row recovery dropped
		}
		var r record
		b.memRecord(seq, &r)
		if r.Flags&flagHasTail == 0 {
			continue
		}
		at := ti.add(seq)
		for i, c := range b.tails {
			rb := int64(c.rowBytes)
			copy(anons[i].Bytes()[at*rb:(at+1)*rb], c.row(seq%b.slots))
		}
	}
	var errs []error
	for i, c := range b.tails {
		errs = append(errs, c.region.Close())
		c.region, c.data = anons[i], anons[i].Bytes()
	}
	b.tailIx = ti
	return errors.Join(errs...)
}

// dropRestoredFiles deletes the checkpoint files of memory buffers loaded
// at open.
func (s *Store) dropRestoredFiles() {
	for _, dir := range s.restored {
		if err := os.RemoveAll(dir); err != nil {
			s.log.Warn("remove the checkpoint files of a restored memory buffer", "dir", dir, "err", err)
		}
	}
	s.restored = nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// checkComplete refuses a data dir that a checkpoint did not finish.
func checkComplete(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, checkpointIncomplete)); err == nil {
		return ErrIncompleteCheckpoint
	}
	return nil
}

// createAllocated creates a file of size bytes with every block reserved
// and hdr at its start.
func createAllocated(path string, size int64, hdr []byte) (*os.File, error) {
	return createFile(path, size, size, hdr)
}

// createFile creates a file of size bytes with its first allocated bytes'
// blocks reserved (the rest holes) and hdr written at its start.
func createFile(path string, size, allocated int64, hdr []byte) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, err
	}
	if err := f.Truncate(size); err != nil {
		return nil, errors.Join(err, f.Close())
	}
	if err := mmapfile.Allocate(f, allocated); err != nil {
		return nil, errors.Join(err, f.Close())
	}
	if _, err := f.WriteAt(hdr, 0); err != nil {
		return nil, errors.Join(err, f.Close())
	}
	return f, nil
}

// writeSynced writes a small file and syncs it and its directory.
func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}
