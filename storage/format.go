package storage

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// The on-disk layout below is specified byte for byte in docs/format.md;
// the constants here mirror that page and must change together with it.

// FormatVersion is the version of the column, meta and catalog formats this
// build writes. It only moves forward: a file with a larger version is
// refused with ErrVersionMismatch, never guessed at.
const FormatVersion uint32 = 1

// tailVersionDense is the column format version of a dense tail file: the
// k-th final observation ever written is entry k mod rows, each entry the
// observation's bytes and then the seq of its row (tailstore.go). Version
// 1 tail files keep a row's final observation at its slot. Other column
// files stay at FormatVersion.
const tailVersionDense uint32 = 2

// tailVersionDenseV3 is the column format version of a dense tail file of
// a buffer with rows.meta version 3: entries end in a 16-byte trailer
// whose checksum covers the observation and its row (tailTrailerSizeV3).
const tailVersionDenseV3 uint32 = 3

// tailTrailerSize is the u64 after each entry of a dense tail file: the
// seq of the row the entry belongs to, plus 1 (0: never written).
const tailTrailerSize = 8

const (
	// headerSize is the size of every file header. Data starts right after
	// it, page aligned, so row bytes can be mapped and synced by page.
	headerSize = 4096

	colHeaderCRCOff  = 508 // crc32c of bytes [0, 508) of a column header
	metaHeaderCRCOff = 252 // crc32c of bytes [0, 252) of the meta header
	watermarkOff     = 256 // durable watermark block: int64 seq + crc32c
	maxNameBytes     = 128 // field names; buffer names are at most 64

	// recordSize is the size of one row-metadata record in rows.meta.
	recordSize = 64
)

var (
	colMagic   = [8]byte{'R', 'B', 'D', 'C', 'O', 'L', 0, 0}
	metaMagic  = [8]byte{'R', 'B', 'D', 'M', 'E', 'T', 'A', 0}
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
)

// Column roles, stored in column headers.
const (
	roleField uint32 = 1 // one stored field of the spec
	roleTail  uint32 = 2 // final observations of ended trajectories (compact_obs)
	// rolePriority is the raw priority of each slot (float64), outside the
	// row checksum because it changes after the row is written.
	rolePriority uint32 = 3
)

// colHeader describes a column file. Every value is checked against the
// catalog on open, so a file copied in from another buffer, or one whose
// field changed type, is refused rather than read as wrong data.
type colHeader struct {
	Version  uint32
	Role     uint32
	UID      uint64
	Capacity uint64
	RowBytes uint64
	DType    DType
	Shape    []int
	Name     string
}

func (h colHeader) encode() []byte {
	b := make([]byte, headerSize)
	copy(b[0:8], colMagic[:])
	le := binary.LittleEndian
	le.PutUint32(b[8:], h.Version)
	le.PutUint32(b[12:], h.Role)
	le.PutUint64(b[16:], h.UID)
	le.PutUint64(b[24:], h.Capacity)
	le.PutUint64(b[32:], h.RowBytes)
	b[40] = byte(h.DType)
	b[41] = byte(len(h.Shape))
	le.PutUint16(b[42:], uint16(len(h.Name)))
	for i, d := range h.Shape {
		le.PutUint32(b[44+4*i:], uint32(d))
	}
	copy(b[76:76+maxNameBytes], h.Name)
	le.PutUint32(b[colHeaderCRCOff:], crc32.Checksum(b[:colHeaderCRCOff], castagnoli))
	return b
}

func decodeColHeader(path string, b []byte) (colHeader, error) {
	var h colHeader
	if len(b) < headerSize {
		return h, corruptf(path, 0, "file shorter than its %d-byte header", headerSize)
	}
	if [8]byte(b[0:8]) != colMagic {
		return h, corruptf(path, 0, "not an rbd column file (bad magic %q)", b[0:8])
	}
	le := binary.LittleEndian
	if got, want := le.Uint32(b[colHeaderCRCOff:]), crc32.Checksum(b[:colHeaderCRCOff], castagnoli); got != want {
		return h, corruptf(path, colHeaderCRCOff, "header checksum %08x, computed %08x", got, want)
	}
	h.Version = le.Uint32(b[8:])
	h.Role = le.Uint32(b[12:])
	if h.Version != FormatVersion && h.Version != tailVersionDense && h.Version != tailVersionDenseV3 {
		return h, fmt.Errorf("%s: column format version %d, this build reads %d, %d and %d (dense tail files): %w", path, h.Version, FormatVersion, tailVersionDense, tailVersionDenseV3, ErrVersionMismatch)
	}
	h.UID = le.Uint64(b[16:])
	h.Capacity = le.Uint64(b[24:])
	h.RowBytes = le.Uint64(b[32:])
	h.DType = DType(b[40])
	ndim := int(b[41])
	nameLen := int(le.Uint16(b[42:]))
	if ndim > 8 || nameLen > maxNameBytes {
		return h, corruptf(path, 41, "header has %d dims and a %d-byte name", ndim, nameLen)
	}
	h.Shape = make([]int, ndim)
	for i := range h.Shape {
		h.Shape[i] = int(le.Uint32(b[44+4*i:]))
	}
	h.Name = string(b[76 : 76+nameLen])
	return h, nil
}

// metaHeader describes rows.meta, the row-metadata file of a buffer.
type metaHeader struct {
	Version    uint32
	RecordSize uint32
	UID        uint64
	Capacity   uint64
	Name       string
	// Version 3 only (0 in versions 1 and 2, whose bytes there are
	// zero): the rows of a block and the ring's slots.
	BlockRows uint32
	Slots     uint64
}

func (h metaHeader) encode() []byte {
	b := make([]byte, headerSize)
	copy(b[0:8], metaMagic[:])
	le := binary.LittleEndian
	le.PutUint32(b[8:], h.Version)
	le.PutUint32(b[12:], h.RecordSize)
	le.PutUint64(b[16:], h.UID)
	le.PutUint64(b[24:], h.Capacity)
	le.PutUint16(b[32:], uint16(len(h.Name)))
	copy(b[34:34+64], h.Name)
	if h.Version == metaVersionBlocks {
		le.PutUint32(b[mhBlockRows:], h.BlockRows)
		le.PutUint64(b[mhSlots:], h.Slots)
	}
	le.PutUint32(b[metaHeaderCRCOff:], crc32.Checksum(b[:metaHeaderCRCOff], castagnoli))
	if h.Version == metaVersionBlocks {
		watermarkRecord{TipBase: -1}.encode(b)
	} else {
		putWatermark(b, 0)
	}
	return b
}

func decodeMetaHeader(path string, b []byte) (metaHeader, error) {
	var h metaHeader
	if len(b) < headerSize {
		return h, corruptf(path, 0, "file shorter than its %d-byte header", headerSize)
	}
	if [8]byte(b[0:8]) != metaMagic {
		return h, corruptf(path, 0, "not an rbd row-metadata file (bad magic %q)", b[0:8])
	}
	le := binary.LittleEndian
	if got, want := le.Uint32(b[metaHeaderCRCOff:]), crc32.Checksum(b[:metaHeaderCRCOff], castagnoli); got != want {
		return h, corruptf(path, metaHeaderCRCOff, "header checksum %08x, computed %08x", got, want)
	}
	h.Version = le.Uint32(b[8:])
	if h.Version != FormatVersion && h.Version != metaVersionRuns && h.Version != metaVersionBlocks {
		return h, fmt.Errorf("%s: row-metadata format version %d, this build reads %d, %d and %d: %w", path, h.Version, FormatVersion, metaVersionRuns, metaVersionBlocks, ErrVersionMismatch)
	}
	h.RecordSize = le.Uint32(b[12:])
	h.UID = le.Uint64(b[16:])
	h.Capacity = le.Uint64(b[24:])
	n := int(le.Uint16(b[32:]))
	if n > 64 {
		return h, corruptf(path, 32, "buffer name of %d bytes", n)
	}
	h.Name = string(b[34 : 34+n])
	if h.Version == metaVersionBlocks {
		h.BlockRows, h.Slots = le.Uint32(b[mhBlockRows:]), le.Uint64(b[mhSlots:])
	}
	return h, nil
}

// putWatermark stores the durable watermark (every written row with a
// smaller seq is on stable storage) with its own checksum, so that a torn
// update of this block is detected instead of trusted.
func putWatermark(hdr []byte, seq int64) {
	le := binary.LittleEndian
	le.PutUint64(hdr[watermarkOff:], uint64(seq))
	le.PutUint32(hdr[watermarkOff+8:], crc32.Checksum(hdr[watermarkOff:watermarkOff+8], castagnoli))
}

// watermarkBlock is the watermark block putWatermark would store, for
// writers that store it in one write.
func watermarkBlock(seq int64) []byte {
	b := make([]byte, 12)
	binary.LittleEndian.PutUint64(b, uint64(seq))
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(b[:8], castagnoli))
	return b
}

func readWatermark(hdr []byte) (int64, bool) {
	le := binary.LittleEndian
	if le.Uint32(hdr[watermarkOff+8:]) != crc32.Checksum(hdr[watermarkOff:watermarkOff+8], castagnoli) {
		return 0, false
	}
	return int64(le.Uint64(hdr[watermarkOff:])), true
}

// Row flags, stored in a record's flags word.
const (
	flagDone       uint32 = 1 << 0
	flagTerminated uint32 = 1 << 1
	flagTruncated  uint32 = 1 << 2
	flagHasTail    uint32 = 1 << 3 // tail columns hold this row's final observation
	knownFlags            = flagDone | flagTerminated | flagTruncated | flagHasTail
)

// Record byte offsets (little endian):
//
//	0  int64  seq       write sequence number; -(seq+2) while the slot is being written as seq
//	8  int64  traj_id
//	16 int64  step      index of the row within its trajectory
//	24 int64  prev_seq  seq of the previous row of the trajectory, -1 at its start
//	32 int64  env
//	40 uint32 flags
//	44 int64  policy_version  of the policy that produced the row (0 if unknown)
//	52 [4]byte reserved, zero
//	56 uint32 data crc32c over the row's field bytes (spec order), then its
//	          tail bytes (obs_keys order) when flagHasTail is set; 0 in memory buffers
//	60 uint32 record crc32c over bytes [0, 60)
//
// next_seq is deliberately not stored: it would make a row's record change
// after the row was written (when its successor arrives), and a crash during
// that update could destroy an acknowledged row. It is rebuilt from prev_seq
// on open.
const (
	recSeq     = 0
	recTraj    = 8
	recStep    = 16
	recPrev    = 24
	recEnv     = 32
	recFlags   = 40
	recVersion = 44
	recDataCRC = 56
	recCRC     = 60
)

// record is the decoded form of one row-metadata record.
type record struct {
	Seq, TrajID, Step, PrevSeq, Env int64
	Flags                           uint32
	PolicyVersion                   int64
	DataCRC                         uint32
}

func putRecordBody(b []byte, r *record) {
	le := binary.LittleEndian
	le.PutUint64(b[recTraj:], uint64(r.TrajID))
	le.PutUint64(b[recStep:], uint64(r.Step))
	le.PutUint64(b[recPrev:], uint64(r.PrevSeq))
	le.PutUint64(b[recEnv:], uint64(r.Env))
	le.PutUint32(b[recFlags:], r.Flags)
	le.PutUint64(b[recVersion:], uint64(r.PolicyVersion))
	clear(b[recVersion+8 : recDataCRC])
	le.PutUint32(b[recDataCRC:], r.DataCRC)
}

// writingMarker is stored in a record's seq field while the slot is being
// written as seq: negative, so never a valid seq, and still naming it.
func writingMarker(seq int64) int64 { return -(seq + 2) }

// markedSeq returns the seq a being-written marker names, or -1.
func markedSeq(raw int64) int64 {
	if raw <= -2 {
		return -raw - 2
	}
	return -1
}

// encodeRecord writes the complete record r (seq included) into b.
func encodeRecord(b []byte, r *record) {
	binary.LittleEndian.PutUint64(b[recSeq:], uint64(r.Seq))
	putRecordBody(b, r)
	binary.LittleEndian.PutUint32(b[recCRC:], crc32.Checksum(b[:recCRC], castagnoli))
}

// decodeRecord returns the record and whether its checksum holds and its
// seq is a completed write.
//
// It decodes a private copy of the 64 bytes, in c: read in place next to
// a running writer, the fields could be loaded before an overwrite and the
// checksum computed over the finished new record, and a mixture of two
// rows would pass as one. From one copy, a torn read fails its checksum.
// The caller owns c, one for a whole pass over records: a copy of its own
// here escaped to the heap (crc32 calls through a function variable, which
// escape analysis cannot see into), 64 bytes of garbage a record read.
func decodeRecord(rec []byte, c *[recordSize]byte) (record, bool) {
	copy(c[:], rec)
	b := c[:]
	le := binary.LittleEndian
	r := record{
		Seq:     int64(le.Uint64(b[recSeq:])),
		TrajID:  int64(le.Uint64(b[recTraj:])),
		Step:    int64(le.Uint64(b[recStep:])),
		PrevSeq: int64(le.Uint64(b[recPrev:])),
		Env:     int64(le.Uint64(b[recEnv:])),
		Flags:   le.Uint32(b[recFlags:]),
		DataCRC: le.Uint32(b[recDataCRC:]),
		// Files written before policy versions existed hold zeros here.
		PolicyVersion: int64(le.Uint64(b[recVersion:])),
	}
	ok := r.Seq >= 0 && le.Uint32(b[recCRC:]) == crc32.Checksum(b[:recCRC], castagnoli)
	return r, ok
}

// recordNeverWritten reports whether a record is all zeros, as the sparse
// file (or anonymous memory) gives a slot no write ever reached.
func recordNeverWritten(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
