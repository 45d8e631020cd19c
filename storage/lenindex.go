package storage

import "math/rand/v2"

// lenBuckets bounds the exact length buckets of the trajectory index:
// trajectories of length 1..lenBuckets-1 sit in the bucket of their length,
// longer ones share the last bucket. Slice samplers ask for "a uniform
// trajectory with at least L live rows"; with exact buckets and a Fenwick
// tree of their sizes that costs O(log lenBuckets) whatever the number of
// trajectories or rows, instead of rejection that degrades when most
// trajectories are shorter than L.
const lenBuckets = 4096

// lenIndex groups trajectories by live length.
type lenIndex struct {
	buckets [lenBuckets][]*Trajectory
	fen     [lenBuckets + 1]int // Fenwick tree over bucket sizes, 1-based
}

func lenBucket(n int) int { return min(n, lenBuckets-1) }

func (l *lenIndex) fenAdd(b, d int) {
	for i := b + 1; i <= lenBuckets; i += i & -i {
		l.fen[i] += d
	}
}

// prefix returns the number of trajectories in buckets [0, b).
func (l *lenIndex) prefix(b int) int {
	s := 0
	for i := b; i > 0; i -= i & -i {
		s += l.fen[i]
	}
	return s
}

// insert files t under its current length (> 0).
func (l *lenIndex) insert(t *Trajectory) {
	b := lenBucket(t.Len())
	t.lenPos = len(l.buckets[b])
	l.buckets[b] = append(l.buckets[b], t)
	l.fenAdd(b, 1)
}

// remove takes t out of the bucket of length n.
func (l *lenIndex) remove(t *Trajectory, n int) {
	b := lenBucket(n)
	bk := l.buckets[b]
	last := bk[len(bk)-1]
	bk[t.lenPos] = last
	last.lenPos = t.lenPos
	bk[len(bk)-1] = nil
	l.buckets[b] = bk[:len(bk)-1]
	l.fenAdd(b, -1)
}

// moved refiles t after its length changed from n (0 = not filed).
func (l *lenIndex) moved(t *Trajectory, n int) {
	if n > 0 && lenBucket(n) == lenBucket(t.Len()) {
		return
	}
	if n > 0 {
		l.remove(t, n)
	}
	if t.Len() > 0 {
		l.insert(t)
	}
}

// countAtLeast returns how many trajectories have at least n live rows.
func (l *lenIndex) countAtLeast(n int) int {
	n = max(n, 1)
	if n < lenBuckets-1 {
		return l.prefix(lenBuckets) - l.prefix(n)
	}
	c := 0
	for _, t := range l.buckets[lenBuckets-1] {
		if t.Len() >= n {
			c++
		}
	}
	return c
}

// pickAtLeast draws a trajectory uniformly among those with at least n live
// rows, or returns nil if there is none.
func (l *lenIndex) pickAtLeast(n int, rng *rand.Rand) *Trajectory {
	n = max(n, 1)
	if n < lenBuckets-1 {
		total := l.prefix(lenBuckets) - l.prefix(n)
		if total == 0 {
			return nil
		}
		r := l.prefix(n) + rng.IntN(total)
		// Fenwick descent: the bucket holding the r-th trajectory.
		pos := 0
		for step := lenBuckets; step > 0; step >>= 1 {
			if next := pos + step; next <= lenBuckets && l.fen[next] <= r {
				pos = next
				r -= l.fen[next]
			}
		}
		return l.buckets[pos][r]
	}
	// Slices longer than lenBuckets-1: only the last bucket qualifies, and
	// only some of it. Count exactly, then pick the k-th (the bucket holds
	// at most capacity/(lenBuckets-1) trajectories).
	c := l.countAtLeast(n)
	if c == 0 {
		return nil
	}
	k := rng.IntN(c)
	for _, t := range l.buckets[lenBuckets-1] {
		if t.Len() >= n {
			if k == 0 {
				return t
			}
			k--
		}
	}
	return nil
}
