package storage

// Torn-row test. The race detector cannot see memory-mapped memory (both
// kinds keep row bytes in mappings), so this test is what shows that
// readers never observe a torn row: writers keep overwriting a small ring
// of large rows while readers gather rows near the overwrite frontier and
// check that every row they get back is whole.

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestConcurrentReadersNeverSeeTornRows(t *testing.T) {
	forEachKind(t, func(t *testing.T, kind Kind) { testTornRows(t, kind, "") })
	// Run records: a reader may read a row's run handle, then the run
	// record while the writer frees the run and gives its handle to
	// another; the env and link checks below catch a run record read
	// from the wrong run.
	t.Run("memory-runs", func(t *testing.T) { testTornRows(t, KindMemory, RowMetaRuns) })
	// Strided runs: the run word shares 8 bytes with a 32-bit pass stamp,
	// and a reader derives the row's offset and previous row from the
	// run's first seq and stride, which may be a rewritten run's; the
	// writers' rows interleave irregularly, so irregular runs too, whose
	// rows' offsets and distances a reader reads from the side table.
	t.Run("memory-strided", func(t *testing.T) { testTornRows(t, KindMemory, RowMetaStrided) })
	// rows.meta version 2: the same memory records, beside file records
	// and a run log the writers append to.
	t.Run("memmap-runs", func(t *testing.T) { testTornRows(t, KindMemmap, RowMetaRuns) })
	t.Run("memmap-strided", func(t *testing.T) { testTornRows(t, KindMemmap, RowMetaStrided) })
	// rows.meta version 1 (the default of memmap buffers before
	// 2026-11-27), whatever RBD_TEST_MEMMAP_ROW_META says.
	t.Run("memmap-row", func(t *testing.T) { testTornRows(t, KindMemmap, RowMetaPerRow) })
}

func testTornRows(t *testing.T, kind Kind, layout RowMetaLayout) {
	{
		const (
			capacity = 256
			blob     = 2048 // copies take long enough to be caught mid-way
			writers  = 4
			readers  = 4
		)
		dur := 2 * time.Second
		if testing.Short() {
			dur = 400 * time.Millisecond
		}
		dir := t.TempDir()
		s := openStore(t, dir)
		spec := crashSpec(kind, capacity, blob, true, DurabilityFlush)
		if layout != "" { // "": crashSpec's, which RBD_TEST_MEMMAP_ROW_META sets for memmap
			spec.RowMetaLayout = layout
		}
		b := mustCreate(t, s, "torn", spec)

		var (
			stop                 atomic.Bool
			checked, missed      atomic.Int64
			linked, indexReads   atomic.Int64
			errCount             atomic.Int64
			writtenRows, extends atomic.Int64
			wg                   sync.WaitGroup
		)
		fail := func(format string, args ...any) {
			if errCount.Add(1) <= 10 {
				t.Errorf(format, args...)
			}
		}
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(w), 1))
				tok := int64(w+1) << 40
				for !stop.Load() {
					n := 1 + rng.IntN(8)
					tokens := make([]int64, n)
					for i := range tokens {
						tokens[i] = tok
						tok++
					}
					if _, err := b.Extend(fmt.Sprintf("cw%d", w), crashBatch(spec, tokens, rng.IntN(2) == 0)); err != nil {
						fail("writer %d: %v", w, err)
						return
					}
					writtenRows.Add(int64(n))
					extends.Add(1)
				}
			}(w)
		}
		for r := 0; r < readers; r++ {
			wg.Add(1)
			go func(r int) {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(r), 2))
				cols := crashColumns(b)
				const n = 16
				dst := crashDst(cols, n)
				ms := make([]RowMeta, n)
				seqs := make([]int64, n)
				scratch := make([]byte, blob)
				isMissing := make([]bool, n)
				for !stop.Load() {
					mode := rng.IntN(3)
					k := n
					switch mode {
					case 0: // the overwrite frontier: the oldest live rows
						lo := b.WriteCount() - capacity
						for i := range seqs {
							seqs[i] = max(0, lo-2+rng.Int64N(24))
						}
					case 1: // anywhere, including rows not written yet
						wc := b.WriteCount()
						for i := range seqs {
							seqs[i] = rng.Int64N(wc + 4)
						}
					case 2: // a run of one trajectory, from the index
						k = 0
						err := b.ReadIndex(func(ix Index) {
							nt := ix.NumTrajectories()
							if nt == 0 {
								return
							}
							tr := ix.Trajectory(rng.IntN(nt))
							if tr.Len() == 0 {
								fail("reader %d: trajectory %d in the index with no rows", r, tr.ID())
								return
							}
							for i := rng.IntN(tr.Len()); i < tr.Len() && k < n; i++ {
								seqs[k] = tr.Seq(i)
								if k > 0 && seqs[k] <= seqs[k-1] {
									fail("reader %d: trajectory %d lists seq %d after %d", r, tr.ID(), seqs[k], seqs[k-1])
								}
								k++
							}
						})
						if err != nil {
							fail("reader %d: ReadIndex: %v", r, err)
							return
						}
						if k == 0 {
							continue
						}
						indexReads.Add(1)
					}
					d := dst
					if k < n {
						d = make([][]byte, len(dst))
						for i, c := range cols {
							d[i] = dst[i][:k*c.RowBytes]
						}
					}
					missing, err := b.Gather(seqs[:k], cols, d, ms[:k])
					if err != nil {
						fail("reader %d: gather: %v", r, err)
						return
					}
					clear(isMissing)
					for _, j := range missing {
						isMissing[j] = true
					}
					missed.Add(int64(len(missing)))
					toks := make([]int64, k)
					for j := 0; j < k; j++ {
						if isMissing[j] {
							if ms[j].Seq != -1 {
								fail("reader %d: missing seq %d has meta seq %d", r, seqs[j], ms[j].Seq)
							}
							for i, c := range cols {
								for _, x := range d[i][j*c.RowBytes : (j+1)*c.RowBytes] {
									if x != 0 {
										fail("reader %d: missing seq %d: column %q not zero-filled", r, seqs[j], c.Name)
										break
									}
								}
							}
							continue
						}
						if ms[j].Seq != seqs[j] {
							fail("reader %d: asked for seq %d, meta says %d", r, seqs[j], ms[j].Seq)
							continue
						}
						tok, err := crashCheckRow(cols, d, j, ms[j], scratch)
						if err != nil {
							fail("reader %d (mode %d): torn row: %v", r, mode, err)
							continue
						}
						toks[j] = tok
						checked.Add(1)
					}
					if mode != 2 {
						continue
					}
					for j := 0; j+1 < k; j++ {
						if isMissing[j] || isMissing[j+1] {
							continue
						}
						a, c := ms[j], ms[j+1]
						if c.PrevSeq != a.Seq || c.TrajID != a.TrajID || c.Step != a.Step+1 || a.Done ||
							c.Env != a.Env || toks[j+1] <= toks[j] || toks[j]>>40 != toks[j+1]>>40 {
							fail("reader %d: index neighbours do not link: %+v (token %d) then %+v (token %d)", r, a, toks[j], c, toks[j+1])
						}
						if a.NextSeq != -1 && a.NextSeq != c.Seq {
							fail("reader %d: seq %d has next_seq %d, but its successor in the index is %d", r, a.Seq, a.NextSeq, c.Seq)
						}
						linked.Add(1)
					}
				}
			}(r)
		}
		// Run for dur, and on a loaded machine longer (up to 30 s) until
		// the ring has wrapped enough times to matter.
		start := time.Now()
		time.Sleep(dur)
		for writtenRows.Load() < 8*capacity && time.Since(start) < 30*time.Second {
			time.Sleep(50 * time.Millisecond)
		}
		stop.Store(true)
		wg.Wait()

		t.Logf("%s (row_meta %q): %d extends, %d rows written (ring of %d); %d rows checked whole, %d reported missing, %d index links checked in %d index reads",
			kind, b.Spec().RowMetaLayout, extends.Load(), writtenRows.Load(), capacity, checked.Load(), missed.Load(), linked.Load(), indexReads.Load())
		if checked.Load() == 0 || linked.Load() == 0 {
			t.Fatalf("readers checked %d rows and %d links: the test proved nothing", checked.Load(), linked.Load())
		}
		if layout == RowMetaStrided && b.runs.irr.Load() == nil {
			t.Fatal("no irregular strided run was written: the readers never met one")
		}
		if writtenRows.Load() < 4*capacity {
			t.Errorf("only %d rows written: the ring of %d barely wrapped", writtenRows.Load(), capacity)
		}

		// Quiescent: the index and the rows agree.
		info, err := b.Info()
		if err != nil {
			t.Fatal(err)
		}
		if info.Size > capacity || info.Size != min(info.WriteCount, capacity) {
			t.Errorf("size %d with write count %d and capacity %d (no crash, so no holes)", info.Size, info.WriteCount, capacity)
		}
		if info.OpenTrajectories > writers*3 {
			t.Errorf("%d open trajectories, at most %d (stream, env) pairs", info.OpenTrajectories, writers*3)
		}
		var sum int64
		if err := b.ReadIndex(func(ix Index) {
			for i := 0; i < ix.NumTrajectories(); i++ {
				sum += int64(ix.Trajectory(i).Len())
			}
			if ix.LiveRows() != info.Size {
				t.Errorf("index counts %d live rows, info %d", ix.LiveRows(), info.Size)
			}
		}); err != nil {
			t.Fatal(err)
		}
		if sum != info.Size {
			t.Errorf("trajectories hold %d rows, size is %d", sum, info.Size)
		}
		live := b.LiveSeqs(0, capacity+1)
		if int64(len(live)) != info.Size {
			t.Errorf("%d live seqs, size %d", len(live), info.Size)
		}
		cols := crashColumns(b)
		dst := crashDst(cols, len(live))
		ms := make([]RowMeta, len(live))
		missing, err := b.Gather(live, cols, dst, ms)
		if err != nil || len(missing) > 0 {
			t.Fatalf("quiescent gather: missing %v, %v", missing, err)
		}
		scratch := make([]byte, blob)
		for j := range live {
			if _, err := crashCheckRow(cols, dst, j, ms[j], scratch); err != nil {
				t.Errorf("quiescent: %v", err)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if kind == KindMemmap {
			rep, err := Verify(dir, nil)
			if err != nil || !rep.OK() {
				t.Fatalf("verify after close: %v %+v", err, rep)
			}
		}
	}
}
