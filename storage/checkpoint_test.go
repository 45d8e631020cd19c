package storage

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

// Checkpoint rows carry a token: writer w's i-th row has observation
// [tok, tok+1, tok+2, tok+3] and action tok with tok = w<<20 | i, and its
// trajectories are 10 rows long, so step = i % 10.
const cpTrajLen = 10

func cpTok(w, i int) float32 { return float32(w<<20 | i) }

func cpBatch(spec Spec, w, from, n int) *Batch {
	rows := make([]row, n)
	for k := range rows {
		i := from + k
		rows[k] = row{val: cpTok(w, i), terminated: i%cpTrajLen == cpTrajLen-1, final: -cpTok(w, i)}
	}
	return makeBatch(spec, rows, true)
}

// checkCheckpointRows checks every live row of b against its token.
func checkCheckpointRows(t *testing.T, b *Buffer) {
	t.Helper()
	seqs := b.LiveSeqs(0, int(b.Capacity()))
	obs, _ := b.Column("observation")
	act, _ := b.Column("action")
	dObs := make([]byte, len(seqs)*obs.RowBytes)
	dAct := make([]byte, len(seqs)*act.RowBytes)
	meta := make([]RowMeta, len(seqs))
	missing, err := b.Gather(seqs, []Column{obs, act}, [][]byte{dObs, dAct}, meta)
	if err != nil || len(missing) > 0 {
		t.Fatalf("gather: %v, %d missing", err, len(missing))
	}
	tokOf := map[int64]int64{}
	for j, seq := range seqs {
		tok := int64(obsOf(dObs[j*obs.RowBytes:]))
		for k := range 4 {
			if v := obsOf(dObs[j*obs.RowBytes+4*k:]); v != float32(tok)+float32(k) {
				t.Fatalf("seq %d: observation[%d] = %v, want %v (torn or misplaced)", seq, k, v, float32(tok)+float32(k))
			}
		}
		if a := int64(leInt64(dAct[j*8:])); a != tok {
			t.Fatalf("seq %d: action %d, observation says token %d", seq, a, tok)
		}
		w, i := int(tok>>20), int(tok&(1<<20-1))
		if meta[j].Step != int64(i%cpTrajLen) {
			t.Fatalf("seq %d (writer %d row %d): step %d, want %d", seq, w, i, meta[j].Step, i%cpTrajLen)
		}
		if p, ok := tokOf[meta[j].PrevSeq]; ok && p != tok-1 {
			t.Fatalf("seq %d (token %d) links back to seq %d holding token %d", seq, tok, meta[j].PrevSeq, p)
		}
		tokOf[seq] = tok
	}
}

func leInt64(b []byte) uint64 {
	var v uint64
	for k := 7; k >= 0; k-- {
		v = v<<8 | uint64(b[k])
	}
	return v
}

// TestCheckpointWhileWriting takes a hot checkpoint while 4 writers
// extend the buffer (and the ring wraps), then opens it: every row it
// holds is whole and in its place, it holds the rows below its seq and
// none after, the streams continue where they were at that seq, verify is
// clean. For every kind; a memory buffer's rows come back into memory.
func TestCheckpointWhileWriting(t *testing.T) {
	forEachKind(t, func(t *testing.T, kind Kind) { testCheckpointWhileWriting(t, kind, "") })
	// Run records: the copy reads memory records and their runs while
	// writers free and reuse runs; the restore builds runs again.
	t.Run("memory-runs", func(t *testing.T) { testCheckpointWhileWriting(t, KindMemory, RowMetaRuns) })
	// rows.meta version 2: the copy takes the file records as they are
	// and the run segments pinned, while writers append to them.
	t.Run("memmap-runs", func(t *testing.T) { testCheckpointWhileWriting(t, KindMemmap, RowMetaRuns) })
	t.Run("memmap-strided", func(t *testing.T) { testCheckpointWhileWriting(t, KindMemmap, RowMetaStrided) })
	// rows.meta version 3: blocks checked against their checksums as
	// copied, fresh records and a watermark record with its tip.
	t.Run("memmap-blocks", func(t *testing.T) { testCheckpointWhileWriting(t, KindMemmap, RowMetaBlocks) })
	// rows.meta version 1 (the default of memmap buffers before
	// 2026-11-27), whatever RBD_TEST_MEMMAP_ROW_META says.
	t.Run("memmap-row", func(t *testing.T) { testCheckpointWhileWriting(t, KindMemmap, RowMetaPerRow) })
}

func testCheckpointWhileWriting(t *testing.T, kind Kind, layout RowMetaLayout) {
	{
		const writers, capacity = 4, 20000
		spec := testSpec(kind, capacity, true)
		s := openStore(t, t.TempDir())
		defer s.Close()
		spec.Priority = &PriorityOptions{Alpha: 0.6, Eps: 1e-6}
		if layout != "" { // "": testSpec's, which RBD_TEST_MEMMAP_ROW_META sets for memmap
			spec.RowMetaLayout = layout
		}
		b := mustCreate(t, s, "b", spec)
		var stop atomic.Bool
		// Writers go on while the checkpoint copies, but overwrite at most
		// half the ring meanwhile: on a loaded machine the copy can be
		// starved long enough for unbounded writers to overwrite every
		// row it had to copy (seen: Rows 0, Overwritten 20000).
		var limit atomic.Int64
		limit.Store(math.MaxInt64)
		var wg sync.WaitGroup
		type ack struct{ first, i0 int64 }
		var acks [writers][]ack // per writer, guarded by its goroutine until wg.Wait
		for w := range writers {
			wg.Go(func() {
				for i := 0; !stop.Load() && i < 1<<19 && b.WriteCount() < limit.Load(); i += 64 {
					res, err := b.Extend(fmt.Sprintf("w%d", w), cpBatch(spec, w, i, 64))
					if err != nil {
						t.Error(err)
						return
					}
					acks[w] = append(acks[w], ack{res.FirstSeq, int64(i)})
				}
			})
		}
		for b.WriteCount() < 3*capacity { // the ring has wrapped
			if t.Failed() {
				return
			}
		}
		limit.Store(b.WriteCount() + capacity/2)
		dest := filepath.Join(t.TempDir(), "cp")
		var calls atomic.Int64
		res, err := b.Checkpoint(context.Background(), dest, &CheckpointOptions{Progress: func(done, total int64) {
			if done > total {
				t.Errorf("progress %d of %d", done, total)
			}
			calls.Add(1)
		}})
		after := b.WriteCount()
		stop.Store(true)
		wg.Wait()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: checkpoint at seq %d of %d rows (%d overwritten while copying; %d written meanwhile) in %.3fs, %d progress calls",
			kind, res.WriteCount, res.Rows, res.Overwritten, after-res.WriteCount, res.Seconds, calls.Load())
		if res.Rows+res.Overwritten != res.WriteCount-res.FirstSeq || res.Rows == 0 || calls.Load() == 0 {
			t.Fatalf("result %+v", res)
		}
		if _, err := os.Stat(filepath.Join(dest, checkpointIncomplete)); !errors.Is(err, os.ErrNotExist) {
			t.Fatal("a finished checkpoint still says it is incomplete")
		}
		if rep, err := Verify(dest, nil); err != nil || !rep.OK() {
			t.Fatalf("verify the checkpoint: %v %+v", err, rep)
		}
		cs := openStore(t, dest)
		defer cs.Close()
		cb := mustBuffer(t, cs, "b")
		info, _ := cb.Info()
		if info.WriteCount != res.WriteCount || info.Size != res.Rows {
			t.Fatalf("opened checkpoint: write_count %d size %d, want %d and %d", info.WriteCount, info.Size, res.WriteCount, res.Rows)
		}
		checkCheckpointRows(t, cb)
		// Priorities came along (every row has one, new rows the largest).
		if err := cb.ReadIndex(func(ix Index) {
			if total := ix.PriorityTotal(); !(total > 0) || math.IsInf(total, 0) {
				t.Errorf("priority total %v", total)
			}
		}); err != nil {
			t.Fatal(err)
		}
		// Each stream continues where it was at the checkpoint's seq:
		// after its last row below it (which may have left the copy).
		for w := range writers {
			var lastSeq, lastI int64 = -1, -1
			for _, a := range acks[w] {
				for k := int64(0); k < 64; k++ {
					if a.first+k < res.WriteCount && a.first+k > lastSeq {
						lastSeq, lastI = a.first+k, a.i0+k
					}
				}
			}
			next := int(lastI + 1)
			r := mustExtend(t, cb, fmt.Sprintf("w%d", w), cpBatch(spec, w, next, 1))
			m := metas(t, cb, r.FirstSeq)[0]
			wantPrev := lastSeq
			if next%cpTrajLen == 0 {
				wantPrev = -1
			}
			if m.Step != int64(next%cpTrajLen) || m.PrevSeq != wantPrev {
				t.Errorf("writer %d continues at step %d after seq %d, want step %d after seq %d", w, m.Step, m.PrevSeq, next%cpTrajLen, wantPrev)
			}
		}
		checkCheckpointRows(t, cb)
		if kind == KindMemory {
			if _, err := os.Stat(bufferDir(dest, "b")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a restored memory buffer kept its checkpoint files: %v", err)
			}
		}
		if layout == RowMetaRuns || layout == RowMetaStrided {
			if cb.runs == nil {
				t.Fatal("the restored buffer has no run records")
			}
			checkRuns(t, cb)
		}
	}
}

// TestCheckpointDestinationExists: a checkpoint never writes over a dir.
func TestCheckpointDestinationExists(t *testing.T) {
	s := openStore(t, t.TempDir())
	defer s.Close()
	b := mustCreate(t, s, "b", testSpec(KindMemmap, 100, true))
	dest := t.TempDir()
	if _, err := b.Checkpoint(context.Background(), dest, nil); !errors.Is(err, ErrCheckpointExists) {
		t.Fatalf("checkpoint into an existing dir: %v", err)
	}
}

// TestCheckpointKilledMidCopy kills a real process in the middle of a
// checkpoint's copy: the destination is refused as incomplete by Open and
// reported by Verify, never taken for a checkpoint.
func TestCheckpointKilledMidCopy(t *testing.T) {
	if os.Getenv("RBD_CP_CHILD") == "1" {
		checkpointChild(t)
		return
	}
	src, dest := t.TempDir(), filepath.Join(t.TempDir(), "cp")
	cmd := exec.Command(os.Args[0], "-test.run=^TestCheckpointKilledMidCopy$", "-test.count=1")
	cmd.Env = append(os.Environ(), "RBD_CP_CHILD=1", "RBD_CP_SRC="+src, "RBD_CP_DEST="+dest,
		"RBD_CRASH_AT=checkpoint-copy", "RBD_CRASH_AFTER=3")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(interface{ Signaled() bool }).Signaled() == false {
		t.Fatalf("the child was not killed mid-copy: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dest, checkpointIncomplete)); err != nil {
		t.Fatalf("the cut checkpoint has no marker: %v", err)
	}
	if s, err := Open(dest, nil); !errors.Is(err, ErrIncompleteCheckpoint) {
		if err == nil {
			s.Close()
		}
		t.Fatalf("open of a cut checkpoint: %v, want ErrIncompleteCheckpoint", err)
	}
	rep, err := Verify(dest, nil)
	if err != nil || rep.OK() {
		t.Fatalf("verify of a cut checkpoint: %v %+v", err, rep)
	}
	// The source is untouched.
	s := openStore(t, src)
	defer s.Close()
	b, err := s.Buffer("b")
	if err != nil {
		t.Fatal(err)
	}
	// After a kill the window stays where the rows are (after a power
	// loss it would move up to the seq reservation, the oldest rows
	// leaving it early); every row written below it is there.
	want := 20000 - max(0, b.WriteCount()-20000)
	if info, _ := b.Info(); info.Size != want {
		t.Fatalf("source holds %d rows, want %d (write count %d)", info.Size, want, b.WriteCount())
	}
}

func checkpointChild(t *testing.T) {
	s := openStore(t, os.Getenv("RBD_CP_SRC"))
	spec := testSpec(KindMemmap, 20000, true)
	b := mustCreate(t, s, "b", spec)
	for i := 0; i < 20000; i += 500 {
		mustExtend(t, b, "w0", cpBatch(spec, 0, i, 500))
	}
	if err := b.checkpoint(); err != nil {
		t.Fatal(err)
	}
	b.Checkpoint(context.Background(), os.Getenv("RBD_CP_DEST"), nil)
	t.Fatal("the checkpoint finished: the crash point was not reached")
}

// TestCheckpointCancelled: a cancelled checkpoint leaves nothing behind.
func TestCheckpointCancelled(t *testing.T) {
	spec := testSpec(KindMemmap, 10000, true)
	s := openStore(t, t.TempDir())
	defer s.Close()
	b := mustCreate(t, s, "b", spec)
	mustExtend(t, b, "w0", cpBatch(spec, 0, 0, 9000))
	ctx, cancel := context.WithCancel(context.Background())
	dest := filepath.Join(t.TempDir(), "cp")
	_, err := b.Checkpoint(ctx, dest, &CheckpointOptions{Progress: func(done, total int64) { cancel() }})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled checkpoint: %v", err)
	}
	if _, err := os.Stat(dest); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a cancelled checkpoint left %s: %v", dest, err)
	}
}
