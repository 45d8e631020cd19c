package storage

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
)

// Run log records of format version 3 (docs/proposals/format-v3.md, "Run
// log version 3"): version 2's 64-byte piece with a stride where version 2
// has a span, since rows no longer carry their offsets, and hole records,
// the seqs a writer skipped (read, not written: this build makes skipped
// seqs catalog holes); and the trailer of its dense tail entries.

// rlHole marks a hole record in the flags byte (bit 7: no row flag uses
// it).
const rlHole uint8 = 1 << 7

// maxSeqV3 bounds every seq a version 3 record may name: no writer gets
// near it (2^62 rows at 10^9 a second is 146 years), and a crafted or
// damaged record past it could make seq + capacity overflow in a snapshot
// open, which has no seq reservation to bound records by.
const maxSeqV3 = 1 << 62

// pieceV3 is a decoded version 3 run log record: a piece of a trajectory
// whose rows are Stride seqs apart, or (Hole) the seqs [FirstSeq, TrajID).
type pieceV3 struct {
	FirstSeq, TrajID, FirstStep, PrevSeq, Env, PolicyVersion int64
	Stride, Rows                                             uint16
	Flags                                                    uint8
}

// holeRecord is the hole record of the seqs [from, to).
func holeRecord(from, to int64) pieceV3 {
	return pieceV3{FirstSeq: from, TrajID: to, Flags: rlHole}
}

// Hole reports whether p is a hole record.
func (p *pieceV3) Hole() bool { return p.Flags&rlHole != 0 }

// lastSeq is the seq of the piece's last row, or a hole's last seq: what
// keeps its segment from being collected while the window holds it.
func (p *pieceV3) lastSeq() int64 {
	if p.Hole() {
		return p.TrajID - 1
	}
	return p.FirstSeq + int64(p.Rows-1)*int64(p.Stride)
}

// rowOf returns the index in the piece of the row with seq, if the piece
// holds it.
func (p *pieceV3) rowOf(seq int64) (int, bool) {
	d := seq - p.FirstSeq
	switch {
	case p.Hole() || d < 0 || seq > p.lastSeq():
		return 0, false
	case d == 0:
		return 0, true
	case d%int64(p.Stride) != 0:
		return 0, false
	}
	return int(d / int64(p.Stride)), true
}

// row returns the metadata of the piece's row k: its seq, step and
// previous row (the piece's prev_seq for its first row), and its flags
// (the piece's for its last row, none before).
func (p *pieceV3) row(k int) (seq, step, prev int64, flags uint32) {
	seq = p.FirstSeq + int64(k)*int64(p.Stride)
	prev = p.PrevSeq
	if k > 0 {
		prev = seq - int64(p.Stride)
	}
	if k == int(p.Rows)-1 {
		flags = uint32(p.Flags)
	}
	return seq, p.FirstStep + int64(k), prev, flags
}

// encode writes the record: version 2's layout, the stride where version
// 2 has the span.
func (p *pieceV3) encode(b []byte) {
	r := runPiece{FirstSeq: p.FirstSeq, TrajID: p.TrajID, FirstStep: p.FirstStep, PrevSeq: p.PrevSeq,
		Env: p.Env, PolicyVersion: p.PolicyVersion, Span: p.Stride, Rows: p.Rows, Flags: p.Flags}
	r.encode(b)
}

// decodePieceV3 decodes a version 3 run log record and says why it is not
// one a writer could have written ("" if it is). reserved is the catalog's
// seq reservation for writable opens (no record names a seq at or past
// it: seqs are reserved before they are used, a hole's too), or -1 for
// snapshot opens, whose catalog copy lags the writer's.
func decodePieceV3(b []byte, reserved int64) (pieceV3, string) {
	r, why := readRunRecord(b)
	p := pieceV3{FirstSeq: r.FirstSeq, TrajID: r.TrajID, FirstStep: r.FirstStep, PrevSeq: r.PrevSeq,
		Env: r.Env, PolicyVersion: r.PolicyVersion, Stride: r.Span, Rows: r.Rows, Flags: r.Flags}
	if why != "" {
		return p, why
	}
	if p.Hole() {
		switch {
		case p.Flags != rlHole || p.FirstStep != 0 || p.PrevSeq != 0 || p.Env != 0 || p.PolicyVersion != 0 || p.Stride != 0 || p.Rows != 0:
			return p, "a hole record with fields of a piece"
		case p.FirstSeq < 0 || p.TrajID <= p.FirstSeq:
			return p, fmt.Sprintf("a hole [%d, %d)", p.FirstSeq, p.TrajID)
		case p.TrajID > maxSeqV3:
			return p, fmt.Sprintf("a hole [%d, %d) past seq 2^62", p.FirstSeq, p.TrajID)
		case reserved >= 0 && p.TrajID > reserved:
			return p, fmt.Sprintf("a hole [%d, %d) past the seq reservation %d", p.FirstSeq, p.TrajID, reserved)
		}
		return p, ""
	}
	switch {
	case p.FirstSeq < 0 || p.TrajID < 0 || p.FirstStep < 0:
		return p, fmt.Sprintf("negative seq %d, trajectory %d or step %d", p.FirstSeq, p.TrajID, p.FirstStep)
	case p.PrevSeq < -1 || p.PrevSeq >= p.FirstSeq:
		return p, fmt.Sprintf("impossible prev_seq %d for first seq %d", p.PrevSeq, p.FirstSeq)
	case p.Rows == 0 || (p.Rows == 1) != (p.Stride == 0):
		return p, fmt.Sprintf("%d rows %d seqs apart", p.Rows, p.Stride)
	case int64(p.Rows-1)*int64(p.Stride) > maxPieceSpan:
		return p, fmt.Sprintf("%d rows %d seqs apart span more than %d seqs", p.Rows, p.Stride, maxPieceSpan)
	case p.FirstSeq > math.MaxInt64-maxPieceSpan:
		return p, fmt.Sprintf("first seq %d: its rows' seqs would overflow", p.FirstSeq)
	case p.lastSeq() >= maxSeqV3:
		return p, fmt.Sprintf("last seq %d past seq 2^62", p.lastSeq())
	case uint32(p.Flags)&^knownFlags != 0:
		return p, fmt.Sprintf("unknown flags %#x", p.Flags)
	case reserved >= 0 && p.lastSeq() >= reserved:
		return p, fmt.Sprintf("last seq %d at or past the seq reservation %d", p.lastSeq(), reserved)
	}
	return p, ""
}

// tailTrailerSizeV3 is what follows a final observation in a version 3
// dense tail entry: seq + 1 (u64, 0 for an entry never written), a
// CRC-32C (u32) of the observation's bytes, the seq, and the row's
// traj_id and step (u64 each), then 4 zero bytes. The checksum covers the
// trajectory and step so that an entry an older row left under the same
// seq (written before a crash, its seq then used again by an fsync
// writer's resumed extend) cannot pass for the new row's: trajectory ids
// are never handed out twice.
const tailTrailerSizeV3 = 16

// putTailTrailerV3 ends entry (a final observation of rowBytes bytes,
// then its trailer) as the entry of the row seq of trajectory traj at
// step.
func putTailTrailerV3(entry []byte, rowBytes int, seq, traj, step int64) {
	t := entry[rowBytes : rowBytes+tailTrailerSizeV3]
	binary.LittleEndian.PutUint64(t, uint64(seq+1))
	binary.LittleEndian.PutUint32(t[8:], tailEntryCRC(entry[:rowBytes], seq, traj, step))
	clear(t[12:])
}

// tailEntryV3 reads entry's trailer: the seq it names (-1 for an entry
// never written), and whether its checksum holds for that seq's row of
// trajectory traj at step.
func tailEntryV3(entry []byte, rowBytes int, traj, step int64) (seq int64, ok bool) {
	t := entry[rowBytes : rowBytes+tailTrailerSizeV3]
	seq = int64(binary.LittleEndian.Uint64(t)) - 1
	if seq < 0 {
		return -1, false
	}
	return seq, isZero(t[12:]) && binary.LittleEndian.Uint32(t[8:]) == tailEntryCRC(entry[:rowBytes], seq, traj, step)
}

func tailEntryCRC(obs []byte, seq, traj, step int64) uint32 {
	var ids [24]byte
	binary.LittleEndian.PutUint64(ids[0:], uint64(seq))
	binary.LittleEndian.PutUint64(ids[8:], uint64(traj))
	binary.LittleEndian.PutUint64(ids[16:], uint64(step))
	return crc32.Update(crc32.Checksum(obs, castagnoli), castagnoli, ids[:])
}
