package server

import (
	"context"
	"math"
	"os"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"time"
)

// TuneMemoryLimit keeps the Go runtime's soft memory limit just above what
// the server should hold: the live heap of everything but requests (the
// store's indexes and the like) plus the request budget (MaxMemory) and a
// margin. The collector then runs sooner as requests fill the budget,
// instead of letting the heap grow to twice the live data (GOGC's default):
// without it, a server whose requests hold the whole budget was measured
// at over twice the budget resident. A limit set by the user (GOMEMLIMIT)
// is left alone. It returns when ctx ends, restoring the previous limit.
func (s *Server) TuneMemoryLimit(ctx context.Context) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	prev := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prev)
	sample := []rtmetrics.Sample{{Name: "/gc/heap/live:bytes"}}
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		rtmetrics.Read(sample)
		live := int64(0)
		if sample[0].Value.Kind() == rtmetrics.KindUint64 {
			live = int64(min(sample[0].Value.Uint64(), math.MaxInt64))
		}
		// What the heap holds besides requests, as of the last collection.
		base := max(0, live-s.budget.used())
		debug.SetMemoryLimit(base + s.budget.total + s.budget.total/10 + 32<<20)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
