package storage

import (
	"errors"
	"fmt"
)

// These errors are returned when opening a data dir or a buffer's files.
var (
	// ErrLocked is returned by Open when another process holds the data
	// dir's catalog past Options.LockTimeout.
	ErrLocked = errors.New("storage: data dir is locked by another process")
	// ErrVersionMismatch is returned when a file or the catalog was written
	// by a format version this build does not know (usually a newer rbd).
	ErrVersionMismatch = errors.New("storage: format version mismatch")
	// ErrCorrupt marks damage found in stored bytes: a bad magic number, a
	// checksum mismatch, a file of the wrong size or one that belongs to
	// another buffer. Test for it with errors.Is; errors.As with
	// *CorruptionError gives the location.
	ErrCorrupt = errors.New("storage: corruption")
	// ErrReadOnly is returned by mutating calls on a store opened read-only.
	ErrReadOnly = errors.New("storage: store is read-only")
	// ErrClosed is returned by calls on a closed store or deleted buffer.
	ErrClosed = errors.New("storage: closed")
)

// These errors are returned by buffer management calls.
var (
	// ErrNotFound is returned when a named buffer does not exist.
	ErrNotFound = errors.New("storage: buffer not found")
	// ErrSpecConflict is returned by CreateBuffer when a buffer of that name
	// exists with a different spec.
	ErrSpecConflict = errors.New("storage: buffer exists with a different spec")
	// ErrTooManyBuffers is returned by CreateBuffer when Options.MaxBuffers
	// buffers are open, or the process has too few file descriptors left
	// for another persistent buffer.
	ErrTooManyBuffers = errors.New("storage: too many buffers")
	// ErrTooManyStreams is returned by Extend when a new stream would
	// hold an open trajectory while Options.MaxStreams streams of the
	// buffer already do. Nothing is written.
	ErrTooManyStreams = errors.New("storage: too many open streams")
	// ErrInvalidName is returned for a buffer name outside
	// ^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$ (or containing "..").
	ErrInvalidName = errors.New("storage: invalid buffer name")
	// ErrSeqsExhausted was returned by Extend when the rows would take
	// seqs past what the buffer could stamp: (2^32 - 1) x capacity in a
	// memory buffer with row_meta "strided", whose stamps held the whole
	// pass. Since 2026-11-28 they hold its low bits and no buffer returns
	// it; it stays for callers that test for it (and the HTTP API's 507
	// seqs_exhausted, which no request gets now).
	ErrSeqsExhausted = errors.New("storage: seqs exhausted")
)

// These errors are returned when the machine cannot hold what a call asks
// for. Test for them with errors.Is; errors.As with *ResourceError gives
// the figures.
var (
	// ErrInsufficientMemory is returned by CreateBuffer when the buffer,
	// once full, would not fit in the memory left to buffers
	// (Options.MemoryLimit).
	ErrInsufficientMemory = errors.New("storage: insufficient memory")
	// ErrInsufficientStorage is returned when the disk cannot hold what
	// a call must write.
	ErrInsufficientStorage = errors.New("storage: insufficient storage")
)

// ResourceError says how much of a resource a call needed and how much was
// available.
type ResourceError struct {
	Op        string // what was attempted, e.g. `create buffer "x"`
	Err       error  // ErrInsufficientMemory or ErrInsufficientStorage
	Needed    int64  // bytes
	Available int64  // bytes
	Hint      string // what to change, if anything
}

func (e *ResourceError) Error() string {
	what := "memory"
	if e.Err == ErrInsufficientStorage {
		what = "disk space"
	}
	msg := fmt.Sprintf("%s: needs %d bytes of %s, %d available", e.Op, e.Needed, what, e.Available)
	if e.Needed <= 0 {
		msg = fmt.Sprintf("%s: out of %s, %d bytes available", e.Op, what, e.Available)
	}
	if e.Hint != "" {
		msg += " (" + e.Hint + ")"
	}
	return msg
}

// Unwrap returns the sentinel.
func (e *ResourceError) Unwrap() error { return e.Err }

// ErrInvalidBatch is wrapped by every error that rejects an extend because
// of its content (missing, extra, mis-typed or mis-shaped field, bad flags).
// Nothing is written when it is returned.
var ErrInvalidBatch = errors.New("storage: invalid batch")

// CorruptionError locates damage in a buffer's files.
type CorruptionError struct {
	Path   string // file that holds the damage
	Offset int64  // byte offset in the file, -1 if not known
	Err    error  // what is wrong
}

func (e *CorruptionError) Error() string {
	if e.Offset >= 0 {
		return fmt.Sprintf("storage: corruption in %s at offset %d: %v", e.Path, e.Offset, e.Err)
	}
	return fmt.Sprintf("storage: corruption in %s: %v", e.Path, e.Err)
}

// Unwrap lets errors.Is match both ErrCorrupt and the underlying cause.
func (e *CorruptionError) Unwrap() []error { return []error{ErrCorrupt, e.Err} }

func corruptf(path string, off int64, format string, args ...any) error {
	return &CorruptionError{Path: path, Offset: off, Err: fmt.Errorf(format, args...)}
}

// BatchError names the field (and row, when one row is at fault) that made
// an extend invalid.
type BatchError struct {
	Field string // field name, "env", or "" for the batch as a whole
	Row   int    // -1 when not about one row
	Msg   string
}

func (e *BatchError) Error() string {
	switch {
	case e.Field != "" && e.Row >= 0:
		return fmt.Sprintf("field %q row %d: %s", e.Field, e.Row, e.Msg)
	case e.Field != "":
		return fmt.Sprintf("field %q: %s", e.Field, e.Msg)
	case e.Row >= 0:
		return fmt.Sprintf("row %d: %s", e.Row, e.Msg)
	}
	return e.Msg
}

// Unwrap returns ErrInvalidBatch.
func (e *BatchError) Unwrap() error { return ErrInvalidBatch }

func batchErr(field string, row int, format string, args ...any) error {
	return &BatchError{Field: field, Row: row, Msg: fmt.Sprintf(format, args...)}
}
