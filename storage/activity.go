package storage

import (
	"math/rand/v2"
	"slices"
	"time"
)

// ActivityWindow is how many seconds of history Activity keeps (the last
// ten minutes in which the buffer changed).
const ActivityWindow = 600

// The numbers of a buffer's activity ring.
const (
	actWriteCount = iota
	actSamples
	actSize
	activityWidth
)

// Activity is a buffer's recent history, one point per second in which
// something changed, oldest first: T is the unix second, and the other
// slices hold, at the end of that second, the write count, the rows served
// by samples so far and the live rows. Rates are differences of
// consecutive points over their seconds; a gap means nothing changed.
type Activity struct {
	T             []int64   `json:"t"`
	WriteCount    []float64 `json:"write_count"`
	SamplesServed []float64 `json:"samples_served"`
	Size          []float64 `json:"size"`
}

// noteWrite records an extend: the write count it reached and the live
// rows after it, in one update (an extend's hot path pays one lock).
// Counters only grow: two writers may record out of order, and the later,
// smaller value must not make a rate negative.
func (b *Buffer) noteWrite(writeCount, size int64) {
	b.activity.Update(time.Now(), func(vals []float64) {
		vals[actWriteCount] = max(vals[actWriteCount], float64(writeCount))
		vals[actSize] = float64(size)
	})
}

// noteSamples records the rows served by samples so far (monotonic, as
// noteWrite's counter).
func (b *Buffer) noteSamples(served int64) {
	b.activity.Update(time.Now(), func(vals []float64) {
		vals[actSamples] = max(vals[actSamples], float64(served))
	})
}

// Activity returns the points of the seconds after since (unix seconds;
// 0 for all).
func (b *Buffer) Activity(since int64) Activity {
	t, cols := b.activity.Columns(since)
	return Activity{T: t, WriteCount: cols[actWriteCount], SamplesServed: cols[actSamples], Size: cols[actSize]}
}

// LengthHistogram is how many live trajectories have a live length in
// each bucket: Counts[i] counts lengths in [Edges[i], Edges[i+1]). The last
// edge is one past the longest length counted; trajectories of
// MaxExactLength live rows or more share the last bucket (Capped is then
// true).
type LengthHistogram struct {
	Edges        []int `json:"edges"`
	Counts       []int `json:"counts"`
	Trajectories int   `json:"trajectories"`
	Capped       bool  `json:"capped"`
}

// MaxExactLength is the longest live length LengthHistogram tells apart.
const MaxExactLength = lenBuckets - 1

// TrajectoryLengths returns the live-length histogram of the live
// trajectories in at most buckets equal-width buckets. It is exact and
// costs O(buckets * log MaxExactLength), whatever the number of rows: the
// index already files every trajectory under its length.
func (v Index) TrajectoryLengths(buckets int) LengthHistogram {
	v.ix.mustBeSettled()
	l := v.ix.byLen
	total := l.prefix(lenBuckets)
	h := LengthHistogram{Edges: []int{}, Counts: []int{}, Trajectories: total}
	if total == 0 {
		return h
	}
	// The longest length: the last non-empty bucket, by binary search on
	// the prefix counts.
	lo, hi := 1, lenBuckets-1 // the answer is in [lo, hi]
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if l.prefix(lenBuckets)-l.prefix(mid) > 0 {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	longest := lo
	h.Capped = longest == lenBuckets-1
	buckets = max(buckets, 1)
	width := max((longest+buckets-1)/buckets, 1)
	for e := 1; e <= longest; e += width {
		h.Edges = append(h.Edges, e)
		h.Counts = append(h.Counts, l.prefix(min(e+width, longest+1))-l.prefix(e))
	}
	h.Edges = append(h.Edges, longest+1)
	return h
}

// OpenTrajectoriesByStream returns, for each stream with open trajectories,
// how many it has (one per env whose trajectory has not ended).
func (b *Buffer) OpenTrajectoriesByStream() map[string]int {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	out := make(map[string]int, len(b.streams))
	for s, envs := range b.streams {
		out[s] = len(envs)
	}
	return out
}

// SamplePriorities returns the raw priorities of up to n live rows drawn
// uniformly at random (with replacement) from the ring, sorted, for a
// histogram that costs the same at any buffer size. Nil for buffers
// without priorities. Slots that hold no live row (holes, rows not yet
// written) are skipped, trying at most 4n slots.
func (b *Buffer) SamplePriorities(n int, rng *rand.Rand) ([]float64, error) {
	if err := b.enter(); err != nil {
		return nil, err
	}
	defer b.leave()
	if b.prio == nil {
		return nil, nil
	}
	b.imu.RLock()
	defer b.imu.RUnlock()
	wc := b.writeCount.Load()
	lo := max(wc-b.capacity, 0)
	if wc == lo {
		return []float64{}, nil
	}
	out := make([]float64, 0, n)
	for try := 0; try < 4*n && len(out) < n; try++ {
		seq := lo + rng.Int64N(wc-lo)
		if b.stamps.Load(seq%b.slots) != seq {
			continue
		}
		out = append(out, b.prio.raw(seq%b.slots))
	}
	slices.Sort(out)
	return out, nil
}
