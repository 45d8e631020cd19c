package storage

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"
)

// Block records and the watermark record of rows.meta format version 3
// (docs/proposals/format-v3.md): no record per row; the ring's slots are
// grouped in blocks of blockRows, and each block has two 32-byte copies of
// a record that checksums the rows of its current pass. This file is the
// codec and the rules that pick between copies; blocks.go writes them,
// recoverblocks.go reads them.

const (
	// blockCopySize is the size of one copy of a block's record.
	blockCopySize = 32

	// Offsets in a copy.
	bcBase  = 0  // u64: seq of the block's slot 0 in its current pass
	bcGen   = 8  // u32: the valid copy whose gen is ahead is the newer
	bcRows  = 12 // u8: h, rows of the pass written, slots [0, h)
	bcFinal = 13 // u8: 1 once the writer has left the block
	bcCRCh  = 16 // u32: CRC-32C of rows [0, h), row-major
	bcCRC   = 28 // u32: CRC-32C of bytes [0, 28)

	// In the meta header of version 3, under the header checksum.
	mhBlockRows = 104 // u32
	mhSlots     = 112 // u64

	// The watermark record of version 3 replaces version 1 and 2's
	// 12-byte watermark block at watermarkOff.
	wrSeq     = watermarkOff      // i64: the durable watermark W
	wrTipBase = watermarkOff + 8  // i64: base of the tip block, -1 when none
	wrTipRows = watermarkOff + 16 // u8: W - tip_base (1 to B-1), 0 when none
	wrTipCRC  = watermarkOff + 20 // u32: CRC-32C of the tip block's rows [0, tip_rows)
	wrCRC     = watermarkOff + 28 // u32: CRC-32C of [watermarkOff, wrCRC)
	wrSize    = 32
	pageBytes = 4096
)

// blockCopy is one copy of a block's record.
type blockCopy struct {
	Base  int64  // seq of the block's slot 0 in its current pass
	Gen   uint32 // write generation
	Rows  int    // h: rows [0, Rows) of the pass are written
	Final bool   // the writer has left the block: Rows are all the pass has
	CRC   uint32 // crc_h: CRC-32C of the rows [0, Rows), row-major
}

// encode writes the copy into dst (blockCopySize bytes), reserved bytes
// zero and its checksum last.
func (c blockCopy) encode(dst []byte) {
	dst = dst[:blockCopySize]
	clear(dst)
	le := binary.LittleEndian
	le.PutUint64(dst[bcBase:], uint64(c.Base))
	le.PutUint32(dst[bcGen:], c.Gen)
	dst[bcRows] = uint8(c.Rows)
	if c.Final {
		dst[bcFinal] = 1
	}
	le.PutUint32(dst[bcCRCh:], c.CRC)
	le.PutUint32(dst[bcCRC:], crc32.Checksum(dst[:bcCRC], castagnoli))
}

// decodeBlockCopy decodes a copy of block k of a ring of slots slots. It
// says why the copy is not valid ("" when it is): its checksum, reserved
// bytes, h (at most blockRows), final (0 or 1), a base that is not a seq
// of block k's slot 0, or (reserved >= 0, writable opens) a base at or
// past the seq reservation. A snapshot open passes reserved -1: its
// catalog copy lags the writer's reservation.
func decodeBlockCopy(src []byte, k, slots, reserved int64) (blockCopy, string) {
	src = src[:blockCopySize]
	if isZero(src) {
		// Never written (most of a large ring's blocks at open): said
		// without formatting, which allocated 64 bytes a copy.
		return blockCopy{}, "never written"
	}
	le := binary.LittleEndian
	if got, want := le.Uint32(src[bcCRC:]), crc32.Checksum(src[:bcCRC], castagnoli); got != want {
		return blockCopy{}, fmt.Sprintf("checksum %08x, computed %08x", got, want)
	}
	if le.Uint16(src[14:]) != 0 || le.Uint64(src[20:]) != 0 {
		return blockCopy{}, "reserved bytes set"
	}
	c := blockCopy{
		Base: int64(le.Uint64(src[bcBase:])), Gen: le.Uint32(src[bcGen:]),
		Rows: int(src[bcRows]), Final: src[bcFinal] == 1, CRC: le.Uint32(src[bcCRCh:]),
	}
	switch {
	case c.Rows > blockRows:
		return blockCopy{}, fmt.Sprintf("%d rows in a block of %d", c.Rows, blockRows)
	case src[bcFinal] > 1:
		return blockCopy{}, fmt.Sprintf("final byte %d", src[bcFinal])
	case c.Base < 0 || c.Base%slots != k*blockRows:
		return blockCopy{}, fmt.Sprintf("base %d is not a seq of block %d's first slot (%d slots)", c.Base, k, slots)
	case reserved >= 0 && c.Base >= reserved:
		return blockCopy{}, fmt.Sprintf("base %d at or past the seq reservation %d", c.Base, reserved)
	}
	return c, ""
}

// newer reports whether copy a was written after copy b: gens count a
// block's record writes and wrap at 2^32 (up to 64 a pass of the ring:
// 10^6 one-row extends a second into a 1,000-row ring wrap them in about
// 19 hours), so a is newer when its gen is less than 2^31 ahead.
func (a blockCopy) newer(b blockCopy) bool { return int32(a.Gen-b.Gen) > 0 }

// copyToReplace returns which of a block's two copies (0 = A, 1 = B) a
// record write replaces: one that does not verify, if there is one (never
// the only copy that does), else the older. verifies says which copies
// are valid and check their rows; copies holds them (read only where
// verifies is true).
func copyToReplace(copies [2]blockCopy, verifies [2]bool) int {
	switch {
	case !verifies[0]:
		return 0
	case !verifies[1]:
		return 1
	case copies[0].newer(copies[1]):
		return 1
	}
	return 0
}

// nextGen is the gen of a copy that replaces copy i: one past the other
// copy's if that one is valid (whether or not its rows verify: a copy of
// gen 1 beside a valid one of a larger gen would compare as the older),
// else 1.
func nextGen(copies [2]blockCopy, valid [2]bool, i int) uint32 {
	if o := 1 - i; valid[o] {
		return copies[o].Gen + 1
	}
	return 1
}

// blockHalfBytes is H, the bytes of each half of a version 3 rows.meta's
// block records: a copy for each of the ring's blocks, rounded up to a
// page, so that the two copies of a block are never in one page.
func blockHalfBytes(slots int64) int64 {
	n := slots / blockRows * blockCopySize
	return (n + pageBytes - 1) / pageBytes * pageBytes
}

// blockCopyOffset is the file offset of copy i (0 = A, 1 = B) of block k.
func blockCopyOffset(slots, k int64, i int) int64 {
	return headerSize + int64(i)*blockHalfBytes(slots) + k*blockCopySize
}

// metaV3Size is the size of a version 3 rows.meta for a ring of slots.
func metaV3Size(slots int64) int64 { return headerSize + 2*blockHalfBytes(slots) }

// watermarkRecord is version 3's watermark: W, and the tip block's
// durable prefix when W is not a block boundary.
type watermarkRecord struct {
	Seq     int64  // W
	TipBase int64  // base of the block holding W - 1; -1 without a tip
	TipRows int    // W - TipBase, 1 to blockRows-1; 0 without a tip
	TipCRC  uint32 // CRC-32C of the tip block's rows [0, TipRows)
}

// encode writes the record into a meta header's bytes at watermarkOff.
func (w watermarkRecord) encode(hdr []byte) {
	b := hdr[watermarkOff : watermarkOff+wrSize]
	clear(b)
	le := binary.LittleEndian
	le.PutUint64(hdr[wrSeq:], uint64(w.Seq))
	le.PutUint64(hdr[wrTipBase:], uint64(w.TipBase))
	hdr[wrTipRows] = uint8(w.TipRows)
	le.PutUint32(hdr[wrTipCRC:], w.TipCRC)
	le.PutUint32(hdr[wrCRC:], crc32.Checksum(hdr[watermarkOff:wrCRC], castagnoli))
}

// decodeWatermarkRecord reads the record from a meta header and says why
// it is not valid ("" when it is): its checksum (a torn write: recovery
// then uses the catalog's write count, as for versions 1 and 2), reserved
// bytes, or a tip that does not describe W: a base that is not W rounded
// down to a block in its pass (or -1 at a block boundary), or rows other
// than W - base.
func decodeWatermarkRecord(hdr []byte) (watermarkRecord, string) {
	le := binary.LittleEndian
	if got, want := le.Uint32(hdr[wrCRC:]), crc32.Checksum(hdr[watermarkOff:wrCRC], castagnoli); got != want {
		return watermarkRecord{}, fmt.Sprintf("checksum %08x, computed %08x", got, want)
	}
	if hdr[wrTipRows+1] != 0 || hdr[wrTipRows+2] != 0 || hdr[wrTipRows+3] != 0 || le.Uint32(hdr[wrTipCRC+4:]) != 0 {
		return watermarkRecord{}, "reserved bytes set"
	}
	w := watermarkRecord{
		Seq: int64(le.Uint64(hdr[wrSeq:])), TipBase: int64(le.Uint64(hdr[wrTipBase:])),
		TipRows: int(hdr[wrTipRows]), TipCRC: le.Uint32(hdr[wrTipCRC:]),
	}
	switch {
	case w.Seq < 0:
		return watermarkRecord{}, fmt.Sprintf("watermark %d", w.Seq)
	case w.Seq%blockRows == 0:
		if w.TipBase != -1 || w.TipRows != 0 || w.TipCRC != 0 {
			return watermarkRecord{}, fmt.Sprintf("a tip (base %d, %d rows) at watermark %d, a block boundary", w.TipBase, w.TipRows, w.Seq)
		}
	case w.TipBase != w.Seq-w.Seq%blockRows || int64(w.TipRows) != w.Seq-w.TipBase:
		return watermarkRecord{}, fmt.Sprintf("tip base %d with %d rows for watermark %d", w.TipBase, w.TipRows, w.Seq)
	}
	return w, ""
}

// tipOf is the watermark record for W given the running CRC of the block
// holding W - 1 at its row W mod blockRows (ignored at a block boundary).
func tipOf(w int64, crcAt uint32) watermarkRecord {
	if w%blockRows == 0 {
		return watermarkRecord{Seq: w, TipBase: -1}
	}
	base := w - w%blockRows
	return watermarkRecord{Seq: w, TipBase: base, TipRows: int(w - base), TipCRC: crcAt}
}

// rowMajorCRC continues crc over the row-major bytes of the row in slot:
// its bytes in every field column that is not mutable, in spec order (an
// update rewrites mutable fields in place, outside any checksum). It is
// the unit of version 3's block checksums and the start of version 1 and
// 2's per-row data checksum.
func (b *Buffer) rowMajorCRC(crc uint32, slot int64) uint32 {
	for _, c := range b.cols {
		if c.cz < 0 && !c.field.Mutable {
			crc = crc32.Update(crc, castagnoli, c.row(slot))
		}
	}
	return crc
}

// blockSums is the running checksum of the block a writer is filling:
// the CRC-32C of its rows [0, j), row-major, at every j where an extend
// ended (at every row when filled by push, or a row at a time), so that a sync can take
// the checksum at the row its watermark ends on (the tip, always an
// extend's end) without reading rows back.
type blockSums struct {
	base int64 // the block's first seq in this pass
	rows int   // rows added
	at   [blockRows + 1]uint32
}

// start begins the pass of the block whose first seq is base.
func (s *blockSums) start(base int64) { s.base, s.rows, s.at[0] = base, 0, 0 }

// push continues the checksum with the next row's CRC computed elsewhere
// (from at[rows], over its fields one by one).
func (s *blockSums) push(crc uint32) {
	s.at[s.rows+1] = crc
	s.rows++
}

// addRows continues the checksum over n rows whose row-major bytes follow
// each other in data, in one call. Only at[rows] is kept past them: a
// writer needs the checksum only where an extend ends (where a sync may
// take its tip, and where a record is written), and one call over a
// block's 2 KiB of CartPole rows costs a fifth of 64 calls.
func (s *blockSums) addRows(data []byte, n int) {
	s.at[s.rows+n] = crc32.Update(s.at[s.rows], castagnoli, data)
	s.rows += n
}

// verifiedPrefix reads the rows of block k from b's columns and returns
// the most rows any of claims verifies: a claim of n rows with checksum
// crc holds when the row-major CRC of the block's rows [0, n) is crc. One
// pass over at most the longest claim's rows. The rows are read where
// the slots are: recovery and verify call it on mapped files.
func (b *Buffer) verifiedPrefix(k int64, claims []blockClaim) int {
	longest := 0
	for _, c := range claims {
		longest = max(longest, c.Rows)
	}
	pitch := b.rowMajorBytes()
	if pitch > crcScratchSize {
		// Large rows: checksummed where they are, a row at a time.
		sums, best := b.prefixSums(k*blockRows, longest), 0
		for _, c := range claims {
			if sums.at[c.Rows] == c.CRC {
				best = max(best, c.Rows)
			}
		}
		return best
	}
	// Small rows: the block's rows gathered row-major, a column at a
	// time, and checksummed between the claims in one call each (a
	// call a field a row was a sixth of a 10^6-row open).
	rows := b.stageSlots(k*blockRows, longest, pitch)
	best, done := 0, 0
	var crc uint32
	for _, c := range slices.SortedFunc(slices.Values(claims), func(x, y blockClaim) int { return x.Rows - y.Rows }) {
		crc = crc32.Update(crc, castagnoli, rows[int64(done)*pitch:int64(c.Rows)*pitch])
		done = c.Rows
		if c.CRC == crc {
			best = c.Rows
		}
	}
	return best
}

// stageSlots gathers the row-major bytes of n rows of the ring from slot0
// on (within a block) into the staging buffer, pitch bytes a row.
func (b *Buffer) stageSlots(slot0 int64, n int, pitch int64) []byte {
	if need := int64(n) * pitch; int64(cap(b.runStage)) < need {
		b.runStage = make([]byte, need)
	}
	rows := b.runStage[:int64(n)*pitch]
	var off int64
	for _, c := range b.cols {
		if c.cz >= 0 || c.field.Mutable {
			continue
		}
		rb := int64(c.rowBytes)
		cp := c.pitch()
		for j := range int64(n) {
			copyField(rows[j*pitch+off:j*pitch+off+rb], c.data[(slot0+j)*cp:(slot0+j)*cp+rb])
		}
		off += rb
	}
	return rows
}

// blockClaim is what a checksum says of a block: its rows [0, Rows) have
// row-major CRC-32C CRC (a copy's h and crc_h, or the watermark record's
// tip).
type blockClaim struct {
	Rows int
	CRC  uint32
}
