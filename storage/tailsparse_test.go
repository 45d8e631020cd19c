package storage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/rbdb/rbd/internal/testbin"
	"github.com/rbdb/rbd/storage/internal/mmapfile"
)

// sparseSpec is a compact memmap buffer whose observations (and so each
// final observation) are ob bytes.
func sparseSpec(capacity int64, ob int) Spec {
	return Spec{Capacity: capacity, Storage: KindMemmap, Durability: DurabilityFlush, CompactObs: true, ObsKeys: []string{"observation"},
		RowMetaLayout: testMemmapRowMeta,
		Fields: []Field{
			{Name: "observation", DType: Uint8, Shape: []int{ob}},
			{Name: "next.done", DType: Bool, Shape: []int{}},
		}}
}

// sparseBatch is n rows of ob-byte observations from two envs, episodes of
// ep steps, every field derived from the row's number k+i; a done row
// sends its final observation.
func sparseBatch(k, n, ob, ep int) *Batch {
	b := &Batch{Rows: n, Fields: map[string][]byte{}}
	for i := range n {
		v := k + i
		obs := make([]byte, ob)
		for j := range obs {
			obs[j] = byte(v + j/512)
		}
		b.Fields["observation"] = append(b.Fields["observation"], obs...)
		done := v/2%ep == ep-1
		b.Fields["next.done"] = append(b.Fields["next.done"], b2byte(done))
		if done {
			final := make([]byte, ob)
			for j := range final {
				final[j] = byte(200 + v + j/1024)
			}
			b.Fields["next.observation"] = append(b.Fields["next.observation"], final...)
		}
		b.Env = append(b.Env, int64(v%2))
	}
	return b
}

// TestSparseTails: a memmap buffer's final observations of a page or more
// take disk blocks only where rows have one (whole pages: an 8 KiB frame
// has two of its own, a 4 KiB one shares none), however many laps the ring
// has made; they read back as written, also from a hot checkpoint (copied
// sparse) and after a reopen.
func TestSparseTails(t *testing.T) {
	for _, tc := range []struct{ ob, ep, rows int }{{64 * 64 * 2, 7, 900}, {4096, 30, 2100}} {
		t.Run(fmt.Sprintf("bytes=%d", tc.ob), func(t *testing.T) { testSparseTails(t, tc.ob, tc.ep, tc.rows) })
	}
}

func testSparseTails(t *testing.T, ob, ep, rows int) {
	const capacity = 256
	dir := t.TempDir()
	s := openStore(t, dir)
	s.slotTails = true
	spec := sparseSpec(capacity, ob)
	skipOnBlocks(t, spec, "final observations at the slot (it keeps them in dense tail files only)")
	b := mustCreate(t, s, "img", spec)
	ref := mustCreate(t, openStore(t, t.TempDir()), "img", memoryTwin(spec))
	if c := b.tails[0]; !c.sparse {
		t.Fatalf("a final observation column of %d bytes a row is not sparse", ob)
	}
	if info, err := b.Info(); err != nil || info.TailLayout != "slot" {
		t.Fatalf("info: tail_layout %q, %v", info.TailLayout, err)
	}
	path := tailFile(b.dir, "observation")
	if got := fileBytes(path); got > 2*headerSize {
		t.Fatalf("a new tail file takes %d bytes", got)
	}
	for k := 0; k < rows; k += 30 {
		mustExtend(t, b, "s", sparseBatch(k, 30, ob, ep))
		mustExtend(t, ref, "s", sparseBatch(k, 30, ob, ep))
	}
	pages := map[int64]bool{} // pages of the tail file a live final observation touches
	for _, seq := range b.LiveSeqs(0, capacity) {
		if metas(t, b, seq)[0].HasTail {
			off := headerSize + seq%capacity*int64(ob)
			for p := off / 4096; p <= (off+int64(ob)-1)/4096; p++ {
				pages[p] = true
			}
		}
	}
	if len(pages) == 0 {
		t.Fatal("no live row has a final observation")
	}
	// Allowed beyond those pages: rows not punched yet (an eighth of the
	// column at most) and a few blocks the filesystem counts for itself
	// (ext4's extent tree, once a file has more than four extents).
	allowed := headerSize + int64(len(pages))*4096 + capacity*int64(ob)/8 + 4*4096
	column := headerSize + capacity*int64(ob)
	if got := fileBytes(path); got > allowed || got > column/2 {
		t.Errorf("the tail file takes %d bytes: %d pages hold live final observations (allowed %d; the column is %d)", got, len(pages), allowed, column)
	}
	compareBuffers(t, ref, b)
	// A hot checkpoint keeps the holes: its tail file takes the live
	// final observations, and it opens with the same rows.
	checkTailCopies(t, s, dir, b, ref, allowed)
}

// checkTailCopies checks, for the tail tests, that a hot checkpoint of b
// (buffer "img" of the store s in dir) has a tail file of at most allowed
// bytes and the rows of ref, and that so has b reopened (a writable open
// allocates no hole back). It returns the reopened store and buffer.
func checkTailCopies(t *testing.T, s *Store, dir string, b, ref *Buffer, allowed int64) (*Store, *Buffer) {
	t.Helper()
	cpDir := filepath.Join(t.TempDir(), "cp")
	if _, err := b.Checkpoint(context.Background(), cpDir, nil); err != nil {
		t.Fatal(err)
	}
	if got := fileBytes(tailFile(bufferDir(cpDir, "img"), "observation")); got > allowed {
		t.Errorf("the checkpoint's tail file takes %d bytes, allowed %d", got, allowed)
	}
	cs := openStore(t, cpDir)
	cb := mustBuffer(t, cs, "img")
	compareBuffers(t, ref, cb)
	if err := cs.Close(); err != nil {
		t.Fatal(err)
	}
	s, b = reopenVerified(t, s, dir, "img")
	if got := fileBytes(tailFile(b.dir, "observation")); got > allowed {
		t.Errorf("after a reopen the tail file takes %d bytes, allowed %d", got, allowed)
	}
	compareBuffers(t, ref, b)
	return s, b
}

// TestSparseTailsDiskFull: on a full disk an extend whose final
// observations need new blocks is refused before any row is written, with
// an out-of-space error, and goes in once space returns, without a
// restart. (Extends without one may be refused too, when the seq
// reservation's catalog commit finds no room.)
func TestSparseTailsDiskFull(t *testing.T) { testTailsDiskFull(t, true, 700) }

// testTailsDiskFull is TestSparseTailsDiskFull for version 1 tail files
// at the slot (slot) or dense tail files, over rows rows of 8 KiB frames
// in a ring of 128; reopened, the buffer holds every acknowledged row and
// verifies clean.
func testTailsDiskFull(t *testing.T, slot bool, rows int) {
	dir := testbin.MountTmpfs(t, 8<<20)
	s := openStore(t, dir)
	s.slotTails = slot
	const ob = 64 * 64 * 2
	spec := sparseSpec(128, ob)
	if slot {
		skipOnBlocks(t, spec, "final observations at the slot (it keeps them in dense tail files only)")
	}
	b := mustCreate(t, s, "img", spec)
	ref := mustCreate(t, openStore(t, t.TempDir()), "img", memoryTwin(spec))
	filler := testbin.FillDisk(t, dir)
	refused, withTails := 0, 0
	for k := 0; k < rows; k += 10 {
		batch := sparseBatch(k, 10, ob, 7)
		var was bool
		if was, filler = extendOnFullDisk(t, dir, b, batch, filler); was {
			refused++
			if len(batch.Fields["next.observation"]) > 0 {
				withTails++
			}
		}
		mustExtend(t, ref, "s", sparseBatch(k, 10, ob, 7))
	}
	if withTails == 0 {
		t.Fatalf("no extend with final observations ran out of space (%d without did)", refused)
	}
	t.Logf("%d extends refused for space (%d with final observations), each taken again after space returned", refused, withTails)
	compareBuffers(t, ref, b)
	os.Remove(filler)
	_, b = reopenVerified(t, s, dir, "img")
	compareBuffers(t, ref, b)
}

// BenchmarkExtendSparseTails extends a compact memmap buffer of ob-byte
// observations in 256-row batches from 2 envs (an Atari frame stack,
// 28,224 bytes, with episodes of 500 steps per env, a done row every
// 1,000 rows; an 8 KiB frame and a 16-byte CartPole observation with
// episodes of 100 steps per env, a done row every 200)
// in each tail file layout: dense (what new buffers get), and the version
// 1 files of older builds at the slot, sparse (rows of a page or more)
// and allocated whole. It reports what allocations and punches cost a
// writer, and the files' bytes a row (disk_B/row).
//
// go test ./storage -run '^$' -bench BenchmarkExtendSparseTails -benchtime 1s -count 3
func BenchmarkExtendSparseTails(b *testing.B) {
	for _, ob := range []int{28224, 8192, 16} {
		b.Run(fmt.Sprintf("bytes=%d", ob), func(b *testing.B) { benchExtendSparseTails(b, ob) })
	}
}

func benchExtendSparseTails(b *testing.B, ob int) {
	capacity := int64(100_000)
	if ob > 4096 {
		capacity = 10_000 // 80 MB of observations
	}
	if ob > 10000 {
		capacity = 5000
	}
	const batch = 256
	for _, layout := range []string{"dense", "sparse", "whole"} {
		if layout == "sparse" && !sparseTail(ob) {
			continue
		}
		b.Run("layout="+layout, func(b *testing.B) {
			s := openStore(b, b.TempDir())
			s.slotTails = layout != "dense"
			b.Cleanup(func() { s.Close() })
			spec := sparseSpec(capacity, ob)
			spec.Durability = DurabilityNone
			buf := mustCreate(b, s, "p", spec)
			if c := buf.tails[0]; layout == "whole" && c.sparse {
				if err := c.region.Allocate(0, headerSize+capacity*int64(ob)); err != nil {
					b.Fatal(err)
				}
				c.sparse = false
			}
			batches := make([]*Batch, 64)
			for i := range batches {
				batches[i] = sparseBatch(i*batch, batch, ob, map[bool]int{true: 500, false: 100}[ob > 10000])
			}
			for k := 0; k < int(2*capacity/batch); k++ { // the ring full, then overwritten once
				mustExtend(b, buf, "s", batches[k%len(batches)])
			}
			b.SetBytes(int64(batch * (ob + 1)))
			b.ReportAllocs()
			k := 0
			for b.Loop() {
				if _, err := buf.Extend("s", batches[k%len(batches)]); err != nil {
					b.Fatal(err)
				}
				k++
			}
			info, err := buf.Info()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(info.DiskBytes)/float64(capacity), "disk_B/row")
		})
	}
}

// TestSparseTailsFromWholeFile: a tail file an older build allocated whole
// is given back as the ring turns after an open (the open marks every
// allocated slot held), and its rows read the same.
func TestSparseTailsFromWholeFile(t *testing.T) {
	const ob, capacity = 8192, 128
	dir := t.TempDir()
	s := openStore(t, dir)
	s.slotTails = true
	spec := sparseSpec(capacity, ob)
	b := mustCreate(t, s, "img", spec)
	for k := 0; k < capacity; k += 32 {
		mustExtend(t, b, "s", sparseBatch(k, 32, ob, 7))
	}
	path := tailFile(b.dir, "observation")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := f.Stat()
	if err := errors.Join(mmapfile.Allocate(f, st.Size()), f.Close()); err != nil {
		t.Fatal(err)
	}
	whole := fileBytes(path)
	s = openStore(t, dir)
	defer s.Close()
	b, err = s.Buffer("img")
	if err != nil {
		t.Fatal(err)
	}
	for k := capacity; k < 3*capacity; k += 32 { // two laps
		mustExtend(t, b, "s", sparseBatch(k, 32, ob, 7))
	}
	if got := fileBytes(path); got > whole/2 {
		t.Fatalf("the tail file takes %d bytes after two laps, %d allocated whole", got, whole)
	}
}
