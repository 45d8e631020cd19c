package storage

import (
	"fmt"
	"hash/crc32"
	"path/filepath"
)

// Hot checkpoints of a buffer with rows.meta version 3 (format-v3.md, "A
// hot checkpoint"): the copy holds the same slots, every block of its
// window written whole from its first slot, with fresh block records and a
// watermark record at the checkpoint's write count W. Each block's rows
// are checked, as read, against the source's checksum of them (a left
// block's final record, or for the block W ends in the tip captured with
// W under the writer's lock): a checksum recomputed over what was read
// would make damaged bytes valid. A block a writer began to overwrite
// while it was read (a row's stamp changed) is left out, with every older
// row, as for versions 1 and 2; a block whose checksum fails while its
// stamps hold is damage, and the checkpoint fails saying which rows.

// runBlocks is run for a version 3 buffer.
func (cp *rowCopier) runBlocks(bdir string, res *CheckpointResult) (retErr error) {
	b := cp.b
	if cp.st.tipErr != nil {
		return cp.st.tipErr
	}
	cp.cols, cp.slots = b.allColumns(), b.slots
	defer func() {
		for _, f := range cp.files {
			if err := f.Close(); err != nil && retErr == nil {
				retErr = err
			}
		}
	}()
	for _, c := range cp.cols {
		size, allocated := headerSize+cp.slots*int64(c.rowBytes), headerSize+cp.slots*int64(c.rowBytes)
		if c.dense {
			size, allocated = b.colFileSize(c), headerSize // the copy writes the entries it has
		}
		f, err := createFile(filepath.Join(bdir, c.file), size, allocated, b.colHeaderFor(c).encode())
		if err != nil {
			return err
		}
		cp.files = append(cp.files, f)
		cp.total += (res.WriteCount - res.FirstSeq) * int64(c.rowBytes)
	}
	meta, err := createAllocated(metaFile(bdir), metaV3Size(cp.slots), b.metaHeader().encode())
	if err != nil {
		return err
	}
	cp.files = append(cp.files, meta)
	for _, s := range cp.st.runSegs {
		cp.total += s.size
	}
	w := res.WriteCount
	tip := watermarkRecord{Seq: w, TipBase: -1}
	lost := false // newest first: once a row is found overwritten, every older one is
	for hi, bottom := w, res.FirstSeq-res.FirstSeq%blockRows; hi > bottom; {
		if err := cp.ctx.Err(); err != nil {
			return err
		}
		base := (hi - 1) - (hi-1)%blockRows
		kept, overwritten, crc, err := cp.copyBlockV3(base, int(hi-base), res.FirstSeq, &lost)
		if err != nil {
			return err
		}
		if hi-base < blockRows {
			tip = tipOf(w, crc)
		}
		res.Rows += kept
		res.Overwritten += overwritten
		hi = base
	}
	buf := make([]byte, watermarkOff+wrSize)
	tip.encode(buf)
	if _, err := meta.WriteAt(buf[watermarkOff:], watermarkOff); err != nil {
		return err
	}
	res.Bytes = cp.done
	for _, f := range cp.files {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("sync %s: %w", f.Name(), err)
		}
	}
	return nil
}

// copyBlockV3 copies the first n rows of the block whose pass starts at
// base (the rows of the checkpoint's window from first on, and the block's
// rows below it, which its checksum covers), checks them against the
// source's checksum, and writes them with the copy's records. It returns
// the rows kept and overwritten and the checksum of the rows as written
// (overwritten rows are zeros in the copy and holes in its catalog).
func (cp *rowCopier) copyBlockV3(base int64, n int, first int64, lost *bool) (kept, overwritten int64, crc uint32, err error) {
	b := cp.b
	src0 := base % b.slots
	bufs := make([][]byte, len(cp.cols))
	entries := make([][]tailEntry, len(cp.cols))
	// The trajectory and step of each row with a final observation, as
	// read with its entry: its trailer's checksum covers them, and the
	// row's record may be a newer row's by the time the entry is checked
	// (the stamp check below says whether these reads were of this row).
	ids := map[int64][2]int64{}
	read := func() {
		for i, c := range cp.cols {
			rb := int64(c.rowBytes)
			copyCol := func() {
				if c.dense {
					bufs[i], entries[i] = bufs[i][:0], entries[i][:0]
					pitch := c.pitch()
					for seq := max(base, first); seq < base+int64(n); seq++ {
						var r record
						b.loadRecord(seq, &r)
						if r.Flags&flagHasTail != 0 {
							at := b.tailIx.pos(seq)
							bufs[i] = append(bufs[i], c.data[at*pitch:(at+1)*pitch]...)
							entries[i] = append(entries[i], tailEntry{seq, at})
							ids[seq] = [2]int64{r.TrajID, r.Step}
						}
					}
					return
				}
				bufs[i] = append(bufs[i][:0], c.data[src0*rb:(src0+int64(n))*rb]...)
			}
			if c.field.Mutable {
				b.readMutable(copyCol)
			} else {
				copyCol()
			}
		}
	}
	// stale marks the rows of the window whose stamps no longer hold
	// their seq (newest first: the rows older than one found overwritten
	// are overwritten too, or about to be).
	missing := make([]bool, n)
	stale := func() bool {
		any := false
		for j := n - 1; j >= 0; j-- {
			seq := base + int64(j)
			if seq < first {
				break
			}
			if inHoles(cp.st.holes, seq) {
				missing[j] = true
				continue
			}
			// stillHolds: a full barrier where loads may pass one
			// another, so the reads above cannot be ordered after it.
			if *lost || !b.stamps.stillHolds(src0+int64(j), seq) {
				missing[j], *lost, any = true, true, true
			}
		}
		return any
	}
	read()
	// The block's records as they are now, before the stamps are checked:
	// a writer that moves on after the check may start the block's next
	// pass and replace them, and a record of that pass vouches for
	// nothing read here.
	records, recordOK := (&blockVerifier{b: b, reserved: -1}).copies(b.blockOf(base))
	// A block with a row kept is checked, even when older rows of it
	// were found evicted: a row's stamp that held after the read says no
	// slot of the block had been written again before it was checked,
	// since a writer evicts every row of a block's pass before it writes
	// any of its slots (the spare block: that pass's rows are at most
	// s - S + 63 <= s - C - 1 for the seq s it writes, rows its own
	// extend evicts first), so the bytes read are the ones the block's
	// checksum covers, and a mismatch is damage. (Left unchecked, a
	// block half evicted while the checkpoint read it had its damaged
	// rows sealed under the copy's fresh checksum.) A block whose rows
	// are all evicted or holes has no row to vouch for.
	stale()
	if h := b.store.hooks.checkpointChecked; h != nil {
		h(base)
	}
	if cp.liveRows(base, n, first, missing) > 0 && !cp.sourceClaims(base, n, first, bufs, missing, records, recordOK) {
		return 0, 0, 0, fmt.Errorf("%w: block %d of buffer %q (seqs %d to %d) does not match its checksum: rows below the durable watermark are damaged (rbd verify lists them); nothing was checkpointed",
			ErrCorrupt, b.blockOf(base), b.name, base, base+int64(n)-1)
	}
	for j := range n {
		seq := base + int64(j)
		switch {
		case seq < first:
		case !missing[j]:
			kept++
		case !inHoles(cp.st.holes, seq):
			overwritten++
			fallthrough
		default:
			cp.addHole(seq)
			for i, c := range cp.cols {
				if !c.dense {
					rb := int64(c.rowBytes)
					clear(bufs[i][int64(j)*rb : int64(j+1)*rb])
				}
			}
		}
	}
	crc = cp.blockCRC(bufs, n)
	for i, c := range cp.cols {
		if c.dense {
			pitch := c.pitch()
			for e, te := range entries[i] {
				if missing[te.seq-base] {
					continue
				}
				// A kept row's entry, as read, is the one its own trailer
				// checks: no newer row had taken it (an entry is reused S
				// or more tails later, by a row whose extend evicted this
				// one first).
				id := ids[te.seq]
				entry := bufs[i][int64(e)*pitch : int64(e+1)*pitch]
				if seq, ok := tailEntryV3(entry, c.rowBytes, id[0], id[1]); !ok || seq != te.seq {
					return 0, 0, 0, fmt.Errorf("%w: the final observation of seq %d of buffer %q (%s entry %d) does not match its checksum: rows below the durable watermark are damaged (rbd verify lists them); nothing was checkpointed",
						ErrCorrupt, te.seq, b.name, c.file, te.at)
				}
				if _, err := cp.files[i].WriteAt(bufs[i][int64(e)*pitch:int64(e+1)*pitch], headerSize+te.at*pitch); err != nil {
					return 0, 0, 0, err
				}
			}
			cp.advance(int64(len(bufs[i])))
			continue
		}
		if _, err := cp.files[i].WriteAt(bufs[i], headerSize+src0*int64(c.rowBytes)); err != nil {
			return 0, 0, 0, err
		}
		cp.advance(int64(len(bufs[i])))
	}
	rec := blockCopy{Base: base, Gen: 1, Rows: n, Final: n == blockRows, CRC: crc}
	var enc [blockCopySize]byte
	meta := cp.files[len(cp.cols)]
	for i := range 2 {
		if i == 1 && !rec.Final {
			break // the block W ends in: one copy, and the watermark record's tip
		}
		rec.Gen = uint32(i + 1)
		rec.encode(enc[:])
		if _, err := meta.WriteAt(enc[:], blockCopyOffset(cp.slots, b.blockOf(base), i)); err != nil {
			return 0, 0, 0, err
		}
	}
	b.store.crash.at("checkpoint-copy")
	return kept, overwritten, crc, nil
}

// blockCRC is the row-major checksum of the first n rows in bufs (the
// copy's columns, cp.cols order).
func (cp *rowCopier) blockCRC(bufs [][]byte, n int) uint32 {
	var crc uint32
	for j := range n {
		for i, c := range cp.cols {
			if c.role == roleField && !c.field.Mutable {
				rb := c.rowBytes
				crc = crc32.Update(crc, castagnoli, bufs[i][j*rb:(j+1)*rb])
			}
		}
	}
	return crc
}

// liveRows counts the rows of the window among the first n of the block
// at base that the copy keeps.
func (cp *rowCopier) liveRows(base int64, n int, first int64, missing []bool) int {
	live := 0
	for j := range n {
		if base+int64(j) >= first && !missing[j] {
			live++
		}
	}
	return live
}

// sourceClaims reports whether a checksum of the source vouches for the
// rows the copy keeps of the first n rows of the block at base (read into
// bufs): the captured tip for the block W ends in, else a record of the
// block's pass (final, written when the writer left the block: h rows,
// fewer than 64 for a block an open left early, whose rows past h are
// holes) whose h covers every row kept and whose checksum holds over the
// rows [0, h) as read.
func (cp *rowCopier) sourceClaims(base int64, n int, first int64, bufs [][]byte, missing []bool, c [2]blockCopy, ok [2]bool) bool {
	covers := func(h int) bool {
		for j := h; j < n; j++ {
			if base+int64(j) >= first && !missing[j] {
				return false
			}
		}
		return true
	}
	if t := cp.st.tip; t.TipRows > 0 && t.TipBase == base && t.TipRows <= n && covers(t.TipRows) && cp.blockCRC(bufs, t.TipRows) == t.TipCRC {
		return true
	}
	// A record of the pass (c, ok: read before the stamps were checked):
	// for the block W ends in, one an extend wrote past the tip (a
	// read-only store's tip is the watermark record on disk, which may be
	// older than W); never one of more rows than read.
	for i := range 2 {
		if ok[i] && c[i].Base == base && c[i].Rows <= n && covers(c[i].Rows) && cp.blockCRC(bufs, c[i].Rows) == c[i].CRC {
			return true
		}
	}
	return false
}
