//go:build !amd64

package storage

// stillHolds reports whether slot's stamp is still seq after the caller's
// plain reads of the row: the second check of a seqlock read (Gather).
// CompareAndSwap, not Load: it is a full barrier, so on weakly ordered CPUs
// (arm64) the copies cannot be reordered after this check.
func (t *stampTable) stillHolds(slot, seq int64) bool {
	return t.CompareAndSwap(slot, seq, seq)
}
