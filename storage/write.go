package storage

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/rbdb/rbd/ratelimit"
	"hash/crc32"
	"math/bits"
	"os"
	"runtime/debug"
	"time"
)

// Batch is a set of rows to append, column by column, as raw little-endian
// bytes (C order within a row).
type Batch struct {
	// Rows is the number of rows, N >= 1.
	Rows int
	// Fields maps every field of the spec to its N*RowBytes bytes. In a
	// compact_obs buffer, "next.<k>" for the obs keys may also be given,
	// either with N rows (values on rows that are not done are ignored) or
	// with D rows, one final observation per done row in row order.
	Fields map[string][]byte
	// Env gives each row's env (len N). Nil means env 0 for every row.
	Env []int64
	// PolicyVersion gives the version of the policy that produced each row
	// (len N, values >= 0), which samplers can filter on
	// (min_policy_version). Nil means 0 for every row.
	PolicyVersion []int64
}

// ExtendResult reports where an extend's rows went.
type ExtendResult struct {
	FirstSeq   int64 `json:"first_seq"`
	Rows       int   `json:"rows"`
	WriteCount int64 `json:"write_count"`
	// RateLimitWait is how long the extend waited for the buffer's rate
	// limiter before it was admitted (ExtendContext; not sent over HTTP).
	RateLimitWait time.Duration `json:"-"`
}

// plan is a validated batch, ready to be copied without further checks.
type plan struct {
	n        int
	flags    []uint32
	src      [][]byte // per spec field
	tailSrc  [][]byte // per tail column; nil when no final observations were sent
	tailRows []int    // for each row, the row of tailSrc holding its final observation, -1 if none
	env      []int64
	version  []int64
}

func (b *Buffer) validate(batch *Batch) (*plan, error) {
	if batch == nil || batch.Rows < 1 {
		return nil, batchErr("", -1, "a batch needs at least one row")
	}
	n := batch.Rows
	p := &plan{n: n, src: make([][]byte, len(b.cols)), flags: make([]uint32, n), env: batch.Env, version: batch.PolicyVersion}
	for name := range batch.Fields {
		if _, ok := b.colOf[name]; ok {
			continue
		}
		if _, ok := b.tailOf[name]; ok {
			continue
		}
		return nil, batchErr(name, -1, "not a field of buffer %q", b.name)
	}
	for i, c := range b.cols {
		v, ok := batch.Fields[c.name]
		if !ok {
			return nil, batchErr(c.name, -1, "missing")
		}
		if want := n * c.rowBytes; len(v) != want {
			return nil, batchErr(c.name, -1, "has %d bytes, want %d (%d rows of %s %v)", len(v), want, n, c.field.DType, c.field.Shape)
		}
		p.src[i] = v
	}
	if batch.Env != nil && len(batch.Env) != n {
		return nil, batchErr("env", -1, "has %d values, want %d", len(batch.Env), n)
	}
	if batch.PolicyVersion != nil && len(batch.PolicyVersion) != n {
		return nil, batchErr("policy_version", -1, "has %d values, want %d", len(batch.PolicyVersion), n)
	}
	for r, v := range batch.PolicyVersion {
		if v < 0 {
			return nil, batchErr("policy_version", r, "is %d; versions are counts, >= 0", v)
		}
	}
	done := p.src[b.doneCol]
	var term, trunc []byte
	if b.termCol >= 0 {
		term = p.src[b.termCol]
	}
	if b.truncCol >= 0 {
		trunc = p.src[b.truncCol]
	}
	nDone := 0
	for r := 0; r < n; r++ {
		if r&7 == 0 && r+8 <= n && notDone8(r, done, term, trunc) {
			r += 7 // flags stay 0
			continue
		}
		d, err := boolAt(done, r, "next.done")
		if err != nil {
			return nil, err
		}
		var f uint32
		switch {
		case term == nil && trunc == nil:
			// Without the two flags a done row is a termination, as in gym.
			if d {
				f = flagDone | flagTerminated
			}
		default:
			t, tr := false, false
			if term != nil {
				if t, err = boolAt(term, r, "next.terminated"); err != nil {
					return nil, err
				}
			}
			if trunc != nil {
				if tr, err = boolAt(trunc, r, "next.truncated"); err != nil {
					return nil, err
				}
			}
			if d != (t || tr) {
				return nil, batchErr("next.done", r, "done=%v but terminated=%v and truncated=%v (done must equal terminated || truncated)", d, t, tr)
			}
			if d {
				f |= flagDone
			}
			if t {
				f |= flagTerminated
			}
			if tr {
				f |= flagTruncated
			}
		}
		if d {
			nDone++
		}
		p.flags[r] = f
	}
	if len(b.tails) > 0 {
		if err := b.planTails(batch, p, nDone); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func (b *Buffer) planTails(batch *Batch, p *plan, nDone int) error {
	given := 0
	for _, c := range b.tails {
		if _, ok := batch.Fields[c.name]; ok {
			given++
		}
	}
	if given == 0 {
		return nil
	}
	if given != len(b.tails) {
		for _, c := range b.tails {
			if _, ok := batch.Fields[c.name]; !ok {
				return batchErr(c.name, -1, "missing: final observations must be sent for every obs key or for none")
			}
		}
	}
	n := p.n
	rows := -1
	p.tailSrc = make([][]byte, len(b.tails))
	for i, c := range b.tails {
		v := batch.Fields[c.name]
		var r int
		switch len(v) {
		case n * c.rowBytes:
			r = n
		case nDone * c.rowBytes:
			r = nDone
		default:
			return batchErr(c.name, -1, "has %d bytes, want %d rows (one per row) or %d rows (one per done row) of %s %v",
				len(v), n, nDone, c.field.DType, c.field.Shape)
		}
		if rows >= 0 && r != rows {
			return batchErr(c.name, -1, "has %d rows but other final observations have %d", r, rows)
		}
		rows = r
		p.tailSrc[i] = v
	}
	p.tailRows = make([]int, n)
	j := 0
	for r := 0; r < n; r++ {
		p.tailRows[r] = -1
		if p.flags[r]&flagDone == 0 {
			continue
		}
		if rows == n {
			p.tailRows[r] = r
		} else {
			p.tailRows[r] = j
		}
		j++
		p.flags[r] |= flagHasTail
	}
	return nil
}

// notDone8 reports whether rows r to r+7 are 0 in done and in term and
// trunc (either may be nil): eight rows that are valid and carry no flag,
// checked in three loads. Most rows of a batch are such rows; checked one
// at a time, the flags were 3-9% of a CartPole extend's time.
func notDone8(r int, done, term, trunc []byte) bool {
	le := binary.LittleEndian
	w := le.Uint64(done[r:])
	if term != nil {
		w |= le.Uint64(term[r:])
	}
	if trunc != nil {
		w |= le.Uint64(trunc[r:])
	}
	return w == 0
}

func boolAt(b []byte, r int, field string) (bool, error) {
	switch b[r] {
	case 0:
		return false, nil
	case 1:
		return true, nil
	}
	return false, batchErr(field, r, "bool byte is %d, want 0 or 1", b[r])
}

// Extend appends the batch's rows to the buffer as one atomic unit: a batch
// that fails validation writes nothing. Rows of one (stream, env) continue
// that pair's open trajectory; a done row ends it. An empty stream makes the
// call its own stream, whose open trajectories are closed when it returns.
// Under DurabilityFsync, Extend returns once the rows are on stable storage.
// A rate-limited buffer that cannot take the rows now refuses them at once
// (an error matching ratelimit.ErrRateLimited); ExtendContext can wait.
func (b *Buffer) Extend(stream string, batch *Batch) (ExtendResult, error) {
	return b.ExtendContext(context.Background(), stream, batch, nil)
}

// ExtendOptions are the per-call settings of ExtendContext. The zero value
// waits for nothing.
type ExtendOptions struct {
	// Timeout is how long to wait for the rate limiter to admit the rows
	// (0: refuse at once when it does not).
	Timeout time.Duration
	// Stop, when closed, ends a wait with ErrStopped (a server shutting
	// down).
	Stop <-chan struct{}
}

// ExtendContext is Extend with a wait for the rate limiter: up to
// opts.Timeout, until ctx ends or opts.Stop closes, first come first
// served among the buffer's waiting extends. A call that is not admitted,
// or fails after it was, counts nothing.
func (b *Buffer) ExtendContext(ctx context.Context, stream string, batch *Batch, opts *ExtendOptions) (_ ExtendResult, retErr error) {
	p, err := b.validate(batch)
	if err != nil {
		return ExtendResult{}, fmt.Errorf("extend %q: %w", b.name, err)
	}
	var o ExtendOptions
	if opts != nil {
		o = *opts
	}
	// The wait happens before enter: a waiter must not hold the buffer's
	// life lock, which Delete takes.
	grant, err := b.limiter.Acquire(ctx, ratelimit.Inserts, int64(p.n), time.Now().Add(o.Timeout), o.Stop, ErrStopped)
	if err != nil {
		return ExtendResult{}, fmt.Errorf("extend %q: %w", b.name, err)
	}
	defer func() {
		if retErr != nil {
			grant.Refund(grant.Rows())
		}
	}()
	if err := b.enter(); err != nil {
		return ExtendResult{}, err
	}
	defer b.leave()
	defer b.recoverFault(&retErr, debug.SetPanicOnFault(true))
	if b.store.readOnly {
		return ExtendResult{}, fmt.Errorf("extend %q: %w", b.name, ErrReadOnly)
	}
	res, err := b.write(stream, p)
	if err != nil {
		return ExtendResult{}, b.store.asNoSpace(fmt.Sprintf("extend %q", b.name), fmt.Errorf("extend %q: %w", b.name, err))
	}
	if b.spec.Durability == DurabilityFsync {
		if err := b.syncTo(res.WriteCount); err != nil {
			return ExtendResult{}, fmt.Errorf("extend %q: rows written but not durable: %w", b.name, err)
		}
	}
	res.RateLimitWait = grant.Waited()
	return res, nil
}

func (b *Buffer) write(stream string, p *plan) (ExtendResult, error) {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	if b.blk != nil {
		if b.blk.faulted {
			// An extend that was waiting for wmu while another faulted.
			return ExtendResult{}, errBlocksFaulted
		}
		// A fault (recoverFault, after wmu is released) may have cut
		// the block records short: no sync may capture a tip from them,
		// and no extend may follow.
		defer func() {
			if r := recover(); r != nil {
				b.blk.faulted = true
				panic(r)
			}
		}()
	}
	n := int64(p.n)
	first := b.writeCount.Load()
	end := first + n
	if end > b.seqRes.Load() {
		// Seqs are reserved in the catalog before they are handed out, so
		// they stay unique across restarts whatever was lost: memory
		// buffers lose every row, and a power loss can take persistent
		// rows that were acknowledged but not yet synced.
		if err := b.reserveSeqs(end); err != nil {
			return ExtendResult{}, err
		}
	}
	b.maybeReserveAhead(end)

	// Assign trajectories on copies of the positions of the envs the
	// extend writes (edits), applied to the stream only once nothing can
	// fail any more.
	cur := b.streams[stream]
	edits := streamEdits{cur: cur}
	// Which envs have an open trajectory after each row: whether a row
	// starts a trajectory, and so how many ids to allocate.
	var open, met envOpen
	newTraj := 0
	for r := 0; r < p.n; r++ {
		e := p.envAt(r)
		if !met.get(e) {
			met.set(e, true)
			open.set(e, cur[e] != nil)
		}
		if !open.get(e) {
			newTraj++
			open.set(e, true)
		}
		if p.flags[r]&flagDone != 0 {
			open.set(e, false)
		}
	}
	if stream != "" && cur == nil && len(b.streams) >= b.store.opts.maxStreams() && open.any() {
		return ExtendResult{}, fmt.Errorf("extend %q: stream %q would be the %dth with an open trajectory: %w (close streams that are done, end trajectories with a done row, or raise the limit)",
			b.name, stream, len(b.streams)+1, ErrTooManyStreams)
	}
	nextID, err := b.store.allocTrajIDs(newTraj)
	if err != nil {
		return ExtendResult{}, err
	}
	recs := b.batchRecords(p.n)
	for r := 0; r < p.n; r++ {
		e := p.envAt(r)
		seq := first + int64(r)
		pos := edits.get(e)
		if pos == nil {
			pos = edits.start(e, streamPos{TrajID: nextID, Step: -1, LastSeq: -1})
			nextID++
		}
		// Field by field: a composite literal assigned to recs[r] is
		// built aside and copied whole (7% of a memory extend's time).
		rc := &recs[r]
		rc.Seq, rc.TrajID, rc.Step, rc.PrevSeq, rc.Env = seq, pos.TrajID, pos.Step+1, pos.LastSeq, e
		rc.Flags, rc.PolicyVersion, rc.DataCRC = p.flags[r], p.versionAt(r), 0
		pos.Step++
		pos.LastSeq = seq
		if p.flags[r]&flagDone != 0 {
			edits.end(e)
		}
	}

	capacity, slots := b.capacity, b.slots
	written := max(first, end-capacity) // rows below this leave the window in the same batch
	if b.blk != nil {
		// Every pass of a block starts at its first slot: the rows
		// written are at most capacity + blockRows - 1, fewer than the
		// slots, so no two share one.
		written = max(first, (end-capacity)/blockRows*blockRows)
	}

	if b.wit != nil {
		// Before any byte of the extend reaches the files (and after
		// the checks that refuse it): the witness names every seq a
		// crash may have handed out.
		b.wit.raise(end)
	}

	// Compressed fields go into chunks first, so that a row whose record
	// is whole always has them on disk. Nothing in the index has changed
	// yet if this fails.
	if b.cs != nil {
		if err := b.cs.appendBatch(p, recs, written, stream == ""); err != nil {
			return ExtendResult{}, err
		}
	}

	// Version 3 takes the space of its final observations before it
	// writes its pieces: an extend refused for space then leaves no piece
	// behind, which the same seqs written again would duplicate.
	if b.blk != nil {
		if err := b.allocateTails(p, first, written, end); err != nil {
			return ExtendResult{}, err
		}
	}

	// A run log's pieces go to disk before any row names them, as
	// chunks do; nothing has changed yet if this fails either.
	if b.rlog != nil {
		if b.blk != nil {
			b.rlog.planStrided(recs[written-first:], written)
		} else {
			b.rlog.plan(recs[written-first:], written)
		}
		if err := b.rlog.appendPlanned(b.runKeepFrom); err != nil {
			return ExtendResult{}, err
		}
	}

	// Blocks for the final observations this extend writes into sparse
	// tail files: a full disk refuses the extend here, before any row.
	if b.persistent && b.blk == nil {
		if err := b.allocateTails(p, first, written, end); err != nil {
			return ExtendResult{}, err
		}
	}

	// Rows this extend overwrites leave the index before their slots are
	// touched, so samplers stop choosing them; a reader already copying one
	// sees its stamp change and drops it.
	b.evictForWrite(first, end)
	// Every slot this extend writes now has a void stamp (its row evicted,
	// a hole, or never written). One full barrier for the extend, not one
	// a row (an atomic swap a row cost CartPole extends 3-4%):
	// on weakly ordered CPUs the rows' plain stores below cannot become
	// visible before the void stamps, so a reader that copies a row while
	// it is rewritten finds its stamp changed and drops it.
	b.writeFence.Add(1)

	// A memory buffer's fields go in a column at a time: each row's stamp
	// stays void until writeRow stores it after the row's record, as
	// before. Row by row, a CartPole extend took 18.9 µs, by column 16.0
	// (docs/performance.md). So do a version 2 memmap buffer's, once
	// every slot they go to is marked as being written (markRunsWriting).
	if b.rlog != nil && b.blk == nil {
		b.markRunsWriting(recs[written-first:], written%slots)
	}
	if b.copiesByColumn() {
		b.copyColumns(p, int(written-first), written%slots, int(end-written))
	}
	if b.blk != nil {
		b.writeRowsV3(recs, p, first, written, end)
	} else if pitch := b.runStagePitch(); pitch > 0 {
		for s := written; s < end; {
			n := min(end-s, runStageRows)
			rows := b.stageRunRows(p, int(s-first), int(n), pitch)
			for j := range n {
				b.writeRowRuns((s+j)%slots, &recs[s+j-first], p, int(s+j-first), rows[j*pitch:(j+1)*pitch])
			}
			s += n
		}
	} else {
		for s := written; s < end; s++ {
			r := int(s - first)
			b.writeRow(s%slots, &recs[r], p, r)
		}
	}

	if b.persistent {
		b.punchTails(end)
	}
	// A version 3 extend larger than the ring writes rows below the
	// window (from a block's first slot); they are not published.
	envs := b.publish(recs, first, max(written, end-capacity), end, stream, edits.apply())
	if b.tailIx != nil {
		keep := max(0, end-capacity)
		if b.blk != nil {
			keep = b.blockTailFloor(end)
		}
		if err := b.tailIx.release(keep); err != nil {
			b.log.Warn("cannot give back the blocks of final observations no row uses; the file keeps them", "err", err)
		}
	}
	size := b.liveRows()
	b.limiter.SetSize(size)
	b.noteWrite(end, size)
	b.dirty.Store(true)
	b.notifyMu.Lock()
	close(b.notify)
	b.notify = make(chan struct{})
	b.notifyMu.Unlock()

	if stream != "" {
		if len(envs) == 0 {
			delete(b.streams, stream)
			delete(b.streamUsed, stream)
		} else {
			b.streams[stream] = envs
			b.streamUsed[stream] = time.Now()
		}
	}
	return ExtendResult{FirstSeq: first, Rows: p.n, WriteCount: end}, nil
}

// evictForWrite takes the rows that an extend of seqs [first, end) will
// overwrite out of the index, before their slots are touched, so samplers
// stop choosing them; a reader already copying one sees its stamp change
// and drops it. (Unlocks by defer: a memory fault here must not leave the
// index locked.)
func (b *Buffer) evictForWrite(first, end int64) {
	capacity, slots := b.capacity, b.slots
	b.imu.Lock()
	defer b.imu.Unlock()
	defer b.ix.settle()
	var run versionRun
	defer run.done(b.ix.versions.remove)
	for s := max(0, first-capacity); s < end-capacity; s++ {
		slot := s % slots
		if st := b.stamps.Load(slot); st != s {
			// A hole: its stamp is void already (writers rely on it:
			// see write), and voiding it again costs nothing on the
			// rows real extends overwrite.
			if st >= 0 {
				b.stamps.Store(slot, -1)
			}
			continue
		}
		// No checksum: an indexed row's record was checked when it was
		// written or recovered, and only writers (we hold wmu) change it.
		traj, version, flags := b.evictFields(slot, s)
		if err := b.ix.evict(traj, s, flags&flagHasTail != 0); err != nil {
			panic(fmt.Sprintf("rbd: buffer %q index out of step with rows: %v", b.name, err))
		}
		run.next(version, b.ix.versions.remove)
		if b.prio != nil {
			b.prio.clear(slot)
		}
		b.stamps.Store(slot, -1)
	}
}

// publish adds the rows [written, end) of an extend to the index and moves
// the write count, which makes them visible to samplers. An anonymous
// stream's open trajectories are closed; it returns the stream state to
// keep (nil for an anonymous stream).
func (b *Buffer) publish(recs []record, first, written, end int64, stream string, envs map[int64]*streamPos) map[int64]*streamPos {
	b.imu.Lock()
	defer b.imu.Unlock()
	defer b.ix.settle()
	var run versionRun
	defer run.done(b.ix.versions.add)
	for s := written; s < end; s++ {
		rec := &recs[s-first]
		if err := b.ix.add(rec.TrajID, rec.Step, s, rec.Flags&flagDone != 0, rec.Flags&flagHasTail != 0); err != nil {
			panic(fmt.Sprintf("rbd: buffer %q index out of step with rows: %v", b.name, err))
		}
		run.next(rec.PolicyVersion, b.ix.versions.add)
		if b.prio != nil {
			// New rows get the largest priority seen, so each is sampled
			// soon after it arrives (TorchRL, PER paper).
			b.prio.set(s%b.slots, b.prio.max)
		}
	}
	if stream == "" {
		// An anonymous stream ends with its request.
		for _, pos := range envs {
			if t := b.ix.byID[pos.TrajID]; t != nil {
				b.ix.setClosed(t)
			}
		}
		envs = nil
	}
	b.setWriteCount(end)
	return envs
}

// batchRecords returns room for the records of an extend of n rows (every
// one is assigned before use). Batches of usual sizes reuse one slice, so
// an extend allocates no 64 bytes a row; a rare huge batch gets its own,
// which is not kept. Called with wmu held.
func (b *Buffer) batchRecords(n int) []record {
	const keep = 1 << 14 // rows: 1 MiB of records at most stays allocated
	if n > keep {
		return make([]record, n)
	}
	if cap(b.recBatch) < n {
		b.recBatch = make([]record, n, max(n, 256))
	}
	return b.recBatch[:n]
}

func (p *plan) versionAt(r int) int64 {
	if p.version == nil {
		return 0
	}
	return p.version[r]
}

func (p *plan) envAt(r int) int64 {
	if p.env == nil {
		return 0
	}
	return p.env[r]
}

// writeRow copies row r of the plan into slot. The on-disk record is
// invalidated first and completed last, so a crash at any point leaves the
// slot either marked as being written or with the new row whole. (A
// memory buffer's record has no marker and no checksums: nothing recovers
// it after a crash, and readers judge a row by its stamp.)
func (b *Buffer) writeRow(slot int64, rec *record, p *plan, r int) {
	if b.rlog != nil {
		b.writeRowRuns(slot, rec, p, r, nil)
		return
	}
	compact := b.compactRecords()
	var rb []byte
	if !compact {
		rb = b.rec(slot)
	}
	le := binary.LittleEndian
	// The slot's stamp is void, and fenced, already (write).
	if !compact {
		// Mark the slot as being written with this seq: after a crash
		// here, recovery knows the ring had moved this far, so the row
		// this slot held is gone (overwritten), not lost from the middle
		// of the window.
		le.PutUint64(rb[recSeq:], uint64(writingMarker(rec.Seq)))
	}
	var crc uint32
	staged := 0 // bytes in b.crcScratch not yet checksummed
	cols := b.cols
	if b.copiesByColumn() {
		// copyColumns copies them (every column of a memory buffer):
		// a test per column a row was 6% of a memory extend.
		cols = nil
	}
	for i, c := range cols {
		if c.cz >= 0 {
			continue // in a chunk already
		}
		src := p.src[i][r*c.rowBytes : (r+1)*c.rowBytes]
		copyField(c.row(slot), src)
		// Mutable fields stay out of the checksum: updates rewrite them
		// in place and leave the record alone.
		if b.persistent && !c.field.Mutable {
			if staged+len(src) > len(b.crcScratch) {
				crc = crc32.Update(crc, castagnoli, b.crcScratch[:staged])
				staged = 0
			}
			if len(src) > len(b.crcScratch) {
				crc = crc32.Update(crc, castagnoli, src)
				continue
			}
			copyField(b.crcScratch[staged:], src)
			staged += len(src)
		}
	}
	if staged > 0 {
		crc = crc32.Update(crc, castagnoli, b.crcScratch[:staged])
	}
	if b.tailIx != nil {
		b.tailIx.begin(rec.Seq)
	}
	if t := p.tailRowOf(r); t >= 0 {
		at := slot // where the tail columns keep this row's tail
		if b.tailIx != nil {
			at = b.tailIx.add(rec.Seq)
		}
		for i, c := range b.tails {
			if c.cz >= 0 {
				continue
			}
			src := p.tailSrc[i][t*c.rowBytes : (t+1)*c.rowBytes]
			copy(c.row(at), src)
			if c.dense {
				putTailTrailer(c, at, rec.Seq)
			}
			if b.persistent {
				crc = crc32.Update(crc, castagnoli, src)
			}
		}
	}
	b.store.crash.at("after-data")
	if compact {
		b.putMemRecord(slot, rec)
		b.stamps.Store(slot, rec.Seq)
		b.store.crash.at("after-meta")
		return
	}
	rec.DataCRC = crc
	// Build the record aside (b.recScratch, guarded by wmu), then publish
	// it with seq stored last, so the marker stays until the row is whole.
	sc := b.recScratch[:]
	encodeRecord(sc, rec)
	copy(rb[recSeq+8:], sc[recSeq+8:])
	le.PutUint64(rb[recSeq:], uint64(rec.Seq))
	b.stamps.Store(slot, rec.Seq)
	b.store.crash.at("after-meta")
}

// runStagePitch returns the bytes a row takes in stageRunRows' staging:
// its checksummed field bytes and room for its record's. It returns 0 when
// rows are not staged a batch at a time: when the buffer is not a version
// 2 memmap buffer, or when a row's checksummed bytes are more than
// crcScratchSize (images: checksummed where they are, row by row).
func (b *Buffer) runStagePitch() int64 {
	if b.rlog == nil || b.blk != nil {
		return 0
	}
	var fieldBytes int
	for _, c := range b.cols {
		if !c.field.Mutable {
			fieldBytes += c.rowBytes
		}
	}
	if fieldBytes > crcScratchSize {
		return 0
	}
	return int64(fieldBytes + runCRCBytes)
}

// runStageRows bounds the rows stageRunRows stages at once (at most 1 MiB
// and a bit for rows of crcScratchSize bytes).
const runStageRows = 4096

// stageRunRows stages the checksummed field bytes of n rows of p from its
// row r0 on for writeRowRuns, a column at a time: row j's bytes side by
// side at j × pitch (runStagePitch) in the returned slice, each followed by
// runCRCBytes of room for its record's bytes. Column loops over the batch
// instead of a loop over the fields in each row: that loop took more of a
// CartPole extend's time than the checksum call (docs/performance.md).
func (b *Buffer) stageRunRows(p *plan, r0, n int, pitch int64) []byte {
	if need := int64(n) * pitch; int64(cap(b.runStage)) < need {
		b.runStage = make([]byte, need)
	}
	rows := b.runStage[:int64(n)*pitch]
	off := 0
	for i, c := range b.cols {
		if c.field.Mutable {
			continue
		}
		rb := c.rowBytes
		scatterFixed(rows[off:], p.src[i][r0*rb:(r0+n)*rb], pitch, rb, n)
		off += rb
	}
	return rows
}

// writeRowRuns is writeRow for a memmap buffer with rows.meta version 2,
// whose fields write has copied already, a column at a time, after marking
// the row's file record as being written: the row's checksum, its tail,
// the memory record as a memory buffer writes it, and the version 2 file
// record with its seq word last. row is the row's checksummed field bytes
// and room for its record's (stageRunRows), or nil: then they are staged
// here, field by field, in b.crcScratch. A function of its own: its
// branches in writeRow made memory and version 1 extends 6-7% slower
// (BenchmarkExtend/kind=memory, alternating builds).
func (b *Buffer) writeRowRuns(slot int64, rec *record, p *plan, r int, row []byte) {
	drec := b.drecs[slot*fileRunRecordSize : (slot+1)*fileRunRecordSize]
	pr := b.rlog.rows[rec.Seq-b.rlog.first]
	// The checksum covers the row's bytes as the extend gave them, which
	// are the bytes in the columns: staged from the extend's own arrays,
	// which are in cache, not read back from the files' pages.
	var crc uint32
	scratch := b.crcScratch[:]
	staged := 0 // bytes in scratch not yet checksummed
	if row != nil {
		scratch, staged = row, len(row)-runCRCBytes
	} else {
		for i, c := range b.cols {
			src := p.src[i][r*c.rowBytes : (r+1)*c.rowBytes]
			if !c.field.Mutable { // updates rewrite mutable fields in place
				if staged+len(src) > len(scratch) {
					crc = crc32.Update(crc, castagnoli, scratch[:staged])
					staged = 0
				}
				if len(src) > len(scratch) {
					crc = crc32.Update(crc, castagnoli, src)
					continue
				}
				copyField(scratch[staged:], src)
				staged += len(src)
			}
		}
	}
	if b.tailIx != nil {
		b.tailIx.begin(rec.Seq)
	}
	if t := p.tailRowOf(r); t >= 0 {
		if staged > 0 {
			crc = crc32.Update(crc, castagnoli, scratch[:staged])
			staged = 0 // the record's bytes then go where the fields were
		}
		at := slot // a tail file of an older build keeps it at the slot
		if b.tailIx != nil {
			at = b.tailIx.add(rec.Seq)
		}
		for i, c := range b.tails {
			src := p.tailSrc[i][t*c.rowBytes : (t+1)*c.rowBytes]
			copy(c.row(at), src)
			if c.dense {
				putTailTrailer(c, at, rec.Seq)
			}
			crc = crc32.Update(crc, castagnoli, src)
		}
	}
	// The record's bytes the checksum covers are staged after the row's:
	// a row without a tail (nearly all) is checksummed in one call, not
	// two (3-4 ns a call, BenchmarkRowChecksum).
	if staged+runCRCBytes > len(scratch) {
		crc = crc32.Update(crc, castagnoli, scratch[:staged])
		staged = 0
	}
	putRunCRCBytes(scratch[staged:], rec.Seq, pr)
	crc = crc32.Update(crc, castagnoli, scratch[:staged+runCRCBytes])
	b.store.crash.at("after-data")
	b.putMemRecord(slot, rec)
	putFileRunRecord(drec, rec.Seq, pr, crc)
	b.stamps.Store(slot, rec.Seq)
	b.store.crash.at("after-meta")
}

// putTailTrailer ends entry at of dense tail column c with the seq of its
// row (plus 1: zeros are an entry never written).
func putTailTrailer(c *column, at, seq int64) {
	binary.LittleEndian.PutUint64(c.data[at*c.pitch()+int64(c.rowBytes):], uint64(seq+1))
}

// fileRunCRC is the checksum of the version 2 file record of seq whose row
// bytes have checksum dataCRC: it goes on over the record's bytes [0, 8)
// and [12, 16), which it puts in t (scratch).
func fileRunCRC(dataCRC uint32, seq int64, pr pieceRow, t *[runCRCBytes]byte) uint32 {
	putRunCRCBytes(t[:], seq, pr)
	return crc32.Update(dataCRC, castagnoli, t[:])
}

// runCRCBytes is how many bytes of a version 2 file record its checksum
// covers after the row's.
const runCRCBytes = 12

// putRunCRCBytes puts into t the bytes of the version 2 file record of
// seq that its checksum covers after the row's: the record's bytes [0, 8)
// and [12, 16).
func putRunCRCBytes(t []byte, seq int64, pr pieceRow) {
	le := binary.LittleEndian
	le.PutUint64(t[0:], fileRunWord(seq, pr.delta))
	le.PutUint16(t[8:], pr.off)
	le.PutUint16(t[10:], pr.dist)
}

// putFileRunRecord completes the version 2 file record of seq (its writing
// marker stored) whose checksum, over the row's bytes and the record's
// (fileRunCRC), is crc: the checksum and the piece's offset and distance
// first, the seq word, which clears the marker, last.
func putFileRunRecord(drec []byte, seq int64, pr pieceRow, crc uint32) {
	le := binary.LittleEndian
	le.PutUint16(drec[frOff:], pr.off)
	le.PutUint16(drec[frDist:], pr.dist)
	le.PutUint32(drec[frCRC:], crc)
	le.PutUint64(drec[frWord:], fileRunWord(seq, pr.delta))
}

// runKeepFrom is the seq below which no row of the buffer can come back
// after a crash (runLog.collect): the window's start as of the last
// sync for fsync buffers, the current one for the others.
func (b *Buffer) runKeepFrom() int64 {
	wc := b.writeCount.Load()
	if b.spec.Durability == DurabilityFsync {
		wc = min(wc, b.Durable())
	}
	return wc - b.capacity
}

// sparseTail reports whether a persistent buffer keeps a tail column of
// rowBytes a row sparse: only rows with a final observation (done rows, one
// in tens to thousands) use the column, and a row of a page or more has
// pages of its own, which the rows without one leave as holes (an image's
// tail column would otherwise take as much disk as the observations).
// Smaller rows share pages with their neighbours: a page can go back only
// when none of its slots holds a final observation, so a punch is rarely
// possible and each costs a journalled filesystem operation (512-byte
// rows forced sparse: extends 17-35% slower for no disk given back,
// BenchmarkExtendSparseTails run at that size). So
// their columns are allocated whole.
func sparseTail(rowBytes int) bool { return rowBytes >= os.Getpagesize() }

// allocateTails reserves, in each dense or sparse tail file, the blocks
// of the final observations of the rows [written, end) (a write through
// the mapping into a hole would fault on a full disk). Called before any
// row is written: its error leaves everything as it was.
func (b *Buffer) allocateTails(p *plan, first, written, end int64) error {
	if b.tailIx != nil && b.tailIx.files() {
		var n int64
		for s := written; s < end; s++ {
			if p.tailRowOf(int(s-first)) >= 0 {
				n++
			}
		}
		return b.tailIx.allocate(n)
	}
	for _, c := range b.tails {
		if !c.sparse || c.cz >= 0 {
			continue
		}
		rb := int64(c.rowBytes)
		for s := written; s < end; s++ {
			if p.tailRowOf(int(s-first)) < 0 {
				continue
			}
			if err := c.region.Allocate(headerSize+s%b.slots*rb, rb); err != nil {
				return fmt.Errorf("final observation of seq %d: %w", s, err)
			}
			c.held.set(s % b.slots)
		}
	}
	return nil
}

// Sparse tail files are punched where a final observation died: a punch
// of allocated blocks is a journalled filesystem operation (40 µs on ext4
// for 8 KiB, more when the pages are mapped), so only the slots whose
// blocks a final observation allocated are punched, once the row written
// over it has none (column.held), neighbours in one call. Rows are looked
// at once their stretch since the last look holds a MiB of tail rows (or
// an eighth of the column, for small rings), at most punchRows at a time.
// A first open of a file whose blocks an older build allocated whole marks
// every slot held, so a lap of the ring gives them back.
const (
	punchBytes = 1 << 20
	punchRows  = 1 << 16
)

// punchTails gives back, in each sparse tail file, the blocks of the slots
// below end, not looked at yet, whose final observation has died (held,
// and the row now there has none). Called by writers after an extend's
// rows are written. A failure only leaves the blocks allocated; after one
// (a filesystem without hole punching) the column is no longer punched.
func (b *Buffer) punchTails(end int64) {
	lo := max(b.punchFrom, end-b.capacity)
	var rb int64 // the widest sparse tail row
	for _, c := range b.tails {
		if c.sparse && c.cz < 0 && !c.noPunch {
			rb = max(rb, int64(c.rowBytes))
		}
	}
	if rb == 0 || (end-lo)*rb < min(punchBytes, b.capacity*rb/8) {
		return
	}
	hi := min(end, lo+punchRows)
	for _, c := range b.tails {
		if !c.sparse || c.cz >= 0 || c.noPunch {
			continue
		}
		rb := int64(c.rowBytes)
		// A stretch of dead held slots, neighbours in one punch; it
		// ends at a slot that is not one and at the ring's end.
		from, to := int64(-1), int64(-1)
		flush := func() {
			if from < 0 {
				return
			}
			if err := c.region.Punch(headerSize+from*rb, (to-from)*rb); err != nil && !c.noPunch {
				c.noPunch = true
				b.log.Warn("cannot give back the blocks of final observations no row uses; the file keeps them", "file", c.region.Path(), "err", err)
			}
			for slot := from; slot < to; slot++ {
				c.held.put(slot, false)
			}
			from = -1
		}
		for s := lo; s < hi; s++ {
			slot := s % b.slots
			var r record
			b.loadRecord(s, &r)
			dead := c.held.get(slot) && !(b.stamps.Load(slot) == s && r.Flags&flagHasTail != 0)
			switch {
			case dead && from >= 0 && slot == to:
				to++
			case dead:
				flush()
				from, to = slot, slot+1
			default:
				flush()
			}
		}
		flush()
	}
	b.punchFrom = hi
}

// crcScratchSize bounds the field bytes a row stages for its checksum at
// once; larger fields are checksummed where they are.
const crcScratchSize = 256

// copyField is copy(dst, src) for one row of a field. The fields of small
// rows are 1 to 16 bytes: moved as fixed-size words they cost a load and a
// store each, where copy calls memmove, whose call costs more than a
// CartPole row's bytes.
func copyField(dst, src []byte) {
	switch len(src) {
	case 1:
		dst[0] = src[0]
	case 4:
		*(*[4]byte)(dst) = *(*[4]byte)(src)
	case 8:
		*(*[8]byte)(dst) = *(*[8]byte)(src)
	case 16:
		*(*[16]byte)(dst) = *(*[16]byte)(src)
	default:
		copy(dst, src)
	}
}

// copiesByColumn reports whether an extend copies its fields a column at a
// time (copyColumns) before writing each row's record, instead of row by
// row in writeRow: a memory buffer's, whose rows have no checksum to stage
// and no crash protocol to follow, and a memmap buffer's with rows.meta
// version 2, whose records are all marked as being written first
// (markRunsWriting) and whose rows' checksums writeRowRuns stages from the
// extend's own bytes. Version 1 memmap buffers still copy row by row,
// staging each row's checksum as they copy it.
func (b *Buffer) copiesByColumn() bool { return !b.persistent || b.rlog != nil }

// markRunsWriting puts the writing marker of each of recs in the version 2
// file record of its slot (the first at slot0, wrapping at the ring's end),
// before any of the rows' bytes change: after a crash, recovery knows that
// the ring had reached these seqs, so the rows these slots held are gone
// (overwritten or about to be), not lost from the middle of the window, and
// the marked rows are not there (no record: an unacknowledged extend's,
// torn). writeRowRuns then completes each record once its row is whole.
func (b *Buffer) markRunsWriting(recs []record, slot0 int64) {
	le := binary.LittleEndian
	slot := slot0
	for i := range recs {
		seq := recs[i].Seq
		pr := b.rlog.rows[seq-b.rlog.first]
		le.PutUint64(b.drecs[slot*fileRunRecordSize+frWord:], fileRunWord(seq, pr.delta)|frWriting)
		if slot++; slot == b.slots {
			slot = 0
		}
	}
}

// copyColumns copies n rows of the plan from its row r0 on into the slots
// from slot0 on (wrapping at the ring's end), a column at a time.
func (b *Buffer) copyColumns(p *plan, r0 int, slot0 int64, n int) {
	for i, c := range b.cols {
		if c.cz >= 0 {
			continue
		}
		rb := c.rowBytes
		src := p.src[i][r0*rb : (r0+n)*rb]
		pitch := c.pitch()
		for done := 0; done < n; {
			slot := (slot0 + int64(done)) % b.slots
			k := min(n-done, int(b.slots-slot)) // rows before the ring wraps
			scatterFixed(c.data[slot*pitch:], src[done*rb:(done+k)*rb], pitch, rb, k)
			done += k
		}
	}
}

// scatterFixed copies k rows of rb bytes from src, one after another, to
// dst, pitch bytes apart.
func scatterFixed(dst, src []byte, pitch int64, rb, k int) {
	if pitch == int64(rb) { // a column of its own: the rows are contiguous
		copy(dst[:k*rb], src)
		return
	}
	switch rb {
	case 1:
		for j := range k {
			dst[int64(j)*pitch] = src[j]
		}
	case 4:
		for j := range k {
			*(*[4]byte)(dst[int64(j)*pitch:]) = *(*[4]byte)(src[4*j:])
		}
	case 8:
		for j := range k {
			*(*[8]byte)(dst[int64(j)*pitch:]) = *(*[8]byte)(src[8*j:])
		}
	case 16:
		for j := range k {
			*(*[16]byte)(dst[int64(j)*pitch:]) = *(*[16]byte)(src[16*j:])
		}
	default:
		for j := range k {
			copy(dst[int64(j)*pitch:int64(j)*pitch+int64(rb)], src[j*rb:(j+1)*rb])
		}
	}
}

func (p *plan) tailRowOf(r int) int {
	if p.tailRows == nil {
		return -1
	}
	return p.tailRows[r]
}

// CloseStream closes the open trajectories of a stream (as truncated in the
// index; the stored flags of their last rows stay as written). The next
// extend on that stream starts new trajectories. It returns how many were
// open.
func (b *Buffer) CloseStream(stream string) (int, error) {
	if err := b.enter(); err != nil {
		return 0, err
	}
	defer b.leave()
	b.wmu.Lock()
	defer b.wmu.Unlock()
	n, err := b.closeStreamLocked(stream)
	return n, b.store.asNoSpace(fmt.Sprintf("close stream %q of %q", stream, b.name), err)
}

// closeStreamLocked closes a stream's open trajectories and forgets it.
// Called with wmu held.
func (b *Buffer) closeStreamLocked(stream string) (int, error) {
	envs := b.streams[stream]
	if b.cs != nil {
		// The chunks first: if sealing one fails (the disk is full), the
		// stream stays open as it was, and closing it again later seals
		// what is left (closeTrajectory of a sealed one does nothing).
		for _, pos := range envs {
			if err := b.cs.closeTrajectory(pos.TrajID); err != nil {
				return 0, fmt.Errorf("close stream %q of %q: %w", stream, b.name, err)
			}
		}
	}
	b.imu.Lock()
	for _, pos := range envs {
		if t := b.ix.byID[pos.TrajID]; t != nil {
			b.ix.setClosed(t)
		}
	}
	b.imu.Unlock()
	delete(b.streams, stream)
	delete(b.streamUsed, stream)
	return len(envs), nil
}

// expireStreams closes the streams that have not extended for idle or
// longer, as if their writers had closed them: a writer that went away
// without closing its stream stops holding memory and open trajectories.
// A stream that comes back after that starts new trajectories. It returns
// how many streams it closed.
func (b *Buffer) expireStreams(idle time.Duration) (int, error) {
	if err := b.enter(); err != nil {
		return 0, err
	}
	defer b.leave()
	b.wmu.Lock()
	defer b.wmu.Unlock()
	cutoff := time.Now().Add(-idle)
	var n int
	var errs []error
	for name, last := range b.streamUsed {
		if last.After(cutoff) {
			continue
		}
		if _, err := b.closeStreamLocked(name); err != nil {
			errs = append(errs, err)
		}
		n++
	}
	return n, errors.Join(errs...)
}

// Changed returns a channel that is closed when the next rows are
// published, so a sampler waiting for data wakes on the write rather than
// polling.
func (b *Buffer) Changed() <-chan struct{} {
	b.notifyMu.Lock()
	defer b.notifyMu.Unlock()
	return b.notify
}

// smallEnvs is how many env ids (0 to smallEnvs-1) an extend looks up in
// arrays rather than maps: real writers number their envs from 0, and two
// map operations per row were measurable (BenchmarkExtend, memory CartPole:
// 22.0-23.6 µs a batch with maps, 20.1-21.0 with the arrays).
const smallEnvs = 64

// streamEdits is what an extend does to its stream's state (cur, the
// stream's positions by env, which it leaves alone): the position of each
// env a row of the extend writes, copied from cur when the extend first
// meets the env, or ended. apply writes them into cur once nothing can
// fail, so that a failed extend leaves the stream as it was, while an
// extend costs the envs it writes, not every env of its stream: copying
// the whole stream cost a stream of 64 envs written a step at a time
// 6.7 µs and 72 allocations an extend, where 64 streams of one env took
// 2.3 µs and 7 (BenchmarkExtendActors).
type streamEdits struct {
	cur map[int64]*streamPos
	// Envs 0 to smallEnvs-1: met says the extend has met the env, open
	// that it has an open trajectory, at pos[e].
	met, open uint64
	pos       [smallEnvs]streamPos
	// Other env ids met, nil for a trajectory ended.
	m map[int64]*streamPos
}

// get returns e's position, nil when e has no open trajectory.
func (d *streamEdits) get(e int64) *streamPos {
	if uint64(e) < smallEnvs {
		bit := uint64(1) << e
		if d.met&bit == 0 {
			d.met |= bit
			if c := d.cur[e]; c != nil {
				d.pos[e] = *c
				d.open |= bit
			}
		}
		if d.open&bit == 0 {
			return nil
		}
		return &d.pos[e]
	}
	p, ok := d.m[e]
	if !ok {
		if c := d.cur[e]; c != nil {
			v := *c
			p = &v
		}
		if d.m == nil {
			d.m = map[int64]*streamPos{}
		}
		d.m[e] = p
	}
	return p
}

// start gives e a trajectory at pos and returns its position.
func (d *streamEdits) start(e int64, pos streamPos) *streamPos {
	if uint64(e) < smallEnvs {
		bit := uint64(1) << e
		d.met |= bit
		d.open |= bit
		d.pos[e] = pos
		return &d.pos[e]
	}
	if d.m == nil {
		d.m = map[int64]*streamPos{}
	}
	p := new(streamPos) // pos itself stays on the caller's stack for small ids
	*p = pos
	d.m[e] = p
	return p
}

// end ends e's trajectory.
func (d *streamEdits) end(e int64) {
	if uint64(e) < smallEnvs {
		bit := uint64(1) << e
		d.met |= bit
		d.open &^= bit
		return
	}
	if d.m == nil {
		d.m = map[int64]*streamPos{}
	}
	d.m[e] = nil
}

// apply writes the edits into cur (made when it is nil and an env has a
// trajectory open) and returns it. Positions cur holds are overwritten in
// place: only writers (holding the buffer's wmu) read them.
func (d *streamEdits) apply() map[int64]*streamPos {
	envs := d.cur
	put := func(e int64, p *streamPos) {
		if envs == nil {
			envs = map[int64]*streamPos{}
		}
		envs[e] = p
	}
	for met := d.met; met != 0; met &= met - 1 {
		e := int64(bits.TrailingZeros64(met))
		switch {
		case d.open&(1<<e) == 0:
			delete(envs, e)
		case envs[e] != nil:
			*envs[e] = d.pos[e]
		default:
			v := d.pos[e]
			put(e, &v)
		}
	}
	for e, p := range d.m {
		if p == nil {
			delete(envs, e)
		} else {
			put(e, p)
		}
	}
	return envs
}

// envOpen says which envs have an open trajectory, small ids in a bitmap.
type envOpen struct {
	small uint64
	m     map[int64]bool
}

func (o *envOpen) get(e int64) bool {
	if uint64(e) < smallEnvs {
		return o.small&(1<<e) != 0
	}
	return o.m[e]
}

func (o *envOpen) set(e int64, open bool) {
	if uint64(e) < smallEnvs {
		if open {
			o.small |= 1 << e
		} else {
			o.small &^= 1 << e
		}
		return
	}
	if o.m == nil {
		o.m = map[int64]bool{}
	}
	o.m[e] = open
}

func (o *envOpen) any() bool {
	if o.small != 0 {
		return true
	}
	for _, open := range o.m {
		if open {
			return true
		}
	}
	return false
}
