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
