// Package mmapfile maps whole files (or anonymous memory) into the address
// space. It is the only place in rbd that touches mmap, so the mapping library
// can be swapped without touching the storage engine.
//
// # Caveats
//
// Slices returned by Bytes alias the mapping and become invalid after Close:
// touching them then crashes the process. Callers must make sure no reader is
// still using a mapping when they close it.
package mmapfile

import (
	"errors"
	"fmt"
	"io"
	"os"

	mmap "github.com/edsrzf/mmap-go"
	"golang.org/x/sys/unix"
)

// Region is a mapped file or an anonymous mapping.
type Region struct {
	f    *os.File // nil for anonymous regions
	m    mmap.MMap
	path string
}

// Anonymous maps size bytes of zeroed memory that is not backed by a file.
// Pages are allocated by the kernel on first touch, so a sparse ring (such as
// the tail store, where only trajectory ends are written) costs only what it
// uses.
func Anonymous(size int64) (*Region, error) {
	// Private, not shared (mmap-go's ANON is MAP_SHARED): shared anonymous
	// memory is shmem, which the kernel backs with huge pages only under
	// shmem_enabled, usually never, while private memory follows
	// MADV_HUGEPAGE (AdviseHugePages). Nothing else maps these pages.
	return anonymous(size, unix.MAP_PRIVATE|unix.MAP_ANON)
}

func anonymous(size int64, flags int) (*Region, error) {
	if size <= 0 {
		return nil, fmt.Errorf("mmap anonymous: size %d must be positive", size)
	}
	if size != int64(int(size)) {
		return nil, fmt.Errorf("mmap anonymous: size %d too large for this platform", size)
	}
	m, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		return nil, fmt.Errorf("mmap anonymous %d bytes: %w", size, err)
	}
	return &Region{m: mmap.MMap(m), path: "(anonymous)"}, nil
}

// AnonymousNoReserve is Anonymous for tables that most processes touch a
// small part of, however large (MAP_NORESERVE): the kernel charges no
// swap or commit for the whole size at the mapping (under its default
// heuristic overcommit), only for the pages written. Writing a page the
// machine has no memory for then kills the process instead of failing
// here; use it only where an allocation of the same pages would have done
// no better.
func AnonymousNoReserve(size int64) (*Region, error) {
	return anonymous(size, unix.MAP_PRIVATE|unix.MAP_ANON|unix.MAP_NORESERVE)
}

// Create makes a new file of exactly size bytes (sparse: holes cost no disk)
// and maps it read-write. It fails if the file exists.
func Create(path string, size int64) (*Region, error) { return CreateSparse(path, size, size) }

// CreateSparse is Create with only the file's first allocated bytes
// reserved: the rest are holes until Allocate reserves them. Writes
// through the mapping must stay within reserved blocks (see reserve).
func CreateSparse(path string, size, allocated int64) (r *Region, retErr error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	defer func() {
		if retErr != nil {
			retErr = errors.Join(retErr, f.Close(), os.Remove(path))
		}
	}()
	if err := f.Truncate(size); err != nil {
		return nil, fmt.Errorf("truncate %s to %d: %w", path, size, err)
	}
	if err := reserve(f, min(allocated, size)); err != nil {
		return nil, fmt.Errorf("reserve %d bytes for %s: %w", allocated, path, err)
	}
	return mapFile(f, path, size, true)
}

// Allocate reserves the blocks of the file's bytes [off, off+n), which
// writes through the mapping may then touch without faulting on a full
// disk. It fails with ENOSPC when the disk cannot provide them.
func (r *Region) Allocate(off, n int64) error {
	if r.f == nil || n <= 0 {
		return nil
	}
	if err := reserveRange(r.f, off, n); err != nil {
		return fmt.Errorf("allocate %d bytes at %d of %s: %w", n, off, r.path, err)
	}
	return nil
}

// Punch gives back to the filesystem the blocks of the whole pages within
// [off, off+n), which then read as zeros and must be allocated again
// before a write touches them.
func (r *Region) Punch(off, n int64) error {
	if r.f == nil {
		return nil
	}
	page := int64(os.Getpagesize())
	start, end := (off+page-1)/page*page, (off+n)/page*page
	if end <= start {
		return nil
	}
	if err := unix.Fallocate(int(r.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, start, end-start); err != nil {
		return fmt.Errorf("punch %d bytes at %d of %s: %w", end-start, start, r.path, err)
	}
	return nil
}

// reserve makes the filesystem allocate every block of the file's first
// size bytes. A write through a mapping to a block the filesystem cannot
// allocate (the disk is full) is not an error but a SIGBUS that kills the
// process: with every block reserved up front, the mapping never needs
// one. fallocate(2) does it in one call; where the filesystem does not
// support it, a zero byte is written into every block that is not
// allocated yet (what posix_fallocate does).
func reserve(f *os.File, size int64) error { return reserveRange(f, 0, size) }

// reserveRange is reserve for the bytes [off, off+n).
func reserveRange(f *os.File, off, n int64) error {
	err := unix.Fallocate(int(f.Fd()), 0, off, n)
	if err == nil || (err != unix.EOPNOTSUPP && err != unix.ENOSYS) {
		return err
	}
	page := int64(os.Getpagesize())
	var zero [1]byte
	for p := off / page * page; p < off+n; p += page {
		// A block that already holds data keeps it: only holes get the
		// zero byte (reading a hole gives zeros too).
		if next, err := unix.Seek(int(f.Fd()), p, unix.SEEK_DATA); err == nil && next == p {
			continue
		}
		if _, err := f.WriteAt(zero[:], max(p, off)); err != nil {
			return err
		}
	}
	return nil
}

// Allocate reserves every block of f's first size bytes (see reserve),
// for files written without a mapping (a checkpoint's copies).
func Allocate(f *os.File, size int64) error {
	if err := reserve(f, size); err != nil {
		return fmt.Errorf("reserve %d bytes for %s: %w", size, f.Name(), err)
	}
	return nil
}

// Reserve allocates whatever blocks of the file are not allocated yet (a
// file written by an older rbd, or copied sparse), so that writes through
// the mapping never fault. It fails with ENOSPC (wrapped) when the disk
// cannot hold the file; nothing written is lost then.
func (r *Region) Reserve() error {
	if r.f == nil {
		return nil
	}
	if err := reserve(r.f, int64(len(r.m))); err != nil {
		return fmt.Errorf("reserve %d bytes for %s: %w", len(r.m), r.path, err)
	}
	return nil
}

// Unbacked returns how many of the file's bytes are holes (blocks not
// allocated): 0 for a file reserved with Create or Reserve.
func (r *Region) Unbacked() (int64, error) {
	if r.f == nil {
		return 0, nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(r.f.Fd()), &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", r.path, err)
	}
	return max(0, int64(len(r.m))-st.Blocks*512), nil
}

// Open maps an existing file. The file must be exactly size bytes long: a
// mapping past the end of a shorter file would crash on first touch (SIGBUS),
// so a short file is refused here instead.
func Open(path string, size int64, writable bool) (*Region, error) {
	flag := os.O_RDONLY
	if writable {
		flag = os.O_RDWR
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	st, err := f.Stat()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("stat %s: %w", path, err), f.Close())
	}
	if st.Size() != size {
		return nil, errors.Join(&SizeError{Path: path, Want: size, Got: st.Size()}, f.Close())
	}
	r, err := mapFile(f, path, size, writable)
	if err != nil {
		return nil, errors.Join(err, f.Close())
	}
	return r, nil
}

// SizeError reports a file whose length differs from what its header and the
// catalog require (typically a truncated or foreign file).
type SizeError struct {
	Path      string
	Want, Got int64
}

func (e *SizeError) Error() string {
	return fmt.Sprintf("%s is %d bytes, want %d", e.Path, e.Got, e.Want)
}

func mapFile(f *os.File, path string, size int64, writable bool) (*Region, error) {
	if size != int64(int(size)) {
		return nil, fmt.Errorf("mmap %s: size %d too large for this platform", path, size)
	}
	prot := mmap.RDONLY
	if writable {
		prot = mmap.RDWR
	}
	m, err := mmap.MapRegion(f, int(size), prot, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	return &Region{f: f, m: m, path: path}, nil
}

// ReadAt reads the file behind the region through its descriptor, not the
// mapping: a scan of a large file then leaves no pages mapped into this
// process (they stay in the page cache, which the kernel reclaims). It is
// io.ReaderAt; anonymous regions read from memory.
func (r *Region) ReadAt(p []byte, off int64) (int, error) {
	if r.f == nil {
		if off >= int64(len(r.m)) {
			return 0, io.EOF
		}
		n := copy(p, r.m[off:])
		if n < len(p) {
			return n, io.EOF
		}
		return n, nil
	}
	return r.f.ReadAt(p, off)
}

// WriteAt writes p at off through the file's descriptor (one pwrite; the
// mapping sees it, both being the page cache). A small write this way is
// whole or absent if the process is killed, where stores into the mapping
// could be cut between two of them. Anonymous regions copy into memory.
func (r *Region) WriteAt(p []byte, off int64) (int, error) {
	if r.f == nil {
		if off < 0 || off+int64(len(p)) > int64(len(r.m)) {
			return 0, fmt.Errorf("mmap write at %d: %d bytes past the region's %d", off, len(p), len(r.m))
		}
		return copy(r.m[off:], p), nil
	}
	return r.f.WriteAt(p, off)
}

// NextData returns the offset of the first byte at or after off that may
// hold data, skipping holes of a sparse file (lseek SEEK_DATA), or size
// when there is none. Where the filesystem cannot tell, it returns off.
func (r *Region) NextData(off int64) int64 {
	size := int64(len(r.m))
	if r.f == nil || off >= size {
		return min(off, size)
	}
	next, err := unix.Seek(int(r.f.Fd()), off, unix.SEEK_DATA)
	switch {
	case err == unix.ENXIO:
		return size // no data past off
	case err != nil:
		return off
	}
	return min(next, size)
}

// NextHole returns the offset of the first byte at or after off that is
// in a hole (or the region's size): where the data run at off ends.
func (r *Region) NextHole(off int64) int64 {
	size := int64(len(r.m))
	if r.f == nil || off >= size {
		return min(off, size)
	}
	next, err := unix.Seek(int(r.f.Fd()), off, unix.SEEK_HOLE)
	if err != nil {
		return size // as if all data: the caller assumes blocks are held
	}
	return min(next, size)
}

// Bytes returns the mapped memory.
func (r *Region) Bytes() []byte { return r.m }

// Path names the file behind the region ("(anonymous)" for anonymous ones).
func (r *Region) Path() string { return r.path }

// Sync writes the dirty pages of the whole region to stable storage and
// waits for it (msync MS_SYNC). The kernel only visits dirty pages, so the
// cost follows what was written, not the size of the mapping.
func (r *Region) Sync() error {
	if r.f == nil {
		return nil
	}
	if err := r.m.Flush(); err != nil {
		return fmt.Errorf("msync %s: %w", r.path, err)
	}
	return nil
}

// SyncRange syncs the pages covering [off, off+n).
func (r *Region) SyncRange(off, n int) error {
	if r.f == nil || n <= 0 {
		return nil
	}
	page := os.Getpagesize()
	start := off &^ (page - 1)
	end := off + n
	if end > len(r.m) {
		end = len(r.m)
	}
	if err := unix.Msync(r.m[start:end], unix.MS_SYNC); err != nil {
		return fmt.Errorf("msync %s [%d,%d): %w", r.path, start, end, err)
	}
	return nil
}

// Close unmaps the region and closes the file.
func (r *Region) Close() error {
	var errs []error
	if r.m != nil {
		if err := r.m.Unmap(); err != nil {
			errs = append(errs, fmt.Errorf("munmap %s: %w", r.path, err))
		}
		r.m = nil
	}
	if r.f != nil {
		if err := r.f.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close %s: %w", r.path, err))
		}
		r.f = nil
	}
	return errors.Join(errs...)
}

// AdviseHugePages asks the kernel to back the region with transparent huge
// pages where it can (madvise MADV_HUGEPAGE). Only for regions that are
// read at random and filled densely: a huge page is allocated whole on
// first touch, so a sparse region would cost up to 2 MiB per touched row.
// It is advice: an error only means the kernel keeps small pages.
func (r *Region) AdviseHugePages() error {
	if len(r.m) == 0 {
		return nil
	}
	return unix.Madvise(r.m, unix.MADV_HUGEPAGE)
}

// AdviseRandom tells the kernel that the region's pages are used in no
// order (madvise MADV_RANDOM): a fault reads no pages around it, so the
// page cache holds the file in single pages, not in the large folios
// readahead would make.
func (r *Region) AdviseRandom() error {
	if len(r.m) == 0 {
		return nil
	}
	return unix.Madvise(r.m, unix.MADV_RANDOM)
}

// Discard gives the pages of an anonymous region back to the kernel
// (madvise MADV_DONTNEED): it reads as zeros afterwards, and a page is
// backed again when next written. Only for memory nothing reads as data
// any more.
func (r *Region) Discard() error {
	if len(r.m) == 0 || r.f != nil {
		return nil
	}
	return unix.Madvise(r.m, unix.MADV_DONTNEED)
}
