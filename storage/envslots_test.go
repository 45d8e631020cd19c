package storage

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestEnvSlotsMatchMaps holds envSlots and envOpen to plain maps over
// random sets, lookups and deletes of env ids around the array's edges
// (negative, 0, 63, 64, the ends of int64): the map behind envSlots must
// stay exactly what a map alone would hold, because it is the stream
// state the extend keeps.
func TestEnvSlotsMatchMaps(t *testing.T) {
	ids := []int64{0, 1, 7, 62, 63, 64, 65, -1, -64, 1 << 40, math.MinInt64, math.MaxInt64}
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 200 {
		refPos := map[int64]*streamPos{}
		refOpen := map[int64]bool{}
		// Start from a stream state, as an extend does.
		for _, e := range ids {
			if rng.IntN(3) == 0 {
				refPos[e] = &streamPos{TrajID: e}
			}
		}
		envs := map[int64]*streamPos{}
		slots := envSlots{m: envs}
		for e, p := range refPos {
			slots.set(e, p)
		}
		var open envOpen
		for range 50 {
			e := ids[rng.IntN(len(ids))]
			switch rng.IntN(4) {
			case 0:
				p := &streamPos{TrajID: rng.Int64()}
				slots.set(e, p)
				refPos[e] = p
			case 1:
				slots.del(e)
				delete(refPos, e)
			case 2:
				v := rng.IntN(2) == 0
				open.set(e, v)
				refOpen[e] = v
			}
			if got, want := slots.get(e), refPos[e]; got != want {
				t.Fatalf("round %d: env %d: slots hold %v, the map %v", round, e, got, want)
			}
			if got, want := open.get(e), refOpen[e]; got != want {
				t.Fatalf("round %d: env %d: open %v, want %v", round, e, got, want)
			}
		}
		if len(envs) != len(refPos) {
			t.Fatalf("round %d: the stream map has %d envs, want %d", round, len(envs), len(refPos))
		}
		for e, p := range refPos {
			if envs[e] != p {
				t.Fatalf("round %d: the stream map lost env %d", round, e)
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
