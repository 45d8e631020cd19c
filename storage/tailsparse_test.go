package storage

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/rbdb/rbd/internal/testbin"
)

// sparseSpec is a compact memmap buffer whose observation (and so each
// final observation) spans two pages.
func sparseSpec(capacity int64) Spec {
	return Spec{Capacity: capacity, Storage: KindMemmap, Durability: DurabilityFlush, CompactObs: true, ObsKeys: []string{"observation"},
		Fields: []Field{
			{Name: "observation", DType: Uint8, Shape: []int{64, 64, 2}},
			{Name: "next.done", DType: Bool, Shape: []int{}},
		}}
}

// sparseBatch is n rows from two envs, episodes of 7 steps, every field
// derived from the row's number k+i; a done row sends its final
// observation.
func sparseBatch(k, n int) *Batch {
	const ob = 64 * 64 * 2
	b := &Batch{Rows: n, Fields: map[string][]byte{}}
	for i := range n {
		v := k + i
		obs := make([]byte, ob)
		for j := range obs {
			obs[j] = byte(v + j/512)
		}
		b.Fields["observation"] = append(b.Fields["observation"], obs...)
		done := v/2%7 == 6
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
// take disk blocks only for the rows that have one, however many laps the
// ring has made, and read back as written, also after a reopen.
func TestSparseTails(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	spec := sparseSpec(256)
	b := mustCreate(t, s, "img", spec)
	ref := mustCreate(t, openStore(t, t.TempDir()), "img", func() Spec { r := spec; r.Storage, r.Durability = KindMemory, ""; return r }())
	if c := b.tails[0]; !c.sparse {
		t.Fatal("an 8 KiB final observation column is not sparse")
	}
	path := tailFile(b.dir, "observation")
	const ob = 64 * 64 * 2
	if got := fileBytes(path); got > 2*headerSize {
		t.Fatalf("a new tail file takes %d bytes", got)
	}
	for k := 0; k < 900; k += 30 { // three laps and a half
		mustExtend(t, b, "s", sparseBatch(k, 30))
		mustExtend(t, ref, "s", sparseBatch(k, 30))
	}
	tails := 0
	for _, seq := range b.LiveSeqs(0, 256) {
		if metas(t, b, seq)[0].HasTail {
			tails++
		}
	}
	if tails == 0 {
		t.Fatal("no live row has a final observation")
	}
	// The filesystem may count a few blocks of its own (ext4's extent
	// tree, once a file has more than four extents).
	const slack = 4 * 4096
	if got, want := fileBytes(path), headerSize+int64(tails)*ob; got > want+slack || got < want-2*ob {
		t.Errorf("the tail file takes %d bytes for %d live final observations of %d bytes (want about %d; the column is %d)",
			got, tails, ob, want, headerSize+256*ob)
	}
	compareBuffers(t, ref, b)
	// A hot checkpoint keeps the holes: its tail file takes the live
	// final observations, and it opens with the same rows.
	cpDir := filepath.Join(t.TempDir(), "cp")
	if _, err := b.Checkpoint(context.Background(), cpDir, nil); err != nil {
		t.Fatal(err)
	}
	if got := fileBytes(tailFile(bufferDir(cpDir, "img"), "observation")); got > headerSize+int64(tails)*ob+slack {
		t.Errorf("the checkpoint's tail file takes %d bytes for %d final observations of %d", got, tails, ob)
	}
	cs := openStore(t, cpDir)
	cb, err := cs.Buffer("img")
	if err != nil {
		t.Fatal(err)
	}
	compareBuffers(t, ref, cb)
	if err := cs.Close(); err != nil {
		t.Fatal(err)
	}
	_, b = reopenVerified(t, s, dir, "img")
	// A writable open does not allocate the holes back.
	if got := fileBytes(path); got > headerSize+int64(tails)*ob+slack {
		t.Errorf("after a reopen the tail file takes %d bytes", got)
	}
	compareBuffers(t, ref, b)
}

// TestSparseTailsDiskFull: on a full disk an extend whose final
// observations need new blocks is refused before any row is written, with
// an out-of-space error, and goes in once space returns, without a
// restart. (Extends without one may be refused too, when the seq
// reservation's catalog commit finds no room.)
func TestSparseTailsDiskFull(t *testing.T) {
	dir := testbin.MountTmpfs(t, 8<<20)
	s := openStore(t, dir)
	spec := sparseSpec(128)
	b := mustCreate(t, s, "img", spec)
	rs := spec
	rs.Storage, rs.Durability = KindMemory, ""
	ref := mustCreate(t, openStore(t, t.TempDir()), "img", rs)
	filler := testbin.FillDisk(t, dir)
	refused, withTails := 0, 0
	for k := 0; k < 700; k += 10 {
		batch := sparseBatch(k, 10)
		wc := b.WriteCount()
		if _, err := b.Extend("s", batch); err != nil {
			if !errors.Is(err, ErrInsufficientStorage) {
				t.Fatalf("extend on a full disk: %v", err)
			}
			if b.WriteCount() != wc {
				t.Fatalf("a refused extend moved the write count %d -> %d", wc, b.WriteCount())
			}
			if len(batch.Fields["next.observation"]) > 0 {
				withTails++
			}
			refused++
			if err := os.Remove(filler); err != nil {
				t.Fatal(err)
			}
			mustExtend(t, b, "s", batch)
			filler = testbin.FillDisk(t, dir)
		}
		mustExtend(t, ref, "s", sparseBatch(k, 10))
	}
	if withTails == 0 {
		t.Fatalf("no extend with final observations ran out of space (%d without did)", refused)
	}
	t.Logf("%d extends refused for space (%d with final observations), each taken again after space returned", refused, withTails)
	compareBuffers(t, ref, b)
	os.Remove(filler)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if rep, err := Verify(dir, nil); err != nil || !rep.OK() {
		t.Fatalf("verify: %v %+v", err, rep)
	}
}
