package storage

import (
	"github.com/rbdb/rbd/ratelimit"

	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// A running store holds bbolt's exclusive lock on catalog.db, so read-only
// tools (dump, verify) cannot open the catalog meanwhile — and a raw copy of
// a live bbolt file can be torn. Instead the store publishes what they need
// in catalog.snapshot.json (written to a temporary file and renamed, so it
// is always whole) at open, on every buffer change and at every checkpoint.
// A read-only Open that cannot get the lock in time reads it instead and
// says how old it is.

const snapshotFile = "catalog.snapshot.json"

type snapshot struct {
	// Seq grows by one with every snapshot a store writes: a reader can
	// tell a newer one from an older one.
	Seq       uint64    `json:"seq"`
	WrittenAt time.Time `json:"written_at"`
	Format    uint32    `json:"format"`
	PID       int       `json:"pid"`
	// Instance is random to each open of the store that writes the
	// snapshots (a PID repeats across restarts in a container): a reader
	// that finds another instance's snapshot after it read the files
	// knows the store restarted meanwhile (restartedSince).
	Instance string           `json:"instance,omitempty"`
	Buffers  []snapshotBuffer `json:"buffers"`
}

type snapshotBuffer struct {
	Name  string          `json:"name"`
	Spec  json.RawMessage `json:"spec"`
	State bufferState     `json:"state"`
	// RateLimit is the limiter's live state when the snapshot was taken
	// (for rbd dump next to a running server).
	RateLimit *ratelimit.State `json:"rate_limit,omitempty"`
}

// publishSnapshot writes the catalog snapshot. Failures are logged, not
// returned: the snapshot only serves read-only tools. (At open a failure
// also removes the snapshot of the store's previous instance: see
// Store.publishFirstSnapshot.)
//
// One writer at a time (snapMu), so the content is taken and the file
// renamed in the same order, and an older snapshot never replaces a newer
// one. Each write goes to its own temporary file, created exclusively
// (os.CreateTemp: O_EXCL, so a symlink planted in the dir is never
// followed), synced, then renamed over the snapshot: a reader sees the
// old file or the new one, whole.
func (s *Store) publishSnapshot() {
	if s.readOnly {
		return
	}
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	s.snapSeq++
	s.snapFailed = false
	// What this snapshot shows is no longer news for the checkpoint loop
	// (cleared before the state is read: a change racing with the read
	// sets them again, and costs at most one more snapshot). Left set, an
	// idle store republished once after every open.
	s.stateChanged.Store(false)
	snap := snapshot{Seq: s.snapSeq, WrittenAt: time.Now().UTC(), Format: FormatVersion, PID: os.Getpid(), Instance: s.instance}
	for _, b := range s.Buffers() {
		spec, err := b.Spec().MarshalJSON()
		if err != nil {
			continue
		}
		b.rlShown.Store(b.limiter.Version())
		sb := snapshotBuffer{Name: b.name, Spec: spec, State: b.state(false)}
		if st, on := b.limiter.State(); on {
			sb.RateLimit = &st
		}
		snap.Buffers = append(snap.Buffers, sb)
	}
	if err := writeSnapshotFile(s.dir, snap); err != nil {
		s.log.Warn("publish catalog snapshot", "err", err)
		s.snapFailed = true
	}
}

// publishFirstSnapshot publishes the snapshot of a store just opened. If
// that fails, the snapshot on disk is the previous instance's, from
// before this open's recovery: a reader that took it would read files
// this open changed (holes it made of rows whose bytes and pieces are
// there) as that instance left them, so it is removed, and readers say
// there is no usable snapshot until the next publish succeeds.
func (s *Store) publishFirstSnapshot() {
	s.publishSnapshot()
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	if !s.snapFailed {
		return
	}
	if err := os.Remove(filepath.Join(s.dir, snapshotFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Error("remove the catalog snapshot of the store's previous open after failing to publish this one's: read-only tools next to this store may read the files as before its recovery", "err", err)
	}
}

// snapshotTempPattern names the temporary files of snapshot writes.
const snapshotTempPattern = snapshotFile + ".*.tmp"

func writeSnapshotFile(dir string, snap snapshot) (retErr error) {
	data, err := json.MarshalIndent(snap, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, snapshotTempPattern)
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if retErr != nil {
			retErr = errors.Join(retErr, os.Remove(tmp))
		}
	}()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, snapshotFile))
}

// removeSnapshotTemps deletes temporary snapshot files a crash left.
func removeSnapshotTemps(dir string, log interface{ Warn(string, ...any) }) {
	paths, _ := filepath.Glob(filepath.Join(dir, snapshotTempPattern))
	paths = append(paths, filepath.Join(dir, snapshotFile+".tmp")) // the fixed name of older builds
	for _, p := range paths {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.Warn("remove a stale snapshot file", "path", p, "err", err)
		}
	}
}

// loadSnapshot reads the snapshot a running store published.
func loadSnapshot(dir string) (*snapshot, []catalogEntry, error) {
	data, err := os.ReadFile(filepath.Join(dir, snapshotFile))
	if err != nil {
		return nil, nil, fmt.Errorf("read catalog snapshot: %w", err)
	}
	var snap snapshot
	if err := json.Unmarshal(data, &snap); err != nil {
		return nil, nil, corruptf(filepath.Join(dir, snapshotFile), -1, "%v", err)
	}
	if snap.Format != FormatVersion {
		return nil, nil, fmt.Errorf("catalog snapshot has format version %d, this build reads %d: %w", snap.Format, FormatVersion, ErrVersionMismatch)
	}
	var out []catalogEntry
	for _, sb := range snap.Buffers {
		e := catalogEntry{name: sb.Name, state: sb.State, rateLimit: sb.RateLimit}
		if err := e.spec.UnmarshalJSON(sb.Spec); err != nil {
			return nil, nil, corruptf(filepath.Join(dir, snapshotFile), -1, "buffer %q spec: %v", sb.Name, err)
		}
		e.spec = e.spec.WithDefaults()
		out = append(out, e)
	}
	return &snap, out, nil
}

// errStoreRestarted: the running store whose snapshot a read-only open
// read restarted while the open read the files (see snapshot.Instance).
var errStoreRestarted = errors.New("the running store restarted while this open read its files")

// snapshotTries is how many times a read-only open next to a running store
// reads the files again when that store restarted meanwhile.
const snapshotTries = 3

// readSettled runs read (an open of the files) again while it finds that
// the running store restarted as it read, at most snapshotTries times.
func readSettled[T any](read func() (T, error)) (T, error) {
	for try := 1; ; try++ {
		v, err := read()
		if !errors.Is(err, errStoreRestarted) || try == snapshotTries {
			return v, err
		}
	}
}

// restartedSince reports whether the snapshot in dir is another store
// instance's than instance (a snapshot read before the files were), or
// is gone or unreadable (an instance that could not publish its own
// removes its predecessor's). The files may then mix what the store wrote
// before its restart with what it wrote after: an open after a crash can
// make holes of rows whose bytes and pieces are in the files, known only
// to its catalog and, for version 3 blocks it goes on filling, to a hole
// record the reader may have read the run log too early to see. Two
// snapshots without an instance (builds before 2026-11-30, which make no
// such holes) are not told apart.
func restartedSince(dir, instance string) bool {
	snap, _, err := loadSnapshot(dir)
	return err != nil || snap.Instance != instance
}

// SnapshotTime reports whether the store was opened from the snapshot of a
// running store (because its catalog was locked), and when that snapshot
// was written.
func (s *Store) SnapshotTime() (time.Time, bool) { return s.snapAt, !s.snapAt.IsZero() }

// readOnlyEntries opens the catalog read-only or, when another process
// holds it, falls back to its published snapshot.
func readOnlyEntries(dir string, timeout time.Duration) (*catalog, []catalogEntry, *snapshot, error) {
	cat, err := openCatalog(filepath.Join(dir, "catalog.db"), true, timeout)
	if err == nil {
		entries, err := cat.entries()
		if err != nil {
			return nil, nil, nil, errors.Join(err, cat.close())
		}
		return cat, entries, nil, nil
	}
	if !errors.Is(err, ErrLocked) {
		return nil, nil, nil, err
	}
	snap, entries, serr := loadSnapshot(dir)
	if serr != nil {
		return nil, nil, nil, fmt.Errorf("%w; and no usable snapshot: %w", err, serr)
	}
	return nil, entries, snap, nil
}
