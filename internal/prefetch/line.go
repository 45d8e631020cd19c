//go:build amd64 || arm64

package prefetch

import "unsafe"

// Line asks the CPU to start loading the cache line at p and returns
// without waiting for it. p must point into memory the caller holds.
//
//go:noescape
func Line(p unsafe.Pointer)
