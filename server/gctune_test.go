package server

import (
	"slices"
	"testing"
)

// TestIdleRelease walks idleRelease through sequences of looks (cumulative
// bytes allocated) and checks at which looks it returns the heap to the OS.
func TestIdleRelease(t *testing.T) {
	const mib = 1 << 20
	// looks returns n looks that allocate step bytes each, after from.
	looks := func(from, step int64, n int) []int64 {
		out := make([]int64, n)
		for i := range out {
			from += step
			out[i] = from
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		looks []int64
		want  []int // indexes of the looks that release
	}{
		{"a burst then quiet: once, at the fourth quiet look",
			slices.Concat([]int64{0, 50 * mib}, looks(50*mib, 0, 10)), []int{5}},
		{"busy all along: never",
			looks(0, 10*mib, 12), nil},
		{"quiet from the start: never",
			looks(0, 0, 12), nil},
		{"a steady trickle (a slow collector): never",
			looks(0, 400<<10, 12), nil},
		{"a trickle with spikes: never quiet, never",
			slices.Concat(looks(0, 300<<10, 3), []int64{3 * mib}, looks(3*mib, 100<<10, 8)), nil},
		{"probes after a burst still count as quiet",
			slices.Concat([]int64{50 * mib}, looks(50*mib, 8<<10, 6)), []int{4}},
		{"a look above the quiet allowance restarts the count",
			slices.Concat([]int64{50 * mib}, looks(50*mib, 0, 2), looks(50*mib, 100<<10, 1), looks(50*mib+100<<10, 0, 5)), []int{7}},
		{"a burst in the middle restarts the count",
			slices.Concat([]int64{50 * mib, 50 * mib, 50 * mib, 60 * mib}, looks(60*mib, 0, 5)), []int{7}},
		{"two quiet spells: once each",
			slices.Concat([]int64{50 * mib}, looks(50*mib, 0, 5), []int64{90 * mib}, looks(90*mib, 0, 5)), []int{4, 10}},
		{"a look of exactly the allowance is quiet",
			slices.Concat([]int64{50 * mib}, looks(50*mib, idleQuietBytes, 4)), []int{4}},
		{"a look of just under a burst is not busy",
			slices.Concat([]int64{idleBusyBytes - 1}, looks(idleBusyBytes-1, 0, 6)), nil},
		{"a start-up that allocated (a recovery) counts as a burst",
			looks(20*mib, 0, 5), []int{4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r idleRelease
			var got []int
			for i, allocs := range tc.looks {
				if r.tick(allocs) {
					got = append(got, i)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("released at looks %v, want %v", got, tc.want)
			}
		})
	}
}
