package storage

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/rbdb/rbd/storage/internal/mmapfile"
)

// TestMemoryRecordsMatchFileRecords writes the same batches into a memory
// buffer (memory records of both layouts) and a memmap buffer (64-byte
// file records, the reference) and compares every live row's metadata,
// while the ring goes round three times with envs and versions at the
// extremes of int64: in the row layout rows with values too wide for a
// memory record overwrite narrow ones and the other way round; in the runs
// layout runs break, continue across batches and are released and reused.
// Then the memory buffer goes through a hot checkpoint (memory records out
// as file records) and is opened again (file records back in as memory
// records).
func TestMemoryRecordsMatchFileRecords(t *testing.T) {
	for _, layout := range []RowMetaLayout{RowMetaPerRow, RowMetaRuns, RowMetaStrided} {
		t.Run(string(layout), func(t *testing.T) { testMemoryRecordsMatchFileRecords(t, layout) })
	}
}

func testMemoryRecordsMatchFileRecords(t *testing.T, layout RowMetaLayout) {
	const capacity = 24
	envs := []int64{0, -5, 1 << 40, 7, 1<<memEnvBits - 1, 1 << memEnvBits, math.MinInt64, 3}
	versions := []int64{0, 1 << 33, 3, math.MaxUint32, math.MaxUint32 + 1, 9, math.MaxInt64, 1}
	mem, file := memAndFileBuffers(t, capacity, layout)

	compare := func(t *testing.T, got, want *Buffer) {
		t.Helper()
		seqs := want.LiveSeqs(0, capacity)
		if len(seqs) == 0 {
			t.Fatal("no live rows")
		}
		g, w := metas(t, got, seqs...), metas(t, want, seqs...)
		for i := range seqs {
			if got.compactRecords() {
				checkEvictFields(t, got, seqs[i])
			}
			if g[i] != w[i] {
				t.Fatalf("seq %d: memory record reads %+v, file record %+v", seqs[i], g[i], w[i])
			}
		}
		// The final observations: dense in memory (tailIndex), at the
		// slot in files.
		var tails [2][]byte
		for k, b := range []*Buffer{got, want} {
			col, _ := b.Column("next.observation")
			tails[k] = make([]byte, len(seqs)*col.RowBytes)
			if missing, err := b.Gather(seqs, []Column{col}, [][]byte{tails[k]}, nil); err != nil || len(missing) > 0 {
				t.Fatalf("gather final observations: %v, %d missing", err, len(missing))
			}
		}
		if !bytes.Equal(tails[0], tails[1]) {
			t.Fatalf("final observations differ:\nmemory %x\nfile   %x", tails[0], tails[1])
		}
	}
	wideLive := func(b *Buffer) (n int) {
		for _, seq := range b.LiveSeqs(0, capacity) {
			m := metas(t, b, seq)[0]
			if !narrowFits(&record{Seq: seq, PrevSeq: m.PrevSeq, Env: m.Env, PolicyVersion: m.PolicyVersion}) {
				n++
			}
		}
		return n
	}

	for round := range 9 { // 9 batches of 8 rows: the 24-slot ring wraps three times
		rows := make([]row, 8)
		batchVersions := make([]int64, 8)
		for i := range rows {
			k := (round + i) % len(envs)
			rows[i] = row{env: envs[k], val: float32(round*8 + i), terminated: (round+i)%5 == 4, final: -float32(round*8 + i)}
			batchVersions[i] = versions[(round*3+i)%len(versions)]
		}
		for _, b := range []*Buffer{mem, file} {
			batch := makeBatch(b.spec, rows, true)
			batch.PolicyVersion = batchVersions
			mustExtend(t, b, "actor", batch)
		}
		compare(t, mem, file)
		if layout != RowMetaPerRow {
			checkRuns(t, mem)
			continue
		}
		// Every wide live row has its entry; entries of overwritten
		// wide rows are gone (a slot holds one row at a time). A ring
		// with a spare block keeps those of rows that left the window
		// until their slots are written again.
		live := 0
		for slot := range mem.wide.m {
			if seq := mem.stamps.Load(slot); seq >= 0 && mem.Live(seq) {
				live++
			}
		}
		if got, want := live, wideLive(mem); got != want || len(mem.wide.m) > live+int(mem.slots-mem.capacity) {
			t.Fatalf("after batch %d: %d wide entries (%d of live rows), %d live rows are wide", round, len(mem.wide.m), got, want)
		}
	}
	if layout == RowMetaPerRow && wideLive(mem) == 0 {
		t.Fatal("the test wrote no wide row that is still live")
	}
	metaBytes := map[RowMetaLayout]int64{RowMetaPerRow: 64 - 31, RowMetaRuns: 48 - 31, RowMetaStrided: 40 - 31}[layout]
	for _, c := range []struct {
		b    *Buffer
		want int64
	}{{mem, metaBytes}, {file, file.fileRecordSize()}} {
		info, err := c.b.Info()
		if err != nil || info.RowMetaBytes != c.want {
			t.Errorf("%s: row_meta_bytes %d (%v), want %d", c.b.Name(), info.RowMetaBytes, err, c.want)
		}
	}

	dest := filepath.Join(t.TempDir(), "cp")
	if _, err := mem.Checkpoint(context.Background(), dest, nil); err != nil {
		t.Fatal(err)
	}
	cs := openStore(t, dest)
	restored := mustBuffer(t, cs, "mem")
	if !restored.compactRecords() || restored.tailIx == nil {
		t.Error("a restored memory buffer should hold memory records and dense tails")
	}
	compare(t, restored, file)
	if layout != RowMetaPerRow {
		if restored.runs == nil {
			t.Fatal("the restored buffer has no run records")
		}
		checkRuns(t, restored)
	}
	if err := cs.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(dest, nil)
	if err != nil || !rep.OK() {
		t.Fatalf("verify of the checkpoint: %v, %+v", err, rep)
	}
}

// memAndFileBuffers creates a memory buffer of the given layout and a
// memmap buffer (the reference) with the same spec otherwise, each in a
// store of its own (trajectory ids are counted per store, and the two
// must hand out the same ones). The stores close with the test.
func memAndFileBuffers(t *testing.T, capacity int64, layout RowMetaLayout) (mem, file *Buffer) {
	s, fs := openStore(t, t.TempDir()), openStore(t, t.TempDir())
	t.Cleanup(func() { s.Close(); fs.Close() })
	spec := testSpec(KindMemory, capacity, true)
	spec.RowMetaLayout = layout
	// The reference keeps 64-byte file records: rows.meta version 2 would
	// share the run code under test.
	ref := testSpec(KindMemmap, capacity, true)
	ref.RowMetaLayout = RowMetaPerRow
	return mustCreate(t, s, "mem", spec), mustCreate(t, fs, "file", ref)
}

// TestRunTableMapsAsItGrows: a run table for 10^8 rows maps nothing until
// a handle is handed out, then a 256 KiB block per 4,096 handles; a table
// for 10 rows hands out 10 handles from one block.
func TestRunTableMapsAsItGrows(t *testing.T) {
	rt := newRunTable(100_000_000, false)
	defer rt.close()
	if len(rt.regions) != 0 {
		t.Fatalf("%d blocks mapped before any run", len(rt.regions))
	}
	for i := range runBlockRuns + 10 {
		r := record{Seq: int64(i), TrajID: int64(i), PrevSeq: -1, Flags: flagDone}
		if _, _, _, ok := rt.place(&r); !ok {
			t.Fatalf("run %d: no handle", i)
		}
	}
	if len(rt.regions) != 2 || len(rt.regions[0].Bytes()) != runBlockRuns*runRecordSize {
		t.Fatalf("%d runs: %d blocks mapped, want 2 of %d bytes", runBlockRuns+10, len(rt.regions), runBlockRuns*runRecordSize)
	}
	small := newRunTable(10, false)
	defer small.close()
	for i := range 10 {
		r := record{Seq: int64(i), TrajID: int64(i), PrevSeq: -1, Flags: flagDone}
		small.place(&r)
	}
	r := record{Seq: 10, TrajID: 10, PrevSeq: -1}
	if _, _, _, ok := small.place(&r); ok {
		t.Error("an 11th live run in a table for 10 rows got a handle")
	}
	if len(small.regions) != 1 || len(small.blocks) != 1 {
		t.Errorf("a table for 10 rows has %d blocks, %d mapped", len(small.blocks), len(small.regions))
	}
}

// putReadBack writes want as the memory record of its slot, reads it back
// and compares, and returns the slot. The caller holds b.wmu.
func putReadBack(t *testing.T, b *Buffer, want record) int64 {
	t.Helper()
	slot := want.Seq % b.slots
	b.putMemRecord(slot, &want)
	var got record
	b.memRecord(want.Seq, &got)
	got.Seq = want.Seq
	if got != want {
		t.Errorf("seq %d: wrote %+v, read %+v", want.Seq, want, got)
	}
	return slot
}

// fourSlotBuffer is a compact memory buffer of 4 slots with the given
// row_meta, in a store closed with the test.
func fourSlotBuffer(t *testing.T, layout RowMetaLayout) *Buffer {
	s := openStore(t, t.TempDir())
	t.Cleanup(func() { s.Close() })
	spec := testSpec(KindMemory, 4, true)
	spec.RowMetaLayout = layout
	return mustCreate(t, s, "m", spec)
}

// TestMemoryRecordFarPrev covers the wide values no test can write
// through Extend in reasonable time: a previous row more than 2^32 seqs
// back (a trajectory of an env that was quiet while 4 billion rows went
// by) and a step of 2^34, next to every narrow slot at its largest value.
// It also checks that a narrow row written over a wide one drops the wide
// entry.
func TestMemoryRecordFarPrev(t *testing.T) {
	s := openStore(t, t.TempDir())
	defer s.Close()
	b := mustCreate(t, s, "m", testSpec(KindMemory, 4, true))
	cases := []record{
		{Seq: 1 << 33, TrajID: 12, Step: 1 << 34, PrevSeq: 5, Env: 2, Flags: flagDone | flagTerminated | flagHasTail, PolicyVersion: 4},
		{Seq: 1<<33 + 1, TrajID: 13, Step: 0, PrevSeq: -1, Env: 2, PolicyVersion: 4},
		// Every narrow slot at its largest value.
		{Seq: 1<<33 + 2, TrajID: 13, Step: math.MaxUint32, PrevSeq: 1<<33 + 2 - math.MaxUint32, Env: 1<<memEnvBits - 1, PolicyVersion: math.MaxUint32, Flags: flagDone | flagTruncated | flagHasTail},
		{Seq: 1<<33 + 3, TrajID: 13, Step: 2, PrevSeq: 1<<33 + 2 - math.MaxUint32 - 1, Env: 1, Flags: flagTruncated},
	}
	b.wmu.Lock()
	defer b.wmu.Unlock()
	for _, want := range cases {
		slot := putReadBack(t, b, want)
		if _, wide := b.wide.m[slot]; wide == narrowFits(&want) {
			t.Errorf("seq %d: wide entry %v, want %v", want.Seq, wide, !narrowFits(&want))
		}
	}
	narrow := record{Seq: 1<<33 + b.slots, TrajID: 14, PrevSeq: -1}
	b.putMemRecord(narrow.Seq%b.slots, &narrow) // over the far prev of slot 0
	if len(b.wide.m) != 1 || b.wide.n != 1 {
		t.Errorf("after narrowing slot 0: wide entries %v (n=%d), want only slot 3's", b.wide.m, b.wide.n)
	}
}

// checkRuns holds a memory buffer's run table to its rows: every handle's
// reference count is the number of slots whose record names it (live or
// not: a slot keeps its reference until it is written again), released
// handles have none and are each free once, the live count is right, and
// every open run is live and belongs to its trajectory.
func checkRuns(t *testing.T, b *Buffer) {
	t.Helper()
	rt := b.runs
	named := make([]uint32, len(rt.refs))
	for slot := range b.slots {
		w := binary.LittleEndian.Uint32(b.recs[slot*b.recPitch+b.runs.wordOff:])
		if h := w & memRunMask; h != 0 {
			if int(h) >= len(named) {
				t.Fatalf("slot %d names handle %d, only %d handed out", slot, h, len(named))
			}
			named[h]++
		}
	}
	var live int64
	free := map[uint32]bool{}
	for _, h := range rt.free {
		if free[h] || rt.refs[h] != 0 {
			t.Fatalf("handle %d freed twice or with %d references", h, rt.refs[h])
		}
		free[h] = true
	}
	for h := 1; h < len(rt.refs); h++ {
		if rt.refs[h] != named[h] {
			t.Fatalf("handle %d: %d references counted, %d slots name it", h, rt.refs[h], named[h])
		}
		if rt.refs[h] > 0 {
			live++
		} else if !free[uint32(h)] {
			t.Fatalf("handle %d has no reference and is not free: leaked", h)
		}
	}
	if live != rt.live || live > b.slots {
		t.Fatalf("%d runs live, the table counts %d (%d slots)", live, rt.live, b.slots)
	}
	var irregular int64
	for h := 1; h < len(rt.refs); h++ {
		if rt.refs[h] > 0 && rt.isIrregular(uint32(h)) {
			irregular++
		}
	}
	if got := rt.irregularLive.Load(); got != irregular {
		t.Fatalf("%d irregular runs live, the table counts %d", irregular, got)
	}
	for _, o := range rt.recent {
		if o != nil && rt.open[o.traj] != o {
			t.Fatalf("the open-run cache holds trajectory %d's run %d, which is not open", o.traj, o.handle)
		}
	}
	for traj, o := range rt.open {
		if o.traj != traj {
			t.Fatalf("trajectory %d's open run says trajectory %d", traj, o.traj)
		}
		if rt.refs[o.handle] == 0 {
			t.Fatalf("trajectory %d continues released run %d", traj, o.handle)
		}
		if got := int64(binary.LittleEndian.Uint64(rt.rec(o.handle)[runTraj:])); got != traj {
			t.Fatalf("trajectory %d continues run %d of trajectory %d", traj, o.handle, got)
		}
	}
}

// checkEvictFields checks that what an eviction reads of seq's row
// (evictFields) is what the row's whole record says (memFields).
func checkEvictFields(t *testing.T, b *Buffer, seq int64) {
	t.Helper()
	slot := seq % b.slots
	traj, version, flags := b.evictFields(slot, seq)
	wantTraj, _, _, _, wantVersion, wantFlags := b.memFields(slot, seq)
	if traj != wantTraj || version != wantVersion || flags != wantFlags {
		t.Errorf("seq %d: eviction reads trajectory %d, version %d, flags %#x; the record says %d, %d, %#x",
			seq, traj, version, flags, wantTraj, wantVersion, wantFlags)
	}
}

// TestMemoryRecordRuns writes records straight into a memory buffer's
// slots and reads each back: values no Extend writes in reasonable time
// (a previous row 2^17 seqs back, a step of 2^34, versions and envs at
// the ends of int64), runs that continue, break on a changed env or
// version or a far prev, and a table with room for one run, so that rows
// beyond it keep wide values and go back to runs when one is free.
func TestMemoryRecordRuns(t *testing.T) {
	b := fourSlotBuffer(t, RowMetaRuns)
	const far = 1 << 33
	ring := b.slots // 4, or more with a spare block
	cases := []struct {
		rec  record
		wide bool
	}{
		{rec: record{Seq: far, TrajID: 12, Step: 1 << 34, PrevSeq: 5, Env: math.MinInt64, Flags: flagTerminated | flagHasTail, PolicyVersion: math.MaxInt64}},
		// Continues trajectory 12's run: offset 1, distance 1.
		{rec: record{Seq: far + 1, TrajID: 12, Step: 1<<34 + 1, PrevSeq: far, Env: math.MinInt64, PolicyVersion: math.MaxInt64}},
		// A second trajectory: the one-run table is full.
		{rec: record{Seq: far + 2, TrajID: 13, Step: 0, PrevSeq: -1, Env: 2, PolicyVersion: 4}, wide: true},
		// Over slot 0 (trajectory 12's first row): the run lives on in
		// slot 1, so trajectory 13 is still wide.
		{rec: record{Seq: far + ring, TrajID: 13, Step: 1, PrevSeq: far + 2, Env: 2, Flags: flagDone | flagTruncated, PolicyVersion: 4}, wide: true},
		// Over slot 1: run 1 is released, and taken by the next row.
		{rec: record{Seq: far + ring + 1, TrajID: 14, Step: 7, PrevSeq: far + ring + 1 - (1 << 17), Env: 1, Flags: flagDone, PolicyVersion: -3}},
	}
	b.wmu.Lock()
	defer b.wmu.Unlock()
	limit := b.runs.limit
	b.runs.limit = 2 // handle 1 only
	for _, c := range cases {
		slot := putReadBack(t, b, c.rec)
		if _, wide := b.wide.m[slot]; wide != c.wide {
			t.Errorf("seq %d: wide entry %v, want %v", c.rec.Seq, wide, c.wide)
		}
		checkEvictFields(t, b, c.rec.Seq)
		checkRuns(t, b)
	}
	if len(b.wide.m) != 2 || b.wide.n != 2 {
		t.Errorf("wide entries %v (n=%d), want slots 2 and 0", b.wide.m, b.wide.n)
	}
	// Far prevs and changed versions and envs each start a run.
	b.runs.limit = limit
	base := far + 2*ring
	rows := []record{
		{Seq: base, TrajID: 20, Step: 0, PrevSeq: -1, Env: 1, PolicyVersion: 1},
		{Seq: base + 1, TrajID: 20, Step: 1, PrevSeq: base, Env: 1, PolicyVersion: 2},     // version changed
		{Seq: base + 2, TrajID: 20, Step: 2, PrevSeq: base + 1, Env: 3, PolicyVersion: 2}, // env changed
		{Seq: base + 3, TrajID: 20, Step: 3, PrevSeq: base + 2, Env: 3, PolicyVersion: 2}, // continues
	}
	var handles []uint32
	for i := range rows {
		slot := rows[i].Seq % b.slots
		b.putMemRecord(slot, &rows[i])
		handles = append(handles, binary.LittleEndian.Uint32(b.recs[slot*b.recPitch+b.runs.wordOff:])&memRunMask)
	}
	for i := range rows {
		var got record
		b.memRecord(rows[i].Seq, &got)
		got.Seq = rows[i].Seq
		if got != rows[i] {
			t.Errorf("seq %d: wrote %+v, read %+v", rows[i].Seq, rows[i], got)
		}
	}
	if handles[0] == handles[1] || handles[1] == handles[2] || handles[2] != handles[3] {
		t.Errorf("run handles %v: want a new run at each change and the last row continuing the third", handles)
	}
	checkRuns(t, b)
}

// TestRunRecordsProperty writes random interleaved batches from three
// streams into a small memory buffer with run records and a memmap buffer
// (the reference: 64-byte file records), with episodes ending, envs and
// policy versions changing now and then and the ring wrapping many times,
// and after every batch compares every live row's metadata and holds the
// run table to its rows (checkRuns). Runs must continue across batches:
// at the end the buffer has fewer runs than rows.
//
// In the strided layout the same irregular writes break runs wherever a
// row's distance back differs from its run's stride; the test checks the
// metadata only, and TestStridedRunsLockstep how many runs lockstep
// writers make.
func TestRunRecordsProperty(t *testing.T) {
	for _, layout := range []RowMetaLayout{RowMetaRuns, RowMetaStrided} {
		t.Run(string(layout), func(t *testing.T) { testRunRecordsProperty(t, layout) })
	}
}

func testRunRecordsProperty(t *testing.T, layout RowMetaLayout) {
	const capacity = 64
	rng := rand.New(rand.NewPCG(11, 12))
	mem, file := memAndFileBuffers(t, capacity, layout)
	streams := []string{"a", "b", "c"}
	version := map[string]int64{}
	for batchNo := range 300 {
		stream := streams[rng.IntN(len(streams))]
		if rng.IntN(5) == 0 {
			version[stream] += 1 + rng.Int64N(1<<40) // far versions too
		}
		rows := make([]row, 1+rng.IntN(20))
		versions := make([]int64, len(rows))
		for i := range rows {
			rows[i] = row{env: rng.Int64N(3), val: float32(batchNo*100 + i), terminated: rng.IntN(20) == 0, final: float32(-i)}
			versions[i] = version[stream]
		}
		for _, b := range []*Buffer{mem, file} {
			batch := makeBatch(b.spec, rows, true)
			batch.PolicyVersion = versions
			mustExtend(t, b, stream, batch)
		}
		seqs := file.LiveSeqs(0, capacity)
		g, w := metas(t, mem, seqs...), metas(t, file, seqs...)
		for i := range seqs {
			if g[i] != w[i] {
				t.Fatalf("batch %d, seq %d: run records read %+v, file record %+v", batchNo, seqs[i], g[i], w[i])
			}
		}
		checkRuns(t, mem)
	}
	// Strided runs of rows at irregular distances continue as irregular
	// runs: without them this test's strided buffer held 36 runs for 64
	// rows. (Slots hold their rows' runs until written again: in a ring
	// with a spare block, rows that left the window too.)
	if held := min(mem.writeCount.Load(), mem.slots); mem.runs.live*2 > held {
		t.Fatalf("%d runs for %d rows in the slots: runs did not continue", mem.runs.live, held)
	}
	if info, err := mem.Info(); err != nil || info.RunRecords != mem.runs.live || info.RunRecords == 0 {
		t.Fatalf("info run_records %d (%v), the table holds %d", info.RunRecords, err, mem.runs.live)
	}
	if info, _ := file.Info(); file.rlog == nil && info.RunRecords != 0 {
		t.Fatalf("a memmap buffer without run records reports %d", info.RunRecords)
	}
	if len(mem.runs.refs) > capacity+1 {
		t.Fatalf("%d run handles handed out for a ring of %d", len(mem.runs.refs)-1, capacity)
	}
}

func TestRowGroupPitch(t *testing.T) {
	cases := []struct {
		recBytes, fieldBytes, want int64
	}{
		{memRecordSize, 0, 32},
		{memRecordSize, 1, 64},
		{memRecordSize, 31, 64}, // compact CartPole: one cache line a row
		{memRecordSize, 32, 64},
		{memRecordSize, 33, 72},
		{memRecordSize, 47, 80}, // CartPole with next.observation
		{memRecordSize, 100, 136},
		{memRecordSize, 128, 160},
		{memRunRecordSize, 0, 16},
		{memRunRecordSize, 1, 32},
		{memRunRecordSize, 16, 32},
		{memRunRecordSize, 17, 48},
		{memRunRecordSize, 31, 48}, // compact CartPole: 16 bytes less
		{memRunRecordSize, 32, 48},
		{memRunRecordSize, 33, 64},
		{memRunRecordSize, 47, 64}, // CartPole with next.observation: one line
		{memRunRecordSize, 49, 72},
		{memRunRecordSize, 128, 144},
		{memStridedRecordSize, 0, 8},
		{memStridedRecordSize, 1, 16},
		{memStridedRecordSize, 8, 16},
		{memStridedRecordSize, 31, 40}, // compact CartPole: 24 bytes less than the row layout
		{memStridedRecordSize, 33, 48},
		{memStridedRecordSize, 47, 56},
	}
	for _, tc := range cases {
		if got := rowGroupPitch(tc.recBytes, tc.fieldBytes); got != tc.want {
			t.Errorf("rowGroupPitch(%d, %d) = %d, want %d", tc.recBytes, tc.fieldBytes, got, tc.want)
		}
	}
}

// TestStridedRunsLockstep writes what collectors write, envs stepping in
// lockstep (each batch a few steps of every env, in env order), with
// episodes of different lengths ending at different steps, into a strided
// memory buffer and a file-record reference, and compares every live
// row's metadata after every batch. Each episode must take one run: the
// live runs are at most the live trajectories plus the envs (a run per
// episode that is still partly in the ring).
func TestStridedRunsLockstep(t *testing.T) {
	const capacity, envs = 600, 8
	mem, file := memAndFileBuffers(t, capacity, RowMetaStrided)
	rng := rand.New(rand.NewPCG(5, 6))
	left := make([]int, envs) // steps left in each env's episode
	for e := range left {
		left[e] = 5 + rng.IntN(40)
	}
	for batchNo := range 40 {
		rows := lockstepRows(left[:], 4, func() int { return 5 + rng.IntN(40) })
		for _, b := range []*Buffer{mem, file} {
			mustExtend(t, b, "collector", makeBatch(b.spec, rows, true))
		}
		seqs := file.LiveSeqs(0, capacity)
		g, w := metas(t, mem, seqs...), metas(t, file, seqs...)
		trajs := map[int64]bool{}
		for i := range seqs {
			if g[i] != w[i] {
				t.Fatalf("batch %d, seq %d: strided runs read %+v, file record %+v", batchNo, seqs[i], g[i], w[i])
			}
			trajs[w[i].TrajID] = true
		}
		checkRuns(t, mem)
		if mem.runs.live > int64(len(trajs))+envs {
			t.Fatalf("batch %d: %d runs for %d live trajectories of %d envs in lockstep", batchNo, mem.runs.live, len(trajs), envs)
		}
	}
	if mem.runs.irr.Load() != nil {
		t.Fatal("lockstep writers mapped the side table of irregular runs")
	}
}

// TestStridedRunsTwoCollectors writes what two collectors write into one
// strided buffer: each 32 steps of its 8 envs in lockstep an extend, the
// two taking turns, so every trajectory's rows jump by the other's extend
// at each of its own extends' edges, and an episode's first run is often
// cut short there. That is one early break, not rows at irregular
// distances: the metadata must match the file records, and (nearly) no
// row may go to an irregular run (with a run made irregular after any
// early break, 1,059 of these 4,096 rows did; after two in a row, none).
func TestStridedRunsTwoCollectors(t *testing.T) {
	const capacity, envs = 4096, 8
	mem, file := memAndFileBuffers(t, capacity, RowMetaStrided)
	rng := rand.New(rand.NewPCG(5, 6))
	var left [2][envs]int // steps left in each env's episode
	for c := range left {
		for e := range left[c] {
			left[c][e] = 5 + rng.IntN(40)
		}
	}
	for batchNo := range 100 {
		c := batchNo % 2
		rows := lockstepRows(left[c][:], 32, func() int { return 5 + rng.IntN(40) })
		for _, b := range []*Buffer{mem, file} {
			mustExtend(t, b, fmt.Sprintf("collector%d", c), makeBatch(b.spec, rows, true))
		}
	}
	seqs := file.LiveSeqs(0, capacity)
	g, w := metas(t, mem, seqs...), metas(t, file, seqs...)
	irregular := 0
	for i, seq := range seqs {
		if g[i] != w[i] {
			t.Fatalf("seq %d: strided runs read %+v, file record %+v", seq, g[i], w[i])
		}
		h := binary.LittleEndian.Uint32(mem.recs[(seq%mem.slots)*mem.recPitch+mem.runs.wordOff:]) & memRunMask
		if h != 0 && mem.runs.isIrregular(h) {
			irregular++
		}
	}
	checkRuns(t, mem)
	if irregular*100 > len(seqs) {
		t.Fatalf("%d of %d live rows in irregular runs: two collectors' rows are evenly spaced but for their extends' edges", irregular, len(seqs))
	}
}

// lockstepRows is steps ticks of len(left) envs stepped together, as a
// collector writes them: left[e] is the steps left in env e's episode,
// which ends terminated and starts again at episode() steps.
func lockstepRows(left []int, steps int, episode func() int) []row {
	var rows []row
	for range steps {
		for e := range left {
			left[e]--
			rows = append(rows, row{env: int64(e), val: float32(len(rows)), terminated: left[e] == 0, final: -1})
			if left[e] == 0 {
				left[e] = episode()
			}
		}
	}
	return rows
}

// TestStridedSideTableGivenBack: rows of actors that send a step at a time
// fill irregular runs and their side table entries; once a collector's
// rows have overwritten every one of them, the table's pages are given
// back (every entry reads zero again) and the buffer reads as a file
// record buffer fed the same rows does.
func TestStridedSideTableGivenBack(t *testing.T) {
	const capacity, actors, envs = 4096, 64, 8
	mem, file := memAndFileBuffers(t, capacity, RowMetaStrided)
	rng := rand.New(rand.NewPCG(9, 10))
	var left [actors]int
	for a := range left {
		left[a] = 20 + rng.IntN(60)
	}
	for range 2 * capacity {
		a := rng.IntN(actors)
		left[a]--
		rows := []row{{env: int64(a), val: float32(left[a]), terminated: left[a] == 0, final: -1}}
		if left[a] == 0 {
			left[a] = 20 + rng.IntN(60)
		}
		for _, b := range []*Buffer{mem, file} {
			mustExtend(t, b, fmt.Sprintf("actor%d", a), makeBatch(b.spec, rows, true))
		}
	}
	entries := func() (nonzero int) {
		irr := mem.runs.irr.Load()
		if irr == nil {
			t.Fatal("actors' rows mapped no side table")
		}
		for slot := range int64(capacity) {
			if *irrAt(irr, slot) != 0 {
				nonzero++
			}
		}
		return nonzero
	}
	if n := entries(); mem.runs.irregularLive.Load() == 0 || n < capacity/2 {
		t.Fatalf("after the actors: %d irregular runs live, %d side table entries", mem.runs.irregularLive.Load(), n)
	}
	checkRuns(t, mem)
	for range 2 * capacity / (32 * envs) {
		rows := lockstepRows(left[:envs], 32, func() int { return 20 + rng.IntN(60) })
		for _, b := range []*Buffer{mem, file} {
			mustExtend(t, b, "collector", makeBatch(b.spec, rows, true))
		}
	}
	if n := entries(); mem.runs.irregularLive.Load() != 0 || n != 0 || mem.runs.irrDirty {
		t.Fatalf("after the collector overwrote the ring: %d irregular runs live, %d side table entries, dirty %v", mem.runs.irregularLive.Load(), n, mem.runs.irrDirty)
	}
	checkRuns(t, mem)
	seqs := file.LiveSeqs(0, capacity)
	g, w := metas(t, mem, seqs...), metas(t, file, seqs...)
	for i, seq := range seqs {
		if g[i] != w[i] {
			t.Fatalf("seq %d: strided runs read %+v, file record %+v", seq, g[i], w[i])
		}
	}
}

// TestStridedRuns writes strided records straight into a memory buffer's
// slots and reads each back: a run's second row sets its stride (any
// distance below 2^32: 2^31 + 2 here), rows at that stride continue it, a row at another
// distance, a changed env or version, or a row past the run's span start
// one, and with a table of one run the rows beyond it keep wide values.
func TestStridedRuns(t *testing.T) {
	b := fourSlotBuffer(t, RowMetaStrided)
	const base = 1 << 41
	cases := []struct {
		rec     record
		newRun  bool
		comment string
	}{
		{rec: record{Seq: base, TrajID: 1, Step: 1 << 34, PrevSeq: 9, Env: math.MinInt64, Flags: flagHasTail, PolicyVersion: math.MaxInt64}, newRun: true},
		{rec: record{Seq: base + 1<<31 + 2, TrajID: 1, Step: 1<<34 + 1, PrevSeq: base, Env: math.MinInt64, PolicyVersion: math.MaxInt64}, comment: "a stride of 2^31+2 (slot 2)"},
		{rec: record{Seq: base + 2<<31 + 4, TrajID: 1, Step: 1<<34 + 2, PrevSeq: base + 1<<31 + 2, Env: math.MinInt64, PolicyVersion: math.MaxInt64}, newRun: true, comment: "the same stride, past the span"},
		{rec: record{Seq: base + 2<<40 + 5, TrajID: 2, Step: 0, PrevSeq: -1, Env: 3, PolicyVersion: 0}, newRun: true},
		{rec: record{Seq: base + 2<<40 + 6, TrajID: 2, Step: 1, PrevSeq: base + 2<<40 + 5, Env: 3, PolicyVersion: 0}, comment: "stride 1"},
		{rec: record{Seq: base + 2<<40 + 7, TrajID: 2, Step: 2, PrevSeq: base + 2<<40 + 6, Env: 3, PolicyVersion: 0, Flags: flagTruncated}},
		{rec: record{Seq: base + 2<<40 + 9, TrajID: 2, Step: 3, PrevSeq: base + 2<<40 + 7, Env: 3, PolicyVersion: 0}, newRun: true, comment: "distance 2 in a run of stride 1"},
		{rec: record{Seq: base + 2<<40 + 12, TrajID: 2, Step: 4, PrevSeq: base + 2<<40 + 9, Env: 3, PolicyVersion: 0}, comment: "stride 3"},
		{rec: record{Seq: base + 2<<40 + 15, TrajID: 2, Step: 5, PrevSeq: base + 2<<40 + 12, Env: 3, PolicyVersion: 1}, newRun: true, comment: "version changed"},
		{rec: record{Seq: base + 2<<40 + 18, TrajID: 2, Step: 6, PrevSeq: base + 2<<40 + 15, Env: 4, PolicyVersion: 1, Flags: flagDone | flagTerminated}, newRun: true, comment: "env changed"},
	}
	b.wmu.Lock()
	defer b.wmu.Unlock()
	var last uint32
	for i, c := range cases {
		slot := putReadBack(t, b, c.rec)
		h := binary.LittleEndian.Uint32(b.recs[slot*b.recPitch+b.runs.wordOff:]) & memRunMask
		if i > 0 && (h != last) != c.newRun {
			t.Errorf("seq %d (%s): run %d after run %d, want a new run %v", c.rec.Seq, c.comment, h, last, c.newRun)
		}
		last = h
		checkRuns(t, b)
	}
	// A fresh table with room for one run: a second trajectory's rows
	// are wide until the run is released.
	if err := b.runs.close(); err != nil {
		t.Fatal(err)
	}
	b.runs = newRunTable(b.slots, true)
	b.runs.limit = 2
	clear(b.recs)
	b.wide = wideRecords{}
	rows := []struct {
		rec  record
		wide bool
	}{
		{rec: record{Seq: 8, TrajID: 5, Step: 0, PrevSeq: -1, Env: 1}},
		{rec: record{Seq: 9, TrajID: 6, Step: 0, PrevSeq: -1, Env: 2}, wide: true},
		{rec: record{Seq: 10, TrajID: 5, Step: 1, PrevSeq: 8, Env: 1}},
		{rec: record{Seq: 8 + b.slots, TrajID: 7, Step: 0, PrevSeq: -1, Env: 2, Flags: flagDone}, wide: true}, // over seq 8
		{rec: record{Seq: 10 + b.slots, TrajID: 8, Step: 0, PrevSeq: -1, Env: 2}},                             // over seq 10: run 1 is released
	}
	for _, c := range rows {
		slot := c.rec.Seq % b.slots
		b.stamps.Store(slot, -1)
		putReadBack(t, b, c.rec)
		if _, wide := b.wide.m[slot]; wide != c.wide {
			t.Errorf("seq %d: wide entry %v, want %v", c.rec.Seq, wide, c.wide)
		}
		checkRuns(t, b)
	}
}

// TestStridedIrregularRuns writes strided records straight into a memory
// buffer's slots and reads each back: a run that breaks its stride early
// makes its trajectory's next run irregular, whose rows keep their offsets
// and distances (up to 65,535) in the side table, mapped at the first such
// row; a long run that breaks its stride is followed by a regular one; and
// where the side table cannot be mapped, rows start runs as before.
func TestStridedIrregularRuns(t *testing.T) {
	type step struct {
		seq, step, prev int64
		newRun          bool
		comment         string
	}
	run := func(t *testing.T, b *Buffer, traj int64, steps []step) {
		t.Helper()
		var last uint32
		for i, c := range steps {
			r := record{Seq: c.seq, TrajID: traj, Step: c.step, PrevSeq: c.prev, Env: 1}
			slot := putReadBack(t, b, r)
			h := binary.LittleEndian.Uint32(b.recs[slot*b.recPitch+b.runs.wordOff:]) & memRunMask
			if i > 0 && (h != last) != c.newRun {
				t.Errorf("seq %d (%s): run %d after run %d, want a new run %v", c.seq, c.comment, h, last, c.newRun)
			}
			last = h
			checkRuns(t, b)
		}
	}
	// A ring larger than the seqs written: no row overwrites another, so
	// a handle seen again is the same run, not a released one reused.
	ringOf := func(t *testing.T) *Buffer {
		s := openStore(t, t.TempDir())
		t.Cleanup(func() { s.Close() })
		spec := testSpec(KindMemory, 1<<18, true)
		spec.RowMetaLayout = RowMetaStrided
		return mustCreate(t, s, "m", spec)
	}
	const far = maxRunDist
	irregular := []step{
		{seq: 100, step: 0, prev: -1, newRun: true},
		{seq: 102, step: 1, prev: 100, comment: "stride 2"},
		{seq: 105, step: 2, prev: 102, newRun: true, comment: "off the stride after 2 rows: a regular run (one early break)"},
		{seq: 106, step: 3, prev: 105, comment: "stride 1"},
		{seq: 108, step: 4, prev: 106, newRun: true, comment: "off the stride after 2 rows again: an irregular run"},
		{seq: 109, step: 5, prev: 108, comment: "distance 1"},
		{seq: 109 + far, step: 6, prev: 109, comment: "the farthest distance a side table entry holds"},
		{seq: 109 + 2*far + 1, step: 7, prev: 109 + far, newRun: true, comment: "one further: the next run, irregular too"},
		{seq: 109 + 2*far + 8, step: 8, prev: 109 + 2*far + 1, comment: "distance 7"},
		{seq: 109 + 2*far + 9, step: 9, prev: 109 + 2*far + 8, comment: "distance 1"},
	}
	// Then evenly spaced again: 15 more rows at distance 1 stay in the
	// irregular run (16 in a row with the last one), the next starts a
	// regular run, which the rows after it continue.
	evenAgain := slices.Clone(irregular)
	for i := range int64(18) {
		last := evenAgain[len(evenAgain)-1]
		c := step{seq: last.seq + 1, step: last.step + 1, prev: last.seq, comment: fmt.Sprintf("distance 1, %d rows evenly spaced", i+2)}
		if i == 15 {
			c.newRun, c.comment = true, "the 17th row at distance 1: a regular run"
		}
		evenAgain = append(evenAgain, c)
	}
	t.Run("irregular", func(t *testing.T) {
		b := ringOf(t)
		b.wmu.Lock()
		defer b.wmu.Unlock()
		run(t, b, 3, irregular[:4])
		if b.runs.irr.Load() != nil {
			t.Fatal("side table mapped before any irregular row")
		}
		b2 := ringOf(t)
		b2.wmu.Lock()
		defer b2.wmu.Unlock()
		run(t, b2, 3, irregular)
		if b2.runs.irr.Load() == nil {
			t.Fatal("irregular rows written, no side table")
		}
	})
	t.Run("evenly spaced again", func(t *testing.T) {
		b := ringOf(t)
		b.wmu.Lock()
		defer b.wmu.Unlock()
		run(t, b, 3, evenAgain)
		o := b.runs.openOf(3)
		if o == nil || o.stride != 1 || o.off != 2 {
			t.Fatalf("the trajectory's open run %+v, want a regular run of stride 1 and 3 rows", o)
		}
	})
	t.Run("long run", func(t *testing.T) {
		b := ringOf(t)
		b.wmu.Lock()
		defer b.wmu.Unlock()
		var steps []step
		for i := range int64(irregularBelow) {
			steps = append(steps, step{seq: 1000 + i, step: i, prev: 999 + i, comment: "stride 1"})
		}
		steps[0].prev, steps[0].newRun = -1, true
		steps = append(steps,
			step{seq: 1000 + irregularBelow + 1, step: irregularBelow, prev: 999 + irregularBelow, newRun: true, comment: "off the stride after 16 rows: a regular run"},
			step{seq: 1000 + irregularBelow + 3, step: irregularBelow + 1, prev: 1000 + irregularBelow + 1, comment: "stride 2"},
			step{seq: 1000 + irregularBelow + 5, step: irregularBelow + 2, prev: 1000 + irregularBelow + 3, comment: "stride 2"},
		)
		run(t, b, 4, steps)
		if b.runs.irr.Load() != nil {
			t.Fatal("side table mapped for regular runs")
		}
	})
	t.Run("no side table", func(t *testing.T) {
		b := ringOf(t)
		b.wmu.Lock()
		defer b.wmu.Unlock()
		var tries int
		b.runs.mapIrr = func(int64) (*mmapfile.Region, error) {
			tries++
			return nil, errors.New("refused") // as under a commit limit
		}
		steps := slices.Clone(irregular)
		// Regular runs all: 109+far starts one, the row one further
		// sets its stride (65,536), the row at distance 7 starts one.
		steps[6].newRun, steps[6].comment = true, "off the stride of 1"
		steps[7].newRun, steps[7].comment = false, "stride 65,536"
		steps[8].newRun = true
		run(t, b, 3, steps)
		if b.runs.irr.Load() != nil {
			t.Fatal("side table mapped after its mapping failed")
		}
		if tries != 1 {
			t.Fatalf("%d tries to map the side table, want 1 (the next waits %d rows)", tries, irrRetryRows)
		}
	})
}

// TestStridedSideTableRetried checks that a side table the OS refused to
// map is tried again after irrRetryRows rows that would have used it, and
// not before: memory freed later serves irregular runs again, and a
// refusal that lasts costs a system call per irrRetryRows rows.
func TestStridedSideTableRetried(t *testing.T) {
	rt := newRunTable(1024, true)
	t.Cleanup(func() {
		if err := rt.close(); err != nil {
			t.Error(err)
		}
	})
	var tries int
	refuse := true
	rt.mapIrr = func(size int64) (*mmapfile.Region, error) {
		tries++
		if refuse {
			return nil, errors.New("refused")
		}
		return mmapfile.Anonymous(size)
	}
	for _, c := range []struct {
		rows      int // calls of irrMapped
		refuse    bool
		wantTries int
		wantMap   bool
	}{
		{1, true, 1, false},                 // refused
		{irrRetryRows, true, 1, false},      // waiting
		{1, true, 2, false},                 // tried again, refused again
		{irrRetryRows - 1, false, 2, false}, // memory freed, still waiting
		{1, false, 2, false},                // the wait's last row
		{1, false, 3, true},                 // tried again, mapped
		{irrRetryRows, false, 3, true},      // mapped: no more tries
	} {
		refuse = c.refuse
		var mapped bool
		for range c.rows {
			mapped = rt.irrMapped()
		}
		if tries != c.wantTries || mapped != c.wantMap || (rt.irr.Load() != nil) != c.wantMap {
			t.Fatalf("after %d more rows (refusing %v): %d tries, mapped %v (table %v), want %d tries, mapped %v",
				c.rows, c.refuse, tries, mapped, rt.irr.Load() != nil, c.wantTries, c.wantMap)
		}
	}
}

// TestStridedOffset checks the reciprocal division against the division
// at the ends of its range and at random.
func TestStridedOffset(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	strides := []int64{1, 2, 3, 7, 8, 1000, 1<<31 - 1, 1 << 31, maxStridedSpan - 1, maxStridedSpan}
	for range 200 {
		strides = append(strides, 1+rng.Int64N(maxStridedSpan))
	}
	for _, d := range strides {
		var magic uint64
		if d > 1 {
			magic = ^uint64(0)/uint64(d) + 1
		}
		xs := []int64{0, 1, d - 1, d, d + 1, maxStridedSpan - 1, maxStridedSpan}
		for range 50 {
			xs = append(xs, rng.Int64N(maxStridedSpan+1))
		}
		for _, x := range xs {
			if x < 0 {
				continue
			}
			if got, want := stridedOffset(x, d, magic), x/d; got != want {
				t.Fatalf("%d / %d: %d, want %d", x, d, got, want)
			}
		}
	}
}

// TestStridedSeqsPastPassBits: a strided ring takes rows past the seqs its
// pass stamps once stopped at, (2^32 - 1) x capacity, and past a wrap of
// the 31 bits of a pass they keep, with every row's seq, step and link
// exact, the rows it overwrote gone, and samples of the new rows only.
// The write count is moved there by hand (no test writes 2^34 rows); the
// rows go through Extend.
func TestStridedSeqsPastPassBits(t *testing.T) {
	const capacity = 4
	for _, start := range []int64{(1<<32-1)*capacity - 3, (1<<31)*capacity - 3, (1<<33)*capacity + 1} {
		b := fourSlotBuffer(t, RowMetaStrided)
		b.wmu.Lock()
		b.writeCount.Store(start)
		b.wmu.Unlock()
		rows := make([]row, 3)
		for i := range rows {
			rows[i] = row{env: 0, val: float32(i)}
		}
		var want []int64
		for i := range 3 { // 9 rows: the ring goes round twice
			mustExtend(t, b, "s", makeBatch(b.spec, rows, true))
			for k := range int64(3) {
				want = append(want, start+int64(3*i)+k)
			}
		}
		want = want[len(want)-capacity:]
		seqs := b.LiveSeqs(0, 10)
		if !slices.Equal(seqs, want) {
			t.Fatalf("from seq %d: live seqs %v, want %v", start, seqs, want)
		}
		for i, m := range metas(t, b, seqs...) {
			step := int64(9 - capacity + i)
			if m.Seq != seqs[i] || m.Step != step || m.PrevSeq != seqs[i]-1 {
				t.Errorf("from seq %d: row %d: seq %d step %d prev %d, want seq %d step %d prev %d", start, i, m.Seq, m.Step, m.PrevSeq, seqs[i], step, seqs[i]-1)
			}
		}
		for _, seq := range []int64{start, start + 4} { // overwritten
			if b.stamps.Load(seq%b.slots) == seq {
				t.Errorf("from seq %d: overwritten seq %d still stamped", start, seq)
			}
		}
	}
}
