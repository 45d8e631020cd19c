package storage

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
)

// Dense tail files (tail format version 2) keep a memmap buffer's final
// observations as a memory buffer keeps them (tailIndex): the k-th one
// ever written is entry k mod rows, so the live ones fill a moving window
// of the file, which is sparse: blocks are allocated ahead of the writer
// and punched behind the window. One done row in tens to thousands has a
// final observation, so a tail column at the slot took a row's worth of
// disk for every row (16 bytes a compact CartPole row, a third of its
// files), and sparse slot files of large frames paid a punch for every
// final observation that died.
//
// A memory index says where each tail is; the files say it again, for
// crash recovery, in the u64 after each entry: the seq of its row plus 1.
// Open reads those (scanDenseTails), checks each row's final observation
// where its entry is, and rebuilds the index with the same ranks.

// setDenseTails gives the tail columns of a new memmap buffer the dense
// layout and the buffer its tail index.
func (b *Buffer) setDenseTails() {
	for _, c := range b.tails {
		c.makeDense()
		if b.blk != nil {
			c.stride = int64(c.rowBytes) + tailTrailerSizeV3
		}
	}
	// A version 3 buffer keeps the entries of rows that left the window
	// until their slots are written again (format-v3.md, "Dense tail
	// entries version 3"): the index and the files cover the ring's slots.
	b.tailIx = newTailIndex(b.slots, b.tails)
}

// makeDense gives tail column c the dense layout: entries of its row bytes
// and a trailer (version 2's; setDenseTails widens it for version 3).
func (c *column) makeDense() {
	c.dense, c.sparse = true, false
	c.stride = int64(c.rowBytes) + tailTrailerSize
}

// adviseDense keeps a dense tail file's page cache in single pages
// (madvise MADV_RANDOM: no readahead on a fault). A write fault into a
// hole otherwise reads ahead into a large folio, and a punch whose range
// ends inside a dirty large folio leaves the folio, whose writeback then
// allocates the punched blocks again: on Linux 6.18, ext4, an 8 KiB-frame
// ring of 10^4 rows kept a 17.4 MB tail file for 0.4 MB of live entries.
// It is advice: an error leaves the readahead on.
func (c *column) adviseDense() {
	if c.dense {
		_ = c.region.AdviseRandom()
	}
}

// colFileSize is the size of column c's file.
func (b *Buffer) colFileSize(c *column) int64 {
	if c.dense {
		return headerSize + b.tailIx.rows*c.pitch()
	}
	return headerSize + b.slots*int64(c.rowBytes)
}

// tailFilesDense reports whether the tail files in dir are dense (their
// headers say tail format version 2): every one must agree. It reads the
// version before the files are mapped because the layout decides their
// size, which the mapping checks; the open that follows checks the whole
// header (and reports a file that cannot be read).
func (b *Buffer) tailFilesDense() (bool, error) {
	dense := 0
	for _, c := range b.tails {
		path := filepath.Join(b.dir, c.file)
		f, err := os.Open(path)
		if err != nil {
			return false, nil
		}
		var h [12]byte
		_, err = f.ReadAt(h[:], 0)
		f.Close()
		if err != nil {
			return false, nil
		}
		if v := binary.LittleEndian.Uint32(h[8:]); v == tailVersionDense || v == tailVersionDenseV3 {
			dense++
		}
	}
	if dense != 0 && dense != len(b.tails) {
		return false, corruptf(filepath.Join(b.dir, b.tails[0].file), 8, "%d of the buffer's %d tail files are dense (tail format version %d), the others are not", dense, len(b.tails), tailVersionDense)
	}
	return dense > 0, nil
}

// denseTailScan is what an open read from a buffer's dense tail files:
// the entries that name a row, by seq, and where recovery stands.
type denseTailScan struct {
	entries []tailEntry // sorted by seq, then entry
	// The last row accepted with a final observation (seq -1: none yet),
	// and the entry found by the last rowCRC that matched.
	prevSeq, prevAt int64
	firstAt         int64 // the rank of the first accepted, -1 if none
	found           int64
}

type tailEntry struct{ seq, at int64 }

// scanDenseTails reads the trailers of every allocated entry of the first
// dense tail file (holes read as never written). Entries of rows above the
// write count that recovery settles on are never asked for.
func (b *Buffer) scanDenseTails() *denseTailScan {
	sc := &denseTailScan{prevSeq: -1, prevAt: -1, firstAt: -1}
	c := b.tails[0]
	pitch, rb := c.pitch(), int64(c.rowBytes)
	rows := b.tailIx.rows
	size := headerSize + rows*pitch
	le := binary.LittleEndian
	for off := c.region.NextData(headerSize); off < size; {
		end := max(c.region.NextHole(off), off+1) // never stuck, whatever lseek says
		// Every entry whose trailer starts in [off, end).
		for k := max(0, (off-headerSize-rb)/pitch); k < rows && headerSize+k*pitch+rb < end; k++ {
			if v := int64(le.Uint64(c.data[k*pitch+rb:])); v > 0 {
				sc.entries = append(sc.entries, tailEntry{v - 1, k})
			}
		}
		off = c.region.NextData(end)
	}
	slices.SortFunc(sc.entries, func(x, y tailEntry) int {
		return cmp.Or(cmp.Compare(x.seq, y.seq), cmp.Compare(x.at, y.at))
	})
	sc.entries = slices.Compact(sc.entries)
	return sc
}

// rowCRC returns the data checksum of the row of seq (its field bytes,
// then with flagHasTail its final observation's) as writers compute it.
// Mutable fields are left out: an update rewrites them in place without
// touching the record, so a crash mid-update must not make the row look
// damaged.
// With dense tails a row's final observation is looked for in the entries
// that name its seq (more than one when a crash made a writer write the
// seq again): the first whose checksum match accepts is kept (the scan's
// found), else the last one's checksum is returned; why says why none
// could be read at all.
func (b *Buffer) rowCRC(seq int64, flags uint32, match func(uint32) bool) (uint32, string) {
	slot := seq % b.slots
	crc := b.rowMajorCRC(0, slot)
	if flags&flagHasTail == 0 {
		return crc, ""
	}
	sc := b.tailScan
	if sc == nil {
		for _, c := range b.tails {
			if c.cz < 0 {
				crc = crc32.Update(crc, castagnoli, c.row(slot))
			}
		}
		return crc, ""
	}
	why := fmt.Sprintf("no entry of %s holds its final observation", b.tails[0].file)
	rows := b.tailIx.rows
	got, read := uint32(0), false
	for _, e := range sc.named(seq) {
		at := e.at
		if w := sc.outOfOrder(seq, at, rows, b.tails[0].file); w != "" {
			why = w
			continue
		}
		c0 := crc
		named := true
		for _, c := range b.tails {
			if int64(binary.LittleEndian.Uint64(c.data[at*c.pitch()+int64(c.rowBytes):])) != seq+1 {
				why = fmt.Sprintf("entry %d of %s does not name it", at, c.file)
				named = false
				break
			}
			c0 = crc32.Update(c0, castagnoli, c.row(at))
		}
		if !named {
			continue
		}
		got, read = c0, true
		if match(c0) {
			sc.found = at
			return c0, ""
		}
	}
	if read {
		return got, ""
	}
	return 0, why
}

// named returns the entries the scan found naming seq (more than one when
// a crash made a writer write the seq again).
func (sc *denseTailScan) named(seq int64) []tailEntry {
	i, _ := slices.BinarySearchFunc(sc.entries, seq, func(e tailEntry, seq int64) int { return cmp.Compare(e.seq, seq) })
	j := i
	for j < len(sc.entries) && sc.entries[j].seq == seq {
		j++
	}
	return sc.entries[i:j]
}

// outOfOrder says why entry at (of rows entries) cannot hold seq's final
// observation ("" if it can): entries follow the seqs of their rows, so
// between the last row accepted with one and seq, no more entries than
// rows.
func (sc *denseTailScan) outOfOrder(seq, at, rows int64, file string) string {
	if sc.prevSeq < 0 {
		return ""
	}
	if gap := (at - sc.prevAt - 1 + rows) % rows; gap > seq-sc.prevSeq-1 {
		return fmt.Sprintf("its final observation is entry %d of %s, out of order: %d entries (ring-wise) after seq %d's entry %d, only %d rows later", at, file, gap+1, sc.prevSeq, sc.prevAt, seq-sc.prevSeq)
	}
	return ""
}

// acceptDenseTail gives seq, a row recovery accepted with its final
// observation at entry at, the same rank in the tail index as when it was
// written. The entries between the last accepted one and at belonged to
// rows recovery dropped; seqs between the two rows (there are at least as
// many, rowCRC checked) take their ranks, bits no reader asks for.
func (b *Buffer) acceptDenseTail(seq, at int64) {
	t, sc := b.tailIx, b.tailScan
	if sc.prevSeq < 0 {
		t.written = at
		sc.firstAt = at
	} else {
		gap := (at - t.written%t.rows + t.rows) % t.rows
		for k := int64(1); k <= gap; k++ {
			t.begin(sc.prevSeq + k)
			t.add(sc.prevSeq + k)
		}
	}
	t.begin(seq)
	t.add(seq)
	sc.prevSeq, sc.prevAt = seq, at
}

// finishDenseTails ends recovery's use of the scan: the writer's
// allocation resumes after the last accepted tail, release from the first,
// and a writable open punches every page outside them (what rows recovery
// dropped, or a crash before a punch, left).
func (b *Buffer) finishDenseTails(writable bool) {
	t, sc := b.tailIx, b.tailScan
	b.tailScan = nil
	page := int64(unix.Getpagesize())
	first := t.written // ranks count from the first accepted tail's entry
	if sc.firstAt >= 0 {
		first = sc.firstAt
	}
	var errs []error
	for ci, c := range t.cols {
		pitch := c.pitch()
		size := t.rows * pitch
		lo := first * pitch / page * page
		hi := (t.written*pitch + page - 1) / page * page
		t.freed[ci], t.allocated[ci] = lo, t.written*pitch
		if !writable || hi-lo >= size {
			continue
		}
		// Everything of the file but [lo, hi), unwrapped: from hi to
		// lo a lap later.
		for off := hi; off < lo+size; {
			start := off % size
			n := min(lo+size-off, size-start)
			if err := c.region.Punch(headerSize+start, n); err != nil {
				c.noPunch = true
				errs = append(errs, err)
				break
			}
			off += n
		}
	}
	if err := errors.Join(errs...); err != nil {
		b.log.Warn("cannot give back the blocks of dead final observations; the file keeps them", "err", err)
	}
}
