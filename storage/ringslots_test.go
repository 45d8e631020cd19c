package storage

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestRingSlotsIsMod holds ringSlots.of to seq % capacity for every seq >=
// 0, near the write count (the fast path) and far from it (the division),
// for capacities from 1 to near the int64 limit, and checks that every
// live seq takes the fast path.
func TestRingSlotsIsMod(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	capacities := []int64{1, 2, 3, 7, 64, 1000, 100_003, 1 << 40, math.MaxInt64 / 3}
	for _, capacity := range capacities {
		writeCounts := []int64{0, 1, capacity - 1, capacity, capacity + 1, 5*capacity + capacity/2}
		for range 20 {
			writeCounts = append(writeCounts, rng.Int64N(math.MaxInt64/2))
		}
		for _, wc := range writeCounts {
			if wc < 0 {
				continue // capacities near the limit overflow 5*capacity
			}
			r := newRingSlots(wc, capacity)
			seqs := []int64{0, 1, wc, max(wc-1, 0), max(wc-capacity, 0), max(wc-capacity-1, 0), math.MaxInt64}
			if wc <= math.MaxInt64-capacity {
				seqs = append(seqs, wc+capacity-1, wc+capacity)
			}
			for range 50 {
				seqs = append(seqs, rng.Int64N(math.MaxInt64), max(wc-rng.Int64N(capacity), 0))
			}
			for _, seq := range seqs {
				if got, want := r.of(seq), seq%capacity; got != want {
					t.Fatalf("capacity %d, write count %d: slot of %d is %d, want %d", capacity, wc, seq, got, want)
				}
				// The live window of this write count, and of later ones up
				// to the next multiple of capacity, maps without the
				// division.
				for _, later := range []int64{wc, wc - wc%capacity + capacity} {
					if later < 0 || seq >= later || seq < later-capacity {
						continue
					}
					if _, ok := r.near(seq); !ok {
						t.Fatalf("capacity %d, write count %d: seq %d, live at write count %d, takes the division", capacity, wc, seq, later)
					}
				}
			}
		}
	}
}
