package storage

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// Chunk segments hold the compressed fields of compressed buffers. The
// layout is specified byte for byte in docs/format.md ("Chunk segments").

const (
	segHeaderSize   = 64
	segHeaderCRCOff = 60

	// Record kinds.
	recSealed   = 1 // a whole chunk: the rows of one trajectory it will ever hold
	recFragment = 2 // rows appended to a chunk that is still open

	recFlagTail = 1 // the chunk's last row carries a final observation unit

	chunkHeaderSize = 56
	fieldHeaderSize = 16

	// maxChunkRecord bounds a record's length before anything is allocated
	// from it: a damaged length field must not ask for gigabytes.
	maxChunkRecord = 1 << 31

	codecNone uint8 = 0
	codecZstd uint8 = 1
)

var (
	segMagic   = [8]byte{'R', 'B', 'D', 'S', 'E', 'G', 0, 0}
	chunkMagic = [4]byte{'R', 'B', 'D', 'K'}
)

// Frame modes: how one stored unit of a field rebuilds its row. Fields
// without a frame stack store every row whole (modeFull).
const (
	modeFull    byte = 0 // the whole row
	modeNewest  byte = 1 // the newest frame; the older ones are the previous row's, shifted
	modeZeroPad byte = 2 // the newest frame; the older ones are zero
	modeRepeat  byte = 3 // one frame, repeated K times
)

func crcOf(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// segHeader is the first 64 bytes of a segment file: a chunk segment
// (segMagic, FormatVersion) or a run segment (runSegMagic,
// metaVersionRuns: runlog.go). The zero Magic means segMagic.
type segHeader struct {
	Magic   [8]byte
	Version uint32
	UID     uint64
	Number  uint64
}

func (h segHeader) encode() []byte {
	b := make([]byte, segHeaderSize)
	if h.Magic == ([8]byte{}) {
		h.Magic = segMagic
	}
	copy(b, h.Magic[:])
	le := binary.LittleEndian
	le.PutUint32(b[8:], h.Version)
	le.PutUint64(b[16:], h.UID)
	le.PutUint64(b[24:], h.Number)
	le.PutUint32(b[segHeaderCRCOff:], crc32.Checksum(b[:segHeaderCRCOff], castagnoli))
	return b
}

// decodeSegHeader decodes the header of a segment of the family magic,
// whose files this build writes at version (what names the family in
// errors).
func decodeSegHeader(path string, b []byte, magic [8]byte, version uint32, what string) (segHeader, error) {
	var h segHeader
	if len(b) < segHeaderSize {
		return h, corruptf(path, 0, "%s shorter than its %d-byte header", what, segHeaderSize)
	}
	if [8]byte(b[:8]) != magic {
		return h, corruptf(path, 0, "not an rbd %s (bad magic %q)", what, b[:8])
	}
	le := binary.LittleEndian
	if got, want := le.Uint32(b[segHeaderCRCOff:]), crc32.Checksum(b[:segHeaderCRCOff], castagnoli); got != want {
		return h, corruptf(path, segHeaderCRCOff, "%s header checksum %08x, computed %08x", what, got, want)
	}
	h.Magic = magic
	h.Version = le.Uint32(b[8:])
	if h.Version != version {
		return h, fmt.Errorf("%s: %s format version %d, this build reads %d: %w", path, what, h.Version, version, ErrVersionMismatch)
	}
	h.UID = le.Uint64(b[16:])
	h.Number = le.Uint64(b[24:])
	return h, nil
}

// chunkRecord is one decoded record of a segment: a sealed chunk or a
// fragment of an open one. Payloads are as stored (compressed).
type chunkRecord struct {
	Kind      uint8
	Tail      bool
	TrajID    int64
	FirstStep int64
	ID        uint64 // the chunk's id (fragments carry their open chunk's id)
	PrevID    uint64 // the trajectory's previous chunk, 0 at its start
	Seqs      []int64
	Fields    []recordField
}

// recordField is one compressed field inside a record.
type recordField struct {
	Codec   uint8
	Delta   bool
	RawLen  uint32
	CRC     uint32 // crc32c of the stored payload
	Modes   []byte // one per unit: a row, plus the final observation if Tail and the field has them
	Payload []byte
	// PayloadOff is the payload's offset within the record (set by encode
	// and decode).
	PayloadOff int
}

// units is the number of stored units of a field: a row each, plus one
// for a final observation if the field keeps them (an obs key of a
// compact_obs buffer).
func (r *chunkRecord) units(tailField bool) int {
	if r.Tail && tailField {
		return len(r.Seqs) + 1
	}
	return len(r.Seqs)
}

// encode appends the record to dst, and fills in each field's CRC and
// PayloadOff as written.
func (r *chunkRecord) encode(dst []byte) []byte {
	start := len(dst)
	n := chunkHeaderSize + 8*len(r.Seqs)
	for _, f := range r.Fields {
		n += fieldHeaderSize + len(f.Modes) + len(f.Payload)
	}
	n += 4
	dst = append(dst, make([]byte, n)...)
	b := dst[start:]
	le := binary.LittleEndian
	copy(b, chunkMagic[:])
	le.PutUint32(b[4:], uint32(n))
	b[8] = r.Kind
	if r.Tail {
		b[9] = recFlagTail
	}
	le.PutUint16(b[10:], uint16(len(r.Fields)))
	le.PutUint32(b[12:], uint32(len(r.Seqs)))
	le.PutUint64(b[16:], uint64(r.TrajID))
	le.PutUint64(b[24:], uint64(r.FirstStep))
	le.PutUint64(b[32:], r.ID)
	le.PutUint64(b[40:], r.PrevID)
	off := chunkHeaderSize
	for _, s := range r.Seqs {
		le.PutUint64(b[off:], uint64(s))
		off += 8
	}
	for i := range r.Fields {
		f := &r.Fields[i]
		f.CRC = crcOf(f.Payload)
		b[off] = f.Codec
		if f.Delta {
			b[off+1] = 1
		}
		le.PutUint32(b[off+4:], f.RawLen)
		le.PutUint32(b[off+8:], uint32(len(f.Payload)))
		le.PutUint32(b[off+12:], f.CRC)
		off += fieldHeaderSize
		off += copy(b[off:], f.Modes)
	}
	for i := range r.Fields {
		r.Fields[i].PayloadOff = off
		off += copy(b[off:], r.Fields[i].Payload)
	}
	le.PutUint32(b[off:], crc32.Checksum(b[:off], castagnoli))
	return dst
}

// recordLen reads the length of the record starting at b, checking only
// what is needed to know how many bytes to read next.
func recordLen(b []byte) (int, error) {
	if len(b) < 8 {
		return 0, fmt.Errorf("record header cut short (%d bytes)", len(b))
	}
	if [4]byte(b[:4]) != chunkMagic {
		return 0, fmt.Errorf("bad record magic %q", b[:4])
	}
	n := int(binary.LittleEndian.Uint32(b[4:]))
	if n < chunkHeaderSize+4 || n > maxChunkRecord {
		return 0, fmt.Errorf("record length %d out of range", n)
	}
	return n, nil
}

// decodeChunkRecord parses and checks one whole record. It trusts nothing:
// every count and length is checked against the record's own size and the
// buffer's geometry (one compressed field per entry of tailFields, which
// says whether the field keeps final observations; at most maxRows rows)
// before use, and the checksum is verified first.
func decodeChunkRecord(b []byte, tailFields []bool, maxRows int) (*chunkRecord, error) {
	nfields := len(tailFields)
	n, err := recordLen(b)
	if err != nil {
		return nil, err
	}
	if len(b) != n {
		return nil, fmt.Errorf("record says %d bytes, got %d", n, len(b))
	}
	le := binary.LittleEndian
	if got, want := le.Uint32(b[n-4:]), crc32.Checksum(b[:n-4], castagnoli); got != want {
		return nil, fmt.Errorf("record checksum %08x, computed %08x", got, want)
	}
	r := &chunkRecord{Kind: b[8]}
	if r.Kind != recSealed && r.Kind != recFragment {
		return nil, fmt.Errorf("unknown record kind %d", r.Kind)
	}
	if b[9]&^recFlagTail != 0 {
		return nil, fmt.Errorf("unknown record flags %#x", b[9])
	}
	r.Tail = b[9]&recFlagTail != 0
	nf := int(le.Uint16(b[10:]))
	rows := int(le.Uint32(b[12:]))
	if nf != nfields {
		return nil, fmt.Errorf("record has %d fields, buffer has %d compressed fields", nf, nfields)
	}
	if rows < 1 || rows > maxRows {
		return nil, fmt.Errorf("record has %d rows, want 1 to %d", rows, maxRows)
	}
	r.TrajID = int64(le.Uint64(b[16:]))
	r.FirstStep = int64(le.Uint64(b[24:]))
	r.ID = le.Uint64(b[32:])
	r.PrevID = le.Uint64(b[40:])
	if r.TrajID < 0 || r.FirstStep < 0 || r.ID == 0 {
		return nil, fmt.Errorf("record has trajectory %d, first step %d, id %d", r.TrajID, r.FirstStep, r.ID)
	}
	off := chunkHeaderSize
	body := n - 4
	if off+8*rows > body {
		return nil, fmt.Errorf("record of %d bytes cannot hold %d seqs", n, rows)
	}
	r.Seqs = make([]int64, rows)
	for i := range r.Seqs {
		r.Seqs[i] = int64(le.Uint64(b[off:]))
		if r.Seqs[i] < 0 || (i > 0 && r.Seqs[i] <= r.Seqs[i-1]) {
			return nil, fmt.Errorf("record seqs are not increasing at row %d (%d)", i, r.Seqs[i])
		}
		off += 8
	}
	r.Fields = make([]recordField, nf)
	stored := make([]int, nf)
	for i := range r.Fields {
		units := r.units(tailFields[i])
		if off+fieldHeaderSize+units > body {
			return nil, fmt.Errorf("record of %d bytes cannot hold field %d's header", n, i)
		}
		f := &r.Fields[i]
		f.Codec = b[off]
		if f.Codec != codecNone && f.Codec != codecZstd {
			return nil, fmt.Errorf("field %d: unknown codec %d", i, f.Codec)
		}
		if b[off+1] > 1 {
			return nil, fmt.Errorf("field %d: delta byte %d", i, b[off+1])
		}
		f.Delta = b[off+1] == 1
		f.RawLen = le.Uint32(b[off+4:])
		stored[i] = int(le.Uint32(b[off+8:]))
		f.CRC = le.Uint32(b[off+12:])
		off += fieldHeaderSize
		f.Modes = b[off : off+units : off+units]
		for j, m := range f.Modes {
			if m > modeRepeat {
				return nil, fmt.Errorf("field %d unit %d: unknown frame mode %d", i, j, m)
			}
		}
		off += units
	}
	for i := range r.Fields {
		f := &r.Fields[i]
		if stored[i] > body-off {
			return nil, fmt.Errorf("field %d: payload of %d bytes overruns the record", i, stored[i])
		}
		f.PayloadOff = off
		f.Payload = b[off : off+stored[i] : off+stored[i]]
		off += stored[i]
		if got := crc32.Checksum(f.Payload, castagnoli); got != f.CRC {
			return nil, fmt.Errorf("field %d: payload checksum %08x, header says %08x", i, got, f.CRC)
		}
		if f.Codec == codecNone && int(f.RawLen) != len(f.Payload) {
			return nil, fmt.Errorf("field %d: raw payload of %d bytes, header says %d", i, len(f.Payload), f.RawLen)
		}
	}
	if off != body {
		return nil, fmt.Errorf("record has %d unexplained bytes", body-off)
	}
	return r, nil
}
