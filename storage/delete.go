package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// Deleting a buffer is all or nothing. For a persistent buffer:
//
//  1. its directory is renamed into <data>/trash/ (one rename on the same
//     filesystem: atomic), and the parent dirs are synced;
//  2. its catalog entry is deleted;
//  3. its mappings are dropped, and the trash is emptied in the background.
//
// If 1 fails the buffer is untouched; if 2 fails the directory is renamed
// back: either way the buffer stays whole and usable and the error says
// why. A crash after 1 and before 2 leaves the catalog entry with its
// directory in the trash: Open moves it back (the delete did not happen).
// A crash after 2 leaves only trash, which Open empties. A memory buffer
// has only step 2.

const trashDir = "trash"

// trashName is where a deleted buffer's directory waits to be removed.
func (s *Store) trashName(b *Buffer) string {
	return filepath.Join(s.dir, trashDir, fmt.Sprintf("%s.%016x", b.name, b.uid))
}

// DeleteBuffer removes a buffer. New calls on it fail at once; calls in
// flight finish first (unmapping under a reader would crash the process).
// Either the buffer is gone (catalog entry and files), or it stays whole
// and the error says why.
func (s *Store) DeleteBuffer(name string) (retErr error) {
	if s.readOnly {
		return fmt.Errorf("delete buffer %q: %w", name, ErrReadOnly)
	}
	s.mu.Lock()
	b, ok := s.buffers[name]
	if ok {
		delete(s.buffers, name)
	}
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("delete buffer %q: %w", name, ErrNotFound)
	}
	b.closed.Store(true)
	// Waiters of the rate limiter are answered now (they hold no lock, so
	// the delete does not wait for their deadlines).
	b.limiter.Close(fmt.Errorf("buffer %q was deleted: %w", name, ErrClosed))
	b.life.Lock()
	defer b.life.Unlock()
	defer func() {
		if retErr != nil {
			// The buffer stays: it takes calls again.
			b.limiter.Reopen()
			b.closed.Store(false)
			s.mu.Lock()
			s.buffers[name] = b
			s.mu.Unlock()
			retErr = fmt.Errorf("delete buffer %q (it is kept, whole): %w", name, retErr)
		}
	}()
	var trash string
	if b.persistent {
		trash = s.trashName(b)
		if err := s.moveToTrash(b.dir, trash); err != nil {
			return err
		}
		s.crash.at("delete-after-rename")
	}
	if err := s.hooks.deleteCatalog(s.cat, name); err != nil {
		if b.persistent {
			if rerr := s.hooks.rename(trash, b.dir); rerr != nil {
				// The catalog still lists it and Open moves the dir back
				// from the trash; until then its files are there.
				err = errors.Join(err, fmt.Errorf("move %s back: %w", trash, rerr))
			}
		}
		return err
	}
	s.crash.at("delete-after-catalog")
	if err := b.dropWitness(); err != nil {
		s.log.Warn("remove a deleted buffer's seq witness", "buffer", name, "err", err)
	}
	if err := b.unmap(); err != nil {
		s.log.Warn("unmap a deleted buffer", "buffer", name, "err", err)
	}
	if b.persistent {
		s.trash.add(trash)
	}
	s.log.Info("buffer deleted", "buffer", name)
	s.publishSnapshot()
	return nil
}

// moveToTrash renames a buffer's dir into the trash and makes the rename
// durable.
func (s *Store) moveToTrash(dir, trash string) error {
	if err := os.MkdirAll(filepath.Dir(trash), 0o755); err != nil {
		return fmt.Errorf("make trash dir: %w", err)
	}
	if err := s.hooks.rename(dir, trash); err != nil {
		return fmt.Errorf("move %s to the trash: %w", dir, err)
	}
	if err := errors.Join(syncDir(filepath.Dir(dir)), syncDir(filepath.Dir(trash))); err != nil {
		return errors.Join(err, s.hooks.rename(trash, dir))
	}
	return nil
}

// restoreFromTrash finds the dir of a buffer whose delete a crash cut
// between the rename and the catalog delete, and moves it back (a
// read-only open reads it where it is).
func (s *Store) restoreFromTrash(b *Buffer) bool {
	trash := s.trashName(b)
	if _, err := os.Stat(trash); err != nil {
		return false
	}
	if s.readOnly {
		b.dir = trash
		return true
	}
	name, dir := b.name, b.dir
	if err := os.Rename(trash, dir); err != nil {
		s.log.Error("move a buffer back from the trash", "buffer", name, "err", err)
		return false
	}
	s.log.Warn("buffer's delete was cut short by a crash before its catalog entry went: moved back from the trash", "buffer", name)
	return true
}

// storeHooks lets tests make the steps of a delete fail, and run writes
// between a hot checkpoint's steps.
type storeHooks struct {
	renameFn        func(from, to string) error
	deleteCatalogFn func(c *catalog, name string) error
	// checkpointChecked runs after a version 3 checkpoint has checked the
	// stamps of the block at base.
	checkpointChecked func(base int64)
	// beforeSync, when set, runs as every sync of a buffer's files
	// begins; what it returns fails the sync.
	beforeSync func(buffer string) error
	// afterWatermark, when set, runs once a sync has written its
	// watermark; what it returns fails the sync (as a failure to collect
	// the segments the window left would).
	afterWatermark func(buffer string) error
	// putState, when set, runs before a buffer's state is committed to
	// the catalog; what it returns fails the commit.
	putState func(buffer string) error
}

func (h *storeHooks) rename(from, to string) error {
	if h.renameFn != nil {
		return h.renameFn(from, to)
	}
	return os.Rename(from, to)
}

func (h *storeHooks) deleteCatalog(c *catalog, name string) error {
	if h.deleteCatalogFn != nil {
		return h.deleteCatalogFn(c, name)
	}
	return c.deleteBuffer(name)
}

// trashWorker removes deleted buffers' dirs in the background, and at
// open whatever a crash left in the trash.
type trashWorker struct {
	mu      sync.Mutex
	pending []string
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	log     interface{ Warn(string, ...any) }
}

func (s *Store) startTrash() {
	w := &s.trash
	w.wake, w.stop, w.done, w.log = make(chan struct{}, 1), make(chan struct{}), make(chan struct{}), s.log
	if entries, err := os.ReadDir(filepath.Join(s.dir, trashDir)); err == nil {
		for _, e := range entries {
			w.add(filepath.Join(s.dir, trashDir, e.Name()))
		}
	}
	go w.run()
}

// stopTrash stops the worker (what is left is removed at the next open).
func (s *Store) stopTrash() {
	if s.trash.stop != nil {
		close(s.trash.stop)
		<-s.trash.done
	}
}

func (w *trashWorker) add(path string) {
	w.mu.Lock()
	w.pending = append(w.pending, path)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *trashWorker) run() {
	defer close(w.done)
	for {
		w.mu.Lock()
		var next string
		if len(w.pending) > 0 {
			next, w.pending = w.pending[0], w.pending[1:]
		}
		w.mu.Unlock()
		if next != "" {
			if err := os.RemoveAll(next); err != nil {
				w.log.Warn("empty the trash", "path", next, "err", err)
			}
			select {
			case <-w.stop:
				return
			default:
			}
			continue
		}
		select {
		case <-w.stop:
			return
		case <-w.wake:
		}
	}
}
