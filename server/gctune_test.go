package server

import "testing"

// TestIdleRelease walks idleRelease through sequences of looks (cumulative
// bytes allocated, spare heap) and checks at which looks it returns the
// heap to the OS.
func TestIdleRelease(t *testing.T) {
	const mib = 1 << 20
	type look struct{ allocs, spare int64 }
	quiet := func(allocs, spare int64, n int) []look {
		out := make([]look, n)
		for i := range out {
			out[i] = look{allocs, spare}
		}
		return out
	}
	cat := func(parts ...[]look) []look {
		var out []look
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		looks []look
		want  []int // indexes of the looks that release
	}{
		{"a burst then quiet: once, at the fourth quiet look", cat([]look{{0, 0}, {50 * mib, 3 * mib}}, quiet(50*mib, 3*mib, 10)), []int{5}},
		{"busy all along: never", []look{{10 * mib, 2 * mib}, {20 * mib, 2 * mib}, {30 * mib, 2 * mib}, {40 * mib, 2 * mib}, {50 * mib, 2 * mib}, {60 * mib, 2 * mib}}, nil},
		{"quiet but nothing spare: never", cat([]look{{50 * mib, 0}}, quiet(50*mib, mib/2, 10)), nil},
		{"probes allocating a little still count as quiet", []look{{50 * mib, 2 * mib}, {50*mib + 100<<10, 2 * mib}, {50*mib + 200<<10, 2 * mib}, {50*mib + 300<<10, 2 * mib}, {50*mib + 400<<10, 2 * mib}}, []int{4}},
		{"a burst in the middle restarts the count", cat([]look{{50 * mib, 2 * mib}}, quiet(50*mib, 2*mib, 2), []look{{60 * mib, 2 * mib}}, quiet(60*mib, 2*mib, 5)), []int{7}},
		{"two quiet spells: once each", cat([]look{{50 * mib, 2 * mib}}, quiet(50*mib, 2*mib, 5), []look{{90 * mib, 2 * mib}}, quiet(90*mib, 2*mib, 5)), []int{4, 10}},
		{"spare exactly at the threshold", cat([]look{{50 * mib, idleSpareBytes}}, quiet(50*mib, idleSpareBytes, 4)), []int{4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r idleRelease
			var got []int
			for i, l := range tc.looks {
				if r.tick(l.allocs, l.spare) {
					got = append(got, i)
				}
			}
			if len(got) != len(tc.want) {
				t.Fatalf("released at looks %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("released at looks %v, want %v", got, tc.want)
				}
			}
		})
	}
}
