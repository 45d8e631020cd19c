package storage

import (
	"errors"
	"fmt"
	"maps"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
)

// UpdateFields sets mutable fields of live rows, named by seq: fields maps
// a field name to len(seqs) rows of the field's bytes, in seqs' order.
// Rows that are no longer live (overwritten since they were sampled, or
// never written) are skipped and counted as stale, never applied to the
// slot's new row. With duplicate seqs the last value wins. A field that is
// unknown, not mutable or of the wrong size fails the whole call before
// anything changes; nothing else about a row (its other fields, links,
// flags, priority) ever changes.
//
// Readers never see a row's mutable field half updated: gathers copy
// mutable columns under a seqlock (mutGen). Under DurabilityFsync the
// call returns once the updated columns are on stable storage; otherwise
// updates reach the disk with the next sync. A crash during an update can
// leave a row's mutable field with its old value, its new one or, for the
// row being copied at that moment, part of each: mutable fields are not in
// the row's checksum, so recovery keeps the row either way (docs/format.md).
func (b *Buffer) UpdateFields(seqs []int64, fields map[string][]byte) (updated, stale int, err error) {
	if len(fields) == 0 {
		return 0, 0, batchErr("fields", -1, "none given (want at least one mutable field)")
	}
	cols := make([]*column, 0, len(fields))
	srcs := make([][]byte, 0, len(fields))
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		i, ok := b.colOf[name]
		if !ok {
			return 0, 0, batchErr(name, -1, "not a field of buffer %q (mutable fields: %s)", b.name, b.mutableNames())
		}
		c := b.cols[i]
		if !c.field.Mutable {
			return 0, 0, batchErr(name, -1, "is not mutable: only fields the spec marks \"mutable\": true can be updated (mutable fields: %s)", b.mutableNames())
		}
		if want := len(seqs) * c.rowBytes; len(fields[name]) != want {
			return 0, 0, batchErr(name, -1, "has %d bytes, want %d (%d rows of %s %v)", len(fields[name]), want, len(seqs), c.field.DType, c.field.Shape)
		}
		cols, srcs = append(cols, c), append(srcs, fields[name])
	}
	if err := b.enter(); err != nil {
		return 0, 0, err
	}
	defer b.leave()
	defer b.recoverFault(&err, debug.SetPanicOnFault(true))
	if b.store.readOnly {
		return 0, 0, fmt.Errorf("update %q: %w", b.name, ErrReadOnly)
	}
	updated, stale = b.applyUpdate(seqs, cols, srcs)
	if updated == 0 || !b.persistent {
		return updated, stale, nil
	}
	b.dirty.Store(true)
	if b.spec.Durability == DurabilityFsync {
		var errs []error
		for _, c := range cols {
			errs = append(errs, c.region.Sync())
		}
		if err := errors.Join(errs...); err != nil {
			return updated, stale, fmt.Errorf("update %q: rows updated but not durable: %w", b.name, err)
		}
	}
	return updated, stale, nil
}

// applyUpdate copies the new values into the live rows. wmu keeps writers
// from reusing a slot between the live check and the copy; umu is what
// readers fall back to when updates keep coming. Everything is released by
// defers: a fault in a mapped file (recovered by guard) must not leave the
// seqlock odd or a lock held.
func (b *Buffer) applyUpdate(seqs []int64, cols []*column, srcs [][]byte) (updated, stale int) {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	b.umu.Lock()
	defer b.umu.Unlock()
	b.mutGen.Add(1)
	defer b.mutGen.Add(1)
	wc := b.writeCount.Load()
	for j, seq := range seqs {
		if seq < 0 || seq >= wc || seq < wc-b.capacity || b.stamps.Load(seq%b.slots) != seq {
			stale++
			continue
		}
		slot := seq % b.slots
		for i, c := range cols {
			copy(c.row(slot), srcs[i][j*c.rowBytes:(j+1)*c.rowBytes])
		}
		updated++
	}
	return updated, stale
}

// MutableFields returns the names of the fields UpdateFields may set, in
// spec order.
func (b *Buffer) MutableFields() []string {
	var out []string
	for _, f := range b.spec.Fields {
		if f.Mutable {
			out = append(out, f.Name)
		}
	}
	return out
}

func (b *Buffer) mutableNames() string {
	names := b.MutableFields()
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// readMutable runs copy, which reads mutable columns, so that it sees no
// update half done: optimistically, again while an update ran meanwhile,
// and after a few tries under umu so a stream of updates cannot starve it.
func (b *Buffer) readMutable(copy func()) {
	for try := 0; try < 4; try++ {
		g := b.mutGen.Load()
		if g&1 == 0 {
			copy()
			// CompareAndSwap, not Load: a full barrier, so on weakly
			// ordered CPUs the copy's loads cannot move past the check
			// (as in Gather's stamp check).
			if b.mutGen.CompareAndSwap(g, g) {
				return
			}
		}
		runtime.Gosched()
	}
	b.umu.Lock()
	defer b.umu.Unlock()
	copy()
}
