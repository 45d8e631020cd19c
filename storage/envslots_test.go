package storage

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestStreamEditsMatchMaps holds streamEdits and envOpen to plain maps
// over random stream states, lookups, new trajectories and ends of env ids
// around the array's edges (negative, 0, 63, 64, the ends of int64): the
// stream state must stay exactly as it was until apply, and be after it
// exactly what a copy of the map edited alone would be, because it is the
// stream state the extend keeps.
func TestStreamEditsMatchMaps(t *testing.T) {
	ids := []int64{0, 1, 7, 62, 63, 64, 65, -1, -64, 1 << 40, math.MinInt64, math.MaxInt64}
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 400 {
		// A stream state, as an extend finds it (none in some rounds:
		// a new stream).
		var cur map[int64]*streamPos
		before := map[int64]streamPos{}
		if round%5 != 0 {
			cur = map[int64]*streamPos{}
			for _, e := range ids {
				if rng.IntN(3) == 0 {
					cur[e] = &streamPos{TrajID: rng.Int64N(1000), Step: rng.Int64N(1000), LastSeq: rng.Int64N(1000)}
					before[e] = *cur[e]
				}
			}
		}
		ref := map[int64]streamPos{}
		for e, p := range before {
			ref[e] = p
		}
		refOpen := map[int64]bool{}
		edits := streamEdits{cur: cur}
		var open envOpen
		for range 50 {
			e := ids[rng.IntN(len(ids))]
			switch rng.IntN(4) {
			case 0: // a row of e: a new trajectory if it has none
				pos := edits.get(e)
				if _, ok := ref[e]; ok != (pos != nil) {
					t.Fatalf("round %d: env %d: position %v, the map has one: %v", round, e, pos, ok)
				}
				if pos == nil {
					pos = edits.start(e, streamPos{TrajID: rng.Int64N(1000), Step: -1, LastSeq: -1})
				}
				pos.Step++
				pos.LastSeq = rng.Int64N(1000)
				ref[e] = *pos
			case 1: // a done row
				edits.end(e)
				delete(ref, e)
			case 2:
				v := rng.IntN(2) == 0
				open.set(e, v)
				refOpen[e] = v
			}
			want, ok := ref[e]
			if got := edits.get(e); (got != nil) != ok || got != nil && *got != want {
				t.Fatalf("round %d: env %d: edits hold %v, the map %v (%v)", round, e, got, want, ok)
			}
			if got, want := open.get(e), refOpen[e]; got != want {
				t.Fatalf("round %d: env %d: open %v, want %v", round, e, got, want)
			}
		}
		// Nothing applied yet: the stream state is as it was.
		if len(cur) != len(before) {
			t.Fatalf("round %d: the stream has %d envs before apply, had %d", round, len(cur), len(before))
		}
		for e, p := range before {
			if *cur[e] != p {
				t.Fatalf("round %d: env %d changed before apply: %v, was %v", round, e, *cur[e], p)
			}
		}
		envs := edits.apply()
		if cur != nil && len(ref) > 0 && !sameMap(envs, cur) {
			t.Fatalf("round %d: apply made a new map, not the stream's", round)
		}
		if len(envs) != len(ref) {
			t.Fatalf("round %d: the stream has %d envs after apply, want %d", round, len(envs), len(ref))
		}
		for e, p := range ref {
			if envs[e] == nil || *envs[e] != p {
				t.Fatalf("round %d: env %d after apply: %v, want %v", round, e, envs[e], p)
			}
		}
		anyOpen := false
		for _, v := range refOpen {
			anyOpen = anyOpen || v
		}
		if open.any() != anyOpen {
			t.Fatalf("round %d: any open %v, want %v", round, open.any(), anyOpen)
		}
	}
}

// sameMap reports whether a and b are one map (an insert into one shows in
// the other).
func sameMap(a, b map[int64]*streamPos) bool {
	const probe = math.MinInt64 + 12345
	if _, ok := a[probe]; ok {
		return false
	}
	a[probe] = nil
	_, same := b[probe]
	delete(a, probe)
	return same
}
