//go:build amd64 || arm64

package prefetch

import "unsafe"

// Slots runs Line on base + slot × pitch for every slot of slots that is
// not negative, in one call: the prefetch pass over a column's rows,
// where a call per line cost more than the prefetch instruction (two
// calls, through the wrapper Go puts in front of assembly). Every address
// must lie in memory the caller holds, as for Line.
//
//go:noescape
func Slots(base unsafe.Pointer, slots []int64, pitch int64)
