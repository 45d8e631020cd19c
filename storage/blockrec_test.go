package storage

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"strings"
	"testing"
)

func crc32c(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// TestBlockCopyRoundTrip encodes copies at the ends of every field's range
// and decodes them back, for blocks at both ends of rings of several
// sizes.
func TestBlockCopyRoundTrip(t *testing.T) {
	for _, slots := range []int64{2 * blockRows, spareSlots(1000), spareSlots(1 << 40)} {
		for _, k := range []int64{0, slots/blockRows - 1} {
			for _, c := range []blockCopy{
				{Base: k * blockRows},
				{Base: 3*slots + k*blockRows, Gen: 1, Rows: 1, CRC: 0xdeadbeef},
				{Base: (math.MaxInt64/slots-1)*slots + k*blockRows, Gen: math.MaxUint32, Rows: blockRows, Final: true, CRC: math.MaxUint32},
			} {
				buf := make([]byte, blockCopySize)
				c.encode(buf)
				got, why := decodeBlockCopy(buf, k, slots, -1)
				if why != "" || got != c {
					t.Errorf("slots %d block %d: %+v decoded as %+v (%s)", slots, k, c, got, why)
				}
			}
		}
	}
}

// TestBlockCopyInvalid holds decodeBlockCopy to every rule of a valid
// copy: each case breaks one.
func TestBlockCopyInvalid(t *testing.T) {
	const slots, k = 1024 + blockRows, 3
	good := blockCopy{Base: 2*slots + k*blockRows, Gen: 7, Rows: 40, CRC: 0x12345678}
	enc := func(c blockCopy) []byte {
		b := make([]byte, blockCopySize)
		c.encode(b)
		return b
	}
	reseal := func(b []byte) []byte {
		binary.LittleEndian.PutUint32(b[bcCRC:], crc32c(b[:bcCRC]))
		return b
	}
	for _, tc := range []struct {
		name     string
		b        []byte
		reserved int64
		why      string
	}{
		{"a flipped bit", func() []byte { b := enc(good); b[5] ^= 1; return b }(), -1, "checksum"},
		{"a torn checksum", func() []byte { b := enc(good); b[bcCRC] ^= 0x80; return b }(), -1, "checksum"},
		{"zeros", make([]byte, blockCopySize), -1, "never written"},
		{"reserved byte 14", func() []byte { b := enc(good); b[14] = 1; return reseal(b) }(), -1, "reserved"},
		{"reserved byte 27", func() []byte { b := enc(good); b[27] = 1; return reseal(b) }(), -1, "reserved"},
		{"rows past the block", func() []byte { b := enc(good); b[bcRows] = blockRows + 1; return reseal(b) }(), -1, "rows in a block"},
		{"final 2", func() []byte { b := enc(good); b[bcFinal] = 2; return reseal(b) }(), -1, "final byte"},
		{"another block's base", enc(blockCopy{Base: 2*slots + (k+1)*blockRows}), -1, "not a seq of block"},
		{"a base off the block's first slot", enc(blockCopy{Base: good.Base + 1}), -1, "not a seq of block"},
		{"a negative base", enc(blockCopy{Base: -slots + k*blockRows}), -1, "not a seq of block"},
		{"a base at the reservation", enc(good), good.Base, "seq reservation"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, why := decodeBlockCopy(tc.b, k, slots, tc.reserved); !strings.Contains(why, tc.why) {
				t.Errorf("decoded with %q, want a reason with %q", why, tc.why)
			}
		})
	}
	if _, why := decodeBlockCopy(enc(good), k, slots, good.Base+1); why != "" {
		t.Errorf("a base below the reservation: %q", why)
	}
}

// TestBlockCopyChoice checks which copy is newer across the gens' wrap
// and which copy a record write replaces: never the only one that
// verifies.
func TestBlockCopyChoice(t *testing.T) {
	for _, tc := range []struct{ a, b uint32 }{{2, 1}, {0, math.MaxUint32}, {1<<31 - 1, 0}, {5, 1<<31 + 6}} {
		if !(blockCopy{Gen: tc.a}).newer(blockCopy{Gen: tc.b}) || (blockCopy{Gen: tc.b}).newer(blockCopy{Gen: tc.a}) {
			t.Errorf("gen %d should be newer than gen %d, and not the other way", tc.a, tc.b)
		}
	}
	old, young := blockCopy{Gen: math.MaxUint32}, blockCopy{Gen: 0}
	for _, tc := range []struct {
		copies          [2]blockCopy
		valid, verifies [2]bool
		replace         int
		gen             uint32
	}{
		{[2]blockCopy{old, young}, [2]bool{true, true}, [2]bool{true, true}, 0, 1}, // the older (A) goes
		{[2]blockCopy{young, old}, [2]bool{true, true}, [2]bool{true, true}, 1, 1}, // the older (B) goes
		// A does not verify: it goes, and its gen follows B's.
		{[2]blockCopy{young, old}, [2]bool{true, true}, [2]bool{false, true}, 0, 0},
		// B does not verify (rows a crash tore): it goes, however new,
		// and its gen still follows A's: A, valid, would otherwise
		// compare as the newer.
		{[2]blockCopy{old, young}, [2]bool{true, true}, [2]bool{true, false}, 1, 0},
		{[2]blockCopy{old, young}, [2]bool{true, false}, [2]bool{true, false}, 1, 0},
		// A is not even valid: it goes, and its gen follows B's.
		{[2]blockCopy{old, young}, [2]bool{false, true}, [2]bool{false, true}, 0, 1},
		{[2]blockCopy{old, young}, [2]bool{false, false}, [2]bool{false, false}, 0, 1}, // neither: gen starts again
	} {
		i := copyToReplace(tc.copies, tc.verifies)
		if i != tc.replace {
			t.Errorf("copies %+v verifying %v: replace %d, want %d", tc.copies, tc.verifies, i, tc.replace)
			continue
		}
		g := nextGen(tc.copies, tc.valid, i)
		if g != tc.gen {
			t.Errorf("copies %+v valid %v: gen %d, want %d", tc.copies, tc.valid, g, tc.gen)
		}
		if o := 1 - i; tc.valid[o] && !(blockCopy{Gen: g}).newer(tc.copies[o]) {
			t.Errorf("copies %+v: the new copy (gen %d) is not newer than the valid one it joins", tc.copies, g)
		}
	}
}

// TestBlockCopyLayout checks the rows.meta layout of version 3 for rings
// of every size class: the two copies of a block are never in one page,
// copies never overlap, and the file holds them all.
func TestBlockCopyLayout(t *testing.T) {
	for _, capacity := range []int64{1, 63, 64, 65, 320, 1000, 8100, 8192, 100_000, 1 << 30} {
		slots := spareSlots(capacity)
		if slots%blockRows != 0 || slots < capacity+blockRows || slots >= capacity+2*blockRows {
			t.Fatalf("capacity %d: %d slots", capacity, slots)
		}
		blocks := slots / blockRows
		size := metaV3Size(slots)
		for _, k := range []int64{0, 1, blocks / 2, blocks - 1} {
			a, b := blockCopyOffset(slots, k, 0), blockCopyOffset(slots, k, 1)
			if a/pageBytes == b/pageBytes {
				t.Errorf("capacity %d block %d: both copies in page %d", capacity, k, a/pageBytes)
			}
			if a < headerSize || b+blockCopySize > size || a+blockCopySize > blockCopyOffset(slots, 0, 1) {
				t.Errorf("capacity %d block %d: copies at %d and %d in a file of %d", capacity, k, a, b, size)
			}
		}
		if size%pageBytes != 0 {
			t.Errorf("capacity %d: rows.meta of %d bytes", capacity, size)
		}
	}
}

// TestWatermarkRecord round-trips watermark records with and without a
// tip and refuses the ones that do not describe their watermark.
func TestWatermarkRecord(t *testing.T) {
	hdr := metaHeader{Version: 3, UID: 1, Capacity: 1000, Name: "b"}.encode()
	for _, w := range []watermarkRecord{tipOf(0, 0), tipOf(640, 99), tipOf(641, 0xabcdef01), tipOf(math.MaxInt64-1, 7)} {
		w.encode(hdr)
		got, why := decodeWatermarkRecord(hdr)
		if why != "" || got != w {
			t.Errorf("%+v decoded as %+v (%s)", w, got, why)
		}
	}
	if w := tipOf(700, 5); w.TipBase != 640 || w.TipRows != 60 || w.TipCRC != 5 {
		t.Errorf("tip of 700: %+v", w)
	}
	if w := tipOf(704, 5); w.TipBase != -1 || w.TipRows != 0 || w.TipCRC != 0 {
		t.Errorf("tip of a block boundary: %+v", w)
	}
	for _, tc := range []struct {
		name string
		w    watermarkRecord
		why  string
	}{
		{"a tip at a boundary", watermarkRecord{Seq: 704, TipBase: 640, TipRows: 64, TipCRC: 1}, "block boundary"},
		{"no tip inside a block", watermarkRecord{Seq: 700, TipBase: -1}, "tip base"},
		{"another block's base", watermarkRecord{Seq: 700, TipBase: 576, TipRows: 60}, "tip base"},
		{"rows not W - base", watermarkRecord{Seq: 700, TipBase: 640, TipRows: 59}, "tip base"},
		{"a negative watermark", watermarkRecord{Seq: -64, TipBase: -1}, "watermark -64"},
	} {
		tc.w.encode(hdr)
		if _, why := decodeWatermarkRecord(hdr); !strings.Contains(why, tc.why) {
			t.Errorf("%s: decoded with %q, want a reason with %q", tc.name, why, tc.why)
		}
	}
	tipOf(641, 1).encode(hdr)
	hdr[wrTipRows+2] = 1
	binary.LittleEndian.PutUint32(hdr[wrCRC:], crc32c(hdr[watermarkOff:wrCRC]))
	if _, why := decodeWatermarkRecord(hdr); !strings.Contains(why, "reserved") {
		t.Errorf("a reserved byte set: %q", why)
	}
	hdr[wrSeq] ^= 1
	if _, why := decodeWatermarkRecord(hdr); !strings.Contains(why, "checksum") {
		t.Errorf("a torn watermark: %q", why)
	}
}

// FuzzDecodeBlockCopy feeds decodeBlockCopy any 32 bytes (longer inputs
// cut to 32 and given a checksum that holds): it never panics, and a copy
// it accepts encodes back to the same bytes.
func FuzzDecodeBlockCopy(f *testing.F) {
	const slots = 1024 + blockRows
	for _, c := range []blockCopy{{Base: 0}, {Base: slots + 5*blockRows, Gen: 9, Rows: 3, CRC: 1}, {Base: 7*slots + 16*blockRows, Rows: blockRows, Final: true}} {
		b := make([]byte, blockCopySize)
		c.encode(b)
		f.Add(b, int64(c.Base%slots/blockRows))
	}
	f.Fuzz(func(t *testing.T, b []byte, k int64) {
		if len(b) < blockCopySize || k < 0 || k >= slots/blockRows {
			return
		}
		// Sealed: most mutations only break the checksum, so the rules
		// behind it see the bytes with a checksum that holds too.
		if len(b) > blockCopySize {
			b = append([]byte(nil), b[:blockCopySize]...) // inputs are not ours to change
			binary.LittleEndian.PutUint32(b[bcCRC:], crc32c(b[:bcCRC]))
		}
		c, why := decodeBlockCopy(b, k, slots, -1)
		if why != "" {
			return
		}
		again := make([]byte, blockCopySize)
		c.encode(again)
		if string(again) != string(b[:blockCopySize]) {
			t.Fatalf("accepted %x, which encodes back as %x", b[:blockCopySize], again)
		}
	})
}

// FuzzDecodeWatermarkRecord does the same for watermark records.
func FuzzDecodeWatermarkRecord(f *testing.F) {
	for _, w := range []watermarkRecord{tipOf(0, 0), tipOf(641, 0xabcdef01)} {
		hdr := make([]byte, headerSize)
		w.encode(hdr)
		f.Add(hdr[watermarkOff : watermarkOff+wrSize])
	}
	f.Fuzz(func(t *testing.T, rec []byte) {
		if len(rec) < wrSize {
			return
		}
		if len(rec) > wrSize { // sealed, as in FuzzDecodeBlockCopy
			rec = append([]byte(nil), rec[:wrSize]...)
			binary.LittleEndian.PutUint32(rec[wrCRC-watermarkOff:], crc32c(rec[:wrCRC-watermarkOff]))
		}
		hdr := make([]byte, headerSize)
		copy(hdr[watermarkOff:], rec[:wrSize])
		w, why := decodeWatermarkRecord(hdr)
		if why != "" {
			return
		}
		again := make([]byte, headerSize)
		w.encode(again)
		if string(again[watermarkOff:watermarkOff+wrSize]) != string(rec[:wrSize]) {
			t.Fatalf("accepted %x, which encodes back as %x", rec[:wrSize], again[watermarkOff:watermarkOff+wrSize])
		}
	})
}

// TestGoldenV3FormatEncoding pins the bytes of format version 3's records
// (not written by any build yet: docs/proposals/format-v3.md) in
// testdata/v3/encoding.golden (-update-format refreshes it; review the
// diff): a block record's copy, the watermark record with and without a
// tip, a piece with a stride, a hole record and a dense tail entry.
func TestGoldenV3FormatEncoding(t *testing.T) {
	const slots = 1024 + blockRows // a ring of 1,000 rows
	copyA := make([]byte, blockCopySize)
	blockCopy{Base: 3*slots + 5*blockRows, Gen: 7, Rows: 40, CRC: 0xdeadbeef}.encode(copyA)
	final := make([]byte, blockCopySize)
	blockCopy{Base: 3*slots + 4*blockRows, Gen: 8, Rows: blockRows, Final: true, CRC: 0xfeedface}.encode(final)
	tip := make([]byte, headerSize)
	tipOf(3*slots+5*blockRows+40, 0xdeadbeef).encode(tip)
	boundary := make([]byte, headerSize)
	tipOf(3*slots+5*blockRows, 0).encode(boundary)
	piece := pieceV3{FirstSeq: 9, TrajID: 3, FirstStep: 0, PrevSeq: -1, Env: 1, PolicyVersion: 0x0102030405, Stride: 8, Rows: 4, Flags: uint8(flagDone | flagTruncated | flagHasTail)}
	pieceBytes := make([]byte, runLogRecordSize)
	piece.encode(pieceBytes)
	hole := holeRecord(3*slots+5*blockRows+40, 3*slots+6*blockRows)
	holeBytes := make([]byte, runLogRecordSize)
	hole.encode(holeBytes)

	var sb strings.Builder
	section := func(title string, b []byte) {
		fmt.Fprintf(&sb, "# %s\n%s\n", title, hexdumpC(b))
	}
	section(fmt.Sprintf("block copy of block 5, pass 3 of a ring of %d slots: 40 rows, gen 7, crc_h 0xdeadbeef", slots), copyA)
	section("final block copy of block 4: 64 rows, gen 8, crc_h 0xfeedface", final)
	section("watermark record at block 5's row 40, tip crc 0xdeadbeef (bytes 256-287)", tip[watermarkOff:watermarkOff+wrSize])
	section("watermark record at a block boundary: no tip", boundary[watermarkOff:watermarkOff+wrSize])
	section(fmt.Sprintf("piece %+v", piece), pieceBytes)
	section(fmt.Sprintf("hole record [%d, %d)", hole.FirstSeq, hole.TrajID), holeBytes)
	// seq 11's final observation [1011, -1011], of trajectory 3 at step 2
	entry := make([]byte, 8+tailTrailerSizeV3)
	binary.LittleEndian.PutUint32(entry[0:], math.Float32bits(1011))
	binary.LittleEndian.PutUint32(entry[4:], math.Float32bits(-1011))
	putTailTrailerV3(entry, 8, 11, 3, 2)
	section("dense tail entry: seq 11's final observation [1011 -1011] (trajectory 3, step 2), seq + 1, crc, 4 zero bytes", entry)
	checkEncodingGolden(t, "testdata/v3/encoding.golden", sb.String())
}

// TestBlockChecksums fills a memmap buffer and checks the block checksum
// kernel against its columns: blockSums over the rows' bytes as a writer
// stages them gives, at every row, what verifiedPrefix recomputes from the
// mapped rows; the longest claim that holds wins; a changed byte in a row
// makes every claim past it fail.
func TestBlockChecksums(t *testing.T) {
	s := openStore(t, t.TempDir())
	defer s.Close()
	spec := testSpec(KindMemmap, 4*blockRows, true)
	b := mustCreate(t, s, "b", spec)
	var rows []row
	for i := range 3 * blockRows {
		rows = append(rows, row{env: int64(i % 4), val: float32(i), terminated: i%9 == 8})
	}
	mustExtend(t, b, "w", makeBatch(spec, rows, true))
	const k = 1 // block 1: seqs 64-127, slots 64-127
	var sums blockSums
	sums.start(k * blockRows)
	for j := range blockRows {
		var row []byte
		for _, c := range b.cols {
			if c.cz < 0 && !c.field.Mutable {
				row = append(row, c.row(k*blockRows+int64(j))...)
			}
		}
		sums.addRows(row, 1)
	}
	if sums.rows != blockRows {
		t.Fatalf("%d rows added", sums.rows)
	}
	for j := 0; j <= blockRows; j++ {
		if got := b.verifiedPrefix(k, []blockClaim{{j, sums.at[j]}}); got != j {
			t.Fatalf("a claim of %d rows with the writer's checksum verifies %d rows", j, got)
		}
	}
	claims := []blockClaim{{40, sums.at[40]}, {64, sums.at[64] ^ 1}, {20, sums.at[20]}}
	if got := b.verifiedPrefix(k, claims); got != 40 {
		t.Fatalf("claims %v: %d rows verified, want 40 (the 64-row claim is wrong)", claims, got)
	}
	// A byte of row 30 changes: claims past it fail, claims up to it hold.
	obs := b.cols[b.colOf["observation"]]
	obs.row(k*blockRows + 30)[3] ^= 0x40
	claims = []blockClaim{{64, sums.at[64]}, {31, sums.at[31]}, {30, sums.at[30]}}
	if got := b.verifiedPrefix(k, claims); got != 30 {
		t.Fatalf("row 30 changed: %d rows verified, want 30", got)
	}
	obs.row(k*blockRows + 30)[3] ^= 0x40
	if got := b.verifiedPrefix(k, claims); got != 64 {
		t.Fatalf("row 30 restored: %d rows verified, want 64", got)
	}
	if got := b.verifiedPrefix(k, nil); got != 0 {
		t.Fatalf("no claim verifies %d rows", got)
	}
}
