package storage

import (
	"fmt"
	"math"

	"github.com/rbdb/rbd/internal/sysmem"
)

// Per-row heap costs counted by fullMemoryBytes (bytes per slot); the
// priority trees are counted by prioTreeBytes.
const (
	stampBytesPerRow = 8 // stampTable (files; a memory buffer's are in its row group)
	// indexBytesPerRow is the index at worst: a trajectory's seq runs
	// (24 bytes a run, a run per two rows when rows arrive irregularly;
	// usually a run per trajectory) and the next distance (4 bytes).
	indexBytesPerRow = 12 + 4
	// runBytesPerRow is the run records (RowMetaRuns) at a run per 8
	// rows: a 64-byte run record, its reference count and a free-list
	// entry. Counted at worst (a run per row: one-step episodes, or a
	// policy version that changes every row), a buffer that layout makes
	// smaller would be refused where the default layout is not; those
	// workloads are the ones the layout is not for (docs/http-api.md), and
	// they hold up to 64 bytes a row more than this. Episodes of tens of
	// steps or more make a run each, a byte or two a row.
	runBytesPerRow = (runRecordSize + 4 + 4) / 8
)

// runMetaBytesPerRow is what run records take a row in memory (buffers
// whose records name runs), with the side table of irregular runs for
// strided ones (if rows at irregular distances fill it).
func runMetaBytesPerRow(spec Spec) int64 {
	switch spec.RowMetaLayout {
	case RowMetaRuns, RowMetaBlocks:
		return runBytesPerRow
	case RowMetaStrided:
		return runBytesPerRow + irrEntry
	}
	return 0
}

// fullMemoryBytes estimates what a buffer of spec holds in memory once
// every slot is written: the per-row heap structures (stamps, index,
// priority trees) for every kind and, for memory buffers, the rows
// themselves; compressed buffers add their chunk cache. Memory-mapped files
// are the page cache's business (the kernel drops clean pages under
// pressure), so they are not counted. Sums saturate at MaxInt64.
func fullMemoryBytes(spec Spec) int64 {
	c := ringSlotCount(spec, false) // the per-slot structures' slots
	perRow := int64(indexBytesPerRow)
	switch {
	case spec.runLogFiles():
		// Memory records (the stamps among them) and run records, as in
		// a memory buffer of the same row_meta; rows.meta is in the page
		// cache.
		perRow += memRecordBytes(spec) + runMetaBytesPerRow(spec)
	case spec.Storage != KindMemory:
		perRow += stampBytesPerRow // a memory buffer's are in its row group
	default:
		var group int64 // the row group's fields (interleaveSmallFields)
		for _, f := range spec.Fields {
			if rb := int64(f.RowBytes()); rb <= rowGroupMaxField {
				group += rb
			} else {
				perRow = satAdd(perRow, rb)
			}
		}
		perRow = satAdd(perRow, rowGroupPitch(memRecordBytes(spec), group))
		perRow += runMetaBytesPerRow(spec)
		if spec.CompactObs {
			for _, k := range spec.ObsKeys {
				if f, ok := spec.Field(k); ok {
					perRow = satAdd(perRow, int64(f.RowBytes()))
				}
			}
		}
		if spec.Priority != nil {
			perRow += 8 // the raw priority column
		}
	}
	total := satMul(perRow, c)
	if spec.Priority != nil {
		total = satAdd(total, prioTreeBytes(c))
	}
	if spec.Storage == KindCompressed && spec.Compression != nil {
		total = satAdd(total, int64(spec.Compression.CacheMiB)<<20)
	}
	return total
}

// prioTreeBytes is what the sum and min trees over n leaves take (see
// segtree's layout: the next power of two of internal nodes plus the
// leaves).
func prioTreeBytes(n int64) int64 {
	size := int64(1)
	for size < n {
		size <<= 1
	}
	return satMul(2*8, size+n+n&1)
}

func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func satMul(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}

// memoryLimit resolves Options.MemoryLimit: 0 means three quarters of what
// the machine (or cgroup) gives this process, the rest being left to
// requests in flight and the page cache; negative means no limit.
func (o *Options) memoryLimit() int64 {
	switch {
	case o.MemoryLimit > 0:
		return o.MemoryLimit
	case o.MemoryLimit < 0:
		return math.MaxInt64
	}
	if m := sysmem.Limit(); m > 0 {
		return m / 4 * 3
	}
	return math.MaxInt64
}

// checkMemoryLocked refuses a new buffer whose full size would not fit
// next to the buffers already open. Called with s.mu held.
func (s *Store) checkMemoryLocked(name string, spec Spec) error {
	limit := s.opts.memoryLimit()
	var used int64
	for _, b := range s.buffers {
		used = satAdd(used, fullMemoryBytes(b.spec))
	}
	need := fullMemoryBytes(spec)
	if need <= limit-min(used, limit) {
		return nil
	}
	return &ResourceError{
		Op: fmt.Sprintf("create buffer %q", name), Err: ErrInsufficientMemory,
		Needed: need, Available: max(0, limit-used),
		Hint: fmt.Sprintf("capacity %d of %s storage, once full; the buffers already open may use %d of the %d bytes left to buffers: lower the capacity, use memmap storage, or delete a buffer", spec.Capacity, spec.Storage, used, limit),
	}
}

// MemoryBytes estimates what the buffer holds in memory once full (see
// Store.MemoryUse).
func (b *Buffer) MemoryBytes() int64 { return fullMemoryBytes(b.spec) }

// MemoryUse returns what all open buffers may hold in memory once full, and
// the limit new buffers are checked against (Options.MemoryLimit).
func (s *Store) MemoryUse() (used, limit int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.buffers {
		used = satAdd(used, fullMemoryBytes(b.spec))
	}
	return used, s.opts.memoryLimit()
}
