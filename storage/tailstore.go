package storage

import (
	"math/bits"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// tailIndex places a compact_obs memory buffer's final observations
// densely. Only done rows carry one (one row in tens or hundreds), so a
// tail column indexed by slot touches nearly every page of a
// capacity-sized column (a 4 KiB page spans 256 slots of a 16-byte
// CartPole observation) and costs 16 B for every row. Here the k-th tail
// ever written goes to row k % rows of the tail columns, so the live
// tails fill a moving window of consecutive rows, and the pages behind it
// are given back to the kernel (release).
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
	// tails (tail k at k*rowBytes) below which pages were released.
	freed []int64
	cols  []*column
}

// tailRows is the number of rows a tail column gets: at least capacity
// (every live row may be done), rounded up so that each column's size is
// a multiple of the page size, which keeps page boundaries in the same
// place as the tail index wraps round.
func tailRows(capacity int64, cols []*column) int64 {
	align := int64(1)
	page := int64(unix.Getpagesize())
	for _, c := range cols {
		rb := int64(c.rowBytes)
		// rows*rb is a multiple of page when rows is a multiple of
		// page/gcd(rb, page); page is a power of two.
		a := page >> min(bits.TrailingZeros64(uint64(rb)), bits.TrailingZeros64(uint64(page)))
		align = max(align, a)
	}
	return (capacity + align - 1) / align * align
}

func newTailIndex(capacity int64, cols []*column) *tailIndex {
	n := capacity/64 + 2
	return &tailIndex{rows: tailRows(capacity, cols), bits: make([]atomic.Uint64, n), base: make([]atomic.Int64, n),
		freed: make([]int64, len(cols)), cols: cols}
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

// release gives back to the kernel the pages of the tail columns that
// only hold tails of rows below lo, the oldest seq still in the window
// (the rows below it were evicted and their stamps voided). Writers call
// it after each extend; it makes a system call only when a page's worth of
// tails has died since the last one.
func (t *tailIndex) release(lo int64) {
	if lo <= 0 || lo >= t.nextBlock<<6 {
		return
	}
	dead := t.rank(lo)
	page := int64(unix.Getpagesize())
	for ci, c := range t.cols {
		rb := int64(c.rowBytes)
		size := t.rows * rb
		// Pages of the unwrapped stream below to hold dead tails only.
		// But a page's memory also holds the tails a lap later, so a page
		// the writer has already reached again is in use: pages start at
		// written*rb - size at the lowest.
		from := max(t.freed[ci], (t.written*rb-size+page-1)/page*page)
		to := dead * rb / page * page
		if to-from < page {
			continue
		}
		for off := from; off < to; {
			start := off % size
			n := min(to-off, size-start)
			// Advice only: if it fails, the pages stay resident.
			_ = unix.Madvise(c.data[start:start+n], unix.MADV_DONTNEED)
			off += n
		}
		t.freed[ci] = to
	}
}
