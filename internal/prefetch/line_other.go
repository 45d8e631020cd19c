//go:build !amd64 && !arm64

package prefetch

import "unsafe"

// Line loads the byte at p where this package has no prefetch
// instruction in assembly: the line is then in cache for the read that
// follows, though the load waits for it.
func Line(p unsafe.Pointer) { sink(*(*byte)(p)) }

// sink keeps the load (the compiler drops loads whose value
// nothing uses).
//
//go:noinline
func sink(byte) {}

// Slots runs Line on base + slot × pitch for every slot of slots that is
// not negative.
func Slots(base unsafe.Pointer, slots []int64, pitch int64) {
	for _, slot := range slots {
		if slot >= 0 {
			Line(unsafe.Add(base, slot*pitch))
		}
	}
}
