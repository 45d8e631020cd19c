package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/rbdb/rbd/storage/internal/mmapfile"
)

// A memmap buffer with row_meta "runs" keeps rows.meta in format version 2
// (docs/format.md): a 16-byte record per slot that names its row's run
// piece, and the pieces in a run log of append-only segment files
// (runs.NNNNNNNN.rbdr). A piece is what one extend wrote of one trajectory:
// consecutive steps of one env and policy version, at most 65,535 seqs
// from its first row to its last, ended by a flagged row (done, truncated,
// a final observation). Its record holds what its rows share (traj_id,
// first step, the first row's prev_seq, env, version, the last row's
// flags) and is keyed by its first row's seq; a row's record holds
// seq - first_seq, its offset in the piece and its distance back to the
// row before it. Pieces are written once, before their rows, and die in
// the order they were written, so segments are deleted whole once every
// piece in them has left the window: there is no compaction and no
// rewrite.
//
// Readers never read this: they read the buffer's memory records (the
// memory buffers' runs layout, memruns.go), which recovery rebuilds from
// the files. The run log exists for crash recovery, verify and
// checkpoints.

const (
	// metaVersionRuns is the rows.meta format version of a memmap buffer
	// with row_meta "runs". Column files stay at FormatVersion.
	metaVersionRuns uint32 = 2
	// metaVersionBlocks is the rows.meta format version of a memmap
	// buffer with row_meta "blocks" (blocks.go); its run segments have
	// this version too.
	metaVersionBlocks uint32 = 3
	// fileRunRecordSize is a version 2 row record.
	fileRunRecordSize = 16

	frWord = 0  // u64: seq residue, writing bit, run delta (below)
	frCRC  = 8  // u32 CRC-32C: field bytes, tail bytes, then bytes [0,8) and [12,16)
	frOff  = 12 // u16 the row's offset in its piece
	frDist = 14 // u16 seq - prev_seq when the offset is not 0, else 0

	// A row's seq is stored modulo 2^47: a ring holds at most 2^40 rows,
	// so the seqs a slot can hold are resolved without doubt against the
	// seq reservation (resolveSeq), and the word keeps 16 bits for the
	// run delta and one for the writing marker.
	seqResidueBits = 47
	seqResidueMask = 1<<seqResidueBits - 1
	frWriting      = 1 << seqResidueBits
	frDeltaShift   = 48

	runLogRecordSize = 64
	rlFirstSeq       = 0  // i64 seq of the piece's first row (the key)
	rlTraj           = 8  // i64 traj_id
	rlStep           = 16 // i64 step of the first row
	rlPrev           = 24 // i64 prev_seq of the first row, -1 at a trajectory's start
	rlEnv            = 32 // i64 env
	rlVersion        = 40 // i64 policy_version
	rlSpan           = 48 // u16 last row's seq - first_seq
	rlRows           = 50 // u16 rows in the piece, 1..65535
	rlFlags          = 52 // u8 flags of the last row
	rlCRC            = 60 // u32 CRC-32C of bytes [0, 60)

	maxPieceSpan = 1<<16 - 1
	maxPieceRows = 1<<16 - 1
)

var runSegMagic = [8]byte{'R', 'B', 'D', 'R', 'U', 'N', 'S', 0}

func runSegName(no uint64) string { return fmt.Sprintf("runs.%08d.rbdr", no) }

// fileRunWord is the first word of a version 2 row record of seq, without
// the writing bit.
func fileRunWord(seq int64, delta uint16) uint64 {
	return uint64(seq)&seqResidueMask | uint64(delta)<<frDeltaShift
}

// resolveSeq returns the seq with residue res (mod 2^47) nearest ref: the
// one in (ref - 2^46, ref + 2^46].
func resolveSeq(res uint64, ref int64) int64 {
	d := int64((res - uint64(ref)) & seqResidueMask)
	if d > 1<<(seqResidueBits-1) {
		d -= 1 << seqResidueBits
	}
	return ref + d
}

// runPiece is a decoded run log record.
type runPiece struct {
	FirstSeq, TrajID, FirstStep, PrevSeq, Env, PolicyVersion int64
	Span, Rows                                               uint16
	Flags                                                    uint8
}

func (p *runPiece) lastSeq() int64 { return p.FirstSeq + int64(p.Span) }

func (p *runPiece) encode(b []byte) {
	le := binary.LittleEndian
	le.PutUint64(b[rlFirstSeq:], uint64(p.FirstSeq))
	le.PutUint64(b[rlTraj:], uint64(p.TrajID))
	le.PutUint64(b[rlStep:], uint64(p.FirstStep))
	le.PutUint64(b[rlPrev:], uint64(p.PrevSeq))
	le.PutUint64(b[rlEnv:], uint64(p.Env))
	le.PutUint64(b[rlVersion:], uint64(p.PolicyVersion))
	le.PutUint16(b[rlSpan:], p.Span)
	le.PutUint16(b[rlRows:], p.Rows)
	b[rlFlags] = p.Flags
	clear(b[rlFlags+1 : rlCRC])
	le.PutUint32(b[rlCRC:], crc32.Checksum(b[:rlCRC], castagnoli))
}

// readRunRecord reads the fields of a run log record whose checksum holds
// and whose reserved bytes are zero, and says why it is not such a record
// ("" if it is). Versions 2 and 3 share the layout; the u16 at rlSpan is
// a span in version 2, a stride in version 3.
func readRunRecord(b []byte) (runPiece, string) {
	le := binary.LittleEndian
	if got, want := le.Uint32(b[rlCRC:]), crc32.Checksum(b[:rlCRC], castagnoli); got != want {
		return runPiece{}, fmt.Sprintf("checksum %08x, computed %08x", got, want)
	}
	p := runPiece{
		FirstSeq: int64(le.Uint64(b[rlFirstSeq:])), TrajID: int64(le.Uint64(b[rlTraj:])),
		FirstStep: int64(le.Uint64(b[rlStep:])), PrevSeq: int64(le.Uint64(b[rlPrev:])),
		Env: int64(le.Uint64(b[rlEnv:])), PolicyVersion: int64(le.Uint64(b[rlVersion:])),
		Span: le.Uint16(b[rlSpan:]), Rows: le.Uint16(b[rlRows:]), Flags: b[rlFlags],
	}
	if !isZero(b[rlFlags+1 : rlCRC]) {
		return p, "reserved bytes are not zero"
	}
	return p, ""
}

// decodeRunPiece decodes a run log record and says why it is not one a
// writer could have written ("" if it is).
func decodeRunPiece(b []byte) (runPiece, string) {
	p, why := readRunRecord(b)
	if why != "" {
		return p, why
	}
	switch {
	case p.FirstSeq < 0 || p.TrajID < 0 || p.FirstStep < 0:
		return p, fmt.Sprintf("negative seq %d, trajectory %d or step %d", p.FirstSeq, p.TrajID, p.FirstStep)
	case p.PrevSeq < -1 || p.PrevSeq >= p.FirstSeq:
		return p, fmt.Sprintf("impossible prev_seq %d for first seq %d", p.PrevSeq, p.FirstSeq)
	case p.Rows == 0 || int(p.Rows)-1 > int(p.Span):
		return p, fmt.Sprintf("%d rows in a span of %d seqs", p.Rows, int(p.Span)+1)
	case uint32(p.Flags)&^knownFlags != 0:
		return p, fmt.Sprintf("unknown flags %#x", p.Flags)
	}
	return p, ""
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// pieceRow is what a version 2 row record holds besides its seq.
type pieceRow struct{ delta, off, dist uint16 }

// runLog appends the pieces of a buffer's extends to segment files and
// deletes the segments the window has left. Writers (holding the buffer's
// wmu) call plan, appendPlanned and collect; sync and the checkpoint's pin
// take segMu.
type runLog struct {
	b      *Buffer
	target int64 // a segment is full past this many bytes

	segMu    sync.Mutex
	segs     []*runSegment
	nextSeg  uint64
	newSeg   bool // the next append starts a segment (after an open)
	pins     int  // checkpoints copying the segments: none is deleted
	dirDirty bool // a segment was created or deleted since the last sync

	// A segment is made ahead of need, off the writer's path: when a
	// segment starts, a goroutine creates the next one (the spare) and
	// deletes the segments the window has left. Creating a file,
	// allocating and mapping it, and unmapping and unlinking the dead
	// ones took 5% of a CartPole extend's CPU, at every 1,024th piece.
	// preparing is closed when the spare in the making is ready or has
	// failed (nil: none is); a writer that needs a segment before then
	// waits for it. bg counts the goroutines; close waits for them.
	spare     *runSegment
	preparing chan struct{}
	bg        sync.WaitGroup

	// v3: the run log of a buffer with rows.meta version 3 (pieces with
	// a stride, planned by planStrided into pv3; segment version 3).
	v3 bool

	// Scratch of the batch being written (wmu): its pieces and, for the
	// row of seq first+i, rows[i] (version 2), or its pieces (version 3).
	first  int64
	pieces []runPiece
	rows   []pieceRow
	pv3    []pieceV3
	open   [256]int32 // 1 + index in pieces of a trajectory's open piece, by its low bits
	buf    []byte
}

// runSegment is one run segment file. Segments a build creates are mapped
// and all their blocks allocated at creation (mmapfile.Create): an append
// is a copy into the mapping, not a pwrite (a system call per extend,
// which the CartPole extend's profile showed), and cannot fault on a full
// disk. Run records end where the zeros begin; an all-zero
// record is never valid (its checksum would be 0x5a0b0531).
type runSegment struct {
	no      uint64
	path    string
	r       *mmapfile.Region // nil for segments found at open (never appended to)
	size    int64            // the file's size
	used    int64            // bytes of header and records appended (segments of this open)
	dirty   bool
	syncing int   // syncs in progress (not collected meanwhile)
	maxLast int64 // the largest last seq of its pieces, -1 if none
}

func newRunLog(b *Buffer) *runLog {
	return &runLog{b: b, target: runSegmentTarget(b.capacity), nextSeg: 1, newSeg: true, v3: b.spec.blockFiles()}
}

// version is the format version of the log's segments.
func (l *runLog) version() uint32 {
	if l.v3 {
		return metaVersionBlocks
	}
	return metaVersionRuns
}

// planStrided cuts recs (one extend's rows in seq order, the first at seq
// first) into version 3 pieces: a trajectory's piece continues while its
// rows follow each other (prev_seq, step) equally many seqs apart, keep
// env and version, and none is flagged, up to maxPieceRows rows within
// maxPieceSpan seqs. Envs stepping in lockstep (a collector's rows) make
// a piece per trajectory and extend, as version 2 does; rows of one
// trajectory at irregular distances start a piece at each change of
// distance.
func (l *runLog) planStrided(recs []record, first int64) {
	l.first = first
	l.pv3 = l.pv3[:0]
	clear(l.open[:])
	for i := range recs {
		r := &recs[i]
		k := r.TrajID & int64(len(l.open)-1)
		if j := l.open[k] - 1; j >= 0 {
			p := &l.pv3[j]
			last := p.lastSeq()
			d := r.Seq - last
			if p.TrajID == r.TrajID && last == r.PrevSeq && r.Step == p.FirstStep+int64(p.Rows) && p.Flags == 0 &&
				r.Env == p.Env && r.PolicyVersion == p.PolicyVersion && p.Rows < maxPieceRows &&
				r.Seq-p.FirstSeq <= maxPieceSpan && (p.Rows == 1 || d == int64(p.Stride)) {
				p.Stride = uint16(d)
				p.Rows++
				p.Flags = uint8(r.Flags)
				if r.Flags != 0 {
					l.open[k] = 0
				}
				continue
			}
		}
		l.pv3 = append(l.pv3, pieceV3{FirstSeq: r.Seq, TrajID: r.TrajID, FirstStep: r.Step, PrevSeq: r.PrevSeq,
			Env: r.Env, PolicyVersion: r.PolicyVersion, Rows: 1, Flags: uint8(r.Flags)})
		l.open[k] = int32(len(l.pv3))
		if r.Flags != 0 {
			l.open[k] = 0
		}
	}
}

// runSegmentTarget is the size of the run segments of a ring of capacity
// rows: a quarter of a byte a slot (64 KiB to 64 MiB). The log holds the
// pieces of the window (2 bytes a row for CartPole-like batches of 8 envs)
// plus at most two segments of slack (the one being filled, the oldest
// one partly dead) and the spare: 0.75 bytes a row, above 256 Ki rows. A
// segment starts every 120 or so extends of 256 rows from 8 envs (8-9
// pieces each) at the least size, less often in larger rings (a file
// creation, made ahead by prepareNext; no sync: the next sync does it).
func runSegmentTarget(capacity int64) int64 { return min(max(capacity/4, 64<<10), 64<<20) }

// plan cuts recs (one extend's rows in seq order) into pieces and returns
// what each row's record will hold. A trajectory's piece continues while
// its rows follow each other (prev_seq, step), keep env and version, and
// none is flagged; a trajectory whose low bits another one took in the
// cache starts a new piece, which costs a record, never correctness.
func (l *runLog) plan(recs []record, first int64) []pieceRow {
	l.first = first
	l.reset()
	return l.planMore(recs)
}

// reset forgets the pieces planned so far.
func (l *runLog) reset() {
	l.pieces = l.pieces[:0]
	clear(l.open[:])
}

// planMore is plan for rows that follow those planned since the last
// reset (the pieces of both continue): an upgrade plans a ring's rows a
// block at a time.
func (l *runLog) planMore(recs []record) []pieceRow {
	if cap(l.rows) < len(recs) {
		l.rows = make([]pieceRow, len(recs))
	}
	l.rows = l.rows[:len(recs)]
	for i := range recs {
		r := &recs[i]
		k := r.TrajID & int64(len(l.open)-1)
		if j := l.open[k] - 1; j >= 0 {
			p := &l.pieces[j]
			if p.TrajID == r.TrajID && p.lastSeq() == r.PrevSeq && r.Step == p.FirstStep+int64(p.Rows) &&
				r.Seq-p.FirstSeq <= maxPieceSpan && p.Rows < maxPieceRows && p.Flags == 0 &&
				r.Env == p.Env && r.PolicyVersion == p.PolicyVersion {
				l.rows[i] = pieceRow{delta: uint16(r.Seq - p.FirstSeq), off: p.Rows, dist: uint16(r.Seq - r.PrevSeq)}
				p.Rows++
				p.Span = uint16(r.Seq - p.FirstSeq)
				p.Flags = uint8(r.Flags)
				if r.Flags != 0 {
					l.open[k] = 0
				}
				continue
			}
		}
		l.pieces = append(l.pieces, runPiece{FirstSeq: r.Seq, TrajID: r.TrajID, FirstStep: r.Step, PrevSeq: r.PrevSeq,
			Env: r.Env, PolicyVersion: r.PolicyVersion, Rows: 1, Flags: uint8(r.Flags)})
		l.rows[i] = pieceRow{}
		l.open[k] = int32(len(l.pieces))
		if r.Flags != 0 {
			l.open[k] = 0
		}
	}
	return l.rows
}

// appendPlanned writes the pieces of the last plan at the end of the
// active segment, starting a new one when it is full (and then having
// the segments wholly below keepFrom() deleted in the background; it is
// asked only then: for an fsync buffer it takes the sync lock). It runs
// before any row of the
// batch is written, so a row whose record is whole has its piece in the
// file (durable once the segment is synced, which syncFiles does before
// the rows). The only error is a segment that cannot be created (a full
// disk): nothing of the batch is written then.
func (l *runLog) appendPlanned(keepFrom func() int64) error {
	return l.appendRecords(keepFrom, true)
}

// appendRecords is appendPlanned; extend says whether an extend appends
// (it passes the crash points of one: tests kill a writer there).
func (l *runLog) appendRecords(keepFrom func() int64, extend bool) error {
	count := len(l.pieces)
	if l.v3 {
		count = len(l.pv3)
	}
	if count == 0 {
		return nil
	}
	n := count * runLogRecordSize
	if cap(l.buf) < n {
		l.buf = make([]byte, n)
	}
	buf := l.buf[:n]
	maxLast := int64(-1)
	if l.v3 {
		for i := range l.pv3 {
			l.pv3[i].encode(buf[i*runLogRecordSize:])
			maxLast = max(maxLast, l.pv3[i].lastSeq())
		}
	} else {
		for i := range l.pieces {
			l.pieces[i].encode(buf[i*runLogRecordSize:])
			maxLast = max(maxLast, l.pieces[i].lastSeq())
		}
	}
	l.segMu.Lock()
	defer l.segMu.Unlock()
	var seg *runSegment
	if n := len(l.segs); n > 0 && !l.newSeg {
		seg = l.segs[n-1]
	}
	if seg == nil || seg.used+int64(len(buf)) > seg.size {
		var err error
		if seg, err = l.startSegment(int64(len(buf))); err != nil {
			return err
		}
		l.prepareNext(keepFrom())
	}
	at := seg.used
	dst := seg.r.Bytes()[at : at+int64(len(buf))]
	crash := l.b.store.crash
	if extend && crash.armed("mid-runs") {
		// Leave a torn record behind, as a crash halfway through the
		// copy would.
		copy(dst, buf[:len(buf)-runLogRecordSize/2])
	}
	if extend {
		crash.at("mid-runs")
	}
	copy(dst, buf)
	seg.used += int64(len(buf))
	seg.dirty = true
	seg.maxLast = max(seg.maxLast, maxLast)
	if extend {
		crash.at("after-runs")
	}
	return nil
}

// appendHole appends the hole record of the seqs [from, to) (an open's:
// no extend is being written), keepFrom as appendPlanned's.
func (l *runLog) appendHole(from, to, keepFrom int64) error {
	if !l.v3 {
		return fmt.Errorf("hole records are run log version 3 only")
	}
	l.pv3 = append(l.pv3[:0], holeRecord(from, to))
	defer func() { l.pv3 = l.pv3[:0] }()
	return l.appendRecords(func() int64 { return keepFrom }, false)
}

// startSegment makes a new segment the active one, with room for at least
// need bytes of records: the spare if one is ready (or being made: it
// waits for it) and large enough, else one created here. Called with
// segMu held; it drops it while it waits.
func (l *runLog) startSegment(need int64) (*runSegment, error) {
	for l.preparing != nil {
		done := l.preparing
		l.segMu.Unlock()
		<-done
		l.segMu.Lock()
	}
	s := l.spare
	l.spare = nil
	if s != nil && s.size < segHeaderSize+need {
		// A batch larger than a segment (one run record a row): the spare
		// goes, the segment is made to measure.
		err := errors.Join(s.r.Close(), os.Remove(s.path))
		l.dirDirty = true
		if err != nil {
			l.b.log.Warn("remove a spare run segment", "buffer", l.b.name, "err", err)
		}
		s = nil
	}
	if s == nil {
		var err error
		if s, err = l.createSegment(l.nextSeg, max(l.target, segHeaderSize+need)); err != nil {
			return nil, err
		}
		l.nextSeg++
		l.dirDirty = true
	}
	l.newSeg = false
	l.segs = append(l.segs, s)
	return s, nil
}

// prepareNext starts the goroutine that makes the next spare and deletes
// the segments whose pieces all end below keepFrom. Called with segMu
// held, when a segment starts.
func (l *runLog) prepareNext(keepFrom int64) {
	if l.preparing != nil {
		return
	}
	done := make(chan struct{})
	l.preparing = done
	no := l.nextSeg
	l.nextSeg++
	l.bg.Add(1)
	go func() {
		defer l.bg.Done()
		s, err := l.createSegment(no, l.target)
		l.segMu.Lock()
		l.preparing = nil
		if err == nil {
			l.spare = s
			l.dirDirty = true
		}
		l.segMu.Unlock()
		close(done)
		if err != nil {
			// Not an error of any write: the writer that needs the
			// segment creates it and reports its error (a full disk).
			l.b.log.Debug("make a spare run segment", "buffer", l.b.name, "err", err)
		}
		if err := l.collect(keepFrom); err != nil {
			l.b.log.Warn("delete run segments", "buffer", l.b.name, "err", err)
		}
	}()
}

// createSegment creates segment file no of size bytes, mapped, all its
// blocks allocated (a full disk is an error here, not a fault later),
// with its header. It touches no field of the log.
func (l *runLog) createSegment(no uint64, size int64) (*runSegment, error) {
	path := filepath.Join(l.b.dir, runSegName(no))
	r, err := mmapfile.Create(path, size)
	if err != nil {
		return nil, fmt.Errorf("create run segment: %w", err)
	}
	copy(r.Bytes(), segHeader{Magic: runSegMagic, Version: l.version(), UID: l.b.uid, Number: no}.encode())
	// The header and the directory entry are made durable by the next
	// sync, before any watermark counts a row whose piece is here (a
	// kill -9 keeps both; a power loss before that sync takes only rows
	// above the watermark). Synced here, at a segment every 30-odd
	// extends, they held CartPole extends at 42.9-47.6 µs, against
	// 37.5-40.0 synced later (BenchmarkExtendRunMeta, three runs each).
	return &runSegment{no: no, path: path, r: r, size: size, used: segHeaderSize, maxLast: -1, dirty: true}, nil
}

// collect deletes the segments (never the active one) whose pieces all
// end below keepFrom, a seq below which no row can come back: the window's
// start as of the last sync for fsync buffers, the current one for the
// others (after a crash they resume at or past the seq reservation, so
// their window never starts lower). The segments leave the list under
// segMu and the files go outside it, so that appends do not wait for the
// unlinks; a segment that could not be deleted goes back on the list.
func (l *runLog) collect(keepFrom int64) error {
	l.segMu.Lock()
	if l.pins > 0 {
		l.segMu.Unlock()
		return nil
	}
	var dead []*runSegment
	kept := l.segs[:0]
	for i, s := range l.segs {
		if i == len(l.segs)-1 || s.maxLast >= keepFrom || s.syncing > 0 {
			kept = append(kept, s)
			continue
		}
		dead = append(dead, s)
	}
	clear(l.segs[len(kept):])
	l.segs = kept
	l.segMu.Unlock()
	if len(dead) == 0 {
		return nil
	}
	var errs []error
	var failed []*runSegment
	for _, s := range dead {
		if s.r != nil {
			errs = append(errs, s.r.Close())
			s.r = nil
		}
		if err := os.Remove(s.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			failed = append(failed, s)
		}
	}
	l.segMu.Lock()
	l.dirDirty = true
	l.segs = append(failed, l.segs...)
	l.segMu.Unlock()
	return errors.Join(errs...)
}

// sync makes every piece appended so far durable.
func (l *runLog) sync() error {
	type job struct {
		s *runSegment
		n int
	}
	l.segMu.Lock()
	var jobs []job
	for _, s := range l.segs {
		if s.dirty {
			jobs = append(jobs, job{s, int(s.used)})
			s.dirty = false
			s.syncing++
		}
	}
	dir := l.dirDirty
	l.dirDirty = false
	l.segMu.Unlock()
	// Outside segMu, so that writers go on appending while the pages go
	// to disk (milliseconds on a real one); a segment being synced is not
	// collected (syncing), and whatever is appended meanwhile is dirty
	// again for the next sync.
	failed := make([]bool, len(jobs))
	var errs []error
	for i, j := range jobs {
		if err := j.s.syncData(j.n); err != nil {
			errs = append(errs, err)
			failed[i] = true
		}
	}
	dirFailed := false
	if dir {
		if err := syncDir(l.b.dir); err != nil {
			errs = append(errs, err)
			dirFailed = true
		}
	}
	l.segMu.Lock()
	for i, j := range jobs {
		j.s.syncing--
		if failed[i] {
			j.s.dirty = true
		}
	}
	if dirFailed {
		l.dirDirty = true
	}
	l.segMu.Unlock()
	return errors.Join(errs...)
}

// syncData makes the segment's first n bytes durable: through its
// mapping for a segment of this open, through the file for one found at
// open (whose newest records a killed writer may have left in the page
// cache only; see syncFoundOnNextSync).
func (s *runSegment) syncData(n int) error {
	if s.r != nil {
		return s.r.SyncRange(0, n)
	}
	f, err := os.OpenFile(s.path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("sync %s: %w", s.path, err)
	}
	if err := f.Sync(); err != nil {
		return errors.Join(fmt.Errorf("sync %s: %w", s.path, err), f.Close())
	}
	return f.Close()
}

// syncFoundOnNextSync makes the next sync cover the segments found at open
// and the buffer's directory, before it moves the watermark: after a
// crash that left the page cache (kill -9), recovery accepts rows whose
// pieces are in those segments, perhaps not yet on disk, and perhaps in
// a segment whose directory entry never was; a watermark moved past those
// rows without them would claim rows a power loss could still take.
func (l *runLog) syncFoundOnNextSync() {
	l.segMu.Lock()
	defer l.segMu.Unlock()
	for _, s := range l.segs {
		s.dirty = true
	}
	l.dirDirty = true
}

// close waits for the spare's goroutine, unmaps the segments and deletes
// the spare (a spare a crash leaves is an empty segment, which an open
// takes as one and the window collects).
func (l *runLog) close() error {
	l.bg.Wait()
	l.segMu.Lock()
	defer l.segMu.Unlock()
	var errs []error
	for _, s := range l.segs {
		if s.r != nil {
			errs = append(errs, s.r.Close())
			s.r = nil
		}
	}
	if s := l.spare; s != nil {
		l.spare = nil
		errs = append(errs, s.r.Close(), os.Remove(s.path))
	}
	return errors.Join(errs...)
}

// files returns the bytes the segments take on disk.
func (l *runLog) files() int64 {
	l.segMu.Lock()
	defer l.segMu.Unlock()
	var n int64
	for _, s := range l.segs {
		n += s.size
	}
	if l.spare != nil {
		n += l.spare.size
	}
	return n
}

// pin stops deletions and returns the segments with their sizes as of now,
// for a checkpoint to copy (unpin when done).
func (l *runLog) pin() []segCopy {
	l.segMu.Lock()
	defer l.segMu.Unlock()
	l.pins++
	out := make([]segCopy, 0, len(l.segs))
	for _, s := range l.segs {
		// Segments of this open are copied up to what was appended;
		// segments found at open whole (their unused room is zeros).
		n := s.used
		var src io.ReaderAt = s.r
		if s.r == nil {
			n, src = s.size, fileAt(s.path)
		}
		out = append(out, segCopy{f: src, no: s.no, size: n})
	}
	return out
}

func (l *runLog) unpin() {
	l.segMu.Lock()
	l.pins--
	l.segMu.Unlock()
}

// runSegmentNumbers lists the run segments in dir by number.
func runSegmentNumbers(dir string) ([]uint64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var nos []uint64
	for _, e := range ents {
		name := e.Name()
		rest, ok := strings.CutPrefix(name, "runs.")
		if !ok {
			continue
		}
		digits, ok := strings.CutSuffix(rest, ".rbdr")
		if !ok || len(digits) != 8 {
			continue
		}
		no, err := strconv.ParseUint(digits, 10, 64)
		if err != nil || runSegName(no) != name {
			continue
		}
		nos = append(nos, no)
	}
	slices.Sort(nos)
	return nos, nil
}

// loadedRuns is what an open read from the run log: the pieces by first
// seq and notes on records it could not use.
type loadedRuns struct {
	pieces map[int64]runPiece
	// Version 3: every valid piece and hole record, where it was found.
	v3    []loadedPiece
	notes []string
	// scratch is fileRunAt's copy of a record: one pass over the records
	// at a time uses a loadedRuns.
	scratch [fileRunRecordSize]byte
}

// load reads every segment of the buffer's dir. A record that fails its
// checks is skipped (records have a fixed size, so the next one is still
// found), and so is a partial record at a segment's end (a crash cut the
// last append short); both are noted, and a row that needs such a piece
// is rejected by recovery like any row whose record is torn. A segment
// that vanishes while it is read (a running writer deleted it) is
// skipped. With writable, an empty file a crash left at a segment's
// creation is removed. The next append starts a new segment.
func (l *runLog) load(writable bool, reserved int64) (*loadedRuns, error) {
	dir := l.b.dir
	nos, err := runSegmentNumbers(dir)
	if err != nil {
		return nil, fmt.Errorf("list run segments: %w", err)
	}
	out := &loadedRuns{pieces: map[int64]runPiece{}}
	for _, no := range nos {
		path := filepath.Join(dir, runSegName(no))
		data, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
		if len(data) < segHeaderSize || isZero(data[:segHeaderSize]) {
			// A crash right after the file was created, or a power loss
			// before the first sync that covered it (which writes the
			// header with its records): none of its records counts, and
			// the rows that need them were above the watermark. A file
			// of nothing but zeros is removed; one that holds other bytes
			// is left where it is, for whoever wants to look.
			l.nextSeg = max(l.nextSeg, no+1)
			if !isZero(data) {
				out.notes = append(out.notes, fmt.Sprintf("%s: no header, %d bytes left as they are (written before the first sync of a new segment, or damaged)", path, len(data)))
				continue
			}
			out.notes = append(out.notes, fmt.Sprintf("%s: %d bytes and no header (cut short at creation)", path, len(data)))
			if writable {
				if err := os.Remove(path); err != nil {
					return nil, err
				}
			}
			continue
		}
		h, err := decodeSegHeader(path, data, runSegMagic, l.version(), "run segment")
		if err != nil {
			return nil, err
		}
		if h.UID != l.b.uid {
			return nil, corruptf(path, 16, "run segment belongs to another buffer (uid %016x, catalog says %016x)", h.UID, l.b.uid)
		}
		if h.Number != no {
			return nil, corruptf(path, 24, "run segment says it is number %d", h.Number)
		}
		seg := &runSegment{no: no, path: path, size: int64(len(data)), maxLast: -1}
		for off := segHeaderSize; off < len(data); off += runLogRecordSize {
			if off+runLogRecordSize > len(data) {
				out.notes = append(out.notes, fmt.Sprintf("%s: %d bytes at offset %d are a partial run record", path, len(data)-off, off))
				break
			}
			rec := data[off : off+runLogRecordSize]
			if isZero(rec) {
				continue // room never written (segments are allocated whole)
			}
			if l.v3 {
				p, why := decodePieceV3(rec, reserved)
				if why != "" {
					out.notes = append(out.notes, fmt.Sprintf("%s: run record at offset %d: %s", path, off, why))
					continue
				}
				out.v3 = append(out.v3, loadedPiece{pieceV3: p, seg: no, off: int64(off)})
				seg.maxLast = max(seg.maxLast, p.lastSeq())
				continue
			}
			p, why := decodeRunPiece(rec)
			if why != "" {
				out.notes = append(out.notes, fmt.Sprintf("%s: run record at offset %d: %s", path, off, why))
				continue
			}
			out.pieces[p.FirstSeq] = p
			seg.maxLast = max(seg.maxLast, p.lastSeq())
		}
		l.segs = append(l.segs, seg)
		l.nextSeg = max(l.nextSeg, no+1)
	}
	l.newSeg = true
	return out, nil
}

// pieceEnd returns one past the last seq any valid version 3 piece or hole
// record in the buffer's run segments names, as the files are now (-1 if
// none): how far a running writer has gone, for a snapshot open. Segments
// that vanish while listed or read are skipped.
func (l *runLog) pieceEnd() int64 {
	end := int64(-1)
	nos, err := runSegmentNumbers(l.b.dir)
	if err != nil {
		return end
	}
	for _, no := range nos {
		data, err := os.ReadFile(filepath.Join(l.b.dir, runSegName(no)))
		if err != nil || len(data) < segHeaderSize {
			continue
		}
		for off := segHeaderSize; off+runLogRecordSize <= len(data); off += runLogRecordSize {
			if p, why := decodePieceV3(data[off:off+runLogRecordSize], -1); why == "" {
				end = max(end, p.lastSeq()+1)
			}
		}
	}
	return end
}

// fileAt reads a file by path, opening it for each read: a segment found
// at open is copied by a checkpoint without holding it open.
type fileAt string

func (p fileAt) ReadAt(b []byte, off int64) (int, error) {
	f, err := os.Open(string(p))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.ReadAt(b, off)
}
