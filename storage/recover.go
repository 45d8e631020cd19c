package storage

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"runtime/debug"
	"slices"
	"sort"
	"time"
)

// recover rebuilds the in-memory state of a persistent buffer from its
// files: which slots hold complete rows, the trajectory index, the stream
// positions to continue (after a clean close only) and the holes a crash
// left. It returns the largest trajectory id seen (-1 if none).
//
// A row is accepted when its record checksum holds, its seq belongs to its
// slot and the live window, its data checksum holds, and its predecessor
// (if still in the window) was accepted with the same trajectory and the
// previous step. Everything else is either a hole (above the durable
// watermark: what a crash leaves) or damage (below it: reported, never
// served).
// scanRecords calls fn with the record of every slot that may have been
// written, in slot order. It reads through the file descriptor in blocks
// and skips the holes of the sparse file, so opening a large ring that
// holds little costs what it holds, not its capacity (the records are not
// mapped into the process). Past the seq reservation, the first slot never
// written ends the scan: seqs are reserved before use and the ring fills
// its slots in order (a running writer may be ahead of a snapshot's
// reservation, hence the test rather than a bound).
func (b *Buffer) scanRecords(reserved int64, fn func(slot int64, rec []byte) error) error {
	const block = 1 << 20
	buf := make([]byte, block)
	recordSize := b.fileRecordSize()
	perBlock := block / recordSize
	for slot := int64(0); slot < b.slots; {
		off := headerSize + slot*recordSize
		if next := b.meta.NextData(off); next > off {
			// [slot, skip) lie in a hole: never written.
			skip := min(b.slots, (next-headerSize)/recordSize)
			if max(slot, reserved) < skip {
				return nil
			}
			slot = skip
			continue
		}
		n := min(perBlock, b.slots-slot)
		chunk := buf[:n*recordSize]
		if _, err := b.meta.ReadAt(chunk, headerSize+slot*recordSize); err != nil {
			return fmt.Errorf("read %s: %w", metaFile(b.dir), err)
		}
		for i := int64(0); i < n; i++ {
			rec := chunk[i*recordSize : (i+1)*recordSize]
			if slot+i >= reserved && recordNeverWritten(rec) {
				return nil
			}
			if err := fn(slot+i, rec); err != nil {
				return err
			}
		}
		slot += n
	}
	return nil
}

func (b *Buffer) recover(st bufferState, streams map[string]map[int64]streamPos) (_ int64, err error) {
	if b.blk != nil {
		return b.recoverBlocks(st, streams)
	}
	defer b.recoverFault(&err, debug.SetPanicOnFault(true))
	capacity, slots := b.capacity, b.slots
	durable, ok := readWatermark(b.hdr)
	// Next to a running writer the block may be read between its two
	// stores (seq, then checksum): read it again before calling it torn.
	for try := 0; !ok && !b.store.snapAt.IsZero() && try < 100; try++ {
		time.Sleep(time.Millisecond)
		durable, ok = readWatermark(b.hdr)
	}
	if !ok {
		// The last checkpoint's write count is a safe lower bound: a
		// checkpoint syncs the rows before it commits the count.
		durable = st.WriteCount
		b.damage = append(b.damage, fmt.Sprintf("durable watermark block of %s is torn; using the last checkpoint's write count %d", metaFile(b.dir), durable))
	}
	var runs *loadedRuns
	if b.rlog != nil {
		if runs, err = b.rlog.load(!b.store.readOnly, -1); err != nil {
			return -1, err
		}
	}
	if b.tailIx != nil && b.tails[0].dense {
		// Before the first pass: a version 2 row is complete only if its
		// checksum, final observation included, holds.
		b.tailScan = b.scanDenseTails()
	}
	maxSeq := int64(-1)
	scratch := new([recordSize]byte) // decodeRecord's, for the whole recovery
	err = b.scanRecords(st.SeqReserved, func(slot int64, rec []byte) error {
		if runs != nil {
			maxSeq = b.scanFileRun(slot, rec, st.SeqReserved, maxSeq, runs)
			return nil
		}
		if recordNeverWritten(rec) {
			// Neither a row nor a marker: a ring of 10^8 rows that holds
			// 1,000 has millions of these below its seq reservation.
			return nil
		}
		r, ok := decodeRecord(rec, scratch)
		if !ok {
			// A write cut short still moved the ring: its seq counts,
			// and the rows it was overwriting are gone.
			// The marker has no checksum of its own: trust it only for a
			// seq the writer could have had (below the reservation).
			if m := markedSeq(r.Seq); m >= 0 && m%slots == slot && m < st.SeqReserved {
				maxSeq = max(maxSeq, m)
			}
			return nil
		}
		if r.Seq%slots != slot {
			return corruptf(metaFile(b.dir), headerSize+slot*recordSize, "record in slot %d holds seq %d (slot %d)", slot, r.Seq, r.Seq%slots)
		}
		maxSeq = max(maxSeq, r.Seq)
		return nil
	})
	if err != nil {
		return -1, err
	}
	wc := max(st.WriteCount, maxSeq+1)
	st = b.witnessSaysUnclean(st, wc)
	switch {
	case st.Clean:
	case !b.store.snapAt.IsZero():
		// Read next to a running server: it has not crashed; its
		// reservation is ahead of what it wrote.
	case b.spec.Durability != DurabilityFsync:
		// After a power loss, seqs up to the reservation may have been
		// handed out — and acknowledged, then lost with unsynced pages.
		// Resuming past them keeps seqs unique; the oldest rows (up to a
		// reservation block) leave the window early in exchange. After a
		// crash of the process alone its seq witness names the end of
		// every seq it handed out (witness.go): nothing moves, unless
		// its files lost writes (restored, or pages an I/O error
		// dropped), whose seqs are then skipped.
		if !b.witnessed { // else past the witness, below
			wc = max(wc, st.SeqReserved)
		}
	default:
		// fsync: every acknowledged row is on disk, so the window stays
		// where the rows are. Only rows at its bottom that an unfinished
		// (unacknowledged) write with a reserved seq may have been
		// overwriting when power was lost are let go, as that write would
		// have.
		for s := max(0, wc-capacity); s < wc && s+slots < st.SeqReserved; s++ {
			if runs != nil {
				// The seq word alone, as a version 1 record's own
				// checksum: a slot no writer reached still names s (a
				// row damaged there is reported, not let go). A record
				// of zeros is a lost page, not seq 0, whose complete
				// record's word is zero too but whose checksum is not.
				rec := b.drecs[(s%slots)*fileRunRecordSize : (s%slots+1)*fileRunRecordSize]
				if w := binary.LittleEndian.Uint64(rec); w&frWriting == 0 && w&seqResidueMask == uint64(s)&seqResidueMask && !recordNeverWritten(rec) {
					break
				}
			} else if r, ok := decodeRecord(b.rec(s%slots), scratch); ok && r.Seq == s {
				break
			}
			if !slices.ContainsFunc(st.Holes, func(h [2]int64) bool { return s >= h[0] && s < h[1] }) {
				b.letGo++
			}
			wc = s + capacity + 1
		}
	}
	wc = b.pastWitness(wc)
	b.seqRes.Store(b.resumedReservation(st, wc))
	lo := max(0, wc-capacity)
	durable = min(durable, wc)
	inOldHole := func(seq int64) bool {
		for _, h := range st.Holes {
			if seq >= h[0] && seq < h[1] {
				return true
			}
		}
		return false
	}

	var holes [][2]int64
	addHole := func(seq int64) {
		if n := len(holes); n > 0 && holes[n-1][1] == seq {
			holes[n-1][1]++
			return
		}
		holes = append(holes, [2]int64{seq, seq + 1})
	}
	live := !b.store.snapAt.IsZero()
	lost := func(seq int64, why string) {
		if seq >= durable || inOldHole(seq) {
			addHole(seq)
			return
		}
		if live && b.overwrittenMeanwhile(seq) {
			// Read next to a running writer: the ring moved on while we
			// scanned. Not damage, and no longer in the window.
			return
		}
		b.noteDamage(seq, fmt.Sprintf("seq %d (below durable watermark %d): %s", seq, durable, why))
	}
	if b.cs != nil {
		if err := b.cs.load(!b.store.readOnly); err != nil {
			return -1, err
		}
	}
	if !b.store.readOnly && !st.Clean {
		// The rows accepted above may have their pieces or chunks in the
		// page cache only (a killed writer's); the first sync makes them
		// durable before it moves the watermark past those rows.
		if b.rlog != nil {
			b.rlog.syncFoundOnNextSync()
		}
		if b.cs != nil {
			b.cs.syncFoundOnNextSync()
		}
	}
	maxTraj := int64(-1)
	lk := newLinks()
	liveWait := time.Second // see the reads again below
	for seq := lo; seq < wc; seq++ {
		slot := seq % slots
		var why string
		read := func() (record, bool) {
			if runs != nil {
				var r record
				r, why = b.fileRunAt(slot, seq, runs)
				return r, why == ""
			}
			return decodeRecord(b.rec(slot), scratch)
		}
		r, ok := read()
		// Next to a running writer a record can be caught mid-write: read
		// it again before judging it, as the watermark above. Real damage
		// reads the same every time and is still reported. Five quick
		// reads have not always been enough under load (reliability.md:
		// a lapped row reported torn, cause not understood), so a row
		// still unsettled gets up to 200 ms more, from a budget of one
		// second for the whole verify.
		for try := 0; live && (!ok || r.Seq != seq) && !b.overwrittenMeanwhile(seq); try++ {
			if !retryPause(try, &liveWait) {
				break
			}
			r, ok = read()
		}
		switch {
		case runs != nil && !ok:
			lost(seq, why)
			continue
		case runs != nil:
			// fileRunAt checked the flags and the checksum of the row's
			// bytes and record together.
		case !ok || r.Seq != seq:
			lost(seq, "record missing or torn")
			continue
		case r.Flags&^knownFlags != 0:
			lost(seq, fmt.Sprintf("unknown flags %#x", r.Flags))
			continue
		default:
			got, why := b.rowCRC(seq, r.Flags, func(crc uint32) bool { return crc == r.DataCRC })
			if why != "" {
				lost(seq, why)
				continue
			}
			if got != r.DataCRC {
				lost(seq, fmt.Sprintf("data checksum %08x, record says %08x", got, r.DataCRC))
				continue
			}
		}
		if b.cs != nil {
			if why := b.cs.accept(seq, slot, r.TrajID, r.Step, r.Flags&flagHasTail != 0); why != "" {
				lost(seq, why)
				continue
			}
		}
		if why := lk.link(b, seq, &r, lo, inOldHole, live, b.overwrittenMeanwhile); why != "" {
			lost(seq, why)
			continue
		}
		if runs != nil {
			// Oldest first, so runs continue as when the rows were
			// written.
			r.Seq = seq
			b.putMemRecord(slot, &r)
		}
		if b.tailScan != nil && r.Flags&flagHasTail != 0 {
			b.acceptDenseTail(seq, b.tailScan.found)
		}
		b.stamps.Store(slot, seq)
		maxTraj = max(maxTraj, r.TrajID)
		if b.prio != nil {
			raw := b.prio.raw(slot)
			if !validPriority(raw) || (raw == 0 && seq >= durable) {
				// Priorities are outside the row checksum; a torn or
				// never-synced value gets the default a new row would.
				raw = b.prio.max
			}
			if b.store.readOnly {
				b.prio.setTrees(slot, raw)
			} else {
				b.prio.set(slot, raw)
			}
		}
	}
	if b.tailScan != nil {
		b.finishDenseTails(!b.store.readOnly)
	}
	return b.endRecovery(st, streams, wc, durable, holes, runs, maxTraj)
}

// endRecovery is what every rows.meta version's recovery ends with, once
// its scan settled the write count wc, the durable watermark and the
// rows of the window: the streams to continue, the trajectories to close,
// the run log's garbage, the holes and the log lines.
func (b *Buffer) endRecovery(st bufferState, streams map[string]map[int64]streamPos, wc, durable int64, holes [][2]int64, runs *loadedRuns, maxTraj int64) (int64, error) {
	lo := max(0, wc-b.capacity)
	inOldHole := func(seq int64) bool {
		for _, h := range st.Holes {
			if seq >= h[0] && seq < h[1] {
				return true
			}
		}
		return false
	}
	b.setWriteCount(wc)
	b.sync.durable = durable

	// Continue open trajectories only after a clean close: after a crash
	// their last rows may be lost, so they are closed (as truncated).
	if st.Clean {
		for name, envs := range streams {
			kept := map[int64]*streamPos{}
			for e, pos := range envs {
				t := b.ix.byID[pos.TrajID]
				switch {
				case t != nil && t.open && t.Seq(t.Len()-1) == pos.LastSeq:
				case t == nil && (pos.LastSeq < lo || inOldHole(pos.LastSeq)):
					// Every row of it was overwritten (or, in a
					// checkpoint, left out as overwritten while it was
					// copied); it still continues.
				default:
					continue
				}
				p := pos
				kept[e] = &p
				maxTraj = max(maxTraj, pos.TrajID)
			}
			if len(kept) > 0 {
				b.streams[name] = kept
				b.streamUsed[name] = time.Now() // the idle clock restarts at open
			}
		}
	}
	continued := map[int64]bool{}
	for _, envs := range b.streams {
		for _, pos := range envs {
			continued[pos.TrajID] = true
		}
	}
	if b.cs != nil {
		if len(b.damage) > 0 {
			// Rows lost for want of their chunks: say first which
			// records could not be read.
			b.damage = append(slices.Clip(b.cs.loadNotes), b.damage...)
		}
		b.cs.finishLoad(continued)
	}
	if runs != nil {
		if len(runs.notes) > 0 {
			b.log.Warn("run records skipped", "count", len(runs.notes), "first", runs.notes[0])
			if len(b.damage) > 0 {
				b.damage = append(slices.Clip(runs.notes), b.damage...)
			}
		}
		if !b.store.readOnly {
			// Segments whose pieces all left the window are garbage:
			// for an fsync buffer the window as of its last sync (an
			// open that fails, or a power loss before its commit, may
			// bring that window back: the write count is the witness's
			// here).
			if err := b.rlog.collect(b.runKeepFrom()); err != nil {
				return -1, err
			}
		}
	}
	b.ix.settle()
	for _, t := range b.ix.list {
		// Next to a running server the writer has not stopped: its open
		// trajectories stay open.
		if t.open && !continued[t.id] && b.store.snapAt.IsZero() {
			b.ix.setClosed(t)
		}
	}

	b.countVersions()

	// Keep the holes still in the ring, old and new, for verify.
	for _, h := range st.Holes {
		if h[1] > lo {
			holes = append(holes, h)
		}
	}
	sort.Slice(holes, func(i, j int) bool { return holes[i][0] < holes[j][0] })
	b.holes = mergeRanges(holes)
	if len(b.damage) > 0 {
		b.log.Error("damaged rows below the durable watermark were dropped", "rows", len(b.damage), "first", b.damage[0])
	}
	if !st.Clean {
		b.log.Warn("buffer was not closed cleanly; recovered", "write_count", wc, "live_rows", b.ix.rows, "holes", len(holes))
	}
	// The catalog learns of the recovery (Clean false, saved streams
	// consumed, holes) only once the whole store opened: see
	// Store.commitRecovery. A refused Open leaves it as it was.
	return maxTraj, nil
}

// noteDamage records the row of seq, dropped by recovery, as damage: the
// reason for verify and Info, the seq for hot checkpoints. Seqs come in
// increasing order.
func (b *Buffer) noteDamage(seq int64, why string) {
	b.damage = append(b.damage, why)
	if n := len(b.damaged); n > 0 && b.damaged[n-1][1] == seq {
		b.damaged[n-1][1]++
		return
	}
	b.damaged = append(b.damaged, [2]int64{seq, seq + 1})
}

// retryPause waits before a snapshot open reads a row again, for its
// try-th time: five quick reads a millisecond apart, then up to twenty of
// 10 ms from budget, the whole open's. It reports false when the row
// has had its reads.
func retryPause(try int, budget *time.Duration) bool {
	pause := time.Millisecond
	if try >= 5 {
		pause = 10 * time.Millisecond
		if try >= 25 || *budget < pause {
			return false
		}
		*budget -= pause
	}
	time.Sleep(pause)
	return true
}

// links checks, in a recovery's scan, each row's link to the row before it
// in its trajectory: that row, if in the window and not a hole, must have
// been accepted with the same trajectory and the previous step.
type links struct {
	ok map[int64]linkedRow // accepted rows whose successor may still come
}

type linkedRow struct{ traj, step int64 }

func newLinks() *links { return &links{ok: map[int64]linkedRow{}} }

// check says why the row r of seq cannot be accepted for its link ("" if
// it can). Next to a running writer (live), a predecessor the ring moved
// past while the scan read (gone) makes r its trajectory's oldest live
// row, and the rows of it accepted earlier in the scan are dropped.
func (l *links) check(b *Buffer, seq int64, r *record, lo int64, hole func(int64) bool, live bool, gone func(int64) bool) string {
	if r.PrevSeq < lo || hole(r.PrevSeq) {
		if r.PrevSeq < -1 || r.PrevSeq >= seq {
			return fmt.Sprintf("impossible prev_seq %d", r.PrevSeq)
		}
		return ""
	}
	p, ok := l.ok[r.PrevSeq]
	switch {
	case !ok && live && gone(r.PrevSeq):
		p = linkedRow{r.TrajID, r.Step - 1}
		b.dropScanned(r.TrajID)
	case !ok:
		return fmt.Sprintf("previous row %d of trajectory %d is missing", r.PrevSeq, r.TrajID)
	}
	if p.traj != r.TrajID || p.step != r.Step-1 {
		return fmt.Sprintf("links to row %d of trajectory %d step %d, but it is trajectory %d step %d", r.PrevSeq, r.TrajID, r.Step-1, p.traj, p.step)
	}
	delete(l.ok, r.PrevSeq)
	return ""
}

// link accepts the row r of seq into the index if its link checks (check)
// and the index takes it, and notes it as a predecessor to come; it says
// why the row was not accepted ("" if it was).
func (l *links) link(b *Buffer, seq int64, r *record, lo int64, hole func(int64) bool, live bool, gone func(int64) bool) string {
	if why := l.check(b, seq, r, lo, hole, live, gone); why != "" {
		return why
	}
	if err := b.ix.add(r.TrajID, r.Step, seq, r.Flags&flagDone != 0, r.Flags&flagHasTail != 0); err != nil {
		return err.Error()
	}
	if r.Flags&flagDone == 0 {
		l.ok[seq] = linkedRow{r.TrajID, r.Step}
	}
	return ""
}

// dropScanned removes from the index, while reading next to a running
// writer, the rows of a trajectory accepted earlier in the scan: the ring
// has since overwritten a later row of it, so they are overwritten too.
// They have successors, so none carries a final observation. Their
// priorities leave the trees (not the file: snapshot opens write nothing),
// so that the priority mass is the live rows' alone.
func (b *Buffer) dropScanned(traj int64) {
	t := b.ix.byID[traj]
	for t != nil && t.Len() > 0 {
		seq := t.Seq(0)
		if b.ix.evict(traj, seq, false) != nil {
			return
		}
		b.stamps.CompareAndSwap(seq%b.slots, seq, -1)
		if b.prio != nil {
			b.prio.clear(seq % b.slots)
		}
		if t.Len() == 0 {
			return
		}
	}
}

// overwrittenMeanwhile reports whether seq's slot now holds (or is being
// given) a newer row.
func (b *Buffer) overwrittenMeanwhile(seq int64) bool {
	// One read of the seq field: a writer stores the marker there first
	// and the new seq last, so reading it twice (once to decode, once for
	// the marker) could see a marker and then a finished seq and miss both.
	if b.rlog != nil {
		w := binary.LittleEndian.Uint64(b.drecs[(seq%b.slots)*fileRunRecordSize:])
		return resolveSeq(w&seqResidueMask, seq) > seq
	}
	if b.compactRecords() {
		return b.stamps.Load(seq%b.slots) > seq
	}
	raw := int64(binary.LittleEndian.Uint64(b.rec(seq % b.slots)[recSeq:]))
	return raw > seq || markedSeq(raw) > seq
}

func mergeRanges(rs [][2]int64) [][2]int64 {
	var out [][2]int64
	for _, r := range rs {
		if n := len(out); n > 0 && r[0] <= out[n-1][1] {
			out[n-1][1] = max(out[n-1][1], r[1])
			continue
		}
		out = append(out, r)
	}
	return out
}

// scanFileRun is recover's first pass over one version 2 record (a copy in
// rec, of slot): it returns maxSeq raised to the record's seq when the
// record is a complete row of its slot (its piece found, its checksum
// holding) or a writing marker of its slot below the reservation. Only
// records that would raise maxSeq are checked: the rest of the ring costs
// a read of its seq word here (every row is checked in the second pass).
func (b *Buffer) scanFileRun(slot int64, rec []byte, reserved, maxSeq int64, runs *loadedRuns) int64 {
	w := binary.LittleEndian.Uint64(rec[frWord:])
	seq := resolveSeq(w&seqResidueMask, reserved)
	if seq < 0 || seq%b.slots != slot || seq <= maxSeq {
		return maxSeq
	}
	if w&frWriting != 0 {
		// The marker has no checksum of its own: trust it only for a
		// seq the writer could have had.
		if seq < reserved {
			return seq
		}
		return maxSeq
	}
	if _, why := b.fileRunAt(slot, seq, runs); why == "" {
		return seq
	}
	return maxSeq
}

// fileRunAt decodes and checks the version 2 record of slot as the row of
// seq and returns the record it stands for, or why it is not one: the
// record must name seq (no writing marker), its piece must be in the run
// log and hold it where the record says, and the checksum over the row's
// bytes and the record must hold. One copy of the 16 bytes is read, as
// decodeRecord does, so that a record caught mid-write fails as a whole;
// into runs.scratch (one for the pass: a copy of its own escaped to the
// heap, as decodeRecord's did).
func (b *Buffer) fileRunAt(slot, seq int64, runs *loadedRuns) (record, string) {
	c := &runs.scratch
	copy(c[:], b.drecs[slot*fileRunRecordSize:])
	le := binary.LittleEndian
	w := le.Uint64(c[frWord:])
	if w&frWriting != 0 || w&seqResidueMask != uint64(seq)&seqResidueMask {
		return record{}, "record missing or torn"
	}
	delta, off, dist := uint16(w>>frDeltaShift), le.Uint16(c[frOff:]), le.Uint16(c[frDist:])
	first := seq - int64(delta)
	p, ok := runs.pieces[first]
	if !ok {
		return record{}, fmt.Sprintf("no run record for its piece (first seq %d)", first)
	}
	last := off == p.Rows-1
	if off >= p.Rows || delta > p.Span || (off == 0) != (delta == 0) || last != (delta == p.Span) ||
		off > delta || (off > 0 && (dist == 0 || dist > delta)) {
		return record{}, fmt.Sprintf("record places it at offset %d, %d seqs into its piece (distance back %d), which has %d rows over %d seqs",
			off, delta, dist, p.Rows, int(p.Span)+1)
	}
	var flags uint32
	if last {
		flags = uint32(p.Flags)
	}
	want := le.Uint32(c[frCRC:])
	recCRC := func(data uint32) uint32 {
		crc := crc32.Update(data, castagnoli, c[frWord:frWord+8])
		return crc32.Update(crc, castagnoli, c[frOff:])
	}
	data, why := b.rowCRC(seq, flags, func(data uint32) bool { return recCRC(data) == want })
	if why != "" {
		return record{}, why
	}
	if crc := recCRC(data); crc != want {
		return record{}, fmt.Sprintf("checksum %08x, record says %08x", crc, want)
	}
	r := record{Seq: seq, TrajID: p.TrajID, Step: p.FirstStep + int64(off), PrevSeq: p.PrevSeq, Env: p.Env, Flags: flags, PolicyVersion: p.PolicyVersion}
	if off > 0 {
		r.PrevSeq = seq - int64(dist)
	}
	return r, ""
}
