package storage

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"hash/crc32"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// testdata/v1/datadir is a data dir written by a format-version-1 build
// (testdata/gen_golden.go; never regenerate it). Every future build must
// still open it and read exactly the rows below, or refuse it deliberately
// with ErrVersionMismatch once v1 support is dropped: a release that
// silently misreads it, or calls it corrupt, breaks every user's data dir.
// A new format version adds testdata/v2 next to it; v1 stays.

var updateFormat = flag.Bool("update-format", false, "rewrite storage/testdata/v1/encoding.golden")

const (
	goldenDir = "testdata/v1/datadir"
	// goldenDirV2 holds the same buffer with rows.meta in format version
	// 2 and a run log (gen_golden.go -row-meta runs).
	goldenDirV2 = "testdata/v2/datadir"
	// goldenDirTails2 holds the same buffer with rows.meta in version 1
	// and a dense tail file (tail format version 2): gen_golden.go -o
	// storage/testdata/tails2/datadir, by the first build that had them.
	goldenDirTails2 = "testdata/tails2/datadir"
	// goldenDirV3 holds the same buffer with rows.meta in format version
	// 3 (gen_golden.go -row-meta blocks, 2026-11-29).
	goldenDirV3 = "testdata/v3/datadir"
)

// goldenRow is one live row of the golden buffer; its field values follow
// from seq (see gen_golden.go): observation [seq, -seq], action 100+seq,
// next.reward seq/4, final observation [1000+seq, -(1000+seq)].
type goldenRow struct {
	seq, traj, step, prev, next, env int64 // traj relative to the trajectory of seq 4
	term, trunc                      bool
}

// The rows of the golden buffer after 12 writes to a ring of 8.
var goldenRows = []goldenRow{
	{seq: 4, traj: 0, step: 2, prev: 2, next: -1, env: 0, term: true},
	{seq: 5, traj: 1, step: 2, prev: 3, next: 7, env: 1},
	{seq: 6, traj: 2, step: 0, prev: -1, next: 8, env: 0},
	{seq: 7, traj: 1, step: 3, prev: 5, next: -1, env: 1, trunc: true},
	{seq: 8, traj: 2, step: 1, prev: 6, next: 10, env: 0},
	{seq: 9, traj: 3, step: 0, prev: -1, next: 11, env: 1},
	{seq: 10, traj: 2, step: 2, prev: 8, next: -1, env: 0, term: true},
	{seq: 11, traj: 3, step: 1, prev: 9, next: -1, env: 1}, // open: stream "gen" continues it
}

// goldenCopy copies the golden data dir to a temp dir: Open writes.
func goldenCopy(t *testing.T) string { return goldenCopyOf(t, goldenDir) }

func goldenCopyOf(t *testing.T, src string) string {
	t.Helper()
	dir := t.TempDir()
	files := readTree(t, src)
	if len(files) == 0 {
		t.Fatalf("%s is empty: run go run ./storage/testdata/gen_golden.go from the repository root", src)
	}
	writeTree(t, dir, files)
	return dir
}

func TestGoldenV1Layout(t *testing.T) {
	got := slices.Sorted(maps.Keys(readTree(t, goldenDir)))
	want := []string{
		"buffers/golden/f.action.col",
		"buffers/golden/f.next.done.col",
		"buffers/golden/f.next.reward.col",
		"buffers/golden/f.next.terminated.col",
		"buffers/golden/f.next.truncated.col",
		"buffers/golden/f.observation.col",
		"buffers/golden/priority.col",
		"buffers/golden/rows.meta",
		"buffers/golden/tail.observation.col",
		"catalog.db",
		"catalog.snapshot.json", // for read-only tools while a store runs; not needed to open
	}
	if !slices.Equal(got, want) {
		t.Fatalf("files of %s:\n%q\nwant\n%q", goldenDir, got, want)
	}

	cat := catalogContents(t, filepath.Join(goldenCopy(t), "catalog.db"))
	keys := slices.Sorted(maps.Keys(cat))
	wantKeys := []string{"buffers/golden/spec", "buffers/golden/state", "buffers/golden/streams/gen", "rbd/format", "rbd/traj_next"}
	if !slices.Equal(keys, wantKeys) {
		t.Fatalf("catalog keys %q, want %q", keys, wantKeys)
	}
	if v := cat["rbd/format"]; v != "\x01\x00\x00\x00" {
		t.Errorf("rbd/format = %q, want uint32 LE 1", v)
	}
	if v := cat["rbd/traj_next"]; len(v) != 8 || binary.LittleEndian.Uint64([]byte(v)) < 4 {
		t.Errorf("rbd/traj_next = %q, want a uint64 LE >= 4", v)
	}
	const spec = `{"capacity":8,"storage":"memmap","fields":{"observation":{"dtype":"float32","shape":[2]},"action":{"dtype":"int64","shape":[]},` +
		`"next.reward":{"dtype":"float32","shape":[]},"next.done":{"dtype":"bool","shape":[]},"next.terminated":{"dtype":"bool","shape":[]},` +
		`"next.truncated":{"dtype":"bool","shape":[]}},"compact_obs":true,"obs_keys":["observation"],"priority":{"alpha":0.6,"eps":0.000001},` +
		`"durability":"flush"}`
	if v := cat["buffers/golden/spec"]; v != spec {
		t.Errorf("spec JSON\n%s\nwant\n%s", v, spec)
	}
	var st bufferState
	if err := json.Unmarshal([]byte(cat["buffers/golden/state"]), &st); err != nil {
		t.Fatal(err)
	}
	if st.WriteCount != 12 || !st.Clean || st.UID == 0 || st.CreatedAt.IsZero() || st.MaxPriority != 4 || st.SeqReserved < 12 {
		t.Errorf("state %+v: want write_count 12, clean, a uid, a creation time, max_priority 4", st)
	}
	var streams map[int64]streamPos
	if err := json.Unmarshal([]byte(cat["buffers/golden/streams/gen"]), &streams); err != nil {
		t.Fatal(err)
	}
	if p, ok := streams[1]; len(streams) != 1 || !ok || p.Step != 1 || p.LastSeq != 11 {
		t.Errorf("stream gen = %+v, want env 1 at step 1 after seq 11", streams)
	}
}

func TestGoldenV1Contents(t *testing.T) {
	testGoldenContents(t, goldenCopyOf(t, goldenDir), goldenDir, RowMetaPerRow)
}

// TestGoldenV2Contents: the version 2 golden dir reads as the same rows.
func TestGoldenV2Contents(t *testing.T) {
	testGoldenContents(t, goldenCopyOf(t, goldenDirV2), goldenDirV2, RowMetaRuns)
}

// TestGoldenV3Contents: the golden buffer written with rows.meta format
// version 3 reads as the same rows, and its files are laid out as
// docs/format.md says: a ring of 8 rows has a block of 64 slots and a
// spare one (128 slots: columns of 128 rows), rows.meta a header and two
// pages of block copies, and the watermark record at 12 with the tip of
// block 0 (12 rows).
func TestGoldenV3Contents(t *testing.T) {
	testGoldenContents(t, goldenCopyOf(t, goldenDirV3), goldenDirV3, RowMetaBlocks)
	files := readTree(t, goldenDirV3)
	meta := files["buffers/golden/rows.meta"]
	h, err := decodeMetaHeader("rows.meta", meta)
	if err != nil || h.Version != metaVersionBlocks || h.RecordSize != 0 || h.BlockRows != 64 || h.Slots != 128 || len(meta) != 3*4096 {
		t.Fatalf("rows.meta header %+v, %v, %d bytes", h, err, len(meta))
	}
	if got := len(files["buffers/golden/f.action.col"]); got != headerSize+128*8 {
		t.Errorf("action column of %d bytes, want 128 slots", got)
	}
	w, why := decodeWatermarkRecord(meta[:headerSize])
	if why != "" || w != (watermarkRecord{Seq: 12, TipBase: 0, TipRows: 12, TipCRC: w.TipCRC}) {
		t.Fatalf("watermark record %+v (%s)", w, why)
	}
	for i := range 2 {
		off := blockCopyOffset(128, 0, i)
		c, why := decodeBlockCopy(meta[off:off+blockCopySize], 0, 128, 64)
		if why == "" && c.Rows == 12 && c.CRC == w.TipCRC {
			return // the copy the last extend wrote agrees with the tip
		}
	}
	t.Errorf("no copy of block 0's record says 12 rows with the tip's checksum")
}

// TestGoldenDenseTailsContents: the golden dir with a dense tail file reads
// as the same rows; its tail file is version 2, entry k holding the k-th
// final observation written (the generator's done rows 4, 7 and 10) with
// its seq + 1 after it.
func TestGoldenDenseTailsContents(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(goldenDirTails2, "buffers", "golden", "tail.observation.col"))
	if err != nil {
		t.Fatal(err)
	}
	h, err := decodeColHeader("golden", data)
	if err != nil || h.Version != tailVersionDense || h.Role != roleTail || h.RowBytes != 8 {
		t.Fatalf("tail header %+v, %v", h, err)
	}
	if len(data) != headerSize+256*16 {
		t.Fatalf("tail file of %d bytes, want 4096 + 256 entries of 16", len(data))
	}
	var named []int64
	for k := range 256 {
		e := data[headerSize+16*k : headerSize+16*(k+1)]
		if v := binary.LittleEndian.Uint64(e[8:]); v != 0 {
			x := float32(int64(v) - 1)
			if got := [2]float32{math.Float32frombits(binary.LittleEndian.Uint32(e)), math.Float32frombits(binary.LittleEndian.Uint32(e[4:]))}; got != [2]float32{1000 + x, -1000 - x} {
				t.Errorf("entry %d (seq %v): %v", k, x, got)
			}
			if int64(k) != int64(len(named)) {
				t.Errorf("entry %d follows %d entries", k, len(named))
			}
			named = append(named, int64(v)-1)
		}
	}
	if !slices.Equal(named, []int64{4, 7, 10}) {
		t.Fatalf("entries name seqs %v, want the done rows 4, 7, 10", named)
	}
	testGoldenContents(t, goldenCopyOf(t, goldenDirTails2), goldenDirTails2, RowMetaPerRow)
}

// TestGoldenV1Upgraded: the version 1 golden dir, upgraded to version 2
// and to version 3, and the version 2 golden dir upgraded to version 3
// (Upgrade), read as the same rows, priorities and streams.
func TestGoldenV1Upgraded(t *testing.T) {
	for _, tc := range []struct {
		src string
		to  RowMetaLayout
	}{
		{goldenDir, RowMetaRuns},
		{goldenDir, RowMetaBlocks},
		{goldenDirV2, RowMetaBlocks},
	} {
		t.Run(fmt.Sprintf("%s/to=%s", tc.src, tc.to), func(t *testing.T) {
			dir := goldenCopyOf(t, tc.src)
			rep, err := Upgrade(dir, &UpgradeOptions{RowMeta: tc.to})
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Buffers) != 1 || rep.Buffers[0].Rows != 8 || rep.Buffers[0].RunRecords == 0 {
				t.Fatalf("upgrade report %+v", rep)
			}
			testGoldenContents(t, dir, "upgraded "+tc.src, tc.to)
		})
	}
}

// testGoldenContents checks the golden buffer in dir (a copy of src, which
// names it in failures) with row metadata layout layout.
func testGoldenContents(t *testing.T, dir, src string, layout RowMetaLayout) {
	rep, err := Verify(dir, nil)
	if err != nil || !rep.OK() {
		t.Fatalf("verify %s: %v %+v", src, err, rep)
	}
	if br := rep.Buffers; len(br) != 1 || br[0].Name != "golden" || br[0].WriteCount != 12 || br[0].LiveRows != 8 || br[0].Durable != 12 || br[0].Holes != 0 {
		t.Fatalf("verify %s: %+v", src, br)
	}

	s := openStore(t, dir)
	defer func() {
		if s != nil {
			s.Close()
		}
	}()
	bufs := s.Buffers()
	if len(bufs) != 1 || bufs[0].Name() != "golden" {
		t.Fatalf("buffers %v, want [golden]", bufs)
	}
	b := bufs[0]
	spec := b.Spec()
	if spec.Capacity != 8 || spec.Storage != KindMemmap || !spec.CompactObs || len(spec.Fields) != 6 || spec.Durability != DurabilityFlush ||
		spec.Priority == nil || spec.Priority.Alpha != 0.6 || spec.Priority.Eps != 1e-6 || cmp.Or(spec.RowMetaLayout, RowMetaPerRow) != layout {
		t.Fatalf("spec %+v", spec)
	}
	info, err := b.Info()
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != 8 || info.WriteCount != 12 || info.Trajectories != 4 || info.OpenTrajectories != 1 || info.Streams != 1 || info.Damaged != 0 {
		t.Fatalf("info %+v", info)
	}

	seqs, meta, cols, dst := gatherLive(t, b)
	if want := []int64{4, 5, 6, 7, 8, 9, 10, 11}; !slices.Equal(seqs, want) {
		t.Fatalf("live seqs %v, want %v", seqs, want)
	}
	col := map[string][]byte{}
	for i, c := range cols {
		col[c.Name] = dst[i]
	}
	if names := slices.Sorted(maps.Keys(col)); len(names) != 7 || names[2] != "next.observation" {
		t.Fatalf("columns %q", names)
	}
	f32 := func(name string, j, k, n int) float32 {
		return math.Float32frombits(binary.LittleEndian.Uint32(col[name][(j*n+k)*4:]))
	}
	base := meta[0].TrajID
	for j, w := range goldenRows {
		m := meta[j]
		done := w.term || w.trunc
		wm := RowMeta{Seq: w.seq, TrajID: base + w.traj, Step: w.step, PrevSeq: w.prev, NextSeq: w.next, Env: w.env,
			Done: done, Terminated: w.term, Truncated: w.trunc, HasTail: done}
		if m != wm {
			t.Errorf("seq %d: meta\n got %+v\nwant %+v", w.seq, m, wm)
		}
		x := float32(w.seq)
		if o0, o1 := f32("observation", j, 0, 2), f32("observation", j, 1, 2); o0 != x || o1 != -x {
			t.Errorf("seq %d: observation [%v %v], want [%v %v]", w.seq, o0, o1, x, -x)
		}
		if a := int64(binary.LittleEndian.Uint64(col["action"][8*j:])); a != 100+w.seq {
			t.Errorf("seq %d: action %d, want %d", w.seq, a, 100+w.seq)
		}
		if r := f32("next.reward", j, 0, 1); r != x/4 {
			t.Errorf("seq %d: next.reward %v, want %v", w.seq, r, x/4)
		}
		for name, v := range map[string]bool{"next.done": done, "next.terminated": w.term, "next.truncated": w.trunc} {
			if got := col[name][j]; got != b2byte(v) {
				t.Errorf("seq %d: %s = %d, want %v", w.seq, name, got, v)
			}
		}
		tail := [2]float32{}
		if done {
			tail = [2]float32{1000 + x, -1000 - x}
		}
		if t0, t1 := f32("next.observation", j, 0, 2), f32("next.observation", j, 1, 2); t0 != tail[0] || t1 != tail[1] {
			t.Errorf("seq %d: final observation [%v %v], want %v", w.seq, t0, t1, tail)
		}
	}

	// Priorities: 1 for rows written before any update, then 2.5, 0.5, 4.
	wantPrio := map[int64]float64{4: 1, 5: 2.5, 6: 1, 7: 1, 8: 0.5, 9: 1, 10: 1, 11: 4}
	for _, seq := range seqs {
		if p, ok := b.Priority(seq); !ok || p != wantPrio[seq] {
			t.Errorf("seq %d: priority %v (ok %v), want %v", seq, p, ok, wantPrio[seq])
		}
	}
	if m := b.MaxPriority(); m != 4 {
		t.Errorf("max priority %v, want 4", m)
	}

	// The clean close saved stream "gen": its open trajectory continues.
	res := mustExtend(t, b, "gen", makeGoldenRow(b.Spec(), 1))
	if m := metas(t, b, res.FirstSeq)[0]; res.FirstSeq != 12 || m.TrajID != base+3 || m.Step != 2 || m.PrevSeq != 11 {
		t.Fatalf("extend after reopen: seq %d %+v, want seq 12 continuing trajectory %d at step 2 after seq 11", res.FirstSeq, m, base+3)
	}
	if p, _ := b.Priority(12); p != 4 {
		t.Errorf("a new row got priority %v, want the largest seen, 4", p)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = nil
	if rep, err := Verify(dir, nil); err != nil || !rep.OK() {
		t.Fatalf("verify after writing to %s: %v %+v", src, err, rep)
	}
}

func TestGoldenV2Layout(t *testing.T) {
	files := readTree(t, goldenDirV2)
	got := slices.Sorted(maps.Keys(files))
	want := []string{
		"buffers/golden/f.action.col",
		"buffers/golden/f.next.done.col",
		"buffers/golden/f.next.reward.col",
		"buffers/golden/f.next.terminated.col",
		"buffers/golden/f.next.truncated.col",
		"buffers/golden/f.observation.col",
		"buffers/golden/priority.col",
		"buffers/golden/rows.meta",
		"buffers/golden/runs.00000001.rbdr",
		"buffers/golden/tail.observation.col",
		"catalog.db",
		"catalog.snapshot.json",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("files of %s:\n%q\nwant\n%q", goldenDirV2, got, want)
	}
	cat := catalogContents(t, filepath.Join(goldenCopyOf(t, goldenDirV2), "catalog.db"))
	if v := cat["rbd/format"]; v != "\x01\x00\x00\x00" {
		t.Errorf("rbd/format = %q, want uint32 LE 1 (the catalog's format is unchanged)", v)
	}
	if v := cat["buffers/golden/spec"]; !strings.HasSuffix(v, `"durability":"flush","row_meta":"runs"}`) {
		t.Errorf("spec JSON %s: want row_meta runs", v)
	}
	// rows.meta: the version 2 header, and a record per slot that names
	// its row's run piece; the run segment: a header and, for the two
	// extends of 6 rows of two envs, the pieces below.
	meta := files["buffers/golden/rows.meta"]
	h, err := decodeMetaHeader("rows.meta", meta)
	if err != nil || h.Version != metaVersionRuns || h.RecordSize != fileRunRecordSize || len(meta) != headerSize+8*fileRunRecordSize {
		t.Fatalf("rows.meta header %+v, %v, %d bytes", h, err, len(meta))
	}
	if wm, ok := readWatermark(meta); !ok || wm != 12 {
		t.Errorf("watermark %d (ok %v), want 12", wm, ok)
	}
	seg := files["buffers/golden/runs.00000001.rbdr"]
	sh, err := decodeSegHeader("runs", seg, runSegMagic, metaVersionRuns, "run segment")
	if err != nil || sh.Number != 1 || sh.UID != h.UID || !bytes.Equal(sh.encode(), seg[:segHeaderSize]) {
		t.Fatalf("run segment header %+v, %v", sh, err)
	}
	var pieces []runPiece
	for off := segHeaderSize; off < len(seg); off += runLogRecordSize {
		if isZero(seg[off : off+runLogRecordSize]) {
			continue // room never written
		}
		p, why := decodeRunPiece(seg[off : off+runLogRecordSize])
		if why != "" {
			t.Fatalf("run record at %d: %s", off, why)
		}
		again := make([]byte, runLogRecordSize)
		p.encode(again)
		if !bytes.Equal(again, seg[off:off+runLogRecordSize]) {
			t.Errorf("run record %+v encodes differently from the v2 bytes", p)
		}
		pieces = append(pieces, p)
	}
	// Trajectory ids relative to the first piece's (seq 0's).
	base := pieces[0].TrajID
	for i := range pieces {
		pieces[i].TrajID -= base
	}
	wantPieces := []runPiece{
		{FirstSeq: 0, TrajID: 0, FirstStep: 0, PrevSeq: -1, Env: 0, Span: 4, Rows: 3, Flags: uint8(flagDone | flagTerminated | flagHasTail)}, // 0, 2, 4
		{FirstSeq: 1, TrajID: 1, FirstStep: 0, PrevSeq: -1, Env: 1, Span: 4, Rows: 3},                                                        // 1, 3, 5
		{FirstSeq: 6, TrajID: 2, FirstStep: 0, PrevSeq: -1, Env: 0, Span: 4, Rows: 3, Flags: uint8(flagDone | flagTerminated | flagHasTail)}, // 6, 8, 10
		{FirstSeq: 7, TrajID: 1, FirstStep: 3, PrevSeq: 5, Env: 1, Span: 0, Rows: 1, Flags: uint8(flagDone | flagTruncated | flagHasTail)},   // 7
		{FirstSeq: 9, TrajID: 3, FirstStep: 0, PrevSeq: -1, Env: 1, Span: 2, Rows: 2},                                                        // 9, 11
	}
	if !slices.Equal(pieces, wantPieces) {
		t.Fatalf("run records\n got %+v\nwant %+v", pieces, wantPieces)
	}
	le := binary.LittleEndian
	for _, w := range []struct {
		seq              int64
		delta, off, dist uint16
	}{{4, 4, 2, 2}, {5, 4, 2, 2}, {6, 0, 0, 0}, {7, 0, 0, 0}, {8, 2, 1, 2}, {9, 0, 0, 0}, {10, 4, 2, 2}, {11, 2, 1, 2}} {
		rb := meta[headerSize+w.seq%8*fileRunRecordSize:]
		if got := le.Uint64(rb[frWord:]); got != fileRunWord(w.seq, w.delta) {
			t.Errorf("seq %d: word %#x, want %#x", w.seq, got, fileRunWord(w.seq, w.delta))
		}
		if off, dist := le.Uint16(rb[frOff:]), le.Uint16(rb[frDist:]); off != w.off || dist != w.dist {
			t.Errorf("seq %d: offset %d, distance %d; want %d, %d", w.seq, off, dist, w.off, w.dist)
		}
	}
}

func b2byte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// makeGoldenRow is one row for the golden buffer's spec, not done.
func makeGoldenRow(spec Spec, env int64) *Batch {
	f := map[string][]byte{}
	for _, fl := range spec.Fields {
		f[fl.Name] = make([]byte, fl.RowBytes())
	}
	return &Batch{Rows: 1, Fields: f, Env: []int64{env}}
}

// TestGoldenV1Encoding decodes every header and live record of the v1 files
// and encodes them again: today's encoders must write v1 bytes exactly.
func TestGoldenV1Encoding(t *testing.T) {
	files := readTree(t, goldenDir)
	for _, rel := range slices.Sorted(maps.Keys(files)) {
		b := files[rel]
		switch {
		case strings.HasSuffix(rel, ".col"):
			h, err := decodeColHeader(rel, b)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(h.encode(), b[:headerSize]) {
				t.Errorf("%s: header %+v encodes differently from the v1 bytes", rel, h)
			}
			if want := headerSize + 8*int(h.RowBytes); len(b) != want {
				t.Errorf("%s: %d bytes, want header + 8 rows = %d", rel, len(b), want)
			}
		case strings.HasSuffix(rel, "rows.meta"):
			h, err := decodeMetaHeader(rel, b)
			if err != nil {
				t.Fatal(err)
			}
			wm, ok := readWatermark(b)
			if !ok || wm != 12 {
				t.Errorf("%s: watermark %d (ok %v), want 12", rel, wm, ok)
			}
			enc := h.encode()
			putWatermark(enc, wm)
			if !bytes.Equal(enc, b[:headerSize]) {
				t.Errorf("%s: header %+v encodes differently from the v1 bytes", rel, h)
			}
			for slot := range 8 {
				rb := b[headerSize+slot*recordSize : headerSize+(slot+1)*recordSize]
				r, ok := decodeRecord(rb, new([recordSize]byte))
				if !ok {
					t.Errorf("%s: slot %d: record rejected", rel, slot)
					continue
				}
				again := make([]byte, recordSize)
				encodeRecord(again, &r)
				if !bytes.Equal(again, rb) {
					t.Errorf("%s: slot %d: record %+v encodes as\n% x\nv1 bytes\n% x", rel, slot, r, again, rb)
				}
			}
		}
	}
}

// TestGoldenFormatEncoding pins the encoders to fixed values, as readable
// hex dumps in testdata/v1/encoding.golden (refresh with -update-format,
// then review the diff: any change to a v1 byte is a format break).
func TestGoldenFormatEncoding(t *testing.T) {
	const uid = 0x0123456789abcdef
	col := colHeader{Version: FormatVersion, Role: roleField, UID: uid, Capacity: 8, RowBytes: 8, DType: Float32, Shape: []int{2}, Name: "observation"}
	tail := colHeader{Version: FormatVersion, Role: roleTail, UID: uid, Capacity: 8, RowBytes: 8, DType: Float32, Shape: []int{2}, Name: "next.observation"}
	prio := colHeader{Version: FormatVersion, Role: rolePriority, UID: uid, Capacity: 8, RowBytes: 8, DType: Float64, Shape: []int{}, Name: "priority"}
	meta := metaHeader{Version: FormatVersion, RecordSize: recordSize, UID: uid, Capacity: 8, Name: "golden"}
	metaBytes := meta.encode()
	putWatermark(metaBytes, 12)
	rec := record{Seq: 7, TrajID: 1, Step: 3, PrevSeq: 5, Env: 1, Flags: flagDone | flagTruncated | flagHasTail, DataCRC: 0xdeadbeef}
	recBytes := make([]byte, recordSize)
	encodeRecord(recBytes, &rec)
	first := make([]byte, recordSize)
	r0 := record{Seq: 0, TrajID: 0, Step: 0, PrevSeq: -1, Env: 0}
	encodeRecord(first, &r0)
	// A row with a policy version (bytes 44-52; zero in files written before
	// versions existed, which read as version 0).
	versioned := make([]byte, recordSize)
	rv := record{Seq: 8, TrajID: 1, Step: 4, PrevSeq: 7, Env: 1, PolicyVersion: 0x0102030405, DataCRC: 0xdeadbeef}
	encodeRecord(versioned, &rv)
	// While seq 7 is being written, its slot's seq field holds a marker.
	marking := slices.Clone(recBytes)
	binary.LittleEndian.PutUint64(marking[recSeq:], uint64(writingMarker(7)))

	var sb strings.Builder
	section := func(title string, b []byte) {
		fmt.Fprintf(&sb, "# %s\n%s\n", title, hexdumpC(b))
	}
	section(fmt.Sprintf("column header %+v", col), col.encode())
	section(fmt.Sprintf("tail column header %+v", tail), tail.encode())
	section(fmt.Sprintf("priority column header %+v", prio), prio.encode())
	section(fmt.Sprintf("meta header %s, watermark 12", goldenMetaHeader(meta)), metaBytes)
	section(fmt.Sprintf("record %+v", rec), recBytes)
	section(fmt.Sprintf("record %+v", r0), first)
	section(fmt.Sprintf("record %+v", rv), versioned)
	section("record of seq 7 being written (seq field = -(7+2), record checksum not yet valid)", marking[:16])
	// Chunk segments (compressed buffers). Codec none only: zstd's output
	// may change with the library version, its framing is zstd's own.
	seg := segHeader{Version: FormatVersion, UID: uid, Number: 3}.encode()
	section(fmt.Sprintf("segment header uid %#x number 3", uint64(uid)), seg)
	sealed := &chunkRecord{Kind: recSealed, Tail: true, TrajID: 4, FirstStep: 32, ID: 9, PrevID: 8, Seqs: []int64{100, 103, 104},
		Fields: []recordField{
			// A frame-stacked field (frames of 2 bytes): newest, zero-padded, full (4 frames), then the final observation (newest).
			{Codec: codecNone, RawLen: 14, Modes: []byte{modeNewest, modeZeroPad, modeFull, modeNewest}, Payload: []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}},
			// A plain compressed field of 4-byte rows, delta-encoded.
			{Codec: codecNone, Delta: true, RawLen: 12, Modes: []byte{modeFull, modeFull, modeFull}, Payload: []byte{1, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0}},
		}}
	section("sealed chunk record, 3 rows and a final observation, 2 fields, codec none", sealed.encode(nil))
	frag := &chunkRecord{Kind: recFragment, TrajID: 5, FirstStep: 0, ID: 10, Seqs: []int64{105},
		Fields: []recordField{
			{Codec: codecNone, RawLen: 2, Modes: []byte{modeRepeat}, Payload: []byte{7, 7}},
			{Codec: codecNone, RawLen: 4, Modes: []byte{modeFull}, Payload: []byte{0, 0, 128, 63}},
		}}
	section("fragment record of an open chunk, 1 row", frag.encode(nil))
	for _, r := range []*chunkRecord{sealed, frag} {
		back, err := decodeChunkRecord(r.encode(nil), []bool{true, false}, 4)
		if err != nil || back.ID != r.ID || back.Tail != r.Tail || !slices.Equal(back.Seqs, r.Seqs) ||
			!bytes.Equal(back.Fields[0].Payload, r.Fields[0].Payload) || !bytes.Equal(back.Fields[1].Modes, r.Fields[1].Modes) {
			t.Errorf("chunk record %d does not decode to itself: %+v, %v", r.ID, back, err)
		}
	}
	if h, err := decodeSegHeader("golden", seg, segMagic, FormatVersion, "chunk segment"); err != nil || h.Number != 3 || h.UID != uid {
		t.Errorf("segment header: %+v, %v", h, err)
	}
	got := sb.String()

	checkEncodingGolden(t, "testdata/v1/encoding.golden", got)

	// The dump agrees with the named offsets, as docs/format.md states them.
	le := binary.LittleEndian
	cb := col.encode()
	if string(cb[0:8]) != "RBDCOL\x00\x00" || le.Uint32(cb[8:]) != 1 || le.Uint32(cb[12:]) != roleField || le.Uint64(cb[16:]) != uid ||
		le.Uint64(cb[24:]) != 8 || le.Uint64(cb[32:]) != 8 || cb[40] != byte(Float32) || cb[41] != 1 || le.Uint16(cb[42:]) != 11 ||
		le.Uint32(cb[44:]) != 2 || string(cb[76:87]) != "observation" || len(cb) != 4096 {
		t.Errorf("column header fields are not where docs/format.md says")
	}
	if string(metaBytes[0:8]) != "RBDMETA\x00" || le.Uint32(metaBytes[12:]) != 64 || le.Uint64(metaBytes[24:]) != 8 ||
		le.Uint16(metaBytes[32:]) != 6 || string(metaBytes[34:40]) != "golden" || le.Uint64(metaBytes[256:]) != 12 {
		t.Errorf("meta header fields are not where docs/format.md says")
	}
}

// TestGoldenV2FormatEncoding pins the version 2 encoders (rows.meta of a
// memmap buffer with row_meta "runs", and the run log) to fixed values in
// testdata/v2/encoding.golden (-update-format refreshes it; review the diff).
func TestGoldenV2FormatEncoding(t *testing.T) {
	const uid = 0x0123456789abcdef
	meta := metaHeader{Version: metaVersionRuns, RecordSize: fileRunRecordSize, UID: uid, Capacity: 8, Name: "golden"}
	metaBytes := meta.encode()
	putWatermark(metaBytes, 12)
	// Seq 11, the second row of the piece that starts at seq 9, two seqs
	// after the row before it; 0xdeadbeef stands for the CRC of its field
	// and tail bytes.
	rec := make([]byte, fileRunRecordSize)
	var scratch [12]byte
	putFileRunRecord(rec, 11, pieceRow{delta: 2, off: 1, dist: 2}, fileRunCRC(0xdeadbeef, 11, pieceRow{delta: 2, off: 1, dist: 2}, &scratch))
	first := make([]byte, fileRunRecordSize)
	putFileRunRecord(first, 1<<47+9, pieceRow{}, fileRunCRC(0xdeadbeef, 1<<47+9, pieceRow{}, &scratch)) // seq 2^47+9 is stored as 9
	marking := slices.Clone(rec)
	binary.LittleEndian.PutUint64(marking[frWord:], fileRunWord(11, 2)|frWriting)
	piece := runPiece{FirstSeq: 9, TrajID: 3, FirstStep: 0, PrevSeq: -1, Env: 1, PolicyVersion: 0x0102030405, Span: 2, Rows: 2, Flags: uint8(flagDone | flagTruncated | flagHasTail)}
	pieceBytes := make([]byte, runLogRecordSize)
	piece.encode(pieceBytes)
	seg := segHeader{Magic: runSegMagic, Version: metaVersionRuns, UID: uid, Number: 3}.encode()
	// A dense tail file (tail format version 2): its header, and the
	// entry of seq 11's final observation [1011, -1011] as writers end it.
	dtail := colHeader{Version: tailVersionDense, Role: roleTail, UID: uid, Capacity: 8, RowBytes: 8, DType: Float32, Shape: []int{2}, Name: "next.observation"}
	entry := make([]byte, 8+tailTrailerSize)
	binary.LittleEndian.PutUint32(entry[0:], math.Float32bits(1011))
	binary.LittleEndian.PutUint32(entry[4:], math.Float32bits(-1011))
	putTailTrailer(&column{rowBytes: 8, stride: 8 + tailTrailerSize, data: entry}, 0, 11)

	var sb strings.Builder
	section := func(title string, b []byte) {
		fmt.Fprintf(&sb, "# %s\n%s\n", title, hexdumpC(b))
	}
	section(fmt.Sprintf("meta header %s, watermark 12", goldenMetaHeader(meta)), metaBytes[:272])
	section("record of seq 11: run delta 2, offset 1, distance back 2, data CRC 0xdeadbeef", rec)
	section("record of seq 2^47+9: the first row of its piece, data CRC 0xdeadbeef", first)
	section("record of seq 11 being written (bit 47 of the first word set, checksum not yet valid)", marking[:8])
	section(fmt.Sprintf("run segment header uid %#x number 3", uint64(uid)), seg)
	section(fmt.Sprintf("run record %+v", piece), pieceBytes)
	section(fmt.Sprintf("dense tail column header %+v (first 512 bytes)", dtail), dtail.encode()[:512])
	section("dense tail entry: seq 11's final observation [1011 -1011], then seq + 1", entry)
	got := sb.String()

	checkEncodingGolden(t, "testdata/v2/encoding.golden", got)

	// The dump agrees with the named offsets, as docs/format.md states them.
	le := binary.LittleEndian
	if le.Uint32(metaBytes[8:]) != 2 || le.Uint32(metaBytes[12:]) != 16 {
		t.Errorf("meta header version and record size are not where docs/format.md says")
	}
	if w := le.Uint64(rec[0:]); w&(1<<47-1) != 11 || w>>47&1 != 0 || w>>48 != 2 || le.Uint16(rec[12:]) != 1 || le.Uint16(rec[14:]) != 2 {
		t.Errorf("record fields are not where docs/format.md says: % x", rec)
	}
	crc := crc32.Update(0xdeadbeef, castagnoli, slices.Concat(rec[0:8], rec[12:16]))
	if le.Uint32(rec[8:]) != crc {
		t.Errorf("record checksum %08x, want the data CRC continued over bytes [0,8) and [12,16): %08x", le.Uint32(rec[8:]), crc)
	}
	if le.Uint64(pieceBytes[0:]) != 9 || le.Uint64(pieceBytes[8:]) != 3 || le.Uint64(pieceBytes[24:]) != ^uint64(0) || le.Uint64(pieceBytes[32:]) != 1 ||
		le.Uint64(pieceBytes[40:]) != 0x0102030405 || le.Uint16(pieceBytes[48:]) != 2 || le.Uint16(pieceBytes[50:]) != 2 || pieceBytes[52] != 0x0d ||
		le.Uint32(pieceBytes[60:]) != crc32.Checksum(pieceBytes[:60], castagnoli) {
		t.Errorf("run record fields are not where docs/format.md says: % x", pieceBytes)
	}
	if db := dtail.encode(); le.Uint32(db[8:]) != 2 || le.Uint32(db[12:]) != roleTail || le.Uint64(entry[8:]) != 12 {
		t.Errorf("dense tail header version or entry trailer are not where docs/format.md says")
	}
	if string(seg[:8]) != "RBDRUNS\x00" || le.Uint32(seg[8:]) != 2 || le.Uint64(seg[24:]) != 3 {
		t.Errorf("run segment header fields are not where docs/format.md says")
	}
	// A segment's unused room is zeros, which never read as a record.
	if c := crc32.Checksum(make([]byte, rlCRC), castagnoli); c != 0x5a0b0531 {
		t.Errorf("CRC-32C of 60 zero bytes is %08x, docs/format.md says 5a0b0531", c)
	}
	if _, why := decodeRunPiece(make([]byte, runLogRecordSize)); why == "" {
		t.Errorf("a run record of zeros decodes")
	}
}

// checkEncodingGolden compares the dumps of a format's encoders with its
// golden file (-update-format rewrites it; review the diff: any change to
// a byte of a released version is a format break).
func checkEncodingGolden(t *testing.T, path, got string) {
	t.Helper()
	if *updateFormat {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./storage -run %s -update-format)", err, t.Name())
	}
	if got != string(want) {
		t.Errorf("encodings differ from %s (a format change needs a new version):\n%s", path, lineDiff(string(want), got))
	}
}

// hexdumpC formats b like hexdump -C: 16 bytes a line, a run of lines equal
// to the one before shown as "*", and the length on the last line.
func hexdumpC(b []byte) string {
	var sb strings.Builder
	var prev []byte
	star := false
	for off := 0; off < len(b); off += 16 {
		line := b[off:min(off+16, len(b))]
		if prev != nil && bytes.Equal(line, prev) {
			if !star {
				sb.WriteString("*\n")
				star = true
			}
			continue
		}
		star = false
		prev = line
		fmt.Fprintf(&sb, "%08x ", off)
		for i := range 16 {
			if i == 8 {
				sb.WriteByte(' ')
			}
			if i < len(line) {
				fmt.Fprintf(&sb, " %02x", line[i])
			} else {
				sb.WriteString("   ")
			}
		}
		sb.WriteString("  |")
		for _, c := range line {
			if c < 0x20 || c > 0x7e {
				c = '.'
			}
			sb.WriteByte(c)
		}
		sb.WriteString("|\n")
	}
	fmt.Fprintf(&sb, "%08x\n", len(b))
	return sb.String()
}

// lineDiff lists the lines that differ, numbered, for a golden failure.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var sb strings.Builder
	for i := range max(len(w), len(g)) {
		var a, b string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if a != b {
			fmt.Fprintf(&sb, "line %d:\n- %s\n+ %s\n", i+1, a, b)
		}
	}
	return sb.String()
}

// goldenMetaHeader describes a version 1 or 2 meta header as the golden
// files have since they were written (version 3's fields are zero there).
func goldenMetaHeader(h metaHeader) string {
	return fmt.Sprintf("{Version:%d RecordSize:%d UID:%d Capacity:%d Name:%s}", h.Version, h.RecordSize, h.UID, h.Capacity, h.Name)
}
