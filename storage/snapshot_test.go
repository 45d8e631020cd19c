package storage

import (
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestRestartedSince: a read-only open next to a running store reads its
// catalog snapshot, then the files; it reads the snapshot again at the end
// and tries again when another instance of the store wrote it meanwhile
// (the files may mix what a store wrote before a restart with what it
// wrote after). Each writable open of a store is an instance of its own,
// a PID repeated or not.
func TestRestartedSince(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	mustCreate(t, s, "b", testSpec(KindMemmap, 256, false))
	first, _, err := loadSnapshot(dir)
	if err != nil || first.Instance == "" {
		t.Fatalf("snapshot of a writable store: %+v, %v; want an instance", first, err)
	}
	s.publishSnapshot()
	if restartedSince(dir, first.Instance) {
		t.Error("a newer snapshot of the same store taken for another instance's")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir)
	defer s.Close()
	second, _, err := loadSnapshot(dir)
	if err != nil || second.Instance == first.Instance || second.PID != first.PID {
		t.Fatalf("snapshot after a reopen in the same process: %+v, %v; want the same PID, another instance than %q", second, err, first.Instance)
	}
	for _, tc := range []struct {
		name     string
		instance string
		want     bool
	}{
		{"the instance that wrote it", second.Instance, false},
		{"an instance before a restart", first.Instance, true},
		{"a build's before instances, then this one's", "", true},
	} {
		if got := restartedSince(dir, tc.instance); got != tc.want {
			t.Errorf("%s: restartedSince = %v, want %v", tc.name, got, tc.want)
		}
	}
	// A read-only open next to the running store reads its snapshot: the
	// same instance before and after, so it opens.
	rs, err := Open(dir, &Options{ReadOnly: true, LockTimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := rs.SnapshotTime(); !ok {
		t.Error("not opened from the snapshot")
	}
	rs.Close()
	if err := os.Remove(filepath.Join(dir, snapshotFile)); err != nil {
		t.Fatal(err)
	}
	if !restartedSince(dir, second.Instance) {
		t.Error("a snapshot gone since it was read (an instance that could not publish its own removes it) not taken for a restart")
	}
}

// TestReadOnlyOpenReadsAgainAfterARestart: a read-only open next to a
// running store that finds, once it has read the files, another instance's
// snapshot than the one it read first, reads everything again, up to
// snapshotTries times, then fails with errStoreRestarted.
func TestReadOnlyOpenReadsAgainAfterARestart(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	defer s.Close()
	mustCreate(t, s, "b", testSpec(KindMemmap, 256, false))
	restart := func() { // what another open of the store does
		s.instance = rand.Text()
		s.publishSnapshot()
	}
	for _, tc := range []struct {
		name      string
		restarts  int // reads the open finds a restart after
		wantReads int
		wantErr   bool
	}{
		{"no restart", 0, 1, false},
		{"a restart during the first read", 1, 2, false},
		{"restarts during every read", snapshotTries, snapshotTries, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reads := 0
			rs, err := Open(dir, &Options{ReadOnly: true, LockTimeout: 20 * time.Millisecond, afterSnapshotRead: func() {
				if reads++; reads <= tc.restarts {
					restart()
				}
			}})
			if reads != tc.wantReads || (err != nil) != tc.wantErr || (err != nil && !errors.Is(err, errStoreRestarted)) {
				t.Fatalf("%d reads, err %v; want %d reads, an error %v", reads, err, tc.wantReads, tc.wantErr)
			}
			if err == nil {
				if _, ok := rs.SnapshotTime(); !ok {
					t.Error("not opened from the snapshot")
				}
				rs.Close()
			}
		})
	}
}

// TestFailedFirstPublishRemovesTheSnapshot: an open whose first snapshot
// cannot be written removes its predecessor's, which describes the files
// as they were before the open's recovery.
func TestFailedFirstPublishRemovesTheSnapshot(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	mustCreate(t, s, "b", testSpec(KindMemmap, 256, false))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// A directory in the snapshot's place: the rename over it fails.
	path := filepath.Join(dir, snapshotFile)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir)
	defer s.Close()
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		t.Fatal("the failed first publish left what stood in the snapshot's place")
	}
}
