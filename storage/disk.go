package storage

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrIO is returned by every call on a buffer whose mapped files faulted
// (a file truncated underneath the server, a disk that went away): the
// buffer refuses calls until the store is reopened, and the rest of the
// store goes on. HTTP answers 500 "io_error".
var ErrIO = errors.New("storage: i/o error")

// fileBytesNeeded is what the files of a new persistent buffer take on
// disk: the fixed-size columns and the row metadata, reserved at create,
// and what grows with the rows, estimated: compressed fields go to segment
// files (one segment's worth is counted), run records to a run log, and a
// memmap buffer's final observations to dense tail files.
func fileBytesNeeded(spec Spec) int64 {
	if spec.Storage == KindMemory {
		return 0
	}
	slots := ringSlotCount(spec, false) // version 3: a spare block more
	col := func(rowBytes int) int64 { return satAdd(headerSize, satMul(slots, int64(rowBytes))) }
	total := col(recordSize)
	trailer := int64(tailTrailerSize)
	if spec.blockFiles() {
		// rows.meta format version 3: two 32-byte copies a block of 64
		// slots; tail entries with 16-byte trailers.
		trailer = tailTrailerSizeV3
	}
	if spec.runLogFiles() {
		// rows.meta format version 2, and the run log at a run record
		// per 8 rows plus a segment of slack (runBytesPerRow's bargain:
		// one-step episodes would take 64 bytes a row, CartPole-like
		// episodes take 1-2). The log grows with the rows; nothing of it
		// is reserved at create.
		total = satAdd(col(fileRunRecordSize), satAdd(satMul(spec.Capacity, runLogRecordSize/8), runSegmentTarget(spec.Capacity)))
		if spec.blockFiles() {
			total = satAdd(metaV3Size(slots), satAdd(satMul(spec.Capacity, runLogRecordSize/8), runSegmentTarget(spec.Capacity)))
		}
	}
	var compressed int64
	for _, f := range spec.Fields {
		if spec.Compressed(f) {
			compressed = satAdd(compressed, satMul(spec.Capacity, int64(f.RowBytes())))
		} else {
			total = satAdd(total, col(f.RowBytes()))
		}
	}
	if spec.CompactObs {
		for _, k := range spec.ObsKeys {
			f, ok := spec.Field(k)
			switch {
			case !ok || spec.Compressed(f):
			case spec.Storage == KindMemmap:
				// Dense: allocated as done rows come, counted at one in
				// 8 (episodes of 8 steps or more) and the blocks
				// allocated ahead; more done rows than that fail their
				// extends, cleanly, once the disk is full.
				total = satAdd(total, satAdd(headerSize+2<<20, satMul(spec.Capacity/8+1, int64(f.RowBytes())+trailer)))
			case sparseTail(f.RowBytes()):
				// Allocated row by row, for done rows only: counted at
				// one in 8 (episodes of 8 steps or more). More done
				// rows than that fail their extends, cleanly, once the
				// disk is full.
				total = satAdd(total, satAdd(headerSize, satMul(spec.Capacity/8+1, int64(f.RowBytes()))))
			default:
				total = satAdd(total, col(f.RowBytes()))
			}
		}
	}
	if spec.Priority != nil {
		total = satAdd(total, col(8))
	}
	if spec.Storage == KindCompressed && compressed > 0 {
		total = satAdd(total, segmentTarget(compressed))
	}
	return total
}

// diskFree returns the bytes an unprivileged writer may still use on the
// filesystem of dir, or -1 when it cannot tell.
func diskFree(dir string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return -1
	}
	return int64(st.Bavail) * st.Bsize
}

// checkDiskLocked refuses a persistent buffer whose files would not fit on
// the disk, before any file is made.
func (s *Store) checkDiskLocked(name string, spec Spec) error {
	need := fileBytesNeeded(spec)
	if need == 0 {
		return nil
	}
	free := diskFree(s.dir)
	if free < 0 || need <= free {
		return nil
	}
	return &ResourceError{Op: fmt.Sprintf("create buffer %q", name), Err: ErrInsufficientStorage, Needed: need, Available: free,
		Hint: fmt.Sprintf("capacity %d of %s storage, every file reserved at create: lower the capacity, free disk space or use another data dir", spec.Capacity, spec.Storage)}
}

// noSpace reports whether err is the filesystem running out of space (or
// of the user's quota).
func noSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// asNoSpace turns an out-of-space error of op into ErrInsufficientStorage
// (HTTP 507) and leaves other errors as they are.
func (s *Store) asNoSpace(op string, err error) error {
	if err == nil || !noSpace(err) || errors.Is(err, ErrInsufficientStorage) {
		return err
	}
	return &ResourceError{Op: op, Err: ErrInsufficientStorage, Available: max(0, diskFree(s.dir)),
		Hint: fmt.Sprintf("the disk of %s is full (%v); nothing of this call was written, free space and retry", s.dir, err)}
}

// recoverFault turns a memory fault on this goroutine while it touches the
// buffer's mappings (a file truncated underneath, a disk that failed) into
// an error, instead of a crash of the whole process. Use it as
//
//	defer b.recoverFault(&err, debug.SetPanicOnFault(true))
//
// in calls that read or write mapped memory (a deferred call's arguments
// are evaluated at once, so faults panic from there on, and the deferred
// call itself recovers, as recover requires; no closure is allocated on
// these hot paths). The fault marks the buffer failed, and every later
// call on it returns ErrIO without touching the mappings again (locks that
// the faulting call took without defer might still be held).
func (b *Buffer) recoverFault(errp *error, old bool) {
	debug.SetPanicOnFault(old)
	r := recover()
	if r == nil {
		return
	}
	re, ok := r.(runtime.Error)
	addr, isFault := r.(interface{ Addr() uintptr })
	if !ok || !isFault {
		panic(r)
	}
	err := fmt.Errorf("buffer %q: memory fault at %#x reading or writing its files (%v): a file was truncated or its disk failed; the buffer refuses calls until the store is reopened: %w",
		b.name, addr.Addr(), re, ErrIO)
	b.failed.CompareAndSwap(nil, &err)
	b.log.Error("buffer failed", "err", err)
	*errp = err
}
