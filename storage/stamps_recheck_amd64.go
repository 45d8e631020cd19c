//go:build amd64

package storage

// stillHolds reports whether slot's stamp is still seq after the caller's
// plain reads of the row: the second check of a seqlock read (Gather). On
// amd64 a load is never reordered with an older load (x86-TSO; Linux's
// smp_rmb is a compiler barrier only there), and the copies were stored
// before this call, so an atomic load is ordered after them. It costs a
// load where the CompareAndSwap that weakly ordered CPUs need (see
// stamps_recheck_other.go) locks the line: about a tenth of a large
// small-row gather (BenchmarkSliceR2D2, docs/performance.md).
func (t *stampTable) stillHolds(slot, seq int64) bool { return t.Load(slot) == seq }
