package storage

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"
)

// TestPieceV3RowsAndRoundTrip encodes pieces and hole records, decodes them
// back, and reads every row of the pieces: seqs Stride apart, steps one
// apart, each row's previous row the one before it (the piece's prev_seq
// for the first), flags on the last row only.
func TestPieceV3RowsAndRoundTrip(t *testing.T) {
	for _, p := range []pieceV3{
		{FirstSeq: 9, TrajID: 3, FirstStep: 0, PrevSeq: -1, Env: 1, PolicyVersion: 0x0102030405, Stride: 8, Rows: 4, Flags: uint8(flagDone | flagTruncated | flagHasTail)},
		{FirstSeq: 1 << 40, TrajID: math.MaxInt64, FirstStep: 7, PrevSeq: 1<<40 - 65535, Env: math.MinInt64, PolicyVersion: -1, Stride: 0, Rows: 1},
		{FirstSeq: maxSeqV3 - maxPieceSpan - 1, TrajID: 2, PrevSeq: -1, Stride: 5, Rows: 13108},
		{FirstSeq: 100, TrajID: 1, FirstStep: 5, PrevSeq: 99, Stride: 1, Rows: math.MaxUint16},
		{FirstSeq: 100, TrajID: 1, PrevSeq: -1, Stride: 65535, Rows: 2},
		holeRecord(64, 128),
	} {
		b := make([]byte, runLogRecordSize)
		p.encode(b)
		got, why := decodePieceV3(b, -1)
		if why != "" || got != p {
			t.Errorf("%+v decoded as %+v (%s)", p, got, why)
			continue
		}
		if p.Hole() {
			if _, ok := p.rowOf(p.FirstSeq); ok || p.lastSeq() != p.TrajID-1 {
				t.Errorf("hole %+v: holds its first seq, or last seq %d", p, p.lastSeq())
			}
			continue
		}
		for k := 0; k < int(p.Rows); k++ {
			seq, step, prev, flags := p.row(k)
			wantPrev, wantFlags := seq-int64(p.Stride), uint32(0)
			if k == 0 {
				wantPrev = p.PrevSeq
			}
			if k == int(p.Rows)-1 {
				wantFlags = uint32(p.Flags)
			}
			if step != p.FirstStep+int64(k) || prev != wantPrev || flags != wantFlags || seq != p.FirstSeq+int64(k)*int64(p.Stride) {
				t.Fatalf("%+v row %d: seq %d step %d prev %d flags %#x", p, k, seq, step, prev, flags)
			}
			if got, ok := p.rowOf(seq); !ok || got != k {
				t.Fatalf("%+v: seq %d is row %d (%v), want %d", p, seq, got, ok, k)
			}
			if p.Stride > 1 {
				if _, ok := p.rowOf(seq + 1); ok && k < int(p.Rows)-1 {
					t.Fatalf("%+v: seq %d, between rows, is held", p, seq+1)
				}
			}
		}
		if _, ok := p.rowOf(p.lastSeq() + 1); ok {
			t.Errorf("%+v: the seq past its last row is held", p)
		}
		if _, ok := p.rowOf(p.FirstSeq - 1); ok {
			t.Errorf("%+v: the seq before its first row is held", p)
		}
	}
}

// TestPieceV3Invalid holds decodePieceV3 to every rule: each case breaks
// one.
func TestPieceV3Invalid(t *testing.T) {
	good := pieceV3{FirstSeq: 9, TrajID: 3, PrevSeq: -1, Env: 1, Stride: 2, Rows: 3, Flags: uint8(flagDone)}
	enc := func(p pieceV3) []byte {
		b := make([]byte, runLogRecordSize)
		p.encode(b)
		return b
	}
	with := func(p pieceV3, f func(*pieceV3)) []byte { f(&p); return enc(p) }
	for _, tc := range []struct {
		name     string
		b        []byte
		reserved int64
		why      string
	}{
		{"a flipped bit", func() []byte { b := enc(good); b[9] ^= 4; return b }(), -1, "checksum"},
		{"a reserved byte", func() []byte {
			b := enc(good)
			b[rlFlags+3] = 1
			binary.LittleEndian.PutUint32(b[rlCRC:], crc32c(b[:rlCRC]))
			return b
		}(), -1, "reserved"},
		{"no rows", with(good, func(p *pieceV3) { p.Rows = 0 }), -1, "rows"},
		{"rows without a stride", with(good, func(p *pieceV3) { p.Stride = 0 }), -1, "rows 0 seqs apart"},
		{"one row with a stride", with(good, func(p *pieceV3) { p.Rows = 1 }), -1, "rows 2 seqs apart"},
		{"a span past 65,535 seqs", with(good, func(p *pieceV3) { p.Stride = 40000 }), -1, "span more"},
		{"a prev after the first seq", with(good, func(p *pieceV3) { p.PrevSeq = 9 }), -1, "prev_seq"},
		{"a negative step", with(good, func(p *pieceV3) { p.FirstStep = -1 }), -1, "negative"},
		{"an unknown flag", with(good, func(p *pieceV3) { p.Flags = 1 << 5 }), -1, "unknown flags"},
		{"a last seq at the reservation", enc(good), 13, "seq reservation"},
		{"seqs that overflow", with(good, func(p *pieceV3) { p.FirstSeq = math.MaxInt64 - 3 }), -1, "overflow"},
		{"a last seq at 2^62", with(good, func(p *pieceV3) { p.FirstSeq = maxSeqV3 - 4 }), -1, "past seq 2^62"},
		{"a hole past 2^62", enc(holeRecord(maxSeqV3-1, maxSeqV3+1)), -1, "past seq 2^62"},
		{"an empty hole", enc(holeRecord(64, 64)), -1, "a hole [64, 64)"},
		{"a hole with a step", with(holeRecord(64, 128), func(p *pieceV3) { p.FirstStep = 1 }), -1, "fields of a piece"},
		{"a hole with a row flag", with(holeRecord(64, 128), func(p *pieceV3) { p.Flags |= uint8(flagDone) }), -1, "fields of a piece"},
		{"a hole past the reservation", enc(holeRecord(64, 128)), 127, "past the seq reservation"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, why := decodePieceV3(tc.b, tc.reserved); !strings.Contains(why, tc.why) {
				t.Errorf("decoded with %q, want a reason with %q", why, tc.why)
			}
		})
	}
	for _, tc := range []struct {
		p        pieceV3
		reserved int64
	}{{good, 14}, {holeRecord(64, 128), 128}} {
		if _, why := decodePieceV3(enc(tc.p), tc.reserved); why != "" {
			t.Errorf("%+v below the reservation %d: %q", tc.p, tc.reserved, why)
		}
	}
}

// FuzzDecodePieceV3 feeds decodePieceV3 any 64 bytes (longer inputs cut
// to 64 and sealed, as in FuzzDecodeBlockCopy): it never panics, a
// record it accepts encodes back to the same bytes, and an accepted
// piece holds each of its rows.
func FuzzDecodePieceV3(f *testing.F) {
	for _, p := range []pieceV3{
		{FirstSeq: 9, TrajID: 3, PrevSeq: -1, Env: 1, Stride: 8, Rows: 4, Flags: uint8(flagDone)},
		{FirstSeq: 100, TrajID: 1, PrevSeq: 99, Rows: 1},
		holeRecord(64, 128),
	} {
		b := make([]byte, runLogRecordSize)
		p.encode(b)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < runLogRecordSize {
			return
		}
		if len(b) > runLogRecordSize { // sealed, as in FuzzDecodeBlockCopy
			b = append([]byte(nil), b[:runLogRecordSize]...)
			binary.LittleEndian.PutUint32(b[rlCRC:], crc32c(b[:rlCRC]))
		}
		p, why := decodePieceV3(b, -1)
		if why != "" {
			return
		}
		again := make([]byte, runLogRecordSize)
		p.encode(again)
		if string(again) != string(b[:runLogRecordSize]) {
			t.Fatalf("accepted %x, which encodes back as %x", b[:runLogRecordSize], again)
		}
		for k := 0; !p.Hole() && k < int(p.Rows); k++ {
			seq, _, _, _ := p.row(k)
			if got, ok := p.rowOf(seq); !ok || got != k {
				t.Fatalf("%+v: row %d's seq %d found as row %d (%v)", p, k, seq, got, ok)
			}
		}
	})
}

// TestTailEntryV3 writes a version 3 dense tail entry and reads it back
// for its own row and for rows it must not pass for: another trajectory
// or step under the same seq, a changed byte, a reserved byte set.
func TestTailEntryV3(t *testing.T) {
	const rb = 16
	entry := make([]byte, rb+tailTrailerSizeV3)
	if seq, ok := tailEntryV3(entry, rb, 3, 7); seq != -1 || ok {
		t.Fatalf("an entry never written reads as seq %d (%v)", seq, ok)
	}
	for i := range rb {
		entry[i] = byte(i * 7)
	}
	putTailTrailerV3(entry, rb, 11, 3, 7)
	if seq, ok := tailEntryV3(entry, rb, 3, 7); seq != 11 || !ok {
		t.Fatalf("read back as seq %d (%v)", seq, ok)
	}
	for _, tc := range []struct {
		name       string
		change     func([]byte)
		traj, step int64
	}{
		{"another trajectory", func([]byte) {}, 4, 7},
		{"another step", func([]byte) {}, 3, 8},
		{"a changed observation byte", func(e []byte) { e[5] ^= 1 }, 3, 7},
		{"a changed seq", func(e []byte) { e[rb] ^= 2 }, 3, 7},
		{"a reserved byte", func(e []byte) { e[rb+13] = 1 }, 3, 7},
	} {
		e := append([]byte(nil), entry...)
		tc.change(e)
		if _, ok := tailEntryV3(e, rb, tc.traj, tc.step); ok {
			t.Errorf("%s: the entry passes", tc.name)
		}
	}
}

// FuzzTailEntryV3 reads trailers of any bytes: never a panic, and an entry
// that passes for a row is the one putTailTrailerV3 writes for it.
func FuzzTailEntryV3(f *testing.F) {
	e := make([]byte, 8+tailTrailerSizeV3)
	putTailTrailerV3(e, 8, 11, 3, 7)
	f.Add(e, int64(3), int64(7))
	f.Fuzz(func(t *testing.T, b []byte, traj, step int64) {
		if len(b) < 8+tailTrailerSizeV3 {
			return
		}
		b = b[:8+tailTrailerSizeV3]
		seq, ok := tailEntryV3(b, 8, traj, step)
		if !ok {
			return
		}
		again := append([]byte(nil), b...)
		putTailTrailerV3(again, 8, seq, traj, step)
		if string(again) != string(b) {
			t.Fatalf("passed %x, which is written as %x", b, again)
		}
	})
}
