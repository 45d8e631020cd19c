package storage

import (
	"testing"
	"time"
)

// TestSegmentsFoundAfterCrashSyncedFirst: after a writer is killed, the
// rows recovery accepts may have their run pieces or chunks in the page
// cache only, in segments the killed process wrote. The reopened buffer's
// first sync must make those segments (and, for run segments, the
// directory) durable before it moves the watermark past the rows: the
// segments found at open are marked for it, and a sync clears the marks.
// A clean reopen marks nothing (nothing can be pending).
func TestSegmentsFoundAfterCrashSyncedFirst(t *testing.T) {
	for _, c := range []struct {
		name string
		buf  string
	}{
		{"run log", crashFsyncRuns},
		{"chunk store", czFsync},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			crashRunChild(t, crashChildCfg{
				dir: dir, seed: 3, tokenBase: 1 << 32, bufs: []string{c.buf},
				intervalMS: 20, killAfter: 150 * time.Millisecond,
			})
			// pending reports how many segments found at open wait for
			// a sync, of how many, and whether the directory does.
			pending := func(b *Buffer) (dirty, all int, dir bool) {
				if b.rlog != nil {
					l := b.rlog
					l.segMu.Lock()
					defer l.segMu.Unlock()
					for _, s := range l.segs {
						if s.r == nil { // found at open
							all++
							if s.dirty {
								dirty++
							}
						}
					}
					return dirty, all, l.dirDirty
				}
				cs := b.cs
				cs.segMu.Lock()
				defer cs.segMu.Unlock()
				for _, s := range cs.segs {
					all++
					if s.dirty {
						dirty++
					}
				}
				return dirty, all, false
			}

			s := openStore(t, dir)
			b := mustBuffer(t, s, c.buf)
			dirty, all, dirPending := pending(b)
			if all == 0 {
				t.Fatal("the killed writer left no segments")
			}
			if dirty != all || (b.rlog != nil && !dirPending) {
				t.Fatalf("after a crash: %d of %d segments found at open marked for the first sync (directory: %v)", dirty, all, dirPending)
			}
			// syncFiles, which every checkpoint and fsync extend runs
			// when rows lie above the watermark (called here whether or
			// not the kill left any: when it left none, the marks wait
			// for the first sync that moves the watermark).
			if _, err := b.syncFiles(b.writeCount.Load()); err != nil {
				t.Fatal(err)
			}
			if dirty, _, dirPending = pending(b); dirty != 0 || dirPending {
				t.Errorf("after the first sync: %d segments still marked (directory: %v)", dirty, dirPending)
			}
			if w, ok := readWatermark(b.hdr); !ok || w != b.writeCount.Load() {
				t.Errorf("watermark %d (%v) after the sync, write count %d", w, ok, b.writeCount.Load())
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}

			s = openStore(t, dir)
			defer s.Close()
			b = mustBuffer(t, s, c.buf)
			if dirty, all, dirPending = pending(b); dirty != 0 || dirPending {
				t.Errorf("after a clean close: %d of %d segments marked (directory: %v)", dirty, all, dirPending)
			}
		})
	}
}
