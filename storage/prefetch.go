package storage

import (
	"math"
	"runtime"
	"unsafe"

	"github.com/rbdb/rbd/internal/prefetch"
)

// Samples read rows at random places in rings of up to 10^7 rows, so
// nearly every row is a cache miss, and read one after another the misses
// are served one after another. Two kinds of pass ask for a sample's lines
// before it reads them, so that dozens of misses are served at once:
//
//   - A prefetch pass (prefetchRows, prefetchSlots) runs the CPU's
//     prefetch instruction on each line. It does not hold up the
//     instructions after it until the line arrives, so the work after
//     the pass runs while the misses are served. It is used where a sample
//     first reaches lines: its rows' records and stamps and its next
//     rows' lines (Index.Rows), and the columns outside a row group
//     (touchColumns). A prefetch never faults, so a pass over a mapping
//     truncated underneath does no harm.
//   - A touch pass (touchRows, touchSlots) loads a byte of each line and
//     waits for them. The passes over lines an earlier pass asked for (a
//     row group's lines, again for the copy) find them mostly in cache;
//     there a load that hits costs less than a prefetch call (measured:
//     256-row samples from 10^5 rows 10% slower with every pass a
//     prefetch pass, docs/performance.md).

// prefetchRows prefetches the first span bytes of the row of each seq
// (seqs < 0 skipped) in data, whose rows are pitch bytes apart in the ring
// ring maps seqs to.
func prefetchRows(data []byte, seqs []int64, ring ringSlots, pitch, span int64) {
	if len(data) == 0 {
		return
	}
	if oneLine(data, pitch, span) {
		for _, seq := range seqs {
			if seq >= 0 {
				prefetch.Line(unsafe.Pointer(&data[ring.of(seq)*pitch]))
			}
		}
		return
	}
	if span <= 64 {
		// A row of a line or less (a 48-byte pitch's rows straddle two
		// lines every other row): its first and last byte name its lines.
		for _, seq := range seqs {
			if seq >= 0 {
				off := ring.of(seq) * pitch
				prefetch.Line(unsafe.Pointer(&data[off]))
				prefetch.Line(unsafe.Pointer(&data[off+span-1]))
			}
		}
		return
	}
	for _, seq := range seqs {
		if seq >= 0 {
			off := ring.of(seq) * pitch
			prefetchSpan(data[off : off+span])
		}
	}
}

// prefetchSlots is prefetchRows for slots (slots < 0 skipped).
func prefetchSlots(data []byte, slots []int64, pitch, span int64) {
	if len(data) == 0 {
		return
	}
	if oneLine(data, pitch, span) {
		// Slots within data: the caller's, of rows the column holds.
		prefetch.Slots(unsafe.Pointer(&data[0]), slots, pitch)
		return
	}
	for _, slot := range slots {
		if slot >= 0 {
			prefetchSpan(data[slot*pitch : slot*pitch+span])
		}
	}
}

// oneLine reports whether every row of data (pitch bytes apart, span
// bytes each from its start) lies in one cache line: data starts a line,
// rows start lines or pack them evenly (a pitch dividing 64 or a multiple
// of it) and fit. Most small rows do: a memory buffer's CartPole row
// group, 64-byte file records, columns of 1 to 64 bytes.
func oneLine(data []byte, pitch, span int64) bool {
	return span <= min(pitch, 64) && (pitch%64 == 0 || 64%pitch == 0) &&
		uintptr(unsafe.Pointer(&data[0]))%64 == 0
}

// prefetchSpan prefetches every cache line b spans (b not empty).
func prefetchSpan(b []byte) { eachLine(b, prefetch.Line) }

// eachLine calls fn with a pointer into each cache line b spans (b not
// empty), in order: b[0], then the first byte of every further line.
func eachLine(b []byte, fn func(unsafe.Pointer)) {
	fn(unsafe.Pointer(&b[0]))
	// The next line starts at b[k], k = 64 - (the address of b[0] mod 64).
	for k := 64 - int(uintptr(unsafe.Pointer(&b[0]))&63); k < len(b); k += 64 {
		fn(unsafe.Pointer(&b[k]))
	}
}

// touchRows loads one byte of every cache line of the first span bytes of
// each row of seqs (seqs < 0 skipped) in data, whose rows are pitch apart,
// and returns their sum. The loop is short so that the CPU keeps many of
// its cache misses in flight at once.
func touchRows(data []byte, seqs []int64, ring ringSlots, pitch, span int64) int64 {
	var sum int64
	for _, seq := range seqs {
		if seq >= 0 {
			off := ring.of(seq) * pitch
			sum += touchLines(data[off : off+span])
		}
	}
	return sum
}

// touchSlots is touchRows for slots (slots < 0 skipped).
func touchSlots(data []byte, slots []int64, pitch, span int64) int64 {
	var sum int64
	for _, slot := range slots {
		if slot >= 0 {
			sum += touchLines(data[slot*pitch : slot*pitch+span])
		}
	}
	return sum
}

// touchLines loads one byte of each 64-byte cache line b spans.
func touchLines(b []byte) int64 {
	sum := int64(b[len(b)-1])
	for k := 0; k < len(b); k += 64 {
		sum += int64(b[k])
	}
	return sum
}

// keepLoads uses the sum of a touch pass's loads, so that the compiler
// keeps them (unused loads are dead code to it), without a shared write
// that concurrent samplers would contend for: the branch is never taken.
func keepLoads(sum int64) {
	if sum == math.MinInt64 {
		runtime.KeepAlive(sum)
	}
}
