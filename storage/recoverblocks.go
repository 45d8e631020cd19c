package storage

import (
	"cmp"
	"fmt"
	"runtime/debug"
	"slices"
	"time"
)

// Recovery of a buffer with rows.meta version 3 (format-v3.md, "What Open
// accepts"). A row of the window is live when the block records (or the
// watermark record's tip) verify it, a valid run piece holds it, its
// predecessor was accepted, and its final observation's entry checks.
// Rows that fail are holes above the durable watermark and damage below
// it, reported by block: a block's checksum cannot say which of its rows
// changed.

// loadedPiece is a version 3 run record found at open, and where.
type loadedPiece struct {
	pieceV3
	seg uint64 // segment number
	off int64  // offset in the segment
}

func (p *loadedPiece) where() string { return fmt.Sprintf("%s offset %d", runSegName(p.seg), p.off) }

// pieceCursor walks the rows of a piece in seq order.
type pieceCursor struct {
	p   *loadedPiece
	k   int   // row of the piece
	seq int64 // its seq
}

// cursorHeap is a min-heap of cursors by seq, typed (container/heap's
// interface boxed a cursor at every push: a fifth of a 10^6-row open).
type cursorHeap []pieceCursor

func (h *cursorHeap) push(c pieceCursor) {
	*h = append(*h, c)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if s[p].seq <= s[i].seq {
			break
		}
		s[p], s[i] = s[i], s[p]
		i = p
	}
}

func (h *cursorHeap) pop() pieceCursor {
	s := *h
	top := s[0]
	n := len(s) - 1
	s[0] = s[n]
	s = s[:n]
	for i := 0; ; {
		l, m := 2*i+1, i
		if l < n && s[l].seq < s[m].seq {
			m = l
		}
		if r := l + 1; r < n && s[r].seq < s[m].seq {
			m = r
		}
		if m == i {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}

// pieceSweep finds, seq by seq in increasing order, the pieces holding
// each seq: pieces sorted by first seq enter as the sweep reaches them,
// and a heap orders the next rows of those it is inside.
type pieceSweep struct {
	sorted []*loadedPiece
	next   int
	h      cursorHeap
}

func newPieceSweep(runs *loadedRuns) *pieceSweep {
	w := &pieceSweep{}
	for i := range runs.v3 {
		if !runs.v3[i].Hole() {
			w.sorted = append(w.sorted, &runs.v3[i])
		}
	}
	slices.SortFunc(w.sorted, func(a, b *loadedPiece) int { return cmp.Compare(a.FirstSeq, b.FirstSeq) })
	return w
}

// at returns the pieces holding seq (one, or more when damage made two
// claim it; the cursor says which row), called with increasing seqs.
func (w *pieceSweep) at(seq int64, out []pieceCursor) []pieceCursor {
	out = out[:0]
	for ; w.next < len(w.sorted) && w.sorted[w.next].FirstSeq <= seq; w.next++ {
		p := w.sorted[w.next]
		k := 0
		if d := seq - p.FirstSeq; d > 0 && p.Stride == 0 {
			k = 1 // a piece of one row, before seq
		} else if d > 0 {
			k = int((d + int64(p.Stride) - 1) / int64(p.Stride))
		}
		if k < int(p.Rows) {
			w.h.push(pieceCursor{p: p, k: k, seq: p.FirstSeq + int64(k)*int64(p.Stride)})
		}
	}
	for len(w.h) > 0 && w.h[0].seq <= seq {
		c := w.h.pop()
		if c.seq == seq {
			out = append(out, c)
		}
		if c.k+1 < int(c.p.Rows) {
			c.k++
			c.seq += int64(c.p.Stride)
			w.h.push(c)
		}
	}
	return out
}

// blockVerifier finds the verified prefix of the blocks of the window,
// each once.
type blockVerifier struct {
	b        *Buffer
	reserved int64 // decode's bound on a copy's base
	tip      watermarkRecord
	base     int64 // the block last asked for
	v        int   // its verified prefix
	claims   []blockClaim
}

// copies decodes both record copies of block k.
func (bv *blockVerifier) copies(k int64) (c [2]blockCopy, ok [2]bool) {
	b := bv.b
	meta := b.meta.Bytes()
	for i := range 2 {
		off := blockCopyOffset(b.slots, k, i)
		var why string
		c[i], why = decodeBlockCopy(meta[off:off+blockCopySize], k, b.slots, bv.reserved)
		ok[i] = why == ""
	}
	return c, ok
}

// prefix returns how many rows of the pass of the block starting at base
// a checksum verifies: a copy of that pass, or the watermark record's tip
// when it names that pass of the block.
func (bv *blockVerifier) prefix(base int64) int {
	if base == bv.base {
		return bv.v
	}
	k := bv.b.blockOf(base)
	c, ok := bv.copies(k)
	bv.claims = bv.claims[:0]
	for i := range 2 {
		if ok[i] && c[i].Base == base {
			bv.claims = append(bv.claims, blockClaim{Rows: c[i].Rows, CRC: c[i].CRC})
		}
	}
	if bv.tip.TipRows > 0 && bv.tip.TipBase == base {
		bv.claims = append(bv.claims, blockClaim{Rows: bv.tip.TipRows, CRC: bv.tip.TipCRC})
	}
	bv.base, bv.v = base, bv.b.verifiedPrefix(k, bv.claims)
	return bv.v
}

func (b *Buffer) recoverBlocks(st bufferState, streams map[string]map[int64]streamPos) (_ int64, err error) {
	defer b.recoverFault(&err, debug.SetPanicOnFault(true))
	capacity, slots := b.capacity, b.slots
	writable := !b.store.readOnly
	// Next to a running writer (a snapshot open: rbd verify or dump of a
	// dir a server holds) the catalog copy lags the writer: no bound on
	// seqs from its reservation, and what is read is read in the order
	// the writer writes it backwards (format-v3.md, "Snapshot opens").
	live := !b.store.snapAt.IsZero()
	reserved := st.SeqReserved
	if live {
		reserved = -1
	}
	wr, why := decodeWatermarkRecord(b.hdr)
	for try := 0; why != "" && live && try < 100; try++ {
		time.Sleep(time.Millisecond) // caught between a sync's writes
		wr, why = decodeWatermarkRecord(b.hdr)
	}
	if why == "" && !live && wr.Seq > st.SeqReserved {
		// No writer syncs rows it has not reserved.
		why = fmt.Sprintf("watermark %d past the seq reservation %d", wr.Seq, st.SeqReserved)
	}
	durable := wr.Seq
	if why != "" {
		// The last checkpoint's write count is a safe lower bound: a
		// checkpoint syncs the rows before it commits the count. No tip.
		durable, wr = st.WriteCount, watermarkRecord{TipBase: -1}
		b.damage = append(b.damage, fmt.Sprintf("watermark record of %s is torn (%s); using the last checkpoint's write count %d", metaFile(b.dir), why, durable))
	}
	runs, err := b.rlog.load(writable, reserved)
	if err != nil {
		return -1, err
	}
	if b.tailIx != nil {
		b.tailScan = b.scanDenseTails()
	}
	bv := &blockVerifier{b: b, reserved: reserved, tip: wr, base: -1}

	// The write count: the ring reached every seq a block record, a piece
	// or a hole record names (a cut-off extend's pieces say how far it
	// may have written). Next to a running writer, block records are read
	// after the pieces, so they may name rows whose pieces this open did
	// not read: the pieces and the catalog say how far it reads.
	wc := st.WriteCount
	if !live {
		// The watermark record counts rows synced with their pieces and
		// records: if those are gone, the rows are still reported below
		// (as damage), never dropped in silence by a window that ends
		// before them.
		wc = max(wc, durable)
	}
	known := slices.Clone(st.Holes)
	for i := range runs.v3 {
		p := &runs.v3[i]
		wc = max(wc, p.lastSeq()+1)
		if p.Hole() {
			known = append(known, [2]int64{p.FirstSeq, p.TrajID})
		}
	}
	if !live {
		// An extend writes its pieces before its block records, so only
		// copies of passes at or past the pieces' end can name rows past
		// it (pieces a power loss took, of writes that may have run far
		// ahead): every block's copies once, from the block the pieces
		// end in, up to the reservation (no valid copy's base is past
		// it). Reading only those keeps an open of a large ring that
		// holds little from reading every block's records.
		from := wc - wc%blockRows
		for base := from; base < st.SeqReserved && base < from+slots; base += blockRows {
			c, ok := bv.copies(b.blockOf(base))
			for i := range 2 {
				if ok[i] && c[i].Base >= from {
					wc = max(wc, c[i].Base+int64(c[i].Rows))
				}
			}
		}
	}
	slices.SortFunc(known, func(x, y [2]int64) int { return cmp.Compare(x[0], y[0]) })
	known = mergeRanges(known)
	isHole := func(seq int64) bool {
		i, _ := slices.BinarySearchFunc(known, seq, func(h [2]int64, s int64) int { return cmp.Compare(h[1], s+1) })
		return i < len(known) && known[i][0] <= seq
	}
	letGo := false // the fsync exception: rows an unacknowledged write may have reached
	if !live {
		st = b.witnessSaysUnclean(st, wc)
	}
	switch {
	case st.Clean, live:
		// live: the writer has not crashed; its reservation is ahead of
		// what it wrote.
	case b.spec.Durability != DurabilityFsync:
		// Seqs up to the reservation may have been handed out and
		// acknowledged, then lost with unsynced pages: resume past them.
		// After a crash of the process alone, past what its seq witness
		// names instead (witness.go), which the pieces read above reach
		// unless its files lost writes.
		if !b.witnessed { // else past the witness, below
			wc = max(wc, st.SeqReserved)
		}
	default:
		// fsync: the window stays where the rows are, except that a
		// block at its bottom that does not verify may have been
		// overwritten by an unacknowledged write of its next pass whose
		// records a power loss took: the window moves past it as that
		// write would have moved it. The walk stops at the first sound
		// block.
		letGo = true
		for {
			lo := max(0, wc-capacity)
			base := lo - lo%blockRows
			if base+slots >= st.SeqReserved || lo >= wc {
				break
			}
			v := bv.prefix(base)
			sound := true
			for s := max(lo, base+int64(v)); s < min(base+blockRows, wc, durable); s++ {
				if !isHole(s) {
					sound = false
					break
				}
			}
			if sound {
				break
			}
			// Not damage (version 2 lets such rows go in silence too): a
			// log line says which.
			b.log.Warn("letting go of rows at the bottom of the window that do not verify: an unacknowledged write of their block's next pass may have been overwriting them",
				"from", lo, "to", base+blockRows, "block", b.blockOf(base))
			for s := lo; s < min(base+blockRows, wc, durable); s++ {
				if !isHole(s) {
					b.letGo++ // a row that was there: written and synced
				}
			}
			wc = base + blockRows + capacity
		}
	}
	wc = b.pastWitness(wc)
	b.seqRes.Store(b.resumedReservation(st, wc))
	lo := max(0, wc-capacity)
	durable = min(durable, wc)

	var holes [][2]int64
	addHole := func(seq int64) {
		if n := len(holes); n > 0 && holes[n-1][1] == seq {
			holes[n-1][1]++
			return
		}
		holes = append(holes, [2]int64{seq, seq + 1})
	}
	lost := func(seq int64, why string) {
		if seq >= durable || isHole(seq) {
			addHole(seq)
			return
		}
		b.noteDamage(seq, fmt.Sprintf("seq %d (below durable watermark %d): %s", seq, durable, why))
	}
	if writable && !st.Clean {
		// The accepted rows' pieces may be in the page cache only (a
		// killed writer's): the first sync makes them durable.
		b.rlog.syncFoundOnNextSync()
	}

	maxTraj := int64(-1)
	lk := newLinks()
	sweep := newPieceSweep(runs)
	var hits []pieceCursor
	// judge reads the row of seq: its metadata from its piece, its
	// final observation's entry (-1 if none), or why it is not a row and
	// which check said so (a read again can change a block's or a tail
	// entry's answer, not a piece's: the pieces were read once).
	const (
		byBlock = iota
		byPiece
		byTail
	)
	judge := func(seq int64) (record, int64, string, int) {
		slot := seq % slots
		base := seq - seq%blockRows
		if v := bv.prefix(base); seq-base >= int64(v) {
			return record{}, -1, fmt.Sprintf("block %d (slots %d to %d) is not verified past its row %d by its records or the watermark record", b.blockOf(base), slot-(seq-base), slot-(seq-base)+blockRows-1, v), byBlock
		}
		switch len(hits) {
		case 0:
			return record{}, -1, "no run record holds it", byPiece
		case 1:
		default:
			where := make([]string, len(hits))
			for i, h := range hits {
				where[i] = h.p.where()
			}
			return record{}, -1, fmt.Sprintf("%d run records hold it: %v", len(hits), where), byPiece
		}
		p := hits[0].p
		_, step, prev, flags := p.row(hits[0].k)
		r := record{Seq: seq, TrajID: p.TrajID, Step: step, PrevSeq: prev, Env: p.Env, Flags: flags, PolicyVersion: p.PolicyVersion}
		if flags&flagHasTail == 0 {
			return r, -1, "", byTail
		}
		at, why := b.findTailV3(seq, r.TrajID, r.Step)
		return r, at, why, byTail
	}
	// Next to a running writer, the newest pieces in the run log say how
	// far the writer has gone: an extend appends them before it writes a
	// row, where its block records come last (version 3 marks no slot as
	// being written). Read again at most every 5 ms.
	var pieceEnd int64 = -1
	var pieceEndAt time.Time
	gone := func(seq int64) bool {
		if b.blocksOverwritten(seq, bv) {
			return true
		}
		if time.Since(pieceEndAt) > 5*time.Millisecond {
			pieceEnd, pieceEndAt = b.rlog.pieceEnd(), time.Now()
		}
		return pieceEnd > seq+capacity
	}
	liveWait := time.Second // for the whole open, as version 2's reads again
	for seq := lo; seq < wc; seq++ {
		hits = sweep.at(seq, hits)
		if isHole(seq) {
			continue // a recorded hole: pieces that name it are a failed extend's
		}
		slot := seq % slots
		r, tailAt, why, by := judge(seq)
		// Next to a running writer a block may be read while its next
		// pass overwrites it (rows before records), or a sync or an
		// extend may be between its writes: read again before judging,
		// from a budget of a second for the open. A row whose slot the
		// writer has reached again, or that has left the window since,
		// is gone, not damaged.
		for try := 0; live && why != "" && by != byPiece && !gone(seq); try++ {
			if !retryPause(try, &liveWait) {
				break
			}
			bv.base = -1 // read the records again
			if by == byTail && b.tailScan != nil {
				b.tailScan.entries = b.scanDenseTails().entries
			}
			r, tailAt, why, by = judge(seq)
		}
		if why != "" {
			switch {
			case live && gone(seq):
			case r.Flags&flagHasTail != 0 && letGo && b.tailMayBeReused(seq, wc, st.SeqReserved):
				// Its block verifies, its final observation's entry
				// does not: an fsync writer's unacknowledged write may
				// have written enough final observations after it to
				// reuse its entry (tails reuse the oldest entries), and
				// a power loss can keep the tail file's page while it
				// loses the columns'. As for a block the walk lets go: a
				// hole, not damage.
				b.log.Warn("letting go of a row whose final observation an unacknowledged write may have replaced", "seq", seq)
				b.letGo++
				addHole(seq)
			default:
				lost(seq, why)
			}
			continue
		}
		if why := lk.link(b, seq, &r, lo, isHole, live, gone); why != "" {
			lost(seq, why)
			continue
		}
		b.putMemRecord(slot, &r)
		if tailAt >= 0 {
			b.acceptDenseTail(seq, tailAt)
		}
		b.stamps.Store(slot, seq)
		maxTraj = max(maxTraj, r.TrajID)
		if b.prio != nil {
			raw := b.prio.raw(slot)
			if !validPriority(raw) || (raw == 0 && seq >= durable) {
				// Priorities are outside every checksum; a torn or
				// never-synced value gets the default a new row would.
				raw = b.prio.max
			}
			if writable {
				b.prio.set(slot, raw)
			} else {
				b.prio.setTrees(slot, raw)
			}
		}
	}
	if b.tailScan != nil {
		b.finishDenseTails(writable)
	}
	// Hole records name holes the catalog may not have: they become the
	// catalog's at the open's commit.
	for _, h := range known {
		if h[1] > lo {
			holes = append(holes, h)
		}
	}
	maxTraj, err = b.endRecovery(st, streams, wc, durable, holes, runs, maxTraj)
	if err != nil || !writable {
		return maxTraj, err
	}
	return maxTraj, b.resumeBlocks(st, wr, bv)
}

// blocksOverwritten reports, next to a running writer, whether the row
// of seq is gone since the open read the window: its block's record now
// names a later pass of the block (its slot is written again), or the
// block of seq + capacity has rows written (seq left the window).
func (b *Buffer) blocksOverwritten(seq int64, bv *blockVerifier) bool {
	base := seq - seq%blockRows
	c, ok := bv.copies(b.blockOf(base))
	for i := range 2 {
		if ok[i] && c[i].Base > base {
			return true
		}
	}
	out := seq + b.capacity // the seq whose write moves seq out of the window
	outBase := out - out%blockRows
	c, ok = bv.copies(b.blockOf(outBase))
	for i := range 2 {
		if ok[i] && (c[i].Base > outBase || c[i].Base+int64(c[i].Rows) > out) {
			return true
		}
	}
	return false
}

// tailMayBeReused reports whether, after an unclean close, the dense tail
// entry of the row seq can have been taken by a newer final observation:
// entries are reused after tail_rows more, so the entries found naming
// newer rows, and one a seq for every seq the writer could still have
// had (up to the reservation, past the write count wc), must reach
// tail_rows. Entries a power loss took count as not written: the bound
// errs towards reporting damage.
func (b *Buffer) tailMayBeReused(seq, wc, reserved int64) bool {
	sc := b.tailScan
	if sc == nil || seq+b.slots >= reserved {
		return false
	}
	i, _ := slices.BinarySearchFunc(sc.entries, seq+1, func(e tailEntry, s int64) int { return cmp.Compare(e.seq, s) })
	newer := int64(len(sc.entries) - i)
	return newer+max(0, reserved-wc) >= b.tailIx.rows
}

// findTailV3 returns the dense tail entry holding the final observation of
// the row seq of trajectory traj at step (its checksum covering all
// three, in every tail file), or -1 and why there is none. Entries follow
// the seqs of their rows, as rowCRC checks for version 2.
func (b *Buffer) findTailV3(seq, traj, step int64) (int64, string) {
	sc := b.tailScan
	if sc == nil {
		return -1, "its piece says it has a final observation, but the buffer keeps none"
	}
	why := fmt.Sprintf("no entry of %s holds its final observation", b.tails[0].file)
	rows := b.tailIx.rows
	for _, e := range sc.named(seq) {
		at := e.at
		if w := sc.outOfOrder(seq, at, rows, b.tails[0].file); w != "" {
			why = w
			continue
		}
		good := true
		for _, c := range b.tails {
			entry := c.data[at*c.pitch():]
			if got, ok := tailEntryV3(entry, c.rowBytes, traj, step); got != seq || !ok {
				why = fmt.Sprintf("entry %d of %s does not check for it (trailer names seq %d)", at, c.file, got)
				good = false
				break
			}
		}
		if good {
			return at, ""
		}
	}
	return -1, why
}

// prefixSums returns the running checksums of the first n rows of the
// pass of the block starting at base (any seq of the block's slot 0),
// read from the columns a row at a time.
func (b *Buffer) prefixSums(base int64, n int) *blockSums {
	s := new(blockSums)
	s.start(base)
	slot := base % b.slots
	for j := range n {
		s.push(b.rowMajorCRC(s.at[j], slot+int64(j)))
	}
	return s
}

// resumeBlocks sets up the writer of a version 3 buffer opened for
// writing (format-v3.md, "The writer after Open"). After a clean close
// whose watermark is the write count, it continues the block being
// filled if that block verifies up to the write count; after a crash of
// the process alone (a seq witness), if it verifies up to the write count
// but for holes. Otherwise it writes a final record for every block from
// the tip block up whose records do not already say what recovery
// verified, and leaves the block being filled early: the seqs to the
// next block boundary become holes (reserved and committed with the
// open's recovery), so that a block's running checksum passes no bytes
// but rows' (format-v3.md, "The writer after Open").
func (b *Buffer) resumeBlocks(st bufferState, wr watermarkRecord, bv *blockVerifier) error {
	w := b.blk
	wc := b.writeCount.Load()
	lo := max(0, wc-b.capacity)
	base := wc - wc%blockRows
	// The writer continues the block being filled when its rows verify
	// up to the write count and nothing may change their bytes under
	// the running CRC: after a clean close that synced them, or after a
	// crash of the process alone (a witness was found; the rows are what
	// the page cache holds, and the next sync makes them durable before
	// its watermark names them). A crash of the process inside an extend
	// leaves rows its records do not cover, up to the write count the
	// witness names: when every one of them is a hole now (above the
	// durable watermark, none of them damage), it goes on past them
	// (overHoles). Leaving the block instead skipped seqs to its end,
	// which took up to 63 of the oldest rows out of the window. Without a
	// witness (a power loss, a reboot) the block is still left, as the
	// format's design has it: only fsync buffers lose rows to that
	// (flush and none ones resume at their reservation, a block
	// boundary), and those are version 2 unless asked otherwise.
	keep := -1
	if wc%blockRows != 0 {
		v := bv.prefix(base)
		switch {
		case int64(v) == wc-base && (st.Clean && wr.Seq == wc || !st.Clean && b.witnessed):
			keep = v
		case !st.Clean && b.witnessed && holesCover(b.holes, base+int64(v), wc) && b.overHoles(base+int64(v), wc):
			keep = int(wc - base)
		}
	}
	if wc%blockRows == 0 {
		w.filling = false
		if st.Clean && wr.Seq == wc {
			return nil
		}
	} else if keep >= 0 && st.Clean {
		w.continueBlock(b, base, keep)
		return nil
	}
	// The blocks whose records a crash may have left claiming more than
	// their rows verify: from the tip block (the catalog's write count's
	// when the watermark record is torn) up, within the window.
	from := st.WriteCount
	if wr.TipBase >= 0 {
		from = wr.TipBase
	} else if wr.Seq > 0 {
		from = wr.Seq
	}
	from = max(from, lo)
	from -= from % blockRows
	upTo := wc
	if keep >= 0 {
		upTo = base // the block being filled keeps its records
	}
	for kb := from; kb < upTo; kb += blockRows {
		v := bv.prefix(kb)
		c, ok := bv.copies(b.blockOf(kb))
		newer := 0
		if ok[1] && (!ok[0] || c[1].newer(c[0])) {
			newer = 1
		}
		if ok[newer] && c[newer].Base == kb && c[newer].Final && c[newer].Rows == v {
			continue
		}
		if v == 0 && !(ok[0] && c[0].Base == kb) && !(ok[1] && c[1].Base == kb) {
			// Neither a row nor a record of this pass: seqs the open
			// skipped (holes), in slots whose records still name the
			// rows of an earlier pass. Nothing to say about the pass,
			// and those records stay as they are until the open has
			// committed: an open that fails, or a power loss before
			// its commit, brings that earlier window back (a witness
			// far ahead of the files had this open rewrite every
			// record of it).
			continue
		}
		w.readCopies(b, kb)
		w.sums = *b.prefixSums(kb, v)
		for i := range 2 {
			w.mine[i] = w.valid[i] && w.copies[i].Base == kb && w.copies[i].Rows <= v && w.sums.at[w.copies[i].Rows] == w.copies[i].CRC
		}
		w.record(b, true)
	}
	w.filling = false
	if wc%blockRows == 0 {
		return nil
	}
	if keep >= 0 {
		w.continueBlock(b, base, keep)
		return nil
	}
	// Leave the block early: [wc, end) become holes, the write count
	// moves to end, evicting what an extend of that length would.
	end := base + blockRows
	b.log.Info("leaving the block being filled early after an unclean close", "from", wc, "to", end)
	b.evictForWrite(wc, end)
	b.setWriteCount(end)
	b.seqRes.Store(max(b.seqRes.Load(), end))
	b.stateMu.Lock()
	b.holes = mergeRanges(append(b.holes, [2]int64{wc, end}))
	b.stateMu.Unlock()
	return nil
}

// overHoles readies the holes [from, to) at the end of the block being
// filled for the writer to go on past them, and reports whether it could:
// a hole record of them is appended to the run log, so that every reader
// of the files, a snapshot open next to the writer included (its catalog
// copy may predate this open's holes), knows them for holes once block
// records cover their slots; then their bytes in the checksummed columns
// are zeroed, so that the running CRC goes over bytes this open wrote
// (the next sync makes them durable, or reports why not) rather than
// over what a killed extend left in the page cache. Nothing writes a
// hole's slot again before the block's next pass; the catalog names the
// holes from the open's commit on, before any extend's record covers
// them. A run log that cannot take the record (a full disk) or a page
// that faults: the block is left, as before.
func (b *Buffer) overHoles(from, to int64) bool {
	if err := b.rlog.appendHole(from, to, b.runKeepFrom()); err != nil {
		b.log.Warn("cannot record the holes of an extend cut off; leaving the block being filled", "from", from, "to", to, "err", err)
		return false
	}
	zeroed := func() (ok bool) {
		old := debug.SetPanicOnFault(true)
		defer func() {
			debug.SetPanicOnFault(old)
			if r := recover(); r != nil {
				if _, fault := r.(interface{ Addr() uintptr }); !fault {
					panic(r)
				}
				ok = false
			}
		}()
		for seq := from; seq < to; seq++ {
			for _, c := range b.cols {
				if c.cz < 0 && !c.field.Mutable {
					clear(c.row(seq % b.slots))
				}
			}
		}
		return true
	}()
	if !zeroed {
		b.log.Warn("a memory fault zeroing the holes of an extend cut off; leaving the block being filled", "from", from, "to", to)
	}
	return zeroed
}

// holesCover reports whether the merged, sorted ranges holes hold every
// seq in [from, to).
func holesCover(holes [][2]int64, from, to int64) bool {
	if from >= to {
		return true
	}
	i, _ := slices.BinarySearchFunc(holes, from, func(h [2]int64, s int64) int { return cmp.Compare(h[1], s+1) })
	return i < len(holes) && holes[i][0] <= from && holes[i][1] >= to
}

// continueBlock sets the writer up to go on filling the block at base,
// whose first v rows verify: its running CRC recomputed from the rows,
// and which of its record copies this pass wrote. The block's rows below
// the window are still in its slots: a slot is written again only a ring
// of slots later.
func (w *blockWriter) continueBlock(b *Buffer, base int64, v int) {
	w.readCopies(b, base)
	w.sums = *b.prefixSums(base, v)
	for i := range 2 {
		c := w.copies[i]
		w.mine[i] = w.valid[i] && c.Base == base && c.Rows <= v && w.sums.at[c.Rows] == c.CRC
	}
	w.filling = true
}

// blockRecordsBytes is what a version 3 rows.meta keeps a row: two
// 32-byte copies a block of blockRows.
const blockRecordsBytes = 2 * blockCopySize / blockRows
