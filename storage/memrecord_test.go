package storage

import (
	"bytes"
	"context"
	"math"
	"path/filepath"
	"testing"
)

// TestMemoryRecordsMatchFileRecords writes the same batches into a memory
// buffer (32-byte memory records) and a memmap buffer (64-byte file
// records, the reference) and compares every live row's metadata, while
// the ring goes round three times so that rows with values too wide for a
// memory record overwrite narrow ones and the other way round. Then the
// memory buffer goes through a hot checkpoint (memory records out as file
// records) and is opened again (file records back in as memory records).
func TestMemoryRecordsMatchFileRecords(t *testing.T) {
	const capacity = 24
	envs := []int64{0, -5, 1 << 40, 7, 1<<memEnvBits - 1, 1 << memEnvBits, math.MinInt64, 3}
	versions := []int64{0, 1 << 33, 3, math.MaxUint32, math.MaxUint32 + 1, 9, math.MaxInt64, 1}
	// Two stores: trajectory ids are counted per store.
	s, fs := openStore(t, t.TempDir()), openStore(t, t.TempDir())
	defer s.Close()
	defer fs.Close()
	mem := mustCreate(t, s, "mem", testSpec(KindMemory, capacity, true))
	file := mustCreate(t, fs, "file", testSpec(KindMemmap, capacity, true))

	compare := func(t *testing.T, got, want *Buffer) {
		t.Helper()
		seqs := want.LiveSeqs(0, capacity)
		if len(seqs) == 0 {
			t.Fatal("no live rows")
		}
		g, w := metas(t, got, seqs...), metas(t, want, seqs...)
		for i := range seqs {
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
		// Every wide live row has its entry; entries of overwritten
		// wide rows are gone (a slot holds one row at a time).
		if got, want := len(mem.wide.m), wideLive(mem); got != want {
			t.Fatalf("after batch %d: %d wide entries, %d live rows are wide", round, got, want)
		}
	}
	if wideLive(mem) == 0 {
		t.Fatal("the test wrote no wide row that is still live")
	}
	for _, c := range []struct {
		b    *Buffer
		want int64
	}{{mem, 64 - 31}, {file, recordSize}} {
		info, err := c.b.Info()
		if err != nil || info.RowMetaBytes != c.want {
			t.Errorf("%s: row_meta_bytes %d (%v), want %d", c.b.Name(), info.RowMetaBytes, err, c.want)
		}
	}

	dest := filepath.Join(t.TempDir(), "cp")
	if _, err := mem.Checkpoint(context.Background(), dest, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := Open(dest, nil)
	if err != nil {
		t.Fatal(err)
	}
	restored, err := cs.Buffer("mem")
	if err != nil {
		t.Fatal(err)
	}
	if !restored.compactRecords() || restored.tailIx == nil {
		t.Error("a restored memory buffer should hold memory records and dense tails")
	}
	compare(t, restored, file)
	if err := cs.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(dest, nil)
	if err != nil || !rep.OK() {
		t.Fatalf("verify of the checkpoint: %v, %+v", err, rep)
	}
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
		slot := want.Seq % b.capacity
		b.putMemRecord(slot, &want)
		var got record
		b.memRecord(want.Seq, &got)
		got.Seq = want.Seq
		if got != want {
			t.Errorf("seq %d: wrote %+v, read %+v", want.Seq, want, got)
		}
		if _, wide := b.wide.m[slot]; wide == narrowFits(&want) {
			t.Errorf("seq %d: wide entry %v, want %v", want.Seq, wide, !narrowFits(&want))
		}
	}
	narrow := record{Seq: 1<<33 + 4, TrajID: 14, PrevSeq: -1}
	b.putMemRecord(narrow.Seq%b.capacity, &narrow) // over the far prev of slot 0
	if len(b.wide.m) != 1 || b.wide.n != 1 {
		t.Errorf("after narrowing slot 0: wide entries %v (n=%d), want only slot 3's", b.wide.m, b.wide.n)
	}
}

func TestRowGroupPitch(t *testing.T) {
	cases := []struct {
		fieldBytes, want int64
	}{
		{0, 32},
		{1, 64},
		{31, 64}, // compact CartPole: one cache line a row
		{32, 64},
		{33, 72},
		{47, 80}, // CartPole with next.observation
		{100, 136},
		{128, 160},
	}
	for _, tc := range cases {
		if got := rowGroupPitch(tc.fieldBytes); got != tc.want {
			t.Errorf("rowGroupPitch(%d) = %d, want %d", tc.fieldBytes, got, tc.want)
		}
	}
}
