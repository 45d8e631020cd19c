package storage

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
)

// TestCompressedWriteFailuresRollBack makes a quarter of the chunk record
// writes of a compressed buffer fail halfway (as a disk that fills up
// does), retries every refused call as a client would, and checks that the
// buffer ends up holding exactly what a memory buffer fed each batch once
// holds: a failed write is taken back whole, the buffer takes writes again
// at once (no restart), and neither verify next to the open store, a
// read-only open of what is on disk (as after a crash) nor a clean reopen
// finds anything else.
func TestCompressedWriteFailuresRollBack(t *testing.T) {
	for _, tc := range []struct {
		name string
		g    stackGeom
		opts *CompressionOptions
		cap  int64
	}{
		{"zstd axis 0", stackAxis0, nil, 300},
		{"none chunk 4 delta", stackAxis2, &CompressionOptions{Codec: "none", ChunkLen: 4, Delta: true}, 64},
		{"tiny ring", stackAxis0, &CompressionOptions{ChunkLen: 8}, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			refStore := openStore(t, t.TempDir())
			defer refStore.Close()
			ref := mustCreate(t, refStore, "b", pixelSpec(KindMemory, tc.cap, tc.g, nil))
			dir := t.TempDir()
			s := openStore(t, dir)
			b := mustCreate(t, s, "b", pixelSpec(KindCompressed, tc.cap, tc.g, tc.opts))
			rng := rand.New(rand.NewPCG(7, uint64(tc.cap)))
			// Half of the calls are armed to fail at their first to
			// fourth record write (a call that writes fewer records
			// succeeds); the retry of a failed call is not armed.
			failures, failAt := 0, -1
			fault := func(b *Buffer) {
				b.cs.writeFault = func() error {
					if failAt < 0 {
						return nil
					}
					if failAt--; failAt < 0 {
						failures++
						return fmt.Errorf("injected: %w", syscall.ENOSPC)
					}
					return nil
				}
			}
			fault(b)
			// retry calls op until it succeeds; every failure must be a
			// clean out-of-space error.
			retry := func(what string, op func() error) {
				t.Helper()
				failAt = -1
				if rng.IntN(2) == 0 {
					failAt = rng.IntN(4)
				}
				for try := 0; ; try++ {
					err := op()
					failAt = -1
					if err == nil {
						return
					}
					if !errors.Is(err, ErrInsufficientStorage) || try > 0 {
						t.Fatalf("%s (try %d): %v; want one ErrInsufficientStorage, then success", what, try, err)
					}
				}
			}
			w := newPixelWriter(1, tc.g)
			rounds := func(n int) {
				for round := 0; round < n; round++ {
					batch := w.batch(1+rng.IntN(30), 3)
					stream := "actor"
					if rng.IntN(10) == 0 {
						stream = ""
						w.stacks = map[int64][]byte{}
					}
					mustExtend(t, ref, stream, batch)
					retry("extend", func() error { _, err := b.Extend(stream, batch); return err })
					if rng.IntN(15) == 0 {
						if _, err := ref.CloseStream("actor"); err != nil {
							t.Fatal(err)
						}
						retry("close stream", func() error { _, err := b.CloseStream("actor"); return err })
						w.stacks = map[int64][]byte{}
					}
					if round%10 == 9 {
						compareBuffers(t, ref, b)
					}
				}
			}
			rounds(80)
			compareBuffers(t, ref, b)
			if failures < 10 {
				t.Fatalf("only %d injected failures", failures)
			}
			// Next to the open store: verify, and a read-only open that
			// recovers from the files as they are (what a crash leaves).
			if rep, err := Verify(dir, nil); err != nil || !rep.OK() {
				t.Fatalf("verify next to the open store: %v %+v", err, rep)
			}
			ro, err := Open(dir, &Options{ReadOnly: true, LockTimeout: 10e6})
			if err != nil {
				t.Fatal(err)
			}
			rb, err := ro.Buffer("b")
			if err != nil {
				t.Fatal(err)
			}
			compareBuffers(t, ref, rb)
			ro.Close()
			// A clean reopen continues the stream, with failures again.
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openStore(t, dir)
			defer s.Close()
			if b, err = s.Buffer("b"); err != nil {
				t.Fatal(err)
			}
			compareBuffers(t, ref, b)
			fault(b)
			rounds(30)
			compareBuffers(t, ref, b)
			t.Logf("%d chunk record writes failed and were taken back", failures)
		})
	}
}
