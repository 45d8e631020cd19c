package storage

import (
	"fmt"
	"hash/crc32"
)

// A memmap buffer with row_meta "blocks" keeps rows.meta in format version
// 3 (docs/proposals/format-v3.md): no record per row. Its slots (the
// capacity rounded up to a block of blockRows, plus a spare block) are
// grouped in blocks, and each block has two copies of a record that
// checksums the rows of its current pass written so far, [0, h). An
// extend writes its run pieces (version 3: a stride, no per-row offsets),
// then the rows' fields and final observations, then, for each block it
// wrote rows of, one copy of the block's record (both copies, final, for
// a block it leaves). Because of the spare block, a block being written
// never holds a live row its current pass did not write, so no checksum
// ever covers a live row a torn write can change; a block the writer left
// keeps its record until its next pass, after its rows left the window.
// A sync writes no block record: it captures the write count W and the
// running checksum of the block W ends in (the tip), makes the files
// durable, and then stores both in the watermark record.

// blockWriter is a version 3 buffer's writer state: the block being
// filled and its two record copies as the writer last wrote or read them.
// Writers (wmu) own it; a sync reads the tip under wmu.
type blockWriter struct {
	sums    blockSums // the block being filled: its running CRC at every row
	filling bool      // sums describe the block holding the write count - 1, not yet left
	copies  [2]blockCopy
	valid   [2]bool // copy i decodes (its gen orders the next write)
	mine    [2]bool // copy i was written in the current pass: it verifies
	// faulted is set, under wmu, by an extend that faulted on a mapping:
	// its record writes may have stopped half way, so no sync may capture
	// a tip after it, and close commits the buffer unclean.
	faulted bool
	scratch [blockCopySize]byte
}

// errBlocksFaulted refuses extends and syncs of a version 3 buffer after
// an extend faulted (the buffer's failed flag lands only after the
// faulting extend released the writer's lock).
var errBlocksFaulted = fmt.Errorf("an extend failed on the buffer's files; nothing is written or synced until the store is reopened: %w", ErrIO)

// blockOf is the block holding slot-aligned base (a seq whose slot is a
// block's first).
func (b *Buffer) blockOf(base int64) int64 { return base % b.slots / blockRows }

// readCopies reads both record copies of the block whose current pass
// starts at base, as they are in the file.
func (w *blockWriter) readCopies(b *Buffer, base int64) {
	k := b.blockOf(base)
	meta := b.meta.Bytes()
	for i := range 2 {
		off := blockCopyOffset(b.slots, k, i)
		c, why := decodeBlockCopy(meta[off:off+blockCopySize], k, b.slots, -1)
		w.copies[i], w.valid[i], w.mine[i] = c, why == "", false
	}
}

// startBlock begins the pass of the block whose first seq is base.
func (w *blockWriter) startBlock(b *Buffer, base int64) {
	w.readCopies(b, base)
	w.sums.start(base)
	w.filling = true
}

// writeCopy stores copy i of the block being filled.
func (w *blockWriter) writeCopy(b *Buffer, i int, c blockCopy) {
	c.encode(w.scratch[:])
	off := blockCopyOffset(b.slots, b.blockOf(c.Base), i)
	copy(b.meta.Bytes()[off:off+blockCopySize], w.scratch[:])
	w.copies[i], w.valid[i], w.mine[i] = c, true, true
}

// record writes the block's record for its rows so far: one copy (a copy
// of an older pass first, else the older of the two), or, when final,
// both, the replaced one first, so that a kill between the two leaves the
// other as it was, which verifies the rows before this write.
func (w *blockWriter) record(b *Buffer, final bool) {
	h := w.sums.rows
	c := blockCopy{Base: w.sums.base, Rows: h, Final: final, CRC: w.sums.at[h]}
	i := copyToReplace(w.copies, w.mine)
	c.Gen = nextGen(w.copies, w.valid, i)
	w.writeCopy(b, i, c)
	if !final {
		return
	}
	b.store.crash.at("mid-block-final")
	c.Gen++
	w.writeCopy(b, 1-i, c)
	w.filling = false
}

// rowMajorBytes is how many bytes of a row its block checksum covers:
// every field that is not mutable.
func (b *Buffer) rowMajorBytes() int64 {
	var n int64
	for _, c := range b.cols {
		if !c.field.Mutable {
			n += int64(c.rowBytes)
		}
	}
	return n
}

// writeBlocks is step 5 of a version 3 extend: the running checksum of
// each block the rows [written, end) of p (row r at seq first + r) go to,
// continued over their row-major bytes as the extend gave them (the bytes
// now in the columns), and the blocks' records. Called with wmu held,
// after the rows' fields and final observations are written.
func (b *Buffer) writeBlocks(p *plan, first, written, end int64) {
	w := b.blk
	pitch := b.rowMajorBytes()
	for s := written; s < end; {
		switch {
		case s%blockRows == 0:
			w.startBlock(b, s)
		case !w.filling || w.sums.base+int64(w.sums.rows) != s:
			panic(fmt.Sprintf("rbd: buffer %q block records out of step with rows: seq %d, block at %d with %d rows (filling %v)", b.name, s, w.sums.base, w.sums.rows, w.filling))
		}
		n := min(end, w.sums.base+blockRows) - s
		r0 := int(s - first)
		if pitch <= crcScratchSize {
			w.sums.addRows(b.stageRunRows(p, r0, int(n), pitch), int(n))
		} else {
			for j := range int(n) {
				crc := w.sums.at[w.sums.rows]
				for i, c := range b.cols {
					if !c.field.Mutable {
						crc = crc32.Update(crc, castagnoli, p.src[i][(r0+j)*c.rowBytes:(r0+j+1)*c.rowBytes])
					}
				}
				w.sums.push(crc)
			}
		}
		s += n
		w.record(b, w.sums.rows == blockRows)
	}
}

// writeRowsV3 is steps 4 and 6 of a version 3 extend for the rows
// [written, end): each row's final observation (an entry of the dense tail
// files with its version 3 trailer), then its memory record and stamp,
// which publish it to readers. The fields are in the columns already.
func (b *Buffer) writeRowsV3(recs []record, p *plan, first, written, end int64) {
	for s := written; s < end; s++ {
		r := int(s - first)
		rec := &recs[r]
		if b.tailIx != nil {
			b.tailIx.begin(s)
		}
		if t := p.tailRowOf(r); t >= 0 {
			at := b.tailIx.add(s)
			for i, c := range b.tails {
				entry := c.data[at*c.pitch():]
				copy(entry, p.tailSrc[i][t*c.rowBytes:(t+1)*c.rowBytes])
				putTailTrailerV3(entry, c.rowBytes, s, rec.TrajID, rec.Step)
			}
		}
	}
	b.store.crash.at("after-data")
	b.writeBlocks(p, first, written, end)
	b.store.crash.at("after-meta")
	slots := b.slots
	for s := max(written, end-b.capacity); s < end; s++ { // rows below the window are not published
		slot := s % slots
		b.putMemRecord(slot, &recs[s-first])
		b.stamps.Store(slot, s)
	}
}

// tipLocked is the watermark record for a sync that makes every row below
// the write count durable: the count, and, when it is not a block
// boundary, the running checksum of the block it ends in. Called with wmu
// held.
func (b *Buffer) tipLocked() (watermarkRecord, error) {
	w := b.blk
	if w.faulted {
		return watermarkRecord{}, errBlocksFaulted
	}
	wc := b.writeCount.Load()
	if wc%blockRows == 0 {
		return tipOf(wc, 0), nil
	}
	if !w.filling || w.sums.base != wc-wc%blockRows || w.sums.base+int64(w.sums.rows) != wc {
		return watermarkRecord{}, fmt.Errorf("buffer %q: block records out of step with the write count %d (block at %d with %d rows, filling %v)", b.name, wc, w.sums.base, w.sums.rows, w.filling)
	}
	return tipOf(wc, w.sums.at[wc-w.sums.base]), nil
}

// writeWatermarkRecord stores wr as the watermark record, in one write
// (stores into the mapping could leave it torn if the process died
// between them), and syncs the header's page.
func (b *Buffer) writeWatermarkRecord(wr watermarkRecord) error {
	if cur, why := decodeWatermarkRecord(b.hdr); why == "" && cur == wr {
		return nil
	}
	buf := make([]byte, watermarkOff+wrSize)
	wr.encode(buf)
	if _, err := b.meta.WriteAt(buf[watermarkOff:], watermarkOff); err != nil {
		return fmt.Errorf("write the watermark record: %w", err)
	}
	return b.meta.SyncRange(0, headerSize)
}

// blockTailFloor is the seq below which a version 3 writer at end gives
// back dense tail entries: rows whose slots the ring's next pass may
// reach. A row leaves the window up to a spare block before its slot is
// written again; until then recovery (an fsync buffer's window after a
// power loss may start below end - capacity) and readers may still ask
// for its entry.
func (b *Buffer) blockTailFloor(end int64) int64 {
	if b.spec.Durability == DurabilityFsync {
		end = min(end, b.Durable())
	}
	return max(0, (end-b.slots)/blockRows*blockRows)
}

// roundReservation rounds a seq reservation of a version 3 buffer up to a
// block boundary: a writer that resumes at its reservation after a crash
// then starts a block at its first slot.
func (b *Buffer) roundReservation(seq int64) int64 {
	if b.blk == nil {
		return seq
	}
	return (seq + blockRows - 1) / blockRows * blockRows
}
