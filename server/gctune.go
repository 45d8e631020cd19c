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
// is left alone.
//
// It also returns freed heap to the OS once the server goes quiet (see
// idleRelease), so that an idle server's resident set is what it holds.
// It returns when ctx ends, restoring the previous limit.
func (s *Server) TuneMemoryLimit(ctx context.Context) {
	tune := os.Getenv("GOMEMLIMIT") == ""
	if tune {
		prev := debug.SetMemoryLimit(-1)
		defer debug.SetMemoryLimit(prev)
	}
	const live, allocs, free, objects = 0, 1, 2, 3 // indexes of samples
	samples := []rtmetrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/heap/allocs:bytes"}, {Name: "/memory/classes/heap/free:bytes"}, {Name: "/memory/classes/heap/objects:bytes"}}
	var idle idleRelease
	t := time.NewTicker(tuneEvery)
	defer t.Stop()
	for {
		rtmetrics.Read(samples)
		if tune {
			// What the heap holds besides requests, as of the last collection.
			base := max(0, metricInt(samples[live])-s.budget.used())
			debug.SetMemoryLimit(base + s.budget.total + s.budget.total/10 + 32<<20)
		}
		if idle.tick(metricInt(samples[allocs])) {
			// Free pages plus garbage not yet collected: about what the
			// release gives back.
			spare := metricInt(samples[free]) + metricInt(samples[objects]) - metricInt(samples[live])
			debug.FreeOSMemory()
			s.idleReleases.Add(1)
			s.log.Info(idleReleaseMsg, "spare_bytes", spare)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// idleReleaseMsg is the log line of an idle release (tests wait for it).
const idleReleaseMsg = "quiet: returned freed heap to the OS"

// tuneEvery is how often TuneMemoryLimit looks at the heap.
const tuneEvery = 500 * time.Millisecond

func metricInt(s rtmetrics.Sample) int64 {
	if s.Value.Kind() != rtmetrics.KindUint64 {
		return 0
	}
	return int64(min(s.Value.Uint64(), math.MaxInt64))
}

// idleRelease decides when a quiet server gives its freed heap back to the
// OS. Go's background scavenger returns free pages only down to about 10%
// above the collector's goal, which is twice the live heap: after a burst
// of writes an idle server kept 2.5-3 MB of request garbage resident for
// good (tests/resident, 10^6 CartPole rows: 2.5-2.8 B a row on top of the
// buffer's 46). Like an allocator's decay of dirty pages, the server
// returns them once it has allocated next to nothing for idleTicks looks
// in a row after a look that saw it busy; it does it once per quiet spell,
// so an idle server does not collect again and again. A server that keeps
// working, even slowly (a collector stepping, a learner sampling), is never
// quiet and never collects for it: the thresholds were set by looking at
// one (rbd serve --demo allocates 80-400 KiB a look, spikes to 2.3 MiB; an
// idle server 0). The collection is cheap: the buffers' rows are not on
// the Go heap.
type idleRelease struct {
	lastAllocs int64 // cumulative heap allocations at the last look
	quiet      int   // looks in a row with next to no allocation
	busy       bool  // a look since the last release saw more
}

const (
	// idleTicks looks (of tuneEvery) without allocation make the server
	// quiet: 2 s.
	idleTicks = 4
	// idleQuietBytes is the most a look may see allocated and still
	// count as quiet (a health probe allocates a few KiB).
	idleQuietBytes = 64 << 10
	// idleBusyBytes is the least a look must see allocated to count as
	// busy: 2 MiB/s of garbage, a writer's burst, not a trickle.
	idleBusyBytes = 1 << 20
)

// tick takes the cumulative bytes allocated and reports whether to collect
// and return the freed heap now.
func (r *idleRelease) tick(allocs int64) bool {
	grew := allocs - r.lastAllocs
	r.lastAllocs = allocs
	if grew > idleQuietBytes {
		r.quiet = 0
		r.busy = r.busy || grew >= idleBusyBytes
		return false
	}
	r.quiet++
	if r.quiet < idleTicks || !r.busy {
		return false
	}
	r.busy = false
	return true
}
