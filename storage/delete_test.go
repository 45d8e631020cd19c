package storage

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestDeleteAllOrNothing makes each step of a delete fail: the buffer
// stays listed, readable and writable, and a retry deletes it.
func TestDeleteAllOrNothing(t *testing.T) {
	for _, step := range []string{"rename", "catalog"} {
		t.Run(step, func(t *testing.T) { deleteFailing(t, step) })
	}
}

func deleteFailing(t *testing.T, step string) {
	forEachKind(t, func(t *testing.T, kind Kind) {
		if kind == KindMemory && step == "rename" {
			return // a memory buffer has no dir to move
		}
		dir := t.TempDir()
		s := openStore(t, dir)
		defer s.Close()
		spec := testSpec(kind, 100, true)
		b := mustCreate(t, s, "d", spec)
		mustExtend(t, b, "s", makeBatch(spec, []row{{val: 1}, {val: 2}}, true))
		injected := errors.New("injected failure")
		switch step {
		case "rename":
			s.hooks.renameFn = func(from, to string) error { return injected }
		case "catalog":
			s.hooks.deleteCatalogFn = func(*catalog, string) error { return injected }
		}
		err := s.DeleteBuffer("d")
		if !errors.Is(err, injected) {
			t.Fatalf("%s failing: delete returned %v", step, err)
		}
		// Whole and usable.
		got, err := s.Buffer("d")
		if err != nil || got != b {
			t.Fatalf("after a failed delete: %v", err)
		}
		mustExtend(t, b, "s", makeBatch(spec, []row{{val: 3}}, true))
		if m := metas(t, b, 0, 2); m[0].Step != 0 || m[1].Step != 2 {
			t.Fatalf("rows after a failed delete: %+v", m)
		}
		if b.persistent {
			if _, err := os.Stat(metaFile(bufferDir(dir, "d"))); err != nil {
				t.Fatalf("files after a failed delete: %v", err)
			}
		}
		// A retry works.
		s.hooks = storeHooks{}
		if err := s.DeleteBuffer("d"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Buffer("d"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("after the retry: %v", err)
		}
		waitTrashEmpty(t, dir)
	})
}

func waitTrashEmpty(t *testing.T, dir string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		entries, err := os.ReadDir(filepath.Join(dir, trashDir))
		if errors.Is(err, os.ErrNotExist) || (err == nil && len(entries) == 0) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("trash still holds %d entries (%v)", len(entries), err)
		}
	}
}

// TestDeleteRecreateWhileTrashEmpties: a buffer of the same name can be
// created at once after a delete.
func TestDeleteRecreateWhileTrashEmpties(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	defer s.Close()
	spec := testSpec(KindMemmap, 50000, true)
	for i := range 5 {
		b := mustCreate(t, s, "d", spec)
		mustExtend(t, b, "s", makeBatch(spec, []row{{val: float32(i)}}, true))
		if err := s.DeleteBuffer("d"); err != nil {
			t.Fatal(err)
		}
	}
	b := mustCreate(t, s, "d", spec)
	if b.WriteCount() != 0 {
		t.Fatal("the recreated buffer kept rows")
	}
	waitTrashEmpty(t, dir)
}

// TestDeleteCrashPoints kills a real process at each step of a delete:
// the reopened store has the buffer whole (killed before its catalog entry
// went) or not at all, and no file of it left once the trash is emptied.
func TestDeleteCrashPoints(t *testing.T) {
	if os.Getenv("RBD_DELETE_CHILD") == "1" {
		s := openStore(t, os.Getenv("RBD_DELETE_DIR"))
		spec := testSpec(KindMemmap, 100, true)
		b := mustCreate(t, s, "d", spec)
		mustExtend(t, b, "s", makeBatch(spec, []row{{val: 1}, {val: 2}, {val: 3, terminated: true, final: 4}}, true))
		if err := b.checkpoint(); err != nil {
			t.Fatal(err)
		}
		s.DeleteBuffer("d")
		t.Fatal("the crash point was not reached")
	}
	for _, tc := range []struct {
		point string
		kept  bool
	}{{"delete-after-rename", true}, {"delete-after-catalog", false}} {
		t.Run(tc.point, func(t *testing.T) {
			dir := t.TempDir()
			cmd := exec.Command(os.Args[0], "-test.run=^TestDeleteCrashPoints$", "-test.count=1")
			cmd.Env = append(os.Environ(), "RBD_DELETE_CHILD=1", "RBD_DELETE_DIR="+dir, "RBD_CRASH_AT="+tc.point)
			if out, err := cmd.CombinedOutput(); err == nil || !isKilled(err) {
				t.Fatalf("the child was not killed: %v\n%s", err, out)
			}
			if rep, err := Verify(dir, nil); err != nil || !rep.OK() {
				t.Fatalf("verify after the kill: %v %+v", err, rep)
			}
			s := openStore(t, dir)
			defer s.Close()
			b, err := s.Buffer("d")
			switch {
			case tc.kept && err != nil:
				t.Fatalf("killed before the catalog delete: the buffer is gone: %v", err)
			case tc.kept:
				if info, _ := b.Info(); info.Size != 3 {
					t.Fatalf("the kept buffer holds %d rows, want 3", info.Size)
				}
			case !tc.kept && !errors.Is(err, ErrNotFound):
				t.Fatalf("killed after the catalog delete: %v", err)
			}
			waitTrashEmpty(t, dir)
			if _, err := os.Stat(bufferDir(dir, "d")); tc.kept == errors.Is(err, os.ErrNotExist) {
				t.Fatalf("buffer dir after reopen: %v (kept %v)", err, tc.kept)
			}
		})
	}
}

func isKilled(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee) && ee.ExitCode() == -1
}

// TestSnapshotConcurrentWriters: creates and deletes from many goroutines
// publish snapshots at once while a reader reads them in a loop: it never
// sees a torn file, and never an older one after a newer one.
func TestSnapshotConcurrentWriters(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	defer s.Close()
	var stop atomic.Bool
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			spec := testSpec(KindMemory, 10, true)
			for i := 0; !stop.Load(); i++ {
				name := fmt.Sprintf("b%d-%d", w, i%3)
				if _, _, err := s.CreateBuffer(name, spec); err != nil {
					t.Error(err)
					return
				}
				if err := s.DeleteBuffer(name); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	reads, last := 0, uint64(0)
	for start := time.Now(); time.Since(start) < time.Second; reads++ {
		data, err := os.ReadFile(filepath.Join(dir, snapshotFile))
		if err != nil {
			t.Fatal(err)
		}
		var snap snapshot
		if err := json.Unmarshal(data, &snap); err != nil {
			t.Fatalf("read %d: torn snapshot: %v", reads, err)
		}
		if snap.Seq < last {
			t.Fatalf("read %d: snapshot seq %d after %d", reads, snap.Seq, last)
		}
		last = snap.Seq
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d snapshot reads, last seq %d", reads, last)
	if temps, _ := filepath.Glob(filepath.Join(dir, snapshotTempPattern)); len(temps) > 0 {
		t.Fatalf("temporary files left: %v", temps)
	}
}

// TestSnapshotSymlinkNotFollowed: a symlink planted at a temporary name
// is never written through.
func TestSnapshotSymlinkNotFollowed(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := openStore(t, dir)
	for _, name := range []string{snapshotFile + ".tmp", snapshotFile + ".1.tmp"} {
		os.Remove(filepath.Join(dir, name))
		if err := os.Symlink(victim, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	mustCreate(t, s, "a", testSpec(KindMemory, 10, true))
	s.publishSnapshot()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(victim); string(data) != "keep" {
		t.Fatalf("the symlink's target was written: %q", data)
	}
	// A reopen clears the stale names.
	s = openStore(t, dir)
	defer s.Close()
	if _, err := os.Lstat(filepath.Join(dir, snapshotFile+".tmp")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale temp left: %v", err)
	}
}
