package storage

import (
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
		{"a snapshot of a build before instances", "", false},
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
	if restartedSince(dir, second.Instance) {
		t.Error("no snapshot to read taken for a restart")
	}
}
