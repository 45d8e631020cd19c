package storage

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/rbdb/rbd/internal/testbin"
)

// TestResolveSeq: a seq stored modulo 2^47 comes back exactly from any
// reference within 2^46 of it, at the edges of that range and far from 0.
func TestResolveSeq(t *testing.T) {
	const half = int64(1) << 46
	cases := []struct{ seq, ref int64 }{
		{0, 0}, {5, 0}, {0, 100}, {1 << 40, 1<<40 + 4096},
		{half - 1, 0}, {half, 1}, {1 << 60, 1<<60 - half + 1}, {1<<60 + half, 1 << 60},
		{1<<62 + 12345, 1<<62 + 12345}, {1<<47 - 1, 1 << 47}, {1 << 47, 1<<47 - 1},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10_000 {
		seq := rng.Int64N(1 << 62)
		cases = append(cases, struct{ seq, ref int64 }{seq, seq + rng.Int64N(2*half-1) - half + 1})
	}
	for _, c := range cases {
		if got := resolveSeq(uint64(c.seq)&seqResidueMask, c.ref); got != c.seq {
			t.Fatalf("seq %d stored mod 2^47, resolved against %d: %d", c.seq, c.ref, got)
		}
	}
	// 2^46 + 1 away it is another seq: the range is what the ring and
	// the reservation must stay within (a ring holds at most 2^40 rows).
	if got := resolveSeq(0, half+1); got == 0 {
		t.Fatalf("seq 0 resolved against %d: %d, want the seq 2^47 above it", half+1, got)
	}
}

// TestRunLogPlan: an extend's rows are cut into pieces that continue a
// trajectory while its rows follow each other with one env and version,
// end at a flagged row, and stay within 65,535 seqs; each row's delta,
// offset and distance name its place in its piece.
func TestRunLogPlan(t *testing.T) {
	l := &runLog{}
	var recs []record
	add := func(traj, step, prev, env, version int64, flags uint32) {
		recs = append(recs, record{Seq: int64(len(recs)) + 1000, TrajID: traj, Step: step, PrevSeq: prev, Env: env, PolicyVersion: version, Flags: flags})
	}
	add(1, 5, 990, 0, 0, 0)              // 1000: traj 1 continues from before the extend: a piece starts
	add(2, 0, -1, 1, 0, 0)               // 1001: traj 2 starts
	add(1, 6, 1000, 0, 0, 0)             // 1002: traj 1, off 1
	add(2, 1, 1001, 1, 0, flagDone)      // 1003: traj 2 ends: its piece closes
	add(1, 7, 1002, 0, 1, 0)             // 1004: traj 1, a new policy version: a new piece
	add(3, 0, -1, 1, 0, 0)               // 1005: traj 3 starts on env 1
	add(1, 8, 1004, 0, 1, flagTruncated) // 1006: traj 1 ends
	add(3, 1, 1005, 1, 0, flagHasTail)   // 1007: a flag closes the piece
	add(3+256, 0, -1, 2, 0, 0)           // 1008: traj 259 shares traj 3's cache slot
	add(3, 2, 1007, 1, 0, 0)             // 1009: traj 3 after a flagged row: a new piece
	rows := l.plan(recs, 1000)
	wantPieces := []runPiece{
		{FirstSeq: 1000, TrajID: 1, FirstStep: 5, PrevSeq: 990, Span: 2, Rows: 2},
		{FirstSeq: 1001, TrajID: 2, FirstStep: 0, PrevSeq: -1, Env: 1, Span: 2, Rows: 2, Flags: uint8(flagDone)},
		{FirstSeq: 1004, TrajID: 1, FirstStep: 7, PrevSeq: 1002, PolicyVersion: 1, Span: 2, Rows: 2, Flags: uint8(flagTruncated)},
		{FirstSeq: 1005, TrajID: 3, FirstStep: 0, PrevSeq: -1, Env: 1, Span: 2, Rows: 2, Flags: uint8(flagHasTail)},
		{FirstSeq: 1008, TrajID: 259, FirstStep: 0, PrevSeq: -1, Env: 2, Span: 0, Rows: 1},
		{FirstSeq: 1009, TrajID: 3, FirstStep: 2, PrevSeq: 1007, Env: 1, Span: 0, Rows: 1},
	}
	if !slices.Equal(l.pieces, wantPieces) {
		t.Fatalf("pieces\n got %+v\nwant %+v", l.pieces, wantPieces)
	}
	wantRows := []pieceRow{{}, {}, {2, 1, 2}, {2, 1, 2}, {}, {}, {2, 1, 2}, {2, 1, 2}, {}, {}}
	if !slices.Equal(rows, wantRows) {
		t.Fatalf("rows\n got %v\nwant %v", rows, wantRows)
	}

	// A trajectory whose rows are more than 65,535 seqs apart in one
	// extend (a huge batch of many envs) splits.
	recs = recs[:0]
	for i := range 70_000 {
		traj, step, prev := int64(i%2), int64(i/2), int64(i-2)
		if i < 2 {
			prev = -1
		}
		recs = append(recs, record{Seq: int64(i), TrajID: traj, Step: step, PrevSeq: prev})
	}
	rows = l.plan(recs, 0)
	for _, p := range l.pieces {
		if int64(p.Span) > maxPieceSpan || p.Rows == 0 {
			t.Fatalf("piece %+v", p)
		}
	}
	if len(l.pieces) != 4 {
		t.Fatalf("%d pieces for two trajectories over 70,000 seqs, want 4", len(l.pieces))
	}
	if r := rows[65_536]; r.delta != 0 || r.off != 0 {
		t.Fatalf("row 65,536 (traj 0) is at delta %d offset %d: its piece should start there", r.delta, r.off)
	}
}

// TestRunSegmentsCollected: a memmap buffer with run records keeps its run
// log to about the live pieces: segments the window has passed are
// deleted, on sync and when a new segment starts, and Info counts what is
// left.
func TestRunSegmentsCollected(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	defer s.Close()
	spec := runsSpec(1000)
	spec.Durability = DurabilityNone
	b := mustCreate(t, s, "b", spec)
	// One-row episodes: a run record per row, 64 bytes a row, so that a
	// 64 KiB segment fills every 1,023 rows.
	rows := make([]row, 100)
	for i := range rows {
		rows[i] = row{env: int64(i % 4), val: float32(i), terminated: true}
	}
	for range 200 {
		mustExtend(t, b, "s", makeBatch(spec, rows, true))
	}
	b.rlog.bg.Wait() // the spare made, the collection behind it done
	nos, err := runSegmentNumbers(b.dir)
	if err != nil {
		t.Fatal(err)
	}
	// 20,000 run records (1.25 MiB) were written; the live ones fit in
	// two segments, plus the one being filled and the spare.
	if len(nos) > 4 || nos[len(nos)-1] < 16 {
		t.Fatalf("run segments %v after 20,000 one-row runs in a ring of 1,000", nos)
	}
	info, err := b.Info()
	if err != nil {
		t.Fatal(err)
	}
	var files int64
	for _, no := range nos {
		st, err := os.Stat(filepath.Join(b.dir, runSegName(no)))
		if err != nil {
			t.Fatal(err)
		}
		files += st.Size()
	}
	if got := b.rlog.files(); got != files {
		t.Fatalf("the run log counts %d bytes, its files hold %d", got, files)
	}
	meta := fileBytes(metaFile(b.dir))
	if info.DiskBytes < meta+files {
		t.Fatalf("disk_bytes %d, less than rows.meta (%d) and the run segments (%d)", info.DiskBytes, meta, files)
	}
}

// TestRunSegmentCutAtCreation: a run segment a crash left between its
// creation and its header (a file of zeros, or an empty one) is ignored and
// removed by the next open; one without a header but with other bytes (a
// power loss that kept later pages of a segment never synced) is ignored
// and left as it is. The rows are all there.
func TestRunSegmentCutAtCreation(t *testing.T) {
	for _, tc := range []struct {
		size int64
		junk bool
	}{{0, false}, {64 << 10, false}, {64 << 10, true}} {
		t.Run(fmt.Sprintf("bytes=%d/junk=%v", tc.size, tc.junk), func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir)
			spec := runsSpec(64)
			b := mustCreate(t, s, "b", spec)
			rows := make([]row, 40)
			for i := range rows {
				rows[i] = row{env: int64(i % 3), val: float32(i), terminated: i%7 == 6, final: float32(100 + i)}
			}
			mustExtend(t, b, "s", makeBatch(spec, rows, true))
			want := servedRows(t, b)
			bdir := b.dir
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			stray := filepath.Join(bdir, runSegName(2))
			content := make([]byte, tc.size)
			if tc.junk {
				content[5000] = 1
			}
			if err := os.WriteFile(stray, content, 0o644); err != nil {
				t.Fatal(err)
			}
			if rep, err := Verify(dir, nil); err != nil || !rep.OK() {
				t.Fatalf("verify: %v %+v", err, rep)
			}
			s = openStore(t, dir)
			defer s.Close()
			b, err := s.Buffer("b")
			if err != nil {
				t.Fatal(err)
			}
			if got := checkServed(t, b, want); len(got) != len(want) {
				t.Fatalf("%d rows served, %d written", len(got), len(want))
			}
			if _, err := os.Stat(stray); tc.junk == os.IsNotExist(err) {
				t.Fatalf("segment without a header, junk %v: stat %v", tc.junk, err)
			}
			mustExtend(t, b, "s", makeBatch(spec, rows[:5], true)) // a new segment, numbered past it
			b.rlog.bg.Wait()
			if nos, _ := runSegmentNumbers(bdir); !slices.Contains(nos, 3) || nos[len(nos)-1] != 4 {
				t.Fatalf("run segments %v after the next extend, want it numbered 3 and its spare 4", nos)
			}
		})
	}
}

// TestRunLogDiskFull: a memmap buffer with run records on a full disk
// refuses an extend whose run records need a new segment, with an
// out-of-space error and nothing of the batch written, and takes the same
// batch once space returns, without a restart; reopened, it holds every
// acknowledged row and verifies clean.
func TestRunLogDiskFull(t *testing.T) {
	dir := testbin.MountTmpfs(t, 8<<20)
	s := openStore(t, dir)
	spec := runsSpec(4096)
	b := mustCreate(t, s, "r", spec)
	refStore := openStore(t, t.TempDir())
	defer refStore.Close()
	ref := mustCreate(t, refStore, "r", testSpec(KindMemory, 4096, true))
	// One-row episodes: a run record a row, a 64 KiB segment every 1,023
	// rows.
	rows := make([]row, 100)
	filler := testbin.FillDisk(t, dir)
	refused := 0
	for k := range 60 {
		for i := range rows {
			rows[i] = row{env: int64(i % 4), val: float32(k*100 + i), terminated: true, final: float32(i)}
		}
		var was bool
		if was, filler = extendOnFullDisk(t, dir, b, makeBatch(spec, rows, true), filler); was {
			refused++
		}
		mustExtend(t, ref, "s", makeBatch(spec, rows, true))
	}
	if refused == 0 {
		t.Fatal("the run log never ran out of space")
	}
	t.Logf("extends refused for space %d times, each taken again after space returned", refused)
	compareBuffers(t, ref, b)
	os.Remove(filler)
	_, b = reopenVerified(t, s, dir, "r")
	compareBuffers(t, ref, b)
}

// TestRunLogFsyncWriters: four writers extend an fsync buffer with run
// records at once, so that syncs of the run log (outside its lock) overlap
// appends, segment creations and collections; every acknowledged row is
// there after a reopen and the dir verifies clean. Run under -race.
func TestRunLogFsyncWriters(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	spec := runsSpec(512)
	spec.Durability = DurabilityFsync
	b := mustCreate(t, s, "f", spec)
	const writers, extends = 4, 60
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			rows := make([]row, 16)
			var err error
			for k := range extends {
				for i := range rows {
					// Short episodes: run records fill 64 KiB segments.
					rows[i] = row{env: int64(i % 4), val: float32(w*1e6 + k*100 + i), terminated: i%2 == 1, final: float32(i)}
				}
				if _, e := b.Extend(fmt.Sprintf("w%d", w), makeBatch(spec, rows, true)); e != nil && err == nil {
					err = e
				}
			}
			errs <- err
		}()
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	want := servedRows(t, b)
	if wc := b.WriteCount(); wc != writers*extends*16 || b.Durable() != wc {
		t.Fatalf("write count %d, durable %d; want %d both", wc, b.Durable(), writers*extends*16)
	}
	nos, _ := runSegmentNumbers(b.dir)
	_, b = reopenVerified(t, s, dir, "f")
	if got := checkServed(t, b, want); len(got) != len(want) {
		t.Fatalf("%d rows after reopening, %d before", len(got), len(want))
	}
	if len(nos) == 0 || nos[len(nos)-1] < 2 {
		t.Fatalf("run segments %v: the writers never filled one", nos)
	}
}

// TestRunLogHugeBatch: one extend of 70,000 rows of one trajectory (more
// than a piece can span) and one larger than the ring, into a memmap
// buffer with run records: the pieces split where they must, and the rows
// read back the same after a reopen.
func TestRunLogHugeBatch(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	spec := runsSpec(100_000)
	b := mustCreate(t, s, "h", spec)
	rows := make([]row, 70_000)
	for i := range rows {
		rows[i] = row{val: float32(i)}
	}
	mustExtend(t, b, "s", makeBatch(spec, rows, true))
	rows = make([]row, 130_000) // wraps the ring within the batch
	for i := range rows {
		rows[i] = row{env: int64(i % 2), val: float32(-i), truncated: i == len(rows)-1, final: 1}
	}
	mustExtend(t, b, "s", makeBatch(spec, rows, true))
	want := servedRows(t, b)
	_, b = reopenBuffer(t, s, dir, "h")
	if got := checkServed(t, b, want); len(got) != len(want) || len(got) != 100_000 {
		t.Fatalf("%d rows after reopening, %d before (ring of 100,000)", len(got), len(want))
	}
}

// reopenVerified closes s, checks that Verify finds dir clean, and opens
// it again (closed at the test's end): the store and its buffer name.
func reopenVerified(t *testing.T, s *Store, dir, name string) (*Store, *Buffer) {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if rep, err := Verify(dir, nil); err != nil || !rep.OK() {
		t.Fatalf("verify: %v %+v", err, rep)
	}
	return openBuffer(t, dir, name)
}

// extendOnFullDisk extends b with batch on the stream "s" while filler
// fills dir's disk. A refusal must be an out-of-space error that leaves the
// write count where it was; then space is freed, the same batch goes in,
// and the disk is filled again. It returns whether the extend was refused,
// and the filler.
func extendOnFullDisk(t *testing.T, dir string, b *Buffer, batch *Batch, filler string) (bool, string) {
	t.Helper()
	wc := b.WriteCount()
	_, err := b.Extend("s", batch)
	if err == nil {
		return false, filler
	}
	if !errors.Is(err, ErrInsufficientStorage) {
		t.Fatalf("extend on a full disk: %v", err)
	}
	if b.WriteCount() != wc {
		t.Fatalf("a refused extend moved the write count %d -> %d", wc, b.WriteCount())
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	mustExtend(t, b, "s", batch)
	return true, testbin.FillDisk(t, dir)
}

// runsSpec is testSpec's compact memmap buffer of capacity rows with
// rows.meta format version 2.
func runsSpec(capacity int64) Spec {
	spec := testSpec(KindMemmap, capacity, true)
	spec.RowMetaLayout = RowMetaRuns
	return spec
}

// TestOpenKeepsRunSegmentsOfTheSyncedWindow: an open that finds a
// buffer's seq witness far ahead of its files (a dir restored in place,
// or writes lost to an I/O error) moves the write count to the witness,
// so its window holds none of the files' rows; it must not delete the
// run segments of the rows an fsync buffer synced, since an open that
// fails after that buffer's recovery (here another buffer's), or a power
// loss before its commit, leaves the catalog and the files as they were,
// and the next open without the witness opens that window again (a
// version built on 2026-11-29 deleted them: every synced row reported as
// damage, for want of its piece).
func TestOpenKeepsRunSegmentsOfTheSyncedWindow(t *testing.T) {
	if !witnessesHere() {
		t.Skip("no seq witnesses here")
	}
	for _, layout := range []RowMetaLayout{RowMetaRuns, RowMetaBlocks} {
		t.Run(string(layout), func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir)
			spec := testSpec(KindMemmap, 4096, false)
			spec.Durability, spec.RowMetaLayout = DurabilityFsync, layout
			a := mustCreate(t, s, "a", spec)
			const envs, extends = 64, 24 // a piece a row: two run segments
			for e := range extends {
				rows := make([]row, envs)
				for i := range rows {
					rows[i] = row{env: int64(i), val: float32(e*envs + i)}
				}
				mustExtend(t, a, "w", makeBatch(spec, rows, false))
			}
			if segs := len(a.rlog.segs); segs < 2 {
				t.Fatalf("%d run segments; the test needs two", segs)
			}
			z := mustCreate(t, s, "z", testSpec(KindMemmap, 256, false))
			mustExtend(t, z, "w", makeBatch(z.Spec(), []row{{val: 1}}, false))
			uid, bdir := a.uid, a.dir
			want := a.liveRows()
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			// The witness names seqs far past the files' rows.
			abs, err := filepath.Abs(bdir)
			if err != nil {
				t.Fatal(err)
			}
			w, err := openWitness(defaultWitnessDir, abs, uid, currentBoot(), envs*extends+20*spec.Capacity)
			if err != nil || w == nil {
				t.Fatalf("witness: %v", err)
			}
			if err := w.m.Unmap(); err != nil {
				t.Fatal(err)
			}
			// Buffer z cannot open: the whole open fails after a's recovery.
			zmeta := metaFile(bufferDir(dir, "z"))
			good, err := os.ReadFile(zmeta)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(zmeta, good[:100], 0o644); err != nil {
				t.Fatal(err)
			}
			if s, err := Open(dir, nil); err == nil {
				s.Close()
				t.Fatal("the open succeeded with buffer z's rows.meta cut short")
			}
			if err := os.WriteFile(zmeta, good, 0o644); err != nil {
				t.Fatal(err)
			}
			powerLossReboot(t, dir) // the witness goes
			s = openStore(t, dir)
			defer s.Close()
			a = mustBuffer(t, s, "a")
			info, err := a.Info()
			if err != nil || info.Damaged != 0 || a.liveRows() != want {
				t.Fatalf("after the failed open and a reboot: %d live rows (want %d), %d damaged, %v", a.liveRows(), want, info.Damaged, err)
			}
		})
	}
}
