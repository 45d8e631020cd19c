package storage

import (
	"errors"
	"fmt"
	"math/bits"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// tailIndex places a compact_obs buffer's final observations densely: a
// memory buffer's in anonymous memory, a memmap buffer's in dense tail
// files (tail format version 2; files of older builds keep them at the
// slot). Only done rows carry one (one row in tens or hundreds), so a
// tail column indexed by slot touches nearly every page of a
// capacity-sized column (a 4 KiB page spans 256 slots of a 16-byte
// CartPole observation) and costs 16 B for every row. Here the k-th tail
// ever written goes to row k % rows of the tail columns, so the live
// tails fill a moving window of consecutive rows, and the pages behind it
// are given back to the kernel (release): madvise for memory, a punched
// hole for a file, whose blocks an extend allocates ahead of the tails it
// writes (allocate).
//
// A row finds its tail by rank: one bit per seq says whether it carries a
// tail, and each block of 64 seqs knows how many tails came before it, so
// the tail of seq is number base[block] + (bits set below seq in its
// block). The bits and bases cover the last blocks ring-wise, enough
// blocks that no live seq's block is reused (capacity/64 + 2), 0.25 B a
// slot.
//
// Writers (holding the buffer's wmu) call begin for every row in seq
// order and add for each row with a tail, before the row's stamp is
// stored; readers call pos only for complete rows that carry a tail, and
// lock-free readers check the row's stamp after the copy as for any
// column (a tail whose page was released belongs to an evicted row, whose
// stamp is void).
type tailIndex struct {
	rows int64 // rows of each tail column: >= capacity, see tailRows
	bits []atomic.Uint64
	base []atomic.Int64
	// Writers only (wmu):
	written   int64 // tails ever written
	nextBlock int64 // first block of 64 seqs not begun
	// freed holds, per tail column, the offset in its unwrapped stream of
	// tails (tail k at k*pitch) below which pages were released.
	freed []int64
	cols  []*column
	// Dense tail files only (writers; nil for memory): allocated is, per
	// column, the offset in the unwrapped stream below which the file's
	// blocks are allocated. step is how far allocate reaches ahead and how
	// much must have died before release gives pages back (a system call
	// each).
	allocated []int64
	step      int64
}

// files reports whether the columns are dense tail files (not memory).
func (t *tailIndex) files() bool { return t.allocated != nil }

// tailRows is the number of rows a tail column gets: at least capacity
// (every live row may be done), rounded up so that each column's size is
// a multiple of the page size, which keeps page boundaries in the same
// place as the tail index wraps round.
func tailRows(capacity int64, cols []*column) int64 {
	align := int64(1)
	page := int64(unix.Getpagesize())
	for _, c := range cols {
		rb := c.pitch()
		// rows*rb is a multiple of page when rows is a multiple of
		// page/gcd(rb, page); page is a power of two.
		a := page >> min(bits.TrailingZeros64(uint64(rb)), bits.TrailingZeros64(uint64(page)))
		align = max(align, a)
	}
	return (capacity + align - 1) / align * align
}

func newTailIndex(capacity int64, cols []*column) *tailIndex {
	n := capacity/64 + 2
	t := &tailIndex{rows: tailRows(capacity, cols), bits: make([]atomic.Uint64, n), base: make([]atomic.Int64, n),
		freed: make([]int64, len(cols)), cols: cols, step: int64(unix.Getpagesize())}
	if len(cols) > 0 && cols[0].dense {
		// A MiB at most, a 64th of the smallest column at least a page:
		// a CartPole ring of 10^6 rows (24-byte entries) makes a call
		// every 16,000 final observations, and holds at most two steps
		// of blocks beyond its live tails.
		t.allocated = make([]int64, len(cols))
		size := t.rows * cols[0].pitch()
		for _, c := range cols {
			size = min(size, t.rows*c.pitch())
		}
		t.step = min(1<<20, max(t.step, size/64/t.step*t.step))
	}
	return t
}

// allocate reserves, in each dense tail file, the blocks of the next n
// tails (and up to step beyond), so that writing them through the mapping
// cannot fault on a full disk. Called before an extend writes any row; on
// an error nothing is written and nothing changes.
func (t *tailIndex) allocate(n int64) error {
	if !t.files() || n == 0 {
		return nil
	}
	page := int64(unix.Getpagesize())
	for ci, c := range t.cols {
		pitch := c.pitch()
		size := t.rows * pitch
		need := (t.written + n) * pitch
		if need <= t.allocated[ci] {
			continue
		}
		from := t.allocated[ci]
		to := (max(need, from+t.step) + page - 1) / page * page
		for off := from; off < to; {
			start := off % size
			k := min(to-off, size-start)
			if err := c.region.Allocate(headerSize+start, k); err != nil {
				return fmt.Errorf("final observations of %s: %w", c.name, err)
			}
			off += k
		}
		t.allocated[ci] = to
	}
	return nil
}

// begin starts the rank of every block up to seq's that has not been
// started: its count of earlier tails is the tails written so far, and no
// seq of it has a tail yet.
func (t *tailIndex) begin(seq int64) {
	blk := seq >> 6
	if blk < t.nextBlock {
		return
	}
	nb := int64(len(t.bits))
	for k := max(t.nextBlock, blk-nb+1); k <= blk; k++ {
		i := k % nb
		t.base[i].Store(t.written)
		t.bits[i].Store(0)
	}
	t.nextBlock = blk + 1
}

// add gives seq (begun) the next tail and returns the row of the tail
// columns to write it in.
func (t *tailIndex) add(seq int64) int64 {
	t.bits[(seq>>6)%int64(len(t.bits))].Or(1 << (seq & 63))
	row := t.written % t.rows
	t.written++
	return row
}

// rank returns the number of tails written before seq, for a seq of a
// begun block still covered.
func (t *tailIndex) rank(seq int64) int64 {
	i := (seq >> 6) % int64(len(t.bits))
	below := t.bits[i].Load() & (1<<(seq&63) - 1)
	return t.base[i].Load() + int64(bits.OnesCount64(below))
}

// pos returns the row of the tail columns that holds seq's tail (seq is a
// complete row that carries one).
func (t *tailIndex) pos(seq int64) int64 { return t.rank(seq) % t.rows }

// release gives back the pages of the tail columns that only hold tails
// of rows below lo, the oldest seq still in the window (the rows below it
// were evicted and their stamps voided). Writers call it after each
// extend; it makes a system call only when step bytes of tails have died
// since the last one. A file whose filesystem cannot punch holes keeps
// its blocks (logged once by the caller's buffer).
func (t *tailIndex) release(lo int64) error {
	if lo <= 0 || lo >= t.nextBlock<<6 {
		return nil
	}
	if lo>>6 <= t.nextBlock-int64(len(t.bits)) {
		// lo's block is no longer covered (its bits were reused): a
		// version 3 fsync writer releases below its durable watermark,
		// which an extend larger than the ring can leave far behind.
		// What died is given back by a later call, once lo is covered.
		return nil
	}
	dead := t.rank(lo)
	page := int64(unix.Getpagesize())
	var errs []error
	for ci, c := range t.cols {
		pitch := c.pitch()
		size := t.rows * pitch
		// Pages of the unwrapped stream below to hold dead tails only.
		// But a page's memory also holds the tails a lap later, so a page
		// the writer has already reached again (written, or for a file
		// allocated) is in use: pages start at reached - size at the
		// lowest.
		reached := t.written * pitch
		if t.files() {
			reached = t.allocated[ci]
		}
		from := max(t.freed[ci], (reached-size+page-1)/page*page)
		to := dead * pitch / page * page
		if to-from < t.step {
			continue
		}
		for off := from; off < to; {
			start := off % size
			n := min(to-off, size-start)
			if t.files() {
				if !c.noPunch {
					if err := c.region.Punch(headerSize+start, n); err != nil {
						c.noPunch = true
						errs = append(errs, err)
					}
				}
			} else {
				// Advice only: if it fails, the pages stay resident.
				_ = unix.Madvise(c.data[start:start+n], unix.MADV_DONTNEED)
			}
			off += n
		}
		t.freed[ci] = to
	}
	return errors.Join(errs...)
}
