package storage

import (
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
)

// Crash points let tests kill a real writer process at exact places in the
// write path, which random kills rarely hit. They are armed only by the
// environment: RBD_CRASH_AT names the point and RBD_CRASH_AFTER (default
// 1) how many times it is passed before the process kills itself with
// SIGKILL. Points:
//
//	after-data     a row's field bytes are copied, its record not yet written
//	after-meta     a row's record is complete, the row not yet published
//	before-sync    an fsync-mode extend is about to sync the files
//	after-sync     the files are synced, the extend not yet acknowledged
//	before-commit  a checkpoint is about to commit counters to the catalog
//	mid-chunk      half of a chunk record is written (compressed buffers)
//	after-chunk    a chunk record is written, the rows' records not yet
//	checkpoint-copy  a block of a hot checkpoint's rows is copied, the copy
//	               not finished
//	mid-runs       all but half of the last of an extend's run records are
//	               written (memmap buffers with row_meta "runs")
//	after-runs     an extend's run records are written, its rows not yet
type crasher struct {
	point string
	left  atomic.Int64
}

func newCrasher() *crasher {
	p := os.Getenv("RBD_CRASH_AT")
	if p == "" {
		return nil
	}
	c := &crasher{point: p}
	n, err := strconv.ParseInt(os.Getenv("RBD_CRASH_AFTER"), 10, 64)
	if err != nil || n < 1 {
		n = 1
	}
	c.left.Store(n)
	return c
}

// armed reports whether the next pass of point would kill the process, so
// that a point can first leave the damage a crash there would leave.
func (c *crasher) armed(point string) bool {
	return c != nil && c.point == point && c.left.Load() == 1
}

// at kills the process when the armed point is passed for the last time.
func (c *crasher) at(point string) {
	if c == nil || c.point != point {
		return
	}
	if c.left.Add(-1) == 0 {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is asynchronous; never run past the point
	}
}
