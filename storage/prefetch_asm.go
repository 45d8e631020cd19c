//go:build amd64 || arm64

package storage

import "unsafe"

// prefetchLine asks the CPU to start loading the cache line at p and
// returns without waiting for it (PREFETCHT0 on amd64, PRFM PLDL1KEEP on
// arm64; see prefetch.go). p must point into memory the caller holds.
//
//go:noescape
func prefetchLine(p unsafe.Pointer)
