package storage

import (
	"encoding/binary"
	"hash/crc32"
	"maps"
	"reflect"
	"slices"
	"testing"
)

// Fuzz targets for every decoder of bytes that come from disk (style rule
// 11). The seeds run in CI; a nightly job runs, for example:
//
//	go test ./storage -run '^$' -fuzz FuzzOpenDamaged -fuzztime 60s

const fzBuf = "f"

// fzBuild writes the small store FuzzOpenDamaged damages: a compact memmap
// buffer of capacity 16 with priorities that has wrapped, two envs,
// trajectories ended by termination and truncation (with final
// observations) and one left open.
func fzBuild(t testing.TB, s *Store) { fzBuildLayout(t, s, RowMetaPerRow) }

// fzBuildRuns is fzBuild with rows.meta format version 2 and a run log.
func fzBuildRuns(t testing.TB, s *Store) { fzBuildLayout(t, s, RowMetaRuns) }

func fzBuildLayout(t testing.TB, s *Store, layout RowMetaLayout) {
	spec := testSpec(KindMemmap, 16, true)
	spec.RowMetaLayout = layout
	spec.Priority = &PriorityOptions{Alpha: 0.6, Eps: 1e-6}
	b := mustCreate(t, s, fzBuf, spec)
	rows := make([]row, 24)
	for i := range rows {
		rows[i] = row{env: int64(i % 2), val: float32(i), terminated: i%5 == 4, truncated: i%9 == 8, final: float32(500 + i)}
	}
	mustExtend(t, b, "a", makeBatch(spec, rows[:10], true))
	mustExtend(t, b, "a", makeBatch(spec, rows[10:], true))
	if _, _, err := b.UpdatePriorities([]int64{9, 12, 20}, []float64{0.25, 3, 0}); err != nil {
		t.Fatal(err)
	}
}

// FuzzOpenDamaged damages one file of a cleanly closed data dir (XOR of one
// byte, or truncation) and opens it. Open and Verify must not panic or
// hang; if Open succeeds, every live row it serves must be the row written
// under that seq, byte for byte: damage may cost rows, never serve wrong
// ones.
func FuzzOpenDamaged(f *testing.F) {
	p := pristine(f, "fuzz", fzBuild)
	files := slices.Sorted(maps.Keys(p.files))
	index := func(rel string) uint8 { return fuzzFileIndex(f, files, rel) }
	meta := index("buffers/f/rows.meta")
	obs := index("buffers/f/f.observation.col")
	tail := index("buffers/f/tail.observation.col")
	prio := index("buffers/f/priority.col")
	cat := index("catalog.db")
	for _, s := range []fuzzDamage{
		{meta, 0, 0, false},                                 // pristine
		{meta, 8, 0x02, false},                              // version
		{meta, watermarkOff, 0x01, false},                   // watermark
		{meta, headerSize + 5*recordSize + 9, 0x10, false},  // a record's traj_id
		{meta, headerSize + 16*recordSize - 1, 0, true},     // short by a byte
		{obs, headerSize + 3*16, 0x80, false},               // a row's first byte
		{obs, colHeaderCRCOff, 0x01, false},                 // header checksum
		{obs, headerSize, 0, true},                          // header only
		{tail, headerSize + 2*24 + 1, 0x01, false},          // a dense tail entry's observation (entry 2)
		{tail, headerSize + 2*24 + 16, 0x01, false},         // its trailer: names another seq
		{tail, headerSize + 3*24 + 23, 0x80, false},         // entry 3's trailer: a seq far away
		{tail, 8, 0x03, false},                              // tail format version 2 -> 1 (header checksum fails)
		{meta, headerSize + 15*recordSize + 7, 0x80, false}, // sign bit of seq 23's record: reads as a writing marker
		{prio, headerSize + 5*8 + 7, 0x40, false},           // seq 21's priority 1.0 becomes +Inf
		{cat, 0, 0, true},                                   // empty catalog
		{cat, 4096 + 17, 0xff, false},                       // second meta page
	} {
		f.Add(s.file, s.off, s.val, s.trunc)
	}
	f.Fuzz(func(t *testing.T, file uint8, off uint32, val byte, trunc bool) {
		openDamaged(t, p, files, file, off, val, trunc)
	})
}

// FuzzOpenDamagedRuns is FuzzOpenDamaged on rows.meta format version 2 and
// its run log.
func FuzzOpenDamagedRuns(f *testing.F) {
	p := pristine(f, "fuzz-runs", fzBuildRuns)
	files := slices.Sorted(maps.Keys(p.files))
	index := func(rel string) uint8 { return fuzzFileIndex(f, files, rel) }
	meta := index("buffers/f/rows.meta")
	runs := index("buffers/f/" + runSegName(1))
	rec := func(slot, at uint32) uint32 { return headerSize + slot*fileRunRecordSize + at }
	for _, s := range []fuzzDamage{
		{meta, 0, 0, false},                                            // pristine
		{meta, 8, 0x03, false},                                         // version 2 -> 1
		{meta, rec(5, frWord), 0x01, false},                            // a seq
		{meta, rec(5, frWord+5), 0x80, false},                          // a writing bit
		{meta, rec(7, frWord+5), 0x40, false},                          // seq bit 46: the same slot 2^46 rows on
		{meta, rec(9, frWord+6), 0x01, false},                          // a run delta
		{meta, rec(9, frOff), 0x01, false},                             // an offset
		{meta, rec(9, frDist), 0x01, false},                            // a distance back
		{meta, headerSize + 16*fileRunRecordSize - 1, 0, true},         // short by a byte
		{runs, 1, 0x01, false},                                         // segment magic
		{runs, segHeaderSize + rlTraj, 0x01, false},                    // the first run record's traj_id
		{runs, segHeaderSize + rlRows, 0x01, false},                    // its row count
		{runs, segHeaderSize + runLogRecordSize + rlSpan, 0x02, false}, // the second's span
		{runs, segHeaderSize + 40, 0, true},                            // cut in the first record
	} {
		f.Add(s.file, s.off, s.val, s.trunc)
	}
	f.Fuzz(func(t *testing.T, file uint8, off uint32, val byte, trunc bool) {
		openDamaged(t, p, files, file, off, val, trunc)
	})
}

// fzBuildBlocks is fzBuild with rows.meta format version 3.
func fzBuildBlocks(t testing.TB, s *Store) { fzBuildLayout(t, s, RowMetaBlocks) }

// FuzzOpenDamagedBlocks is FuzzOpenDamaged on rows.meta format version 3:
// block record copies, the watermark record with its tip, pieces with a
// stride, and tail entries with checksums.
func FuzzOpenDamagedBlocks(f *testing.F) {
	p := pristine(f, "fuzz-blocks", fzBuildBlocks)
	files := slices.Sorted(maps.Keys(p.files))
	index := func(rel string) uint8 { return fuzzFileIndex(f, files, rel) }
	meta := index("buffers/f/rows.meta")
	runs := index("buffers/f/" + runSegName(1))
	obs := index("buffers/f/f.observation.col")
	tail := index("buffers/f/tail.observation.col")
	copyB := uint32(blockCopyOffset(spareSlots(16), 0, 1))
	for _, s := range []fuzzDamage{
		{meta, 0, 0, false},                          // pristine
		{meta, mhSlots, 0x01, false},                 // slots (header checksum fails)
		{meta, wrSeq, 0x01, false},                   // the watermark
		{meta, wrTipCRC, 0x01, false},                // the tip's checksum
		{meta, headerSize + bcRows, 0x01, false},     // copy A's h
		{meta, headerSize + bcCRCh, 0x01, false},     // copy A's crc_h
		{meta, copyB + bcGen, 0x01, false},           // copy B's gen
		{meta, copyB + bcBase, 0x40, false},          // copy B's base
		{meta, headerSize + 100, 0, true},            // cut in the copies
		{runs, segHeaderSize + rlSpan, 0x01, false},  // the first piece's stride
		{runs, segHeaderSize + rlFlags, 0x80, false}, // a piece read as a hole record
		{runs, segHeaderSize + runLogRecordSize + rlFirstSeq, 0x01, false},
		{obs, headerSize + 3*16, 0x80, false}, // a row's first byte
		{tail, headerSize + 2*32 + 1, 0x01, false},
		{tail, headerSize + 2*32 + 16 + 8, 0x01, false}, // an entry's checksum
	} {
		f.Add(s.file, s.off, s.val, s.trunc)
	}
	f.Fuzz(func(t *testing.T, file uint8, off uint32, val byte, trunc bool) {
		openDamaged(t, p, files, file, off, val, trunc)
	})
}

// fuzzDamage is a seed of the damage fuzzers: XOR val into byte off of
// file number file, or with trunc cut the file there.
type fuzzDamage struct {
	file  uint8
	off   uint32
	val   byte
	trunc bool
}

// fuzzFileIndex is the index of rel among a fixture's files (the fuzzers
// pick a file by index).
func fuzzFileIndex(f *testing.F, files []string, rel string) uint8 {
	i := slices.Index(files, rel)
	if i < 0 {
		f.Fatalf("fixture has no %s (files %q)", rel, files)
	}
	return uint8(i)
}

// openDamaged damages one file of p (XOR of one byte, or truncation), then
// verifies and opens it: no panic, no hang, and every row served is the row
// written under its seq.
func openDamaged(t *testing.T, p *pristineStore, files []string, file uint8, off uint32, val byte, trunc bool) {
	rel := files[int(file)%len(files)]
	damaged := maps.Clone(p.files)
	b := slices.Clone(damaged[rel])
	switch {
	case trunc:
		b = b[:int(off)%(len(b)+1)]
	case len(b) > 0:
		b[int(off)%len(b)] ^= val
	}
	damaged[rel] = b
	dir := t.TempDir()
	writeTree(t, dir, damaged)

	if _, err := Verify(dir, nil); err != nil {
		t.Logf("verify: %v", err)
	}
	s, err := Open(dir, nil)
	if err != nil {
		return // refusing is fine
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	for _, buf := range s.Buffers() {
		checkServed(t, buf, p.rows[buf.Name()])
	}
}

// FuzzDecodeRunPiece feeds raw 64-byte run records to decodeRunPiece: it
// must not panic, and a record it accepts must encode back to the same
// bytes. With fix set, the checksum is made valid first.
func FuzzDecodeRunPiece(f *testing.F) {
	valid := make([]byte, runLogRecordSize)
	(&runPiece{FirstSeq: 90, TrajID: 4, FirstStep: 7, PrevSeq: 80, Env: 2, PolicyVersion: 3, Span: 21, Rows: 8, Flags: uint8(flagDone | flagTruncated | flagHasTail)}).encode(valid)
	f.Add(valid, false)
	f.Add(make([]byte, runLogRecordSize), true)
	f.Add([]byte{0xff, 1, 2}, true)
	f.Fuzz(func(t *testing.T, in []byte, fix bool) {
		b := make([]byte, runLogRecordSize)
		copy(b, in)
		if fix {
			binary.LittleEndian.PutUint32(b[rlCRC:], crc32.Checksum(b[:rlCRC], castagnoli))
		}
		p, why := decodeRunPiece(b)
		if why != "" {
			return
		}
		if p.Rows == 0 || int(p.Rows) > int(p.Span)+1 || p.PrevSeq >= p.FirstSeq || p.PrevSeq < -1 {
			t.Fatalf("accepted an impossible piece %+v", p)
		}
		again := make([]byte, runLogRecordSize)
		p.encode(again)
		if !slices.Equal(again, b) {
			t.Fatalf("re-encoded run record differs:\n% x\n% x", b, again)
		}
	})
}

// FuzzDecodeRecord feeds raw 64-byte records to decodeRecord: it must not
// panic, and a record it accepts must encode back to the same bytes (apart
// from the reserved bytes, which readers ignore). With fix set, the record
// checksum is made valid first, so the fuzzer gets past it.
func FuzzDecodeRecord(f *testing.F) {
	valid := make([]byte, recordSize)
	encodeRecord(valid, &record{Seq: 9, TrajID: 3, Step: 2, PrevSeq: 5, Env: 1, Flags: flagDone | flagTerminated | flagHasTail, DataCRC: 0xdeadbeef})
	f.Add(valid, false)
	marked := slices.Clone(valid)
	binary.LittleEndian.PutUint64(marked, uint64(writingMarker(9)))
	f.Add(marked, false)
	f.Add(make([]byte, recordSize), true)
	f.Add([]byte{0xff}, true)
	f.Fuzz(func(t *testing.T, in []byte, fix bool) {
		b := make([]byte, recordSize)
		copy(b, in)
		if fix {
			binary.LittleEndian.PutUint32(b[recCRC:], crc32.Checksum(b[:recCRC], castagnoli))
		}
		r, ok := decodeRecord(b, new([recordSize]byte))
		if m := markedSeq(r.Seq); m >= 0 && writingMarker(m) != r.Seq {
			t.Fatalf("marker %d names seq %d, whose marker is %d", r.Seq, m, writingMarker(m))
		}
		if !ok {
			if fix && r.Seq >= 0 {
				t.Fatalf("record with a valid checksum and seq %d rejected", r.Seq)
			}
			return
		}
		if markedSeq(r.Seq) >= 0 {
			t.Fatalf("accepted record %+v has a writing marker for seq", r)
		}
		again := make([]byte, recordSize)
		encodeRecord(again, &r)
		r2, ok := decodeRecord(again, new([recordSize]byte))
		if !ok || r2 != r {
			t.Fatalf("re-encoded record decodes to %+v (ok %v), want %+v", r2, ok, r)
		}
		for i := range recordSize {
			if (i < 44 || i >= recDataCRC) && i < recCRC && again[i] != b[i] {
				t.Fatalf("re-encoded record differs at byte %d:\n% x\n% x", i, b, again)
			}
		}
	})
}

// FuzzDecodeHeaders feeds raw bytes to decodeColHeader and
// decodeMetaHeader. They must not panic, and a header they accept must
// decode the same after encoding. With fix set, magic, version and
// checksum are made valid first, so the fuzzer reaches the field checks.
func FuzzDecodeHeaders(f *testing.F) {
	col := colHeader{Version: FormatVersion, Role: roleField, UID: 7, Capacity: 16, RowBytes: 16, DType: Float32, Shape: []int{4}, Name: "observation"}.encode()
	meta := metaHeader{Version: FormatVersion, RecordSize: recordSize, UID: 7, Capacity: 16, Name: "f"}.encode()
	f.Add(col, false)
	f.Add(meta, false)
	f.Add(col[:128], true)
	f.Add(meta[:64], true)
	f.Add([]byte{}, false)
	f.Fuzz(func(t *testing.T, in []byte, fix bool) {
		for _, kind := range []string{"col", "meta"} {
			b := make([]byte, max(len(in), headerSize))
			copy(b, in)
			if !fix {
				b = in
			}
			magic, crcOff := colMagic, colHeaderCRCOff
			if kind == "meta" {
				magic, crcOff = metaMagic, metaHeaderCRCOff
			}
			if fix {
				copy(b, magic[:])
				binary.LittleEndian.PutUint32(b[8:], FormatVersion)
				binary.LittleEndian.PutUint32(b[crcOff:], crc32.Checksum(b[:crcOff], castagnoli))
			}
			if kind == "col" {
				h, err := decodeColHeader("x", b)
				if err != nil {
					continue
				}
				enc := h.encode()
				h2, err := decodeColHeader("x", enc)
				if err != nil || !reflect.DeepEqual(h, h2) {
					t.Fatalf("column header %+v re-decodes to %+v, %v", h, h2, err)
				}
				// The bytes that carry meaning are written back as read.
				sameBytes(t, b, enc, 0, 44+4*len(h.Shape))
				sameBytes(t, b, enc, 76, 76+len(h.Name))
				continue
			}
			h, err := decodeMetaHeader("x", b)
			if err != nil {
				continue
			}
			enc := h.encode()
			h2, err := decodeMetaHeader("x", enc)
			if err != nil || !reflect.DeepEqual(h, h2) {
				t.Fatalf("meta header %+v re-decodes to %+v, %v", h, h2, err)
			}
			sameBytes(t, b, enc, 0, 34+len(h.Name))
		}
	})
}

func sameBytes(t *testing.T, in, enc []byte, from, to int) {
	t.Helper()
	if !slices.Equal(in[from:to], enc[from:to]) {
		t.Fatalf("re-encoded header differs in [%d, %d):\n% x\n% x", from, to, in[from:to], enc[from:to])
	}
}
