package storage

import (
	"slices"
	"testing"
)

// snapshot captures everything a reader can observe of a buffer.
type bufSnapshot struct {
	info  Info
	seqs  []int64
	metas []RowMeta
	bytes [][]byte
}

func takeSnapshot(t *testing.T, b *Buffer) bufSnapshot {
	t.Helper()
	info, err := b.Info()
	if err != nil {
		t.Fatal(err)
	}
	seqs := b.LiveSeqs(0, 1<<30)
	var cols []Column
	var dst [][]byte
	for _, f := range b.Spec().Fields {
		c, _ := b.Column(f.Name)
		cols = append(cols, c)
		dst = append(dst, make([]byte, len(seqs)*c.RowBytes))
	}
	for _, k := range b.Spec().ObsKeys {
		if c, ok := b.Column("next." + k); ok && c.Tail {
			cols = append(cols, c)
			dst = append(dst, make([]byte, len(seqs)*c.RowBytes))
		}
	}
	m := make([]RowMeta, len(seqs))
	missing, err := b.Gather(seqs, cols, dst, m)
	if err != nil || len(missing) > 0 {
		t.Fatalf("gather: missing %v, err %v", missing, err)
	}
	info.Durable = 0 // syncs on close move it
	info.Bytes = nil // disk blocks may change as files are synced
	return bufSnapshot{info, seqs, m, dst}
}

func TestReopenAfterCloseIsIdentical(t *testing.T) {
	for _, compact := range []bool{false, true} {
		dir := t.TempDir()
		s := openStore(t, dir)
		spec := testSpec(KindMemmap, 50, compact)
		b := mustCreate(t, s, "r", spec)
		var rows []row
		for i := 0; i < 70; i++ {
			rows = append(rows, row{env: int64(i % 3), val: float32(i), terminated: i%7 == 6, truncated: i%11 == 10 && i%7 != 6, final: float32(1000 + i)})
		}
		mustExtend(t, b, "a", makeBatch(spec, rows[:40], true))
		mustExtend(t, b, "b", makeBatch(spec, rows[40:], true))
		before := takeSnapshot(t, b)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = openStore(t, dir)
		b, err := s.Buffer("r")
		if err != nil {
			t.Fatal(err)
		}
		after := takeSnapshot(t, b)
		if before.info.Size != after.info.Size || before.info.WriteCount != after.info.WriteCount ||
			before.info.Trajectories != after.info.Trajectories || before.info.OpenTrajectories != after.info.OpenTrajectories ||
			before.info.Streams != after.info.Streams {
			t.Fatalf("info changed across reopen:\n%+v\n%+v", before.info, after.info)
		}
		if !slices.Equal(before.seqs, after.seqs) || !slices.Equal(before.metas, after.metas) {
			t.Fatalf("rows changed across reopen")
		}
		for i := range before.bytes {
			if !slices.Equal(before.bytes[i], after.bytes[i]) {
				t.Fatalf("column %d bytes changed across reopen", i)
			}
		}
		// Streams continue their open trajectories after a clean close.
		last := after.metas[len(after.metas)-1]
		res := mustExtend(t, b, "b", makeBatch(spec, []row{{env: last.Env, val: 1}}, true))
		m := metas(t, b, res.FirstSeq)[0]
		if !last.Done && (m.TrajID != last.TrajID || m.PrevSeq != last.Seq) {
			t.Fatalf("stream did not continue after clean close: last %+v new %+v", last, m)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		rep, err := Verify(dir, nil)
		if err != nil || !rep.OK() {
			t.Fatalf("verify: %v %+v", err, rep)
		}
	}
}

func TestMemoryBufferRestartKeepsSpecAndCounters(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	spec := testSpec(KindMemory, 10, false)
	b := mustCreate(t, s, "m", spec)
	mustExtend(t, b, "a", makeBatch(spec, []row{{val: 1}, {val: 2}}, false))
	_, b = reopenBuffer(t, s, dir, "m")
	if !b.Spec().Equal(spec) {
		t.Fatal("spec changed")
	}
	info, _ := b.Info()
	if info.Size != 0 || info.WriteCount < 2 {
		t.Fatalf("after restart: %+v", info)
	}
	res := mustExtend(t, b, "a", makeBatch(spec, []row{{val: 3}}, false))
	if res.FirstSeq < 2 {
		t.Fatalf("seq %d reused after restart", res.FirstSeq)
	}
	if m := metas(t, b, res.FirstSeq)[0]; m.Step != 0 {
		t.Fatalf("memory buffer continued a trajectory across restart: %+v", m)
	}
}

func TestLockedDataDir(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	defer s.Close()
	_, err := Open(dir, &Options{LockTimeout: 50e6})
	if err == nil || !errorsIs(err, ErrLocked) {
		t.Fatalf("second open: %v, want ErrLocked", err)
	}
}
