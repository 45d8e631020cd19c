//go:build !amd64 && !arm64

package storage

import "unsafe"

// prefetchLine loads the byte at p where this package has no prefetch
// instruction in assembly: the line is then in cache for the read that
// follows, though the load waits for it (see prefetch.go).
func prefetchLine(p unsafe.Pointer) { prefetchSink(*(*byte)(p)) }

// prefetchSink keeps the load (the compiler drops loads whose value
// nothing uses).
//
//go:noinline
func prefetchSink(byte) {}
